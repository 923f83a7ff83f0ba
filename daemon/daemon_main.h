#pragma once
// The whole of kvtierd's main(): flags, config, Daemon. Shared by kvtierd and the test
// build that injects I/O faults (tests/support/kvtierd_faulty_main.cc).

#include "daemon/daemon.h"

namespace kvtier {

// Returns the process exit status: 0 clean, 1 start or shutdown failure, 2 bad flags or
// config.
int DaemonMain(int argc, char** argv, Daemon::TestHooks hooks = {});

}  // namespace kvtier
