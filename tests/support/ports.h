#pragma once
// PortLease: a TCP port on 127.0.0.1 for a server a test starts (Redis, Prometheus, a fake
// node), below the kernel's ephemeral range so no outgoing connection's local port can take
// it, bindable when picked, and held by an flock on $TMPDIR/kvtier-ports/PORT until the
// lease goes — the protocol of tests/python/kvtier_testing/ports.py, so no two kvtier test
// runs (C++ or Python, in parallel) pick one port. A process outside that protocol can still
// take the port between the pick and the server's bind: the server then fails to bind, and
// the caller takes another lease (RedisClusterProcess does).

#include <cstdint>
#include <random>

#include "protocol/base/status.h"

namespace kvtier::testing {

class PortLease {
 public:
  // A port p with p + span also below the ephemeral range and bindable (Redis Cluster's bus
  // listens at port + 10000), from [10000, ephemeral low - span).
  static Result<PortLease> Take(std::mt19937& rng, int span = 0);
  PortLease() = default;
  PortLease(PortLease&& o) noexcept : port_(o.port_), fd_(o.fd_) { o.fd_ = -1; }
  PortLease& operator=(PortLease&& o) noexcept;
  PortLease(const PortLease&) = delete;
  PortLease& operator=(const PortLease&) = delete;
  ~PortLease();

  uint16_t port() const { return port_; }

 private:
  uint16_t port_ = 0;
  int fd_ = -1;  // the lock file, held
};

// The low end of the kernel's ephemeral port range (ip_local_port_range).
int EphemeralLow();

}  // namespace kvtier::testing
