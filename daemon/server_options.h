#pragma once
// ServerOptions: what the Unix-socket server of kvtierd is told (server.h says what each
// does). A plain value the config embeds as `DaemonConfig::server`; thread-compatible.

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "protocol/base/defaults.h"
#include "protocol/framing.h"

namespace kvtier {

struct ServerOptions {
  std::string socket_path = kDefaultSocketPath;
  uint32_t socket_mode = 0660;
  // Group given the socket (and a socket directory Open creates); -1: the daemon's. The
  // config names it (socket.group); the daemon resolves the name at start.
  gid_t socket_gid = static_cast<gid_t>(-1);
  // A session silent for this long is expired (0: never).
  int64_t heartbeat_ttl_ns = 0;
  uint32_t max_sessions = 1024;
  // A connection that has not sent Hello this long after connecting is closed (0: never).
  int64_t hello_timeout_ns = 10'000'000'000;
  // Connections one non-admin uid may hold (0: no limit beyond max_sessions).
  uint32_t max_sessions_per_uid = 256;
  // Of max_sessions, how many only admin peers may take.
  uint32_t admin_sessions = 8;
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;
  uint64_t max_pending_output_bytes = 16ull << 20;
  bool operator==(const ServerOptions&) const = default;
};

}  // namespace kvtier
