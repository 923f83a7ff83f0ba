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
#include <array>
#include <boost/asio/post.hpp>
#include <filesystem>
#include <optional>
#include <vector>

#include "daemon/session.h"
#include "protocol/base/logging.h"
#include "protocol/framing.h"

namespace kvtier {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;

namespace {
constexpr int64_t kRefusalLogIntervalNs = 10'000'000'000;
constexpr uint32_t kClosesPerTrim = 64;

std::optional<ucred> PeerCredentialsOf(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred)) return std::nullopt;
  return cred;
}
}  // namespace

Server::Server(asio::io_context& io, const Options& options, IsAdmin is_admin, const Clock* clock)
    : io_(io), options_(options), is_admin_(std::move(is_admin)), clock_(clock), acceptor_(io) {}

Server::~Server() { Stop(); }

Result<std::unique_ptr<Server>> Server::Open(asio::io_context& io, const Options& options, IsAdmin is_admin,
                                             const Clock* clock) {
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
  std::unique_ptr<Server> s(new Server(io, options, std::move(is_admin), clock));
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

void Server::NoteUnwatched(const SessionContext& ctx) {
  if (unwatched_sessions_++ == 0) {
    KVTIER_LOG(WARNING) << "session " << ctx.id << " (uid " << ctx.uid << ", pid " << ctx.pid
                        << " as kvtierd sees it): its process cannot be watched (this kernel gives no SO_PEERPIDFD, "
                           "Linux >= 6.5, and the peer's pid is not visible from kvtierd's PID namespace). Leased "
                           "pages of such sessions stay quarantined until kvtierd restarts once the session ends; "
                           "kvtier_sessions_unwatched_total counts them. Said once.";
  }
}

void Server::WatchQuarantine(uint64_t id, int fd, QuarantineWatch watch, pid_t pid) {
  if (fd < 0) {
    // Nothing tells when the process is gone: its mappings may outlive any timeout, so the
    // pages stay out of use until their segments can be renewed (CacheManager) or kvtierd
    // restarts.
    return;
  }
  if (watch == QuarantineWatch::kProcess && pid > 0) {
    if (auto it = watch_of_pid_.find(pid); it != watch_of_pid_.end()) {
      Watch& w = watches_.at(it->second);
      if (!PidfdExited(w.d->native_handle())) {
        // A live pid names one process: this one, whose exit that watch waits for.
        w.quarantines.push_back(id);
        ::close(fd);
        return;
      }
      EndWatch(it->second);  // exited, its wakeup not run yet: the pid may be another's now
    }
  }
  const uint64_t key = next_watch_++;
  watches_.emplace(key, Watch{std::make_shared<asio::posix::stream_descriptor>(io_, fd), watch, pid, {id}});
  if (watch == QuarantineWatch::kProcess && pid > 0) watch_of_pid_[pid] = key;
  ArmWatch(key);
}

void Server::ArmWatch(uint64_t key) {
  auto d = watches_.at(key).d;
  d->async_wait(asio::posix::stream_descriptor::wait_read, [this, key, d](const boost::system::error_code& ec) {
    auto it = watches_.find(key);
    if (ec || it == watches_.end()) return;
    const int fd = d->native_handle();
    const QuarantineWatch watch = it->second.kind;
    if (watch == QuarantineWatch::kSocket) {
      // Whatever the socket's holder still sends is dropped unread (descriptors with it).
      std::array<uint8_t, 4096> scratch;
      for (int i = 0; i < 16 && ::recv(fd, scratch.data(), scratch.size(), MSG_DONTWAIT) > 0; ++i) {
      }
    }
    const bool gone = watch == QuarantineWatch::kSocket ? PeerHungUp(fd) : PidfdExited(fd);
    if (!gone) {  // a wakeup that was not the end
      ArmWatch(key);
      return;
    }
    EndWatch(key);
  });
}

void Server::EndWatch(uint64_t key) {
  auto it = watches_.find(key);
  if (it == watches_.end()) return;
  Watch w = std::move(it->second);
  watches_.erase(it);
  if (auto p = watch_of_pid_.find(w.pid); p != watch_of_pid_.end() && p->second == key) watch_of_pid_.erase(p);
  boost::system::error_code ec;
  w.d->close(ec);  // a wait still pending ends with operation_aborted
  KVTIER_LOG(INFO) << (w.quarantines.size() == 1 ? "quarantine " + std::to_string(w.quarantines[0])
                                                 : std::to_string(w.quarantines.size()) + " quarantines")
                   << (w.kind == QuarantineWatch::kSocket ? ": its socket's last holder closed it"
                                                          : ": their process exited")
                   << "; pages free again";
  for (uint64_t id : w.quarantines) dispatcher_->QuarantineOver(id);
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
      const int64_t silent_ms = (now - s->last_active_ns()) / 1'000'000;
      KVTIER_LOG(WARNING) << "session " << s->ctx().id << " (pid " << s->ctx().pid << ") sent nothing for " << silent_ms
                          << " ms, over protocol.heartbeat_ttl: expired";
      s->End(Aborted("session expired: nothing received for " + std::to_string(silent_ms) +
                     " ms, over kvtierd's protocol.heartbeat_ttl; its references were dropped and pages read "
                     "through them since may hold other blocks' bytes: connect again"));
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
  session_host_.clock = clock_;
  session_host_.dispatcher = dispatcher;
  session_host_.max_frame_bytes = options_.max_frame_bytes;
  session_host_.max_pending_output_bytes = options_.max_pending_output_bytes;
  session_host_.count_uid = [this](uid_t uid, int delta) {
    if ((per_uid_[uid] += delta) == 0) per_uid_.erase(uid);
  };
  session_host_.remove = [this](SessionId id) { Remove(id); };
  session_host_.watch_quarantine = [this](uint64_t id, int fd, QuarantineWatch watch, pid_t pid) {
    WatchQuarantine(id, fd, watch, pid);
  };
  session_host_.note_unwatched = [this](const SessionContext& ctx) { NoteUnwatched(ctx); };
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
        const bool admin = is_admin_ && is_admin_(cred->uid);
        const Status room = Admit(cred->uid, admin);
        const SessionId id = next_id_++;
        auto session = std::make_shared<Session>(&session_host_, std::move(socket), id, *cred);
        if (room.ok()) {
          sessions_[id] = session;
          session->Start();
        } else {
          NoteRefusal(room);
          session->Refuse(room);
        }
      }
    } else if (ec == asio::error::no_descriptors) {
      // Out of descriptors: back off (50 ms, doubling to 1 s) instead of spinning, and say
      // so once per 10 s, not per try.
      ++accept_failures_unlogged_;
      const int64_t now = clock_->NowNanos();
      accept_backoff_ms_ = std::clamp(accept_backoff_ms_ * 2, 50, 1000);
      if (last_accept_log_ns_ == 0 || now - last_accept_log_ns_ >= kRefusalLogIntervalNs) {
        KVTIER_LOG(WARNING) << "accept: " << ec.message() << " (" << accept_failures_unlogged_ << " time(s)"
                            << (last_accept_log_ns_ != 0 ? " in the last 10 s" : "") << "); retrying every "
                            << accept_backoff_ms_
                            << " ms at most: raise LimitNOFILE, or find what holds kvtierd's descriptors "
                               "(kvtier_quarantine_watches, sessions)";
        last_accept_log_ns_ = now;
        accept_failures_unlogged_ = 0;
      }
      auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(accept_backoff_ms_));
      timer->async_wait([this, timer](const boost::system::error_code&) { Accept(); });
      return;
    } else if (ec != asio::error::operation_aborted) {
      KVTIER_LOG(WARNING) << "accept: " << ec.message();
    }
    if (!ec) accept_backoff_ms_ = 0;
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
  for (auto& [key, w] : watches_) w.d->cancel(ec);
  watches_.clear();
  watch_of_pid_.clear();
  ::unlink(options_.socket_path.c_str());
}

}  // namespace kvtier
