#pragma once
// Internal to the client library: what ControlClient makes of the daemon's replies, apart
// from the socket so tests can hand it replies no daemon of this version sends. A tier
// number this client does not know (a newer daemon's tier) is kept as an entry whose tier
// is unknown and whose name the daemon gave, never taken for another tier.

#include "engine/control_client.h"
#include "protocol/codec.h"

namespace kvtier {

DaemonStats StatsFromWire(const fb::StatsReply& reply);

}  // namespace kvtier
