// libkvtier.so: the client library (kvtier_client, linked in whole) as one shared object
// for engines that link kvtier from an installed prefix (find_package(kvtier) or
// pkg-config kvtier). This file only gives the target a source of its own.
#include "engine/client.h"
#include "engine/control_client.h"
#include "engine/kvtier.h"
