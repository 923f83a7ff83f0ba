// kvtierd: the kvtier daemon. Everything but the wiring lives in the kvtier_daemon library.
#include "daemon/daemon_main.h"

int main(int argc, char** argv) { return kvtier::DaemonMain(argc, argv); }
