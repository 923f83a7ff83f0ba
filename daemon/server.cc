#include "daemon/server.h"

#include <errno.h>
#include <malloc.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <filesystem>
#include <optional>
#include <vector>

#include "protocol/base/logging.h"
#include "protocol/framing.h"

namespace kvtier {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;

namespace {
// A session's read buffer starts this small (it grows for large frames and shrinks back
// when idle): a thousand idle connections hold a few MiB, not 64 KiB each.
constexpr size_t kInitialReadBuffer = 8 * 1024;
constexpr int64_t kRefusalLogIntervalNs = 10'000'000'000;
constexpr uint32_t kClosesPerTrim = 64;

std::optional<ucred> PeerCredentialsOf(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred)) return std::nullopt;
  return cred;
}
}  // namespace

// A pidfd turns readable when its process exits.
bool PidfdExited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

// One connection. Lives in Server::sessions_ and in the handlers it has outstanding.
class Session : public std::enable_shared_from_this<Session>, public ReplySink {
 public:
  Session(Server* server, stream::socket socket, SessionId id, const ucred& cred)
      : server_(server),
        socket_(std::move(socket)),
        in_(server->options_.max_frame_bytes, kInitialReadBuffer),
        ctx_(id),
        cred_(cred) {}
  ~Session() override {
    for (int fd : out_fds_) ::close(fd);
  }

  SessionContext& ctx() { return ctx_; }
  const SessionContext& ctx() const { return ctx_; }

