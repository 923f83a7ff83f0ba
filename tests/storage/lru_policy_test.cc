#include "storage/lru_policy.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(LruPolicy, EvictsLeastRecentlyUsedFirst) {
  LruPolicy p;
  for (BlockId id = 0; id < 5; ++id) p.Insert(id, kNoBlock);
  p.Touch(0);
  p.Touch(2);
  // Order now, oldest first: 1, 3, 4, 0, 2.
  for (BlockId want : {1u, 3u, 4u, 0u, 2u}) {
    ASSERT_EQ(p.Victim(), want);
    p.Erase(want);
  }
  EXPECT_EQ(p.Victim(), kNoBlock);
  EXPECT_EQ(p.size(), 0u);
}

TEST(LruPolicy, PinnedBlocksAreNeverVictims) {
  LruPolicy p;
  p.Insert(10, kNoBlock);
  p.Insert(11, kNoBlock);
  p.SetEvictable(10, false);
  EXPECT_EQ(p.Victim(), 11u);
  p.SetEvictable(11, false);
  EXPECT_EQ(p.Victim(), kNoBlock);
  EXPECT_EQ(p.size(), 2u);
  EXPECT_EQ(p.evictable(), 0u);
  // Unpinning makes a block the most recent.
  p.SetEvictable(10, true);
  p.SetEvictable(11, true);
  EXPECT_EQ(p.Victim(), 10u);
}

TEST(LruPolicy, FactoryRefusesUnknownNames) {
  EXPECT_TRUE(MakeEvictionPolicy("lru").ok());
  auto bad = MakeEvictionPolicy("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("random"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
