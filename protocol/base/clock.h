#pragma once
// Clock: the daemon's source of time, an interface so tests can drive leases, TTLs and
// last-access times with a FakeClock (tests/support/fake_clock.h).
// SystemClock is thread-safe; implementations document their own threading.

#include <cstdint>

namespace kvtier {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic nanoseconds since an arbitrary epoch (CLOCK_MONOTONIC). Never goes back.
  virtual int64_t NowNanos() const = 0;
  // Wall-clock seconds since the Unix epoch (CLOCK_REALTIME); for persisted timestamps.
  virtual int64_t WallSeconds() const = 0;
};

class SystemClock final : public Clock {
 public:
  int64_t NowNanos() const override;
  int64_t WallSeconds() const override;
  // A process-wide instance.
  static SystemClock* Default();
};

}  // namespace kvtier
