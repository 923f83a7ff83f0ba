#pragma once
// Server: the Unix-socket front of kvtierd. Accepts engine and kvctl connections, reads
// frames, hands them to the Dispatcher and writes the responses back, all on the
// io_context of the control thread.
//
// Fairness and safety: a session gets at most kFramesPerTurn frames served before other
// ready sessions run; a session that does not read its responses is paused once
// max_pending_output bytes wait for it; a frame over max_frame_bytes, a malformed frame or
// a frame cut short by EOF is answered with an error and the connection closed. None of
// this affects other sessions.
//
// Liveness: each session watches its peer's process through a pidfd (SO_PEERPIDFD, which
// names the process in any PID namespace; pidfd_open of the SO_PEERCRED pid on kernels
// before 6.5) and closes when it exits, socket open or not; with a heartbeat TTL, a
// session silent for longer is expired. A session that ends while its process still
// lives (it closed the socket, or was expired) has its leased pages quarantined until the
// process exits: its mappings cannot be revoked, so the pages are not reused under it. One
// whose process exited while another process holds the socket (forked from it) has them
// quarantined until that socket's last holder closes it. An expired session is told why
// (an error frame with request id 0) before its socket closes. A
// process that cannot be watched (an old kernel, a peer in another PID namespace) may
// live: its ended session's pages stay quarantined until kvtierd restarts.
// Peer credentials that cannot be read close the connection (never a default identity).
//
// Admission (no lock-out by idle connections): a connection must send Hello within
// hello_timeout or it is closed. Of max_sessions, the last admin_sessions are kept for
// admin peers (root, the daemon's uid, security.admin_uids), so kvctl gets in; a non-admin
// uid may hold at most max_sessions_per_uid. When a new connection finds no room, the
// oldest connection that has not sent Hello yet makes way for it (closed with an error
// frame); only when there is none is the new one refused, with an error frame saying
// why. Refusals are counted and logged at most once per 10 s.
//
// Owned by the control thread; not thread-safe.

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "daemon/dispatcher.h"
#include "daemon/server_options.h"
#include "daemon/session.h"
#include "protocol/base/status.h"
#include "protocol/framing.h"

namespace kvtier {

class Server {
 public:
  using Options = ServerOptions;
  // Whether a uid is an admin's (decides admin_sessions and the per-uid limit).
  using IsAdmin = std::function<bool(uid_t)>;
  static constexpr int kFramesPerTurn = 64;

  // Binds the socket (refusing when another daemon answers on it; removing a stale one)
  // but accepts nothing until Start().
  static Result<std::unique_ptr<Server>> Open(boost::asio::io_context& io, const Options& options, IsAdmin is_admin,
                                              const Clock* clock);
  ~Server();

  // Starts accepting connections and serving them through `dispatcher`, which outlives
  // the server's sessions.
  void Start(Dispatcher* dispatcher);
  // Stops accepting, closes every session (their leases and references are dropped) and
  // removes the socket file.
  void Stop();

  void ForEachSession(const std::function<void(const SessionContext&)>& fn) const;
  size_t session_count() const { return sessions_.size(); }
  uint64_t sessions_opened() const { return next_id_ - 1; }
  uint64_t sessions_refused() const { return refused_; }
  uint64_t sessions_expired() const { return expired_; }
  // Connections closed for sending no Hello in time, or to make way for a newer one.
  uint64_t sessions_without_hello_closed() const { return hello_closed_; }
  // Quarantines waiting for a process to exit (or a socket's last holder to close it), and
  // those that wait for a restart since their process could not be watched.
  // Descriptors that watch them: one per process (however many of its sessions ended while
  // it lives), one per socket held by another process.
  size_t quarantine_watches() const { return watches_.size(); }
  // Sessions whose peer's process kvtierd could not watch (OpenPeerPidfd failed).
  uint64_t sessions_unwatched() const { return unwatched_sessions_; }

 private:
  Server(boost::asio::io_context& io, const Options& options, IsAdmin is_admin, const Clock* clock);
  void Accept();
  void Remove(SessionId id);
  // Frees quarantine `id` once `fd` (owned) says its holder is gone (QuarantineWatch);
  // with fd -1, keeps it until kvtierd stops. A process's quarantines (`pid` as kvtierd
  // sees it; 0: unknown) share the first one's watch while that process lives, and `fd`
  // is closed.
  void WatchQuarantine(uint64_t id, int fd, QuarantineWatch watch, pid_t pid);
  // The watch's holder is gone (or its pid may name another process now): its
  // quarantines end, its descriptor goes.
  void EndWatch(uint64_t watch);
  // A session whose process cannot be watched: counted, and logged the first time.
  void NoteUnwatched(const SessionContext& ctx);
  void ArmWatch(uint64_t watch);
  void ScheduleHeartbeatCheck();
  void ScheduleHelloCheck();
  // Room for a connection from `uid`: OK, making way by closing the oldest connection
  // without Hello where needed; else why not.
  Status Admit(uid_t uid, bool admin);
  void NoteRefusal(const Status& why);
  // After many closes, hands freed heap back to the kernel.
  void MaybeTrim();

  boost::asio::io_context& io_;
  Options options_;
  IsAdmin is_admin_;
  const Clock* clock_;
  Dispatcher* dispatcher_ = nullptr;  // from Start
  SessionHost session_host_;          // what every session is given of this server (from Start)
  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::map<SessionId, std::shared_ptr<Session>> sessions_;
  SessionId next_id_ = 1;
  uint64_t refused_ = 0;
  uint64_t expired_ = 0;
  uint64_t hello_closed_ = 0;
  uint64_t unwatched_sessions_ = 0;
  std::map<uid_t, uint32_t> per_uid_;  // sessions open per peer uid
  int64_t last_refusal_log_ns_ = 0;
  int64_t last_accept_log_ns_ = 0;  // accept out of descriptors: said at most every 10 s
  uint64_t accept_failures_unlogged_ = 0;
  int accept_backoff_ms_ = 0;  // 0 after a successful accept
  uint64_t refusals_unlogged_ = 0;
  uint32_t closes_since_trim_ = 0;
  bool trim_posted_ = false;
  bool stopped_ = false;
  struct Watch {
    std::shared_ptr<boost::asio::posix::stream_descriptor> d;
    QuarantineWatch kind;
    pid_t pid = 0;
    std::vector<uint64_t> quarantines;
  };
  std::map<uint64_t, Watch> watches_;
  std::map<pid_t, uint64_t> watch_of_pid_;  // kProcess watches by pid
  uint64_t next_watch_ = 1;
  std::unique_ptr<boost::asio::steady_timer> heartbeat_timer_;
  std::unique_ptr<boost::asio::steady_timer> hello_timer_;
};

}  // namespace kvtier
