#pragma once
// MetricsHttpServer: serves GET /metrics (Prometheus text format), /healthz and /readyz
// (daemon/health.h) over HTTP/1.1 on a TCP port, on a thread of its own, so the probes
// are answered while the control loop is stuck. /metrics is rendered on the control
// thread (the request is posted to its io_context), at most once per 250 ms: every
// scrape waits for the next render started after it arrived, and the scrapes waiting
// share it, so a flood of scrapes costs the control loop four renders a second, not one
// each, and no scrape sees values older than its request; one not rendered within 5 s
// is answered 503. The server's thread runs at nice +10, so answering a flood does not take
// the cores from the control loop. Deliberately minimal: one request per connection, so
// a slow or hostile client cannot hold the daemon or block a scrape:
//  - a request's headers must arrive within 2 s (else 408 Request Timeout) and fit 8 KiB
//    (else 431); the whole exchange ends within 10 s;
//  - at most 32 connections for /metrics at once, and 32 more for the probes (a /metrics
//    request on one of those is answered 503 at once), so scrapes never crowd out
//    /healthz; when a new connection finds all 64 taken, the oldest still sending its
//    request is answered 408 and closed to make room, so a scraper always gets in
//    however many half-sent requests other local users leave open.
//
// Open/Start/Stop on the owner's thread; everything else on the server's thread.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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
  // accept() said the process is out of descriptors: the reserved one takes the connection
  // waiting (a probe is answered, not left to time out), then accepting pauses.
  void OutOfDescriptors();
  class HttpConnection;
  friend class HttpConnection;
  // /metrics for `c`: the next render that starts after now.
  void Scrape(const std::shared_ptr<HttpConnection>& c);
  // Starts a render for the waiting scrapes, now or when the interval allows.
  void ScheduleRender();
  void StartRender();
  void Rendered(std::string body);

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
  // Renders (server thread): the scrapes waiting for the next one and those the one in
  // progress answers, when the last started, whether one is in progress or timed.
  std::vector<std::weak_ptr<HttpConnection>> waiting_, answering_;
  std::chrono::steady_clock::time_point render_started_;
  bool rendering_ = false, render_timed_ = false;
  boost::asio::steady_timer render_timer_;
  // Connections answering or awaiting /metrics (shared like open_connections_).
  std::shared_ptr<int> scrapes_ = std::make_shared<int>(0);
  // A descriptor held in reserve (/dev/null) for the connection a probe makes when the
  // process has none left; -1 while lent to it (or before Start).
  int spare_fd_ = -1;
  boost::asio::steady_timer accept_timer_;
  std::chrono::steady_clock::time_point last_fd_log_;
  std::shared_ptr<char> alive_ = std::make_shared<char>();  // last member: reset first
};

}  // namespace kvtier
