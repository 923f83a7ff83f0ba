#pragma once
// MetricsHttpServer: serves GET /metrics (Prometheus text format) over HTTP/1.1 on a TCP
// port, on the control thread's io_context. Deliberately minimal: one request per
// connection, so a slow or hostile client cannot hold the daemon or block a scrape:
//  - a request's headers must arrive within 2 s (else 408 Request Timeout) and fit 8 KiB
//    (else 431); the whole exchange ends within 10 s;
//  - at most 32 connections at once; when a new one finds them all taken, the oldest
//    still sending its request is answered 408 and closed to make room, so a scraper
//    always gets in however many half-sent requests other local users leave open.
//
// Owned by the control thread; not thread-safe.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <functional>
#include <map>
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
  class HttpConnection;
  friend class HttpConnection;

  boost::asio::ip::tcp::acceptor acceptor_;
  std::function<std::string()> render_;
  std::string address_;
  int port_ = 0;
  // Shared with connections, which may outlive the server inside a stopped io_context.
  std::shared_ptr<int> open_connections_ = std::make_shared<int>(0);
  // Connections still reading their request, oldest first.
  std::map<uint64_t, std::weak_ptr<HttpConnection>> reading_;
  uint64_t next_id_ = 1;
  bool stopped_ = false;
};

}  // namespace kvtier
