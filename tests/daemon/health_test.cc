// Health: what the probes answer as the control loop beats, stalls and recovers.
#include "daemon/health.h"

#include <gtest/gtest.h>

#include "tests/support/fake_clock.h"

namespace kvtier {
namespace {

constexpr int64_t kSecond = 1'000'000'000;

TEST(Health, NotReadyBeforeTheFirstBeatThenAsTheLoopSays) {
  FakeClock clock;
  Health h(&clock, 10 * kSecond);
  EXPECT_TRUE(h.Live().ok);
  EXPECT_FALSE(h.Ready().ok);
  EXPECT_EQ(h.Ready().body, "starting");
  h.Beat("the NVMe index is loading");
  EXPECT_EQ(h.Ready().body, "the NVMe index is loading");
  h.Beat("");
  EXPECT_TRUE(h.Ready().ok);
  EXPECT_EQ(h.Ready().body, "ready");
}

TEST(Health, AStalledLoopIsNotLiveNorReadyUntilItBeatsAgain) {
  FakeClock clock;
  Health h(&clock, 10 * kSecond);
  h.Beat("");
  clock.Advance(10 * kSecond);
  EXPECT_TRUE(h.Live().ok) << "exactly the timeout is still live";
  clock.Advance(1);
  EXPECT_FALSE(h.Live().ok);
  EXPECT_NE(h.Live().body.find("has not run for 10000 ms"), std::string::npos) << h.Live().body;
  EXPECT_FALSE(h.Ready().ok);
  EXPECT_EQ(h.Ready().body, h.Live().body);
  h.Beat("");
  EXPECT_TRUE(h.Live().ok);
  EXPECT_TRUE(h.Ready().ok);
}

}  // namespace
}  // namespace kvtier
