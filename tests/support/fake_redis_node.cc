#include "tests/support/fake_redis_node.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

namespace kvtier::testing {
namespace {

// Parses one RESP array of bulk strings at the front of `in`; consumed bytes, 0 when
// incomplete, -1 when it is not one.
long ParseCommand(const std::string& in, std::vector<std::string>* args) {
  size_t at = 0;
  auto line = [&](long* n) -> int {
    const size_t end = in.find("\r\n", at);
    if (end == std::string::npos) return 0;
    if (end == at + 1) return -1;
    *n = std::strtol(in.c_str() + at + 1, nullptr, 10);
    at = end + 2;
    return 1;
  };
  if (in.empty()) return 0;
  if (in[0] != '*') return -1;
  long count = 0;
  if (int r = line(&count); r <= 0) return r;
  args->clear();
  for (long i = 0; i < count; ++i) {
    if (at >= in.size()) return 0;
    if (in[at] != '$') return -1;
    long len = 0;
    if (int r = line(&len); r <= 0) return r;
    if (in.size() < at + static_cast<size_t>(len) + 2) return 0;
    args->push_back(in.substr(at, static_cast<size_t>(len)));
    at += static_cast<size_t>(len) + 2;
  }
  return static_cast<long>(at);
}

}  // namespace

FakeRedisNode::FakeRedisNode(Handler handler) : handler_(std::move(handler)) {}

FakeRedisNode::~FakeRedisNode() {
  if (thread_.joinable()) {
    const char c = 0;
    (void)!::write(wake_[1], &c, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

std::string FakeRedisNode::Bulk(const std::string& s) { return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n"; }

std::string FakeRedisNode::SlotsForOne(int port) {
  return "*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n" + Bulk("127.0.0.1") + ":" + std::to_string(port) + "\r\n" + Bulk("fake");
}

std::string FakeRedisNode::SlotsForMany(int masters) {
  std::string out = "*" + std::to_string(masters) + "\r\n";
  for (int i = 0; i < masters; ++i) {
    out += "*3\r\n:" + std::to_string(i * 16) + "\r\n:" + std::to_string(i * 16 + 15) + "\r\n*3\r\n" +
           Bulk("127.0.0.1") + ":" + std::to_string(2 + i) + "\r\n" + Bulk("id");
  }
  return out;
}

Status FakeRedisNode::Start(int fixed_port) {
  if (::pipe2(wake_, O_CLOEXEC) != 0) return Internal("pipe: " + std::string(strerror(errno)));
  std::mt19937 rng(std::random_device{}());
  for (int tries = 0; tries < (fixed_port ? 1 : 200); ++tries) {
    const int port = fixed_port ? fixed_port : 20000 + static_cast<int>(rng() % 10000);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd, 64) == 0) {
      listen_fd_ = fd;
      port_ = port;
      thread_ = std::thread([this] { Run(); });
      return Status::Ok();
    }
    ::close(fd);
  }
  return Internal("no free loopback port for a fake Redis node");
}

void FakeRedisNode::Run() {
  // A connection's reply goes out as its socket takes it, so a client that reads slowly (or
  // not at all) never holds up the others, and its next command is read only once the
  // reply before it has gone (Redis, too, stops reading from a client whose output
  // buffer is full). A connection is closed when its reader makes no progress for kStall.
  constexpr auto kStall = std::chrono::seconds(2);
  struct Conn {
    int fd;
    std::string in;
    std::shared_ptr<const std::string> out;
    size_t sent = 0;
    std::chrono::steady_clock::time_point progress;
    bool sending() const { return out != nullptr && sent < out->size(); }
  };
  std::vector<Conn> conns;
  for (;;) {
    std::vector<pollfd> p = {{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const Conn& c : conns) p.push_back({c.fd, static_cast<short>(c.sending() ? POLLOUT : POLLIN), 0});
    if (::poll(p.data(), p.size(), 100) < 0 && errno != EINTR) break;
    if (p[0].revents) break;
    if (p[1].revents & POLLIN) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) conns.push_back({fd, {}, nullptr, 0, std::chrono::steady_clock::now()});
    }
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 2; i < p.size(); ++i) {
      Conn& c = conns[i - 2];
      bool close = false;
      if (!c.sending() && (p[i].revents & (POLLIN | POLLHUP | POLLERR))) {
        char buf[65536];
        const ssize_t n = ::read(c.fd, buf, sizeof(buf));
        close = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
        if (n > 0) c.in.append(buf, static_cast<size_t>(n));
      }
      std::vector<std::string> args;
      while (!close) {
        if (!c.sending()) {
          const long used = ParseCommand(c.in, &args);
          if (used <= 0) break;
          c.in.erase(0, static_cast<size_t>(used));
          ++commands_;
          c.out = handler_(args).bytes;
          c.sent = 0;
          c.progress = now;
          continue;
        }
        const ssize_t k = ::send(c.fd, c.out->data() + c.sent, c.out->size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
          c.sent += static_cast<size_t>(k);
          c.progress = now;
          continue;
        }
        close = (k < 0 && errno != EAGAIN && errno != EINTR) || now - c.progress > kStall;
        break;
      }
      if (close) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
    std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });
  }
  for (const Conn& c : conns) ::close(c.fd);
}

}  // namespace kvtier::testing
