#include "daemon/metrics_http.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <chrono>

#include "protocol/base/logging.h"
#include "protocol/base/thread_name.h"

namespace kvtier {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {
constexpr size_t kMaxRequestBytes = 8192;
constexpr int kMaxScrapes = 32;                                   // connections answering or awaiting /metrics
constexpr int kMaxConnections = kMaxScrapes + 32;                 // the rest only for the probes
constexpr auto kRenderInterval = std::chrono::milliseconds(250);  // between render starts, at least
constexpr int kServerNice = 10;
constexpr auto kHeaderDeadline = std::chrono::seconds(2);
constexpr auto kDeadline = std::chrono::seconds(10);
// How long /metrics waits for the control thread to render it.
constexpr auto kRenderDeadline = std::chrono::seconds(5);
// Out of descriptors: accepting pauses this long (the listening socket stays readable, so an
// immediate retry would spin).
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

int OpenSpare() { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }
}  // namespace

class MetricsHttpServer::HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  // `on_close`: run when the connection is gone (the reserved descriptor given back).
  HttpConnection(MetricsHttpServer* server, tcp::socket socket, uint64_t id, std::function<void()> on_close = {})
      : on_close_(std::move(on_close)),
        server_(server),
        open_(server->open_connections_),
        scrapes_(server->scrapes_),
        socket_(std::move(socket)),
        buf_(kMaxRequestBytes),
        timer_(socket_.get_executor()),
        id_(id) {
    ++*open_;
  }
  ~HttpConnection() {
    --*open_;
    if (scraping_) --*scrapes_;
    boost::system::error_code ignored;
    socket_.close(ignored);  // first: on_close_ may take the descriptor back for the reserve
    if (on_close_) on_close_();
  }

  void Start() {
    server_->reading_[id_] = weak_from_this();
    // First the headers' deadline: a request still not whole by then gets a 408.
    timer_.expires_after(kHeaderDeadline);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->TimedOut();
    });
    asio::async_read_until(
        socket_, buf_, "\r\n\r\n",
        [self = shared_from_this()](const boost::system::error_code& ec, size_t) { self->OnRequest(ec); });
  }

  // Answers 408 and closes (headers too slow, or room needed for a newer connection).
  void TimedOut() {
    if (responding_) return;
    boost::system::error_code ignored;
    socket_.cancel(ignored);  // the read ends with operation_aborted, which OnRequest ignores
    Respond("408 Request Timeout", "text/plain", "request not received in time\n");
  }

 private:
  void OnRequest(const boost::system::error_code& ec) {
    if (responding_) return;
    if (ec) {
      if (ec == asio::error::not_found) {
        Respond("431 Request Header Fields Too Large", "text/plain", "too large\n");
      } else {
        server_->reading_.erase(id_);
        timer_.cancel();
      }
      return;
    }
    std::istream in(&buf_);
    std::string method, target, version;
    in >> method >> target >> version;
    if (method != "GET" && method != "HEAD") {
      Respond("405 Method Not Allowed", "text/plain", "only GET\n");
      return;
    }
    head_only_ = method == "HEAD";
    const Health* health = server_->health_;
    // The path alone names the resource: a query string (probes add one) changes nothing.
    const std::string path = target.substr(0, target.find('?'));
    if (path == "/metrics") {
      if (*scrapes_ >= kMaxScrapes) {
        Respond("503 Service Unavailable", "text/plain", "too many scrapes at once; try again\n");
        return;
      }
      scraping_ = true;
      ++*scrapes_;
      AwaitRender();
    } else if (health && (path == "/healthz" || path == "/readyz")) {
      const Health::Answer a = path == "/healthz" ? health->Live() : health->Ready();
      Respond(a.ok ? "200 OK" : "503 Service Unavailable", "text/plain; charset=utf-8", a.body + "\n");
    } else if (path == "/") {
      Respond("200 OK", "text/html; charset=utf-8",
              "<html><body><a href=\"/metrics\">kvtierd metrics</a></body></html>\n");
    } else {
      Respond("404 Not Found", "text/plain", "not found; try /metrics\n");
    }
  }

  // /metrics: answered by the server's next render (MetricsHttpServer::Scrape); 503 if
  // that takes too long (the control loop is stuck or swamped).
  void AwaitRender() {
    server_->reading_.erase(id_);
    timer_.expires_after(kRenderDeadline);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->Respond("503 Service Unavailable", "text/plain", "the control loop did not render in time\n");
    });
    server_->Scrape(shared_from_this());
  }

 public:
  void Rendered(const std::string& body) { Respond("200 OK", "text/plain; version=0.0.4; charset=utf-8", body); }

 private:
  void Respond(const std::string& status, const std::string& type, std::string body) {
    if (responding_) return;
    responding_ = true;
    if (!server_->stopped_) server_->reading_.erase(id_);
    // The rest of the exchange (writing the response) must end by the overall deadline.
    timer_.expires_after(kDeadline - kHeaderDeadline);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) {
        boost::system::error_code ignored;
        self->socket_.close(ignored);
      }
    });
    response_ = "HTTP/1.1 " + status + "\r\nContent-Type: " + type +
                "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
    if (!head_only_) response_ += body;
    asio::async_write(socket_, asio::buffer(response_),
                      [self = shared_from_this()](const boost::system::error_code&, size_t) {
                        boost::system::error_code ignored;
                        self->socket_.shutdown(tcp::socket::shutdown_both, ignored);
                        self->socket_.close(ignored);
                        self->timer_.cancel();
                      });
  }

  std::function<void()> on_close_;
  MetricsHttpServer* server_;  // only used from handlers, which run while it lives
  std::shared_ptr<int> open_, scrapes_;
  tcp::socket socket_;
  asio::streambuf buf_;
  asio::steady_timer timer_;
  std::string response_;
  bool head_only_ = false;
  bool responding_ = false;
  bool scraping_ = false;  // counted in scrapes_
  uint64_t id_;
};

