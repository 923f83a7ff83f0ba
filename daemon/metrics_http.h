#pragma once
// MetricsHttpServer: serves GET /metrics (Prometheus text format) over HTTP/1.1 on a TCP
// port, on the control thread's io_context. Deliberately minimal: one request per
// connection, a small request-size cap and a per-connection deadline, so a slow or
// hostile client cannot hold the daemon.
//
// Owned by the control thread; not thread-safe.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "protocol/base/status.h"

namespace kvtier {

class MetricsHttpServer {
 public:
  // `render` produces the body of /metrics. port 0 binds any free port.
  static Result<std::unique_ptr<MetricsHttpServer>> Open(boost::asio::io_context& io, const std::string& address,
                                                         int port, std::function<std::string()> render);
  ~MetricsHttpServer();

  void Start();
  void Stop();
  int port() const { return port_; }
  // "http://127.0.0.1:9490/metrics"
  std::string url() const;

 private:
  MetricsHttpServer(boost::asio::io_context& io, std::function<std::string()> render);
  void Accept();

  boost::asio::ip::tcp::acceptor acceptor_;
  std::function<std::string()> render_;
  std::string address_;
  int port_ = 0;
  // Shared with connections, which may outlive the server inside a stopped io_context.
  std::shared_ptr<int> open_connections_ = std::make_shared<int>(0);
  bool stopped_ = false;
  friend class HttpConnection;
};

}  // namespace kvtier
