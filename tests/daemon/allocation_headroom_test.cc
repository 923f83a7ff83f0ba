// AllocationHeadroom: the pages a tier keeps ahead of allocations, from the allocation
// rate and the demotions' round trip.
#include "daemon/cache/allocation_headroom.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

constexpr int64_t kMs = 1'000'000;

// `pages_per_ms` pages every millisecond for `ms` milliseconds from `*now`.
void TakeSteadily(AllocationHeadroom& h, int64_t* now, uint64_t* total, uint64_t pages_per_ms, int ms) {
  for (int i = 0; i < ms; ++i) {
    *now += kMs;
    *total += pages_per_ms;
    h.NoteTaken(*now, *total);
  }
}

TEST(AllocationHeadroom, IsRateTimesRoundTripTimesFactor) {
  AllocationHeadroom h(2.0, 1.0);
  int64_t now = 5'000 * kMs;
  uint64_t total = 7;  // counted before the estimator started: not a burst
  h.NoteTaken(now, total);
  TakeSteadily(h, &now, &total, 3, 8'000);  // 3,000 pages/s for 8 windows
  EXPECT_NEAR(h.rate_per_s(now), 3000, 30);
  EXPECT_EQ(h.Pages(now), 0u) << "no demotion has been timed yet";
  h.NoteRoundTrip(0.020);
  EXPECT_NEAR(h.Pages(now), 2 * 3000 * 0.020, 2);
}

TEST(AllocationHeadroom, DecaysWhenAllocationsStop) {
  AllocationHeadroom h(2.0, 1.0);
  int64_t now = 0;
  uint64_t total = 0;
  h.NoteTaken(now, total);
  TakeSteadily(h, &now, &total, 5, 5'000);
  h.NoteRoundTrip(0.010);
  const uint32_t busy = h.Pages(now);
  EXPECT_GE(busy, 95u);
  EXPECT_NEAR(h.Pages(now + 1'000 * kMs), busy / 2.718, 3) << "one window later: 1/e";
  EXPECT_EQ(h.Pages(now + 20'000 * kMs), 1u) << "idle: what is left of the rate rounds up to one page";
  h.NoteTaken(now + 20'000 * kMs, total);
  EXPECT_LE(h.rate_per_s(now + 30'000 * kMs), 0.01);
}

TEST(AllocationHeadroom, RoundTripIsARecentMean) {
  AllocationHeadroom h;
  h.NoteRoundTrip(0.050);
  EXPECT_DOUBLE_EQ(h.round_trip_s(), 0.050);
  h.NoteRoundTrip(0.450);  // one slow spill moves the mean by an eighth of the difference
  EXPECT_NEAR(h.round_trip_s(), 0.100, 1e-12);
  for (int i = 0; i < 200; ++i) h.NoteRoundTrip(0.010);
  EXPECT_NEAR(h.round_trip_s(), 0.010, 1e-6);
  h.NoteRoundTrip(-1);  // a clock that went back is not a round trip
  EXPECT_NEAR(h.round_trip_s(), 0.010, 1e-6);
}

TEST(AllocationHeadroom, FactorZeroIsOff) {
  AllocationHeadroom h(0.0);
  int64_t now = 0;
  uint64_t total = 0;
  h.NoteTaken(now, total);
  TakeSteadily(h, &now, &total, 10, 2'000);
  h.NoteRoundTrip(0.5);
  EXPECT_GT(h.rate_per_s(now), 0);
  EXPECT_EQ(h.Pages(now), 0u);
}

}  // namespace
}  // namespace kvtier