  void Start() {
    boost::system::error_code ec;
    socket_.non_blocking(true, ec);
    const int fd = socket_.native_handle();
    ctx_.pid = cred_.pid;
    ctx_.uid = cred_.uid;
    ctx_.gid = cred_.gid;
    ++server_->per_uid_[cred_.uid];
    counted_ = true;
    std::vector<gid_t> groups(64);
    socklen_t glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) != 0 && errno == ERANGE) {
      groups.resize(glen / sizeof(gid_t));
      (void)::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen);
    }
    groups.resize(glen / sizeof(gid_t));
    ctx_.groups = std::move(groups);
    ctx_.connected_ns = server_->clock_->NowNanos();
    last_active_ns_ = ctx_.connected_ns;
    ctx_.async_sink = std::static_pointer_cast<ReplySink>(shared_from_this());
    WatchPeerProcess();
    Read();
  }

  // Answers the connection with `why` (an error frame, request id 0) and closes it.
  void Refuse(const Status& why) {
    boost::system::error_code ec;
    socket_.non_blocking(true, ec);
    ctx_.pid = cred_.pid;
    ctx_.uid = cred_.uid;
    ctx_.async_sink = std::static_pointer_cast<ReplySink>(shared_from_this());
    processing_ = true;
    server_->dispatcher_->RejectConnection(ctx_, why, *this);
    processing_ = false;
    Flush();  // a fresh socket has room for one small frame; Close follows the reply
    if (!closed_) Close();
  }

  // Idempotent. Drops the session's cache state and forgets it; leased pages go into
  // quarantine while the peer's process lives.
  void Close() {
    if (closed_) return;
    closed_ = true;
    if (counted_ && --server_->per_uid_[cred_.uid] == 0) server_->per_uid_.erase(cred_.uid);
    boost::system::error_code ec;
    socket_.close(ec);
    const bool alive = pidfd_ && !PidfdExited(pidfd_->native_handle());
    const uint64_t quarantine = server_->dispatcher_->SessionClosed(ctx_, alive);
    if (quarantine != 0) {
      KVTIER_LOG(NOTICE) << "session " << ctx_.id << " ended while pid " << ctx_.pid
                         << " lives: its leased pages are quarantined until it exits";
      server_->WatchQuarantine(quarantine, ::fcntl(pidfd_->native_handle(), F_DUPFD_CLOEXEC, 0));
    }
    if (pidfd_) pidfd_->close(ec);
    server_->Remove(ctx_.id);
  }

  int64_t last_active_ns() const { return last_active_ns_; }
  uid_t uid() const { return cred_.uid; }

 private:
  void Read() {
    if (closed_ || reading_ || paused_ || ctx_.close_after_reply) return;
    reading_ = true;
    auto space = in_.WritableSpace();
    socket_.async_read_some(
        asio::buffer(space.data(), space.size()),
        [self = shared_from_this()](const boost::system::error_code& ec, size_t n) { self->OnRead(ec, n); });
  }

  // The peer's process exiting closes the session even if the socket lives on elsewhere.
  void WatchPeerProcess() {
    const int pfd = ctx_.pid > 0 ? static_cast<int>(::syscall(SYS_pidfd_open, ctx_.pid, 0)) : -1;
    if (pfd < 0) {
      KVTIER_LOG(DEBUG) << "session " << ctx_.id << ": no pidfd for pid " << ctx_.pid << " (" << std::strerror(errno)
                        << "); liveness by socket only";
      return;
    }
    pidfd_ = std::make_unique<asio::posix::stream_descriptor>(socket_.get_executor(), pfd);
    WaitPeerExit();
  }

  void WaitPeerExit() {
    pidfd_->async_wait(asio::posix::stream_descriptor::wait_read,
                       [self = shared_from_this()](const boost::system::error_code& ec) {
                         if (ec || self->closed_) return;
                         if (!PidfdExited(self->pidfd_->native_handle())) {
                           self->WaitPeerExit();  // a wakeup that was not an exit
                           return;
                         }
                         KVTIER_LOG(INFO) << "session " << self->ctx_.id << ": pid " << self->ctx_.pid << " exited";
                         self->Close();
                       });
  }

  void OnRead(const boost::system::error_code& ec, size_t n) {
    reading_ = false;
    if (closed_) return;
    last_active_ns_ = server_->clock_->NowNanos();
    if (ec) {
      if (ec == asio::error::eof && in_.PendingBytes() > 0) {
        // The peer half-closed in the middle of a frame: say so, then close.
        processing_ = true;
        server_->dispatcher_->RejectFrame(ctx_,
                                          InvalidArgument("truncated frame: connection ended after " +
                                                          std::to_string(in_.PendingBytes()) + " bytes of a frame"),
                                          "truncated", *this);
        processing_ = false;
        Flush();
        return;
      }
      Close();
      return;
    }
    in_.Produced(n);
    Process();
  }

  // Serves up to kFramesPerTurn frames, then yields to other sessions.
  void Process() {
    processing_ = true;
    int served = 0;
    bool more = false;
    while (!closed_ && !ctx_.close_after_reply) {
      if (served == Server::kFramesPerTurn) {
        more = true;
        break;
      }
      auto next = in_.Next();
      if (!next.ok()) {
        server_->dispatcher_->RejectFrame(ctx_, next.status(), "oversized", *this);
        break;
      }
      if (!next->has_value()) break;
      server_->dispatcher_->HandleFrame(ctx_, (*next)->frame, *this);
      ++served;
    }
    server_->dispatcher_->EndBatch();
    processing_ = false;
    Flush();
    if (closed_) return;
    if (more) {
      asio::post(socket_.get_executor(), [self = shared_from_this()] { self->Process(); });
      return;
    }
    if (out_.size() - out_off_ > server_->options_.max_pending_output_bytes) {
      paused_ = true;  // resumes when the peer drains its responses
      return;
    }
    Read();
  }

  void Send(std::span<const uint8_t> frame, std::span<const int> fds) override {
    out_.insert(out_.end(), frame.begin(), frame.end());
    for (int fd : fds) {
      int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (d < 0) {
        KVTIER_LOG(ERROR) << "session " << ctx_.id << ": dup of a segment fd failed: " << std::strerror(errno)
                          << "; closing";
        ctx_.close_after_reply = true;
        continue;
      }
      out_fds_.push_back(d);
    }
    // A deferred response arrives outside Process(): send it now.
    if (!processing_) Flush();
  }

  void Flush() {
    if (closed_ || waiting_write_) return;
    while (out_off_ < out_.size()) {
      std::span<const uint8_t> rest(out_.data() + out_off_, out_.size() - out_off_);
      auto n = SendSome(socket_.native_handle(), rest, out_fds_);
      if (!n.ok()) {
        Close();
        return;
      }
      if (*n == 0) {
        waiting_write_ = true;
        socket_.async_wait(stream::socket::wait_write,
                           [self = shared_from_this()](const boost::system::error_code& ec) {
                             self->waiting_write_ = false;
                             if (ec || self->closed_) return;
                             self->Flush();
                           });
        return;
      }
      for (int fd : out_fds_) ::close(fd);  // the kernel holds its own references now
      out_fds_.clear();
      out_off_ += *n;
    }
    out_.clear();
    out_off_ = 0;
    if (ctx_.close_after_reply) {
      Close();
      return;
    }
    if (paused_) {
      paused_ = false;
      Process();  // frames may be buffered already
    }
  }

  Server* server_;
  stream::socket socket_;
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
  std::unique_ptr<asio::posix::stream_descriptor> pidfd_;
  int64_t last_active_ns_ = 0;
  ucred cred_;
  bool counted_ = false;  // in server_->per_uid_
};

