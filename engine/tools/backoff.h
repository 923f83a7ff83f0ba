#pragma once
// Backoff: how the load tools (kvtier-load, kvtier-replay) wait after a refusal or a lost
// daemon, as an engine should: exponential with full jitter (AWS "full jitter": a uniform
// wait in [0, min(cap, base * 2^n))), so a crowd of sessions refused together does not
// come back together, and never past the caller's deadline.
//
//   Backoff b(std::chrono::milliseconds(1), std::chrono::seconds(1), seed);
//   while (!done) { if (Try().ok()) b.Reset(); else if (!b.Wait(deadline)) break; }
//
// Not thread-safe: one per session.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>

#include "protocol/base/status.h"

namespace kvtier {

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;
  Backoff(std::chrono::nanoseconds base, std::chrono::nanoseconds cap, uint64_t seed)
      : base_(base), cap_(cap), rng_(seed) {}

  // The next wait: uniform in [0, min(cap, base * 2^attempts)); attempts grows by one.
  std::chrono::nanoseconds Next() {
    const int64_t ceiling = std::min<int64_t>(cap_.count(), base_.count() << std::min(attempts_, 30));
    ++attempts_;
    return std::chrono::nanoseconds(std::uniform_int_distribution<int64_t>(0, std::max<int64_t>(ceiling - 1, 0))(rng_));
  }
  // Sleeps Next(), cut short at `deadline`; false when the deadline has come.
  bool Wait(Clock::time_point deadline) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_until(std::min(deadline, now + Next()));
    return Clock::now() < deadline;
  }
  // After a success: the next failure waits little again.
  void Reset() { attempts_ = 0; }
  int attempts() const { return attempts_; }

 private:
  std::chrono::nanoseconds base_, cap_;
  std::mt19937_64 rng_;
  int attempts_ = 0;
};

// The daemon is not there (stopped, restarting, or this connection was dropped): a client
// should reconnect rather than retry on this connection.
inline bool DaemonGone(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded ||
         s.code() == StatusCode::kFailedPrecondition;
}

}  // namespace kvtier
