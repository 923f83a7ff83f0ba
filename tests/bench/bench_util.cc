#include "tests/bench/bench_util.h"

#include <limits.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

namespace kvtier::bench {

double Latencies::Percentile(double p) const {
  if (samples_.empty()) return 0;
  std::sort(samples_.begin(), samples_.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(samples_.size())));
  rank = std::clamp<size_t>(rank, 1, samples_.size());
  return samples_[rank - 1];
}

double Latencies::total_us() const { return std::accumulate(samples_.begin(), samples_.end(), 0.0); }

BlockHash IndexHash(uint64_t seed, uint64_t i) {
  const uint64_t in[2] = {seed, i};
  XXH128_hash_t h = XXH3_128bits(in, sizeof(in));
  return BlockHash(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&h), 16));
}

double NowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

std::string SiblingBinary(const std::string& name) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return name;
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + name;
}

void PinToCpu(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ::sched_setaffinity(0, sizeof(set), &set);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

int PinClientAndPickServerCpu() {
  cpu_set_t allowed;
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return -1;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  if (cpus.size() < 2) return -1;
  PinToCpu(cpus[0]);
  return cpus[1];
}

Result<std::unique_ptr<BenchDaemon>> BenchDaemon::Start(const std::string& socket,
                                                        testing::DaemonProcess::Options options, int cpu) {
  auto d = std::unique_ptr<BenchDaemon>(new BenchDaemon());
  if (!socket.empty()) {
    d->socket_ = socket;
    return d;
  }
  options.kvtierd = SiblingBinary("kvtierd");
  options.log_level = "warning";
  options.cpu = cpu;
  d->owned_ = std::make_unique<testing::DaemonProcess>(options);
  KVTIER_RETURN_IF_ERROR(d->owned_->Start());
  d->socket_ = d->owned_->socket_path();
  return d;
}

}  // namespace kvtier::bench