Server::Server(asio::io_context& io, const Options& options, const Clock* clock)
    : io_(io), options_(options), clock_(clock), acceptor_(io) {}

Server::~Server() { Stop(); }

Result<std::unique_ptr<Server>> Server::Open(asio::io_context& io, const Options& options, const Clock* clock) {
  const std::string& path = options.socket_path;
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return InvalidArgument("socket path '" + path + "' is too long for a Unix socket");
  }
  std::error_code fec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::exists(parent, fec)) {
    std::filesystem::create_directories(parent, fec);
    if (fec) return Internal("cannot create socket directory " + parent.string() + ": " + fec.message());
    // Ours: only the daemon's user and the socket's group may enter it.
    if (::chmod(parent.c_str(), 0750) != 0) return ErrnoStatus(errno, "chmod " + parent.string());
    if (options.socket_gid != static_cast<gid_t>(-1) &&
        ::chown(parent.c_str(), static_cast<uid_t>(-1), options.socket_gid) != 0) {
      return ErrnoStatus(errno, "chown " + parent.string());
    }
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return FailedPrecondition("socket path " + path + " exists and is not a socket");
    }
    // A live daemon answers; a stale socket from a crash refuses.
    int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const bool live = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(probe);
    if (live) return FailedPrecondition("another kvtierd is listening on " + path);
    ::unlink(path.c_str());
  }
  std::unique_ptr<Server> s(new Server(io, options, clock));
  boost::system::error_code ec;
  s->acceptor_.open(stream(), ec);
  if (!ec) s->acceptor_.bind(stream::endpoint(path), ec);
  if (!ec) s->acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Internal("cannot listen on " + path + ": " + ec.message());
  if (::chmod(path.c_str(), options.socket_mode) != 0) {
    return ErrnoStatus(errno, "chmod " + path);
  }
  if (options.socket_gid != static_cast<gid_t>(-1) &&
      ::chown(path.c_str(), static_cast<uid_t>(-1), options.socket_gid) != 0) {
    return ErrnoStatus(errno, "chown " + path + " to gid " + std::to_string(options.socket_gid));
  }
  return s;
}

void Server::WatchQuarantine(uint64_t id, int pidfd) {
  if (pidfd < 0) {  // cannot watch: free now rather than never
    dispatcher_->QuarantineOver(id);
    return;
  }
  auto d = std::make_shared<asio::posix::stream_descriptor>(io_, pidfd);
  quarantines_[id] = d;
  ArmQuarantine(id, d);
}

