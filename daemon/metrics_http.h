#pragma once
// MetricsHttpServer: serves GET /metrics (Prometheus text format), /healthz and /readyz
// (daemon/health.h) over HTTP/1.1 on a TCP port, on a thread of its own, so the probes
// are answered while the control loop is stuck. /metrics is rendered on the control
// thread (the request is posted to its io_context); one it does not render within 5 s is
// answered 503. Deliberately minimal: one request per connection, so a slow or hostile
// client cannot hold the daemon or block a scrape:
//  - a request's headers must arrive within 2 s (else 408 Request Timeout) and fit 8 KiB
//    (else 431); the whole exchange ends within 10 s;
//  - at most 32 connections at once; when a new one finds them all taken, the oldest
//    still sending its request is answered 408 and closed to make room, so a scraper
//    always gets in however many half-sent requests other local users leave open.
//
// Open/Start/Stop on the owner's thread; everything else on the server's thread.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "daemon/health.h"
#include "protocol/base/status.h"

namespace kvtier {

class MetricsHttpServer {
 public:
  // `render` produces the body of /metrics, run on `control`; `health` (may be null:
  // 404) answers the probes from the server's thread. port 0 binds any free port.
  static Result<std::unique_ptr<MetricsHttpServer>> Open(boost::asio::io_context& control, const std::string& address,
                                                         int port, std::function<std::string()> render,
                                                         const Health* health);
  ~MetricsHttpServer();

  // Starts the server's thread / stops it and closes every connection (idempotent).
  void Start();
  void Stop();
  int port() const { return port_; }
  // "http://127.0.0.1:9490/metrics"
  std::string url() const;

 private:
  MetricsHttpServer(boost::asio::io_context& control, std::function<std::string()> render, const Health* health);
  void Accept();
  class HttpConnection;
  friend class HttpConnection;

  boost::asio::io_context io_;  // the server's own, run by thread_
  boost::asio::io_context& control_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::function<std::string()> render_;
  const Health* health_;
  std::thread thread_;
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
