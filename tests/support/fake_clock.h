#pragma once
// FakeClock: time that moves only when a test says so. Not thread-safe.

#include "protocol/base/clock.h"

namespace kvtier {

class FakeClock final : public Clock {
 public:
  int64_t NowNanos() const override { return now_ns_; }
  int64_t WallSeconds() const override { return 1'700'000'000 + now_ns_ / 1'000'000'000; }
  void Advance(int64_t ns) { now_ns_ += ns; }

 private:
  int64_t now_ns_ = 1'000'000'000;
};

}  // namespace kvtier
