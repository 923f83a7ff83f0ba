#include "daemon/session.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cstring>
#include <string>

#include "daemon/server.h"
#include "protocol/base/logging.h"

namespace kvtier {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;

namespace {
// A session's read buffer starts this small (it grows for large frames and shrinks back
// when idle): a thousand idle connections hold a few MiB, not 64 KiB each.
constexpr size_t kInitialReadBuffer = 8 * 1024;
}  // namespace

bool PidfdExited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

int OpenPeerPidfd(int socket_fd, pid_t pid) {
  int pfd = -1;
  socklen_t len = sizeof(pfd);
  if (::getsockopt(socket_fd, SOL_SOCKET, kSoPeerPidfd, &pfd, &len) == 0 && pfd >= 0) {
    (void)::fcntl(pfd, F_SETFD, FD_CLOEXEC);
    return pfd;
  }
  // Before Linux 6.5: the pid, where this namespace sees one (0 for a peer in a PID
  // namespace that is not ours or below it).
  if (pid <= 0) return -1;
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

Session::Session(const SessionHost* host, stream::socket socket, SessionId id, const ucred& cred)
    : host_(host), socket_(std::move(socket)), in_(host->max_frame_bytes, kInitialReadBuffer), ctx_(id), cred_(cred) {}

Session::~Session() {
  for (int fd : out_fds_) ::close(fd);
}

void Session::Start() {
  boost::system::error_code ec;
  socket_.non_blocking(true, ec);
  const int fd = socket_.native_handle();
  ctx_.pid = cred_.pid;
  ctx_.uid = cred_.uid;
  ctx_.gid = cred_.gid;
  host_->count_uid(cred_.uid, +1);
  counted_ = true;
  std::vector<gid_t> groups(64);
  socklen_t glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) != 0 && errno == ERANGE) {
    groups.resize(glen / sizeof(gid_t));
    (void)::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen);
  }
  groups.resize(glen / sizeof(gid_t));
  ctx_.groups = std::move(groups);
  ctx_.connected_ns = host_->clock->NowNanos();
  last_active_ns_ = ctx_.connected_ns;
  ctx_.async_sink = std::static_pointer_cast<ReplySink>(shared_from_this());
  WatchPeerProcess();
  Read();
}

void Session::Refuse(const Status& why) {
  boost::system::error_code ec;
  socket_.non_blocking(true, ec);
  ctx_.pid = cred_.pid;
  ctx_.uid = cred_.uid;
  ctx_.async_sink = std::static_pointer_cast<ReplySink>(shared_from_this());
  processing_ = true;
  host_->dispatcher->RejectConnection(ctx_, why, *this);
  processing_ = false;
  Flush();  // a fresh socket has room for one small frame; Close follows the reply
  if (!closed_) Close();
}

void Session::Close() {
  if (closed_) return;
  closed_ = true;
  if (counted_) host_->count_uid(cred_.uid, -1);
  // A process kvtierd cannot watch may live on with its mappings: its leases wait too. So
  // may a process forked from it that inherited the socket (and mappings the client did
  // not keep from it) after the watched one exited: then the leases wait for the socket's
  // last holder to close it.
  const bool process_lives = !pidfd_ || !PidfdExited(pidfd_->native_handle());
  const bool socket_held = !process_lives && !PeerHungUp(socket_.native_handle());
  int socket_watch = socket_held ? ::fcntl(socket_.native_handle(), F_DUPFD_CLOEXEC, 0) : -1;
  boost::system::error_code ec;
  socket_.close(ec);
  const uint64_t quarantine = host_->dispatcher->SessionClosed(ctx_, process_lives || socket_held);
  if (quarantine != 0 && socket_held) {
    KVTIER_LOG(NOTICE) << "session " << ctx_.id << ": its process (pid " << ctx_.pid
                       << ") exited while another process holds its socket: its leased pages are quarantined "
                          "until that socket is closed";
    host_->watch_quarantine(quarantine, socket_watch, QuarantineWatch::kSocket, 0);  // -1 (no dup): until restart
    socket_watch = -1;
  } else if (quarantine != 0) {
    if (pidfd_) {
      KVTIER_LOG(NOTICE) << "session " << ctx_.id << " ended while its process (pid " << ctx_.pid
                         << (ctx_.engine_pid ? ", " + std::to_string(ctx_.engine_pid) + " in its namespace" : "")
                         << ") lives: its leased pages are quarantined until it exits";
    }
    host_->watch_quarantine(quarantine, pidfd_ ? ::fcntl(pidfd_->native_handle(), F_DUPFD_CLOEXEC, 0) : -1,
                            QuarantineWatch::kProcess, ctx_.pid);
  }
  if (socket_watch >= 0) ::close(socket_watch);
  if (pidfd_) pidfd_->close(ec);
  host_->remove(ctx_.id);
}

void Session::End(const Status& why) {
  if (closed_) return;
  host_->dispatcher->RejectConnection(ctx_, why, *this);  // written now if the socket takes it
  Close();
}

void Session::Read() {
  if (closed_ || reading_ || paused_ || ctx_.close_after_reply) return;
  reading_ = true;
  auto space = in_.WritableSpace();
  socket_.async_read_some(
      asio::buffer(space.data(), space.size()),
      [self = shared_from_this()](const boost::system::error_code& ec, size_t n) { self->OnRead(ec, n); });
}

void Session::WatchPeerProcess() {
  const int pfd = OpenPeerPidfd(socket_.native_handle(), ctx_.pid);
  if (pfd < 0) {
    host_->note_unwatched(ctx_);
    return;
  }
  ctx_.watched = true;
  pidfd_ = std::make_unique<asio::posix::stream_descriptor>(socket_.get_executor(), pfd);
  WaitPeerExit();
}

void Session::WaitPeerExit() {
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

void Session::OnRead(const boost::system::error_code& ec, size_t n) {
  reading_ = false;
  if (closed_) return;
  last_active_ns_ = host_->clock->NowNanos();
  if (ec) {
    if (ec == asio::error::eof && in_.PendingBytes() > 0) {
      // The peer half-closed in the middle of a frame: say so, then close.
      processing_ = true;
      host_->dispatcher->RejectFrame(ctx_,
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

void Session::Process() {
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
      host_->dispatcher->RejectFrame(ctx_, next.status(), "oversized", *this);
      break;
    }
    if (!next->has_value()) break;
    host_->dispatcher->HandleFrame(ctx_, (*next)->frame, *this);
    ++served;
  }
  host_->dispatcher->EndBatch();
  processing_ = false;
  Flush();
  if (closed_) return;
  if (more) {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->Process(); });
    return;
  }
  if (out_.size() - out_off_ > host_->max_pending_output_bytes) {
    paused_ = true;  // resumes when the peer drains its responses
    return;
  }
  Read();
}

void Session::Send(std::span<const uint8_t> frame, std::span<const int> fds) {
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

void Session::Flush() {
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
      socket_.async_wait(stream::socket::wait_write, [self = shared_from_this()](const boost::system::error_code& ec) {
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

}  // namespace kvtier
