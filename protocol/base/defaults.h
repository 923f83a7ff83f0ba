#pragma once
// Defaults the daemon and every client tool agree on, so both work from the same
// directory with no flags.

namespace kvtier {

// kvtierd's embedded default socket; clients use it unless given --socket or
// $KVTIER_SOCKET.
inline constexpr const char* kDefaultSocketPath = "./var/kvtierd.sock";
inline constexpr const char* kSocketEnvVar = "KVTIER_SOCKET";

// The socket path a client should use: `flag` when non-empty, else $KVTIER_SOCKET, else
// kDefaultSocketPath.
const char* ResolveSocketPath(const char* flag);

}  // namespace kvtier
