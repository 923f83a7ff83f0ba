#pragma once
// Session: one connection to kvtierd's socket. Reads frames into a FrameAssembler, hands
// each to the Dispatcher, queues the responses (with their descriptors) and writes them
// out without blocking; watches its peer's process through a pidfd (OpenPeerPidfd). Lives in the Server's
// session map and in the handlers it has outstanding; the Server decides admission,
// expiry and quarantine (server.h states those rules).
//
// Owned by the control thread; not thread-safe.

#include <sys/socket.h>
#include <sys/types.h>

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "daemon/dispatcher.h"
#include "protocol/base/clock.h"
#include "protocol/base/status.h"
#include "protocol/framing.h"

namespace kvtier {

// What a quarantine waits for: the session's process to exit (its pidfd), or the last
// holder of the session's socket to close it (a child that inherited the socket and the
// mappings outlived the process that connected).
enum class QuarantineWatch { kProcess, kSocket };

// What a Session needs of the server that owns it, and no more: the clock, the dispatcher
// its frames go to, the output bound, and what the server keeps about its sessions (the
// connections per uid, the set of sessions, quarantines, unwatched peers). Server fills
// one in and outlives every session given it.
struct SessionHost {
  const Clock* clock = nullptr;
  Dispatcher* dispatcher = nullptr;
  uint32_t max_frame_bytes = 0;
  uint64_t max_pending_output_bytes = 0;
  // A connection of `uid` opened (+1) or closed (-1).
  std::function<void(uid_t uid, int delta)> count_uid;
  // The session ended: forget it.
  std::function<void(SessionId id)> remove;
  // Frees quarantine `id` once `fd` (owned) says its holder is gone: a pidfd, when the
  // process exits; a socket (QuarantineWatch::kSocket), when every process that holds its
  // other end has closed it. -1: at restart. `pid`: the process's, so that one descriptor
  // watches all of a process's quarantines (0: unknown).
  std::function<void(uint64_t id, int fd, QuarantineWatch watch, pid_t pid)> watch_quarantine;
  // The peer's process cannot be watched.
  std::function<void(const SessionContext& ctx)> note_unwatched;
};

// Whether the process behind `pidfd` has exited (a pidfd turns readable when it does).
bool PidfdExited(int pidfd);

// SO_PEERPIDFD (Linux 6.5; glibc 2.36's headers do not name it).
inline constexpr int kSoPeerPidfd = 77;

// A pidfd (close-on-exec) for the process at the other end of `socket_fd`: the kernel's
// SO_PEERPIDFD, which names the process in any PID namespace; where the kernel has none,
// pidfd_open of `pid` (SO_PEERCRED's) when this namespace sees it. -1: the process cannot
// be watched (an older kernel and a peer in another PID namespace).
int OpenPeerPidfd(int socket_fd, pid_t pid);

class Session : public std::enable_shared_from_this<Session>, public ReplySink {
 public:
  Session(const SessionHost* host, boost::asio::local::stream_protocol::socket socket, SessionId id, const ucred& cred);
  ~Session() override;

  SessionContext& ctx() { return ctx_; }
  const SessionContext& ctx() const { return ctx_; }

  // Reads the peer's groups, watches its process and starts reading frames.
  void Start();
  // Answers the connection with `why` (an error frame, request id 0) and closes it.
  void Refuse(const Status& why);
  // Idempotent. Drops the session's cache state and forgets it; leased pages go into
  // quarantine while the peer's process lives or another process holds the socket, or for
  // good when the process cannot be watched.
  void Close();
  // Tells the peer why its session ends (an error frame, request id 0, if the socket takes
  // it now) and closes it (heartbeat expiry).
  void End(const Status& why);

  int64_t last_active_ns() const { return last_active_ns_; }
  uid_t uid() const { return cred_.uid; }

 private:
  void Read();
  // The peer's process exiting closes the session even if the socket lives on elsewhere.
  void WatchPeerProcess();
  void WaitPeerExit();
  void OnRead(const boost::system::error_code& ec, size_t n);
  // Serves up to kFramesPerTurn frames, then yields to other sessions.
  void Process();
  // ReplySink: queues a response; one that arrives outside Process() is flushed now.
  void Send(std::span<const uint8_t> frame, std::span<const int> fds) override;
  // Writes what is queued without blocking; waits for the socket when it is full.
  void Flush();

  const SessionHost* host_;
  boost::asio::local::stream_protocol::socket socket_;
  FrameAssembler in_;
  SessionContext ctx_;
  std::vector<uint8_t> out_;
  size_t out_off_ = 0;
  std::vector<int> out_fds_;  // dups, closed once sent
  bool reading_ = false;
  bool waiting_write_ = false;
  bool paused_ = false;
  bool closed_ = false;
  bool processing_ = false;
  std::unique_ptr<boost::asio::posix::stream_descriptor> pidfd_;
  int64_t last_active_ns_ = 0;
  ucred cred_;
  bool counted_ = false;  // in the host's connections per uid
};

}  // namespace kvtier