void MetricsHttpServer::Scrape(const std::shared_ptr<HttpConnection>& c) {
  waiting_.push_back(c);
  ScheduleRender();
}

void MetricsHttpServer::ScheduleRender() {
  if (rendering_ || render_timed_ || waiting_.empty()) return;
  const auto due = render_started_ + kRenderInterval;
  if (std::chrono::steady_clock::now() >= due) {
    StartRender();
    return;
  }
  render_timed_ = true;
  render_timer_.expires_at(due);
  render_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    render_timed_ = false;
    StartRender();
  });
}

void MetricsHttpServer::StartRender() {
  rendering_ = true;
  render_started_ = std::chrono::steady_clock::now();
  answering_.swap(waiting_);  // answering_ was empty: no render was in progress
  // The control thread owns (and destroys) this server, so `alive` tells it the server
  // and its io_context are still there when the render is done.
  asio::post(control_, [this, alive = std::weak_ptr<char>(alive_), render = render_] {
    if (alive.expired()) return;
    asio::post(io_, [this, body = render()]() mutable { Rendered(std::move(body)); });
  });
}

void MetricsHttpServer::Rendered(std::string body) {
  rendering_ = false;
  std::vector<std::weak_ptr<HttpConnection>> answering;
  answering.swap(answering_);
  for (auto& w : answering) {
    if (auto c = w.lock()) c->Rendered(body);
  }
  ScheduleRender();  // the scrapes that came during this render
}

MetricsHttpServer::MetricsHttpServer(asio::io_context& control, std::function<std::string()> render,
                                     const Health* health)
    : control_(control),
      acceptor_(io_),
      render_(std::move(render)),
      health_(health),
      render_timer_(io_),
      accept_timer_(io_) {}