void Server::ArmQuarantine(uint64_t id, std::shared_ptr<asio::posix::stream_descriptor> d) {
  d->async_wait(asio::posix::stream_descriptor::wait_read, [this, id, d](const boost::system::error_code& ec) {
    if (ec) return;
    if (!PidfdExited(d->native_handle())) {  // a wakeup that was not an exit
      ArmQuarantine(id, d);
      return;
    }
    KVTIER_LOG(INFO) << "quarantine " << id << ": its process exited; pages free again";
    quarantines_.erase(id);
    dispatcher_->QuarantineOver(id);
  });
}

void Server::ScheduleHeartbeatCheck() {
  if (options_.heartbeat_ttl_ns <= 0 || stopped_) return;
  if (!heartbeat_timer_) heartbeat_timer_ = std::make_unique<asio::steady_timer>(io_);
  heartbeat_timer_->expires_after(
      std::chrono::nanoseconds(std::max<int64_t>(options_.heartbeat_ttl_ns / 4, 25'000'000)));
  heartbeat_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopped_) return;
    const int64_t now = clock_->NowNanos();
    std::vector<std::shared_ptr<Session>> expired;
    for (auto& [id, s] : sessions_) {
      if (now - s->last_active_ns() > options_.heartbeat_ttl_ns) expired.push_back(s);
    }
    for (auto& s : expired) {
      ++expired_;
      KVTIER_LOG(WARNING) << "session " << s->ctx().id << " (pid " << s->ctx().pid << ") sent nothing for "
                          << (now - s->last_active_ns()) / 1'000'000 << " ms, over protocol.heartbeat_ttl: expired";
      s->Close();
    }
    ScheduleHeartbeatCheck();
  });
}

void Server::ScheduleHelloCheck() {
  if (options_.hello_timeout_ns <= 0 || stopped_) return;
  if (!hello_timer_) hello_timer_ = std::make_unique<asio::steady_timer>(io_);
  hello_timer_->expires_after(
      std::chrono::nanoseconds(std::clamp<int64_t>(options_.hello_timeout_ns / 4, 10'000'000, 1'000'000'000)));
  hello_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopped_) return;
    const int64_t now = clock_->NowNanos();
    std::vector<std::shared_ptr<Session>> late;
    for (auto& [id, s] : sessions_) {
      if (!s->ctx().hello_done && now - s->ctx().connected_ns > options_.hello_timeout_ns) late.push_back(s);
    }
    if (!late.empty()) {
      hello_closed_ += late.size();
      KVTIER_LOG(NOTICE) << "closing " << late.size() << " connection(s) that sent no Hello within "
                         << options_.hello_timeout_ns / 1'000'000 << " ms (protocol.hello_timeout)";
    }
    for (auto& s : late) {
      s->ctx().close_after_reply = true;
      dispatcher_->RejectConnection(
          s->ctx(), FailedPrecondition("no Hello within protocol.hello_timeout of connecting: closing"), *s);
    }
    ScheduleHelloCheck();
  });
}

Status Server::Admit(uid_t uid, bool admin) {
  const uint32_t reserve = std::min(options_.admin_sessions, options_.max_sessions - 1);
  const size_t limit = admin ? options_.max_sessions : options_.max_sessions - reserve;
  auto make_way = [&](bool same_uid_only) {
    // The oldest connection that has not said Hello (sessions_ is in connection order).
    for (auto& [id, s] : sessions_) {
      if (s->ctx().hello_done || (same_uid_only && s->uid() != uid)) continue;
      ++hello_closed_;
      auto victim = s;
      dispatcher_->RejectConnection(
          victim->ctx(), Unavailable("closed to make room for a newer connection: this one has not sent Hello"),
          *victim);
      return true;
    }
    return false;
  };
  if (!admin && options_.max_sessions_per_uid > 0) {
    auto it = per_uid_.find(uid);
    if (it != per_uid_.end() && it->second >= options_.max_sessions_per_uid && !make_way(true)) {
      return ResourceExhausted("uid " + std::to_string(uid) + " already holds protocol.max_sessions_per_uid (" +
                               std::to_string(options_.max_sessions_per_uid) + ") connections");
    }
  }
  if (sessions_.size() >= limit && !make_way(false)) {
    return ResourceExhausted(
        "kvtierd serves protocol.max_sessions (" + std::to_string(options_.max_sessions) + ") connections" +
        (admin ? std::string() : ", " + std::to_string(reserve) + " of them kept for admins") + "; try again later");
  }
  return Status::Ok();
}

