#include "daemon/server.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <filesystem>
#include <vector>

#include "protocol/base/logging.h"
#include "protocol/framing.h"

namespace kvtier {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;

// One connection. Lives in Server::sessions_ and in the handlers it has outstanding.
class Session : public std::enable_shared_from_this<Session>, public ReplySink {
 public:
  Session(Server* server, stream::socket socket, SessionId id)
      : server_(server),
        socket_(std::move(socket)),
        in_(server->options_.max_frame_bytes),
        ctx_(id) {}
  ~Session() override {
    for (int fd : out_fds_) ::close(fd);
  }

  SessionContext& ctx() { return ctx_; }
  const SessionContext& ctx() const { return ctx_; }

  void Start() {
    boost::system::error_code ec;
    socket_.non_blocking(true, ec);
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      ctx_.pid = cred.pid;
      ctx_.uid = cred.uid;
      ctx_.gid = cred.gid;
    }
    ctx_.connected_ns = server_->clock_->NowNanos();
    ctx_.async_sink = std::static_pointer_cast<ReplySink>(shared_from_this());
    Read();
  }

  // Idempotent. Drops the session's cache state and forgets it.
  void Close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ec;
    socket_.close(ec);
    server_->dispatcher_->SessionClosed(ctx_);
    server_->Remove(ctx_.id);
  }

 private:
  void Read() {
    if (closed_ || reading_ || paused_ || ctx_.close_after_reply) return;
    reading_ = true;
    auto space = in_.WritableSpace();
    socket_.async_read_some(asio::buffer(space.data(), space.size()),
                            [self = shared_from_this()](const boost::system::error_code& ec,
                                                        size_t n) { self->OnRead(ec, n); });
  }

  void OnRead(const boost::system::error_code& ec, size_t n) {
    reading_ = false;
    if (closed_) return;
    if (ec) {
      if (ec == asio::error::eof && in_.PendingBytes() > 0) {
        // The peer half-closed in the middle of a frame: say so, then close.
        processing_ = true;
        server_->dispatcher_->RejectFrame(
            ctx_, InvalidArgument("truncated frame: connection ended after " +
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
        KVTIER_LOG(ERROR) << "session " << ctx_.id << ": dup of a segment fd failed: "
                          << std::strerror(errno) << "; closing";
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
};

Server::Server(asio::io_context& io, const Options& options, const Clock* clock)
    : io_(io), options_(options), clock_(clock), acceptor_(io) {}

Server::~Server() { Stop(); }

Result<std::unique_ptr<Server>> Server::Open(asio::io_context& io, const Options& options,
                                             const Clock* clock) {
  const std::string& path = options.socket_path;
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return InvalidArgument("socket path '" + path + "' is too long for a Unix socket");
  }
  std::error_code fec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::filesystem::create_directories(parent, fec);
    if (fec) return Internal("cannot create socket directory " + parent.string() + ": " + fec.message());
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
  return s;
}

void Server::Start() {
  KVTIER_CHECK(dispatcher_ != nullptr) << "Server started without a dispatcher";
  Accept();
}

void Server::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, stream::socket socket) {
    if (stopped_) return;
    if (!ec) {
      if (sessions_.size() >= options_.max_sessions) {
        ++refused_;
        KVTIER_LOG(WARNING) << "refusing a connection: max_sessions " << options_.max_sessions
                            << " reached";
      } else {
        const SessionId id = next_id_++;
        auto session = std::make_shared<Session>(this, std::move(socket), id);
        sessions_[id] = session;
        session->Start();
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

void Server::Remove(SessionId id) { sessions_.erase(id); }

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
  ::unlink(options_.socket_path.c_str());
}

}  // namespace kvtier
