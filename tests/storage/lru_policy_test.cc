#include "storage/policy/lru_policy.h"

#include <gtest/gtest.h>

#include "storage/policy/arc_policy.h"

namespace kvtier {
namespace {

TEST(LruPolicy, EvictsLeastRecentlyUsedFirst) {
  LruPolicy p;
  for (BlockId id = 0; id < 5; ++id) p.Insert(id, kNoBlock, id);
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
  p.Insert(10, kNoBlock, 10);
  p.Insert(11, kNoBlock, 11);
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

namespace kvtier {
namespace {

TEST(PrefixLru, ANewBlockGoesBehindItsParentSoThePrefixOutlivesIt) {
  auto p = std::move(MakeEvictionPolicy("prefix-lru", 8)).value();
  EXPECT_TRUE(p->touch_prefix_deepest_first());
  // A chain 0 <- 1 <- 2, then an unrelated block 3.
  p->Insert(0, kNoBlock, 100);
  p->Insert(1, 0, 101);
  p->Insert(2, 1, 102);
  p->Insert(3, kNoBlock, 103);
  // Oldest first: the chain's deepest block, then its parent, then the head; 3 is newest.
  for (BlockId want : {2u, 1u, 0u, 3u}) {
    ASSERT_EQ(p->Victim(), want);
    p->Erase(want);
  }
  // Plain LRU evicts the head of the chain first, stranding its children.
  auto lru = std::move(MakeEvictionPolicy("lru", 8)).value();
  lru->Insert(0, kNoBlock, 100);
  lru->Insert(1, 0, 101);
  EXPECT_EQ(lru->Victim(), 0u);
}

TEST(Arc, ABlockSeenTwiceOutlivesOneHitWondersAndGhostsAdapt) {
  auto p = std::move(MakeEvictionPolicy("arc", 4)).value();
  // Block 0 is used twice (T2); blocks 1..3 once (T1).
  p->Insert(0, kNoBlock, 100);
  p->Touch(0);
  for (BlockId b = 1; b <= 3; ++b) p->Insert(b, kNoBlock, 100 + b);
  // With T1 above its target (0), the victims are the once-used blocks, oldest first.
  EXPECT_EQ(p->Victim(), 1u);
  p->Erase(1);
  EXPECT_EQ(p->Victim(), 2u);
  // Block 1 comes back: it is remembered (ghost B1), enters T2 and grows T1's target.
  auto* arc = static_cast<ArcPolicy*>(p.get());
  EXPECT_EQ(arc->target_t1(), 0u);
  p->Insert(7, kNoBlock, 101);
  EXPECT_GT(arc->target_t1(), 0u);
  p->Erase(2);
  p->Erase(3);
  // Only T2 blocks (0 and 7) are left; the older goes first.
  EXPECT_EQ(p->Victim(), 0u);
  // Pinned blocks are never victims.
  p->SetEvictable(0, false);
  EXPECT_EQ(p->Victim(), 7u);
  p->SetEvictable(7, false);
  EXPECT_EQ(p->Victim(), kNoBlock);
  EXPECT_EQ(p->size(), 2u);
  EXPECT_EQ(p->evictable(), 0u);
}

TEST(Policies, EveryNameMakesAPolicyOfThatName) {
  for (std::string_view n : EvictionPolicyNames()) {
    auto p = MakeEvictionPolicy(n, 16);
    ASSERT_TRUE(p.ok()) << n;
    EXPECT_EQ((*p)->name(), n);
  }
  EXPECT_TRUE(MakeEvictionPolicy(kDefaultEvictionPolicy).ok());
}

}  // namespace
}  // namespace kvtier