void Server::NoteRefusal(const Status& why) {
  ++refused_;
  ++refusals_unlogged_;
  const int64_t now = clock_->NowNanos();
  if (last_refusal_log_ns_ != 0 && now - last_refusal_log_ns_ < kRefusalLogIntervalNs) return;
  KVTIER_LOG(WARNING) << "refused " << refusals_unlogged_ << " connection(s)"
                      << (last_refusal_log_ns_ != 0 ? " in the last 10 s" : "") << ": " << why.message();
  last_refusal_log_ns_ = now;
  refusals_unlogged_ = 0;
}

void Server::MaybeTrim() {
  if (++closes_since_trim_ < kClosesPerTrim || trim_posted_) return;
  closes_since_trim_ = 0;
  trim_posted_ = true;
  asio::post(io_, [this] {
    trim_posted_ = false;
    ::malloc_trim(0);
  });
}

void Server::Start(Dispatcher* dispatcher) {
  KVTIER_CHECK(dispatcher != nullptr) << "Server started without a dispatcher";
  dispatcher_ = dispatcher;
  Accept();
  ScheduleHeartbeatCheck();
  ScheduleHelloCheck();
}

void Server::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, stream::socket socket) {
    if (stopped_) return;
    if (!ec) {
      const auto cred = PeerCredentialsOf(socket.native_handle());
      if (!cred) {
        KVTIER_LOG(WARNING) << "a connection without peer credentials (" << std::strerror(errno) << "): closed";
      } else {
        const bool admin = options_.is_admin && options_.is_admin(cred->uid);
        const Status room = Admit(cred->uid, admin);
        const SessionId id = next_id_++;
        auto session = std::make_shared<Session>(this, std::move(socket), id, *cred);
        if (room.ok()) {
          sessions_[id] = session;
          session->Start();
        } else {
          NoteRefusal(room);
          session->Refuse(room);
        }
      }
    } else if (ec != asio::error::operation_aborted) {
      KVTIER_LOG(WARNING) << "accept: " << ec.message();
      if (ec == asio::error::no_descriptors) {
        // Out of fds: back off briefly instead of spinning.
        auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(50));
        timer->async_wait([this, timer](const boost::system::error_code&) { Accept(); });
        return;
      }
    }
    Accept();
  });
}

void Server::Remove(SessionId id) {
  if (sessions_.erase(id) != 0) MaybeTrim();
}

void Server::ForEachSession(const std::function<void(const SessionContext&)>& fn) const {
  for (const auto& [id, s] : sessions_) fn(s->ctx());
}

void Server::Stop() {
  if (stopped_) return;
  stopped_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
  // Close() removes the session from the map; iterate over a copy.
  std::vector<std::shared_ptr<Session>> all;
  for (auto& [id, s] : sessions_) all.push_back(s);
  for (auto& s : all) s->Close();
  if (heartbeat_timer_) heartbeat_timer_->cancel();
  if (hello_timer_) hello_timer_->cancel();
  for (auto& [id, d] : quarantines_) d->cancel(ec);
  quarantines_.clear();
  ::unlink(options_.socket_path.c_str());
}

}  // namespace kvtier
