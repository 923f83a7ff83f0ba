#include "tests/support/ports.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace kvtier::testing {
namespace {

bool Bindable(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

int EphemeralLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  in >> low;
  return low;
}

Result<PortLease> PortLease::Take(std::mt19937& rng, int span) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvtier-ports";
  ::mkdir(dir.c_str(), 01777);
  constexpr int kLow = 10000;
  const int high = EphemeralLow() - span;  // exclusive
  if (high <= kLow) return Internal("the ephemeral port range leaves no test ports below it");
  std::uniform_int_distribution<int> pick(kLow, high - 1);
  for (int tries = 0; tries < 200; ++tries) {
    const int port = pick(rng);
    const int fd = ::open((dir + "/" + std::to_string(port)).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0 || !Bindable(port) || (span && !Bindable(port + span))) {
      ::close(fd);
      continue;
    }
    PortLease l;
    l.port_ = static_cast<uint16_t>(port);
    l.fd_ = fd;
    return l;
  }
  return Internal("no free port below " + std::to_string(high) + " after 200 tries");
}

PortLease& PortLease::operator=(PortLease&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    port_ = o.port_;
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

PortLease::~PortLease() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kvtier::testing
