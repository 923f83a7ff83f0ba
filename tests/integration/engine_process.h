#pragma once
// Engine processes for integration tests: fork a child that runs `body` (typically with
// its own kvtier::Client) and exits with its return value; pipes let the parent and the
// child step in lockstep.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>

#include "engine/client.h"
#include "engine/control_client.h"
#include "tests/support/test_util.h"

namespace kvtier::testing {

class Pipe {
 public:
  Pipe() {
    if (::pipe(fds_) != 0) fds_[0] = fds_[1] = -1;
  }
  ~Pipe() {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  void Signal(char c = '!') { (void)!::write(fds_[1], &c, 1); }
  // Waits for one byte; false on EOF.
  bool Wait() {
    char c;
    return ::read(fds_[0], &c, 1) == 1;
  }

 private:
  int fds_[2];
};

class EngineProcess {
 public:
  explicit EngineProcess(std::function<int()> body) {
    pid_ = ::fork();
    if (pid_ == 0) {
      int rc = 99;
      try {
        rc = body();
      } catch (...) {
        rc = 98;
      }
      ::_exit(rc);
    }
  }
  ~EngineProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Join();
    }
  }
  // Exit code, or 128 + signal.
  int Join() {
    int status = 0;
    if (pid_ <= 0) return -1;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  void Kill9() {
    if (pid_ > 0) ::kill(pid_, SIGKILL);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

struct CmdResult {
  int code;
  std::string out;
};

// Runs a shell command, capturing stdout and stderr together.
inline CmdResult Sh(const std::string& cmd) {
  CmdResult r{-1, ""};
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline ClientOptions EngineOptions(const std::string& socket, const std::string& name = "test-engine") {
  ClientOptions o;
  o.socket_path = socket;
  o.engine_name = name;
  o.layout = TestLayout();
  o.timeout_ms = 10'000;
  return o;
}

inline ControlClientOptions ControlOptions(const std::string& socket) {
  ControlClientOptions o;
  o.socket_path = socket;
  o.name = "test-control";
  o.timeout_ms = 10'000;
  return o;
}

// Stats through a control session of its own (engines' sessions have no Stats).
inline Result<DaemonStats> StatsOf(const std::string& socket, bool with_sessions = false) {
  KVTIER_ASSIGN_OR_RETURN(auto c, ControlClient::Connect(ControlOptions(socket)));
  return c->Stats(with_sessions);
}

// A tier's entry in `s`, or nullptr when the daemon has no such tier.
inline const TierStatsInfo* TierOf(const DaemonStats& s, TierKind t) {
  for (const auto& x : s.tiers) {
    if (x.tier == t) return &x;
  }
  return nullptr;
}

// The metrics URL a daemon logged at start ("" if none within 10 s).
inline std::string MetricsUrl(const DaemonProcess& d) {
  // The line that names it may reach the log a moment after the socket is up.
  (void)WaitUntil([&] { return d.Log().find("metrics at ") != std::string::npos; });
  const std::string log = d.Log();
  const size_t at = log.find("metrics at ");
  if (at == std::string::npos) return "";
  const size_t end = log.find_first_of(" \n", at + 11);
  return log.substr(at + 11, end - at - 11);
}

// One unlabelled series of a scrape of `url`; -1 when absent.
inline double Metric(const std::string& url, const std::string& name) {
  CmdResult r = Sh("curl -fsS -m 5 " + url);
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

// Waits (bounded) until `d` has answered at least `n` Lookups: a load started on another
// thread is under way (instead of sleeping for a guess of how long it takes to start).
inline bool WaitForLookups(const DaemonProcess& d, double n) {
  const std::string url = MetricsUrl(d);
  return WaitUntil([&] { return Metric(url, "kvtier_lookups_total") >= n; }, std::chrono::seconds(60),
                   std::chrono::milliseconds(20));
}

// A TCP connection to loopback:`port`; -1 on failure.
inline int TcpConnect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The status line of GET `path` (empty: no answer, or the connection reset).
inline std::string HttpStatus(int port, const std::string& path) {
  const int fd = TcpConnect(port);
  if (fd < 0) return "";
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  std::string got;
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    while (got.find("\r\n") == std::string::npos && ::poll(&p, 1, 5000) == 1) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return got.substr(0, got.find("\r\n"));
}

// A bare connection to the daemon's socket (for tests that speak raw frames); -1 on failure.
inline int RawConnect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace kvtier::testing
