#pragma once
// Shared pieces of kvtier-bench modes: latency samples, a daemon of the bench's own, and
// the helpers every mode uses to print a table or one JSON object.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/client.h"
#include "engine/control_client.h"
#include "tests/support/test_util.h"

namespace kvtier::bench {

class Latencies {
 public:
  void Add(double us) { samples_.push_back(us); }
  void Append(const Latencies& o) { samples_.insert(samples_.end(), o.samples_.begin(), o.samples_.end()); }
  // Percentile in [0, 100] of the samples (nearest rank); 0 when empty.
  double Percentile(double p) const;
  size_t count() const { return samples_.size(); }
  double total_us() const;

 private:
  mutable std::vector<double> samples_;
};

// The median of `v` (mean of the middle two for an even count); 0 when empty.
double Median(std::vector<double> v);

// The 16-byte hash of block `i` of benchmark data set `seed` (independent blocks).
BlockHash IndexHash(uint64_t seed, uint64_t i);

using testing::ProcStatusKb;

// Microseconds on the monotonic clock.
double NowUs();

// CPU placement for latency benchmarks. On a small VM a wake-up across CPUs costs several
// times one on the same CPU, and which one a pair of processes gets is the scheduler's
// whim; so the client runs on one CPU and every server it is compared against (kvtierd and
// the baseline) on another, and all of them pay the same transport. Returns the server
// CPU, or -1 when there is a single CPU (nothing is pinned then).
int PinClientAndPickServerCpu();
void PinToCpu(int cpu);

// A binary next to this one (kvtier-bench lives in build/bin with kvtierd).
std::string SiblingBinary(const std::string& name);

// The daemon a mode measures: the one at `socket` when given, else a fresh kvtierd on a
// temporary socket and directory, stopped when this object goes.
class BenchDaemon {
 public:
  // `cpu` >= 0 pins the daemon this starts.
  static Result<std::unique_ptr<BenchDaemon>> Start(const std::string& socket, testing::DaemonProcess::Options options,
                                                    int cpu = -1);
  const std::string& socket() const { return socket_; }
  // The NVMe slot file of the daemon this started ("" for --socket).
  std::string slot_file() const { return owned_ ? owned_->slot_file() : std::string(); }
  // The pid of the daemon this started (-1 for --socket).
  pid_t pid() const { return owned_ ? owned_->pid() : -1; }

 private:
  std::unique_ptr<testing::DaemonProcess> owned_;
  std::string socket_;
};

}  // namespace kvtier::bench
