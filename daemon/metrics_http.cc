#include "daemon/metrics_http.h"

#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <chrono>

#include "protocol/base/logging.h"

namespace kvtier {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {
constexpr size_t kMaxRequestBytes = 8192;
constexpr int kMaxConnections = 32;
constexpr auto kDeadline = std::chrono::seconds(10);
}  // namespace

class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(MetricsHttpServer* server, tcp::socket socket)
      : server_(server),
        open_(server->open_connections_),
        socket_(std::move(socket)),
        buf_(kMaxRequestBytes),
        timer_(socket_.get_executor()) {
    ++*open_;
  }
  ~HttpConnection() { --*open_; }

  void Start() {
    timer_.expires_after(kDeadline);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) {
        boost::system::error_code ignored;
        self->socket_.close(ignored);
      }
    });
    asio::async_read_until(
        socket_, buf_, "\r\n\r\n",
        [self = shared_from_this()](const boost::system::error_code& ec, size_t) { self->OnRequest(ec); });
  }

 private:
  void OnRequest(const boost::system::error_code& ec) {
    if (ec) {
      if (ec == asio::error::not_found)
        Respond("431 Request Header Fields Too Large", "text/plain", "too large\n");
      else
        timer_.cancel();
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
    if (target == "/metrics" || target.rfind("/metrics?", 0) == 0) {
      Respond("200 OK", "text/plain; version=0.0.4; charset=utf-8", server_->render_());
    } else if (target == "/") {
      Respond("200 OK", "text/html; charset=utf-8",
              "<html><body><a href=\"/metrics\">kvtierd metrics</a></body></html>\n");
    } else {
      Respond("404 Not Found", "text/plain", "not found; try /metrics\n");
    }
  }

  void Respond(const std::string& status, const std::string& type, std::string body) {
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

  MetricsHttpServer* server_;  // only used from handlers, which run while it lives
  std::shared_ptr<int> open_;
  tcp::socket socket_;
  asio::streambuf buf_;
  asio::steady_timer timer_;
  std::string response_;
  bool head_only_ = false;
};

MetricsHttpServer::MetricsHttpServer(asio::io_context& io, std::function<std::string()> render)
    : acceptor_(io), render_(std::move(render)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Open(asio::io_context& io, const std::string& address,
                                                                   int port, std::function<std::string()> render) {
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer(io, std::move(render)));
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

void MetricsHttpServer::Start() { Accept(); }

void MetricsHttpServer::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (stopped_ || ec == asio::error::operation_aborted) return;
    if (!ec && *open_connections_ < kMaxConnections) {
      std::make_shared<HttpConnection>(this, std::move(socket))->Start();
    }
    Accept();
  });
}

void MetricsHttpServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
}

}  // namespace kvtier
