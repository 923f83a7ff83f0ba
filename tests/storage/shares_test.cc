// The quota / reserve / watermark rule shared by the pool tiers and the NVMe tier.
#include "storage/policy/shares.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier {
namespace {

TEST(Shares, LimitsAreWholeUnitsAndANonzeroLimitIsAtLeastOne) {
  EXPECT_EQ(LimitUnits(0, 4096), 0u);
  EXPECT_EQ(LimitUnits(1, 4096), 1u);
  EXPECT_EQ(LimitUnits(3 * 4096 + 100, 4096), 3u);
  EXPECT_TRUE(AtQuota({.held = 3, .quota = 3}));
  EXPECT_FALSE(AtQuota({.held = 2, .quota = 3}));
  EXPECT_FALSE(AtQuota({.held = 1000, .quota = 0})) << "0 is no quota";
  EXPECT_FALSE(AboveReserve({.held = 4, .reserve = 4}));
  EXPECT_TRUE(AboveReserve({.held = 5, .reserve = 4}));
}

TEST(Shares, TheWatermarkTakesFromTheLargestOwnerAboveItsReserveThatCanGive) {
  std::vector<Share> shares = {{.held = 10, .reserve = 10}, {.held = 6}, {.held = 8}, {.held = 9}};
  std::vector<uint32_t> giveable = {10, 6, 8, 0};  // owner 3 has nothing it may give
  auto pick = [&] {
    return OwnerToShrink<uint32_t>(
        static_cast<uint32_t>(shares.size()), [&](uint32_t o) { return shares[o]; },
        [&](uint32_t o) { return giveable[o]; });
  };
  EXPECT_EQ(pick(), std::optional<uint32_t>(2)) << "0 is at its reserve, 3 cannot give";
  giveable[1] = 8;
  EXPECT_EQ(pick(), std::optional<uint32_t>(1)) << "ties go to the lowest id";
  shares = {{.held = 2, .reserve = 2}};
  giveable = {2};
  EXPECT_EQ(pick(), std::nullopt) << "no one above its reserve: nothing is taken";
}

}  // namespace
}  // namespace kvtier