MetricsHttpServer::~MetricsHttpServer() {
  Stop();
  if (spare_fd_ >= 0) ::close(spare_fd_);
}

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Open(asio::io_context& control,
                                                                   const std::string& address, int port,
                                                                   std::function<std::string()> render,
                                                                   const Health* health) {
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer(control, std::move(render), health));
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(address, ec);
  if (ec) return InvalidArgument("metrics.listen '" + address + "' is not an IP address");
  tcp::endpoint ep(addr, static_cast<uint16_t>(port));
  s->acceptor_.open(ep.protocol(), ec);
  if (!ec) s->acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) s->acceptor_.bind(ep, ec);
  if (!ec) s->acceptor_.listen(64, ec);
  if (ec) {
    return Unavailable("cannot listen for metrics on " + address + ":" + std::to_string(port) + ": " + ec.message() +
                       " (set metrics.port, 0 for any free port)");
  }
  s->address_ = address;
  s->port_ = s->acceptor_.local_endpoint().port();
  return s;
}

std::string MetricsHttpServer::url() const {
  const bool v6 = address_.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + address_ + "]" : address_) + ":" + std::to_string(port_) + "/metrics";
}

void MetricsHttpServer::Start() {
  if (thread_.joinable() || stopped_) return;
  spare_fd_ = OpenSpare();
  Accept();
  thread_ = std::thread([this] {
    NameThisThread("kvtier-metrics");
    // Below the control loop: a flood of requests is answered with the cores it leaves.
    if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), kServerNice) != 0) {
      KVTIER_LOG(WARNING) << "metrics server thread: setpriority failed; it runs at the daemon's priority";
    }
    io_.run();
  });
}

void MetricsHttpServer::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (stopped_ || ec == asio::error::operation_aborted) return;
    if (!ec) {
      // Full: the oldest connection still sending its request makes way.
      // (It leaves once its 408 is written: the new one is admitted now regardless.)
      bool made_way = false;
      while (*open_connections_ >= kMaxConnections && !reading_.empty() && !made_way) {
        auto oldest = reading_.begin()->second.lock();
        reading_.erase(reading_.begin());
        if (oldest) {
          oldest->TimedOut();
          made_way = true;
        }
      }
      if (made_way || *open_connections_ < kMaxConnections) {
        std::make_shared<HttpConnection>(this, std::move(socket), next_id_++)->Start();
      }
    } else if (ec == boost::system::errc::too_many_files_open ||
               ec == boost::system::errc::too_many_files_open_in_system) {
      OutOfDescriptors();
      return;
    }
    Accept();
  });
}

void MetricsHttpServer::OutOfDescriptors() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_fd_log_ > std::chrono::minutes(1)) {
    last_fd_log_ = now;
    KVTIER_LOG(WARNING) << "metrics: accept: out of file descriptors; probes are answered on the one kept in "
                           "reserve (logged once a minute; raise LimitNOFILE / the container's nofile limit)";
  }
  if (spare_fd_ >= 0) {
    ::close(spare_fd_);
    spare_fd_ = -1;
    const int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    boost::system::error_code ec;
    tcp::socket socket(io_);
    if (fd >= 0) socket.assign(acceptor_.local_endpoint().protocol(), fd, ec);
    if (fd >= 0 && !ec) {
      auto give_back = [this, alive = std::weak_ptr<char>(alive_)] {
        if (!alive.expired() && spare_fd_ < 0) spare_fd_ = OpenSpare();
      };
      std::make_shared<HttpConnection>(this, std::move(socket), next_id_++, std::move(give_back))->Start();
    } else {
      if (fd >= 0 && ec) ::close(fd);
      spare_fd_ = OpenSpare();
    }
  }
  accept_timer_.expires_after(kAcceptPause);
  accept_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && !stopped_) Accept();
  });
}

void MetricsHttpServer::Stop() {
  if (stopped_) return;
  // The thread first: after the join nothing else touches the acceptor or connections.
  io_.stop();
  if (thread_.joinable()) thread_.join();
  stopped_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
}

}  // namespace kvtier
