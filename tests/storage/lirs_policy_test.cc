// LirsPolicy beyond the conformance suite (eviction_policy_test.cc): what it keeps that LRU
// does not, the order a chain leaves in, and its ghosts' bound.
#include "storage/policy/lirs_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "storage/policy/adaptive_policy.h"
#include "storage/policy/lru_policy.h"

namespace kvtier {
namespace {

// A tier of `capacity` blocks driven as the daemon drives its policy: `chains` chains of
// `len` blocks each are looked up in turn, `rounds` times; a lookup's matched prefix is
// touched deepest first and the rest is committed, each block with its parent, a victim
// evicted first when the tier is full. Returns the prefix hits of the last round.
size_t RoundRobinChains(EvictionPolicy& p, size_t capacity, int chains, int len, int rounds) {
  std::map<uint64_t, BlockId> resident;  // key -> id
  std::map<BlockId, uint64_t> key_of;
  BlockId next_id = 0;
  std::vector<BlockId> free_ids;
  size_t hits = 0;
  for (int r = 0; r < rounds; ++r) {
    hits = 0;
    for (int c = 0; c < chains; ++c) {
      auto key = [&](int i) { return static_cast<uint64_t>(c) * 1000 + static_cast<uint64_t>(i) + 1; };
      int j = 0;
      while (j < len && resident.count(key(j))) ++j;
      hits += static_cast<size_t>(j);
      std::vector<BlockId> matched;
      for (int i = j - 1; i >= 0; --i) matched.push_back(resident[key(i)]);
      p.TouchMany(matched);
      for (int i = j; i < len; ++i) {
        if (resident.size() >= capacity) {
          const BlockId v = p.Victim();
          EXPECT_NE(v, kNoBlock);
          p.Erase(v);
          resident.erase(key_of[v]);
          key_of.erase(v);
          free_ids.push_back(v);
        }
        BlockId id = next_id;
        if (!free_ids.empty()) {
          id = free_ids.back();
          free_ids.pop_back();
        } else {
          ++next_id;
        }
        const auto parent = i > 0 ? resident.find(key(i - 1)) : resident.end();
        p.Insert(id, parent == resident.end() ? kNoBlock : parent->second, key(i));
        resident[key(i)] = id;
        key_of[id] = key(i);
      }
    }
  }
  return hits;
}

TEST(LirsPolicy, KeepsAFixedSetOfChainsThatComeBackFartherThanTheTier) {
  // 15 chains of 10 blocks round robin through a 100-block tier: every chain comes back
  // after 140 other blocks, so LRU has evicted each before its turn and hits nothing. LIRS
  // keeps a set of whole chains (its 99-block LIR budget: 9 chains) and hits them every
  // round.
  LruPolicy lru(100, true);
  LirsPolicy lirs(100);
  EXPECT_EQ(RoundRobinChains(lru, 100, 15, 10, 20), 0u);
  EXPECT_GE(RoundRobinChains(lirs, 100, 15, 10, 20), 80u);
}

TEST(LirsPolicy, FollowsRecencyWhenEverythingFits) {
  LirsPolicy lirs(100);
  EXPECT_EQ(RoundRobinChains(lirs, 100, 9, 10, 5), 90u);
}

TEST(LirsPolicy, ANewChainLeavesFromItsEnd) {
  // The LIR budget of a 4-block tier is 3: the fourth block and the chain after it are HIR.
  LirsPolicy p(4);
  for (BlockId id = 0; id < 3; ++id) p.Insert(id, kNoBlock, 100 + id);
  p.Insert(3, kNoBlock, 103);
  p.Insert(4, 3, 104);
  p.Insert(5, 4, 105);
  EXPECT_FALSE(p.lir(3));
  for (BlockId want : {5u, 4u, 3u}) {
    EXPECT_EQ(p.Victim(), want);
    p.Erase(want);
  }
}

TEST(LirsPolicy, ABlockBackWhileItsGhostIsInTheStackJoinsTheLirSet) {
  LirsPolicy p(4);
  for (BlockId id = 0; id < 3; ++id) p.Insert(id, kNoBlock, 100 + id);  // LIR
  p.Insert(3, kNoBlock, 103);                                           // HIR
  ASSERT_EQ(p.Victim(), 3u);
  p.Erase(3);
  EXPECT_EQ(p.ghosts(), 1u);
  p.Insert(7, kNoBlock, 103);  // the same block again, under another id
  EXPECT_TRUE(p.lir(7));
  EXPECT_EQ(p.ghosts(), 0u);
  // The LIR set stays within budget: its least recent member (block 0) became HIR.
  EXPECT_FALSE(p.lir(0));
  EXPECT_EQ(p.Victim(), 0u);
}

TEST(LirsPolicy, GhostsStayWithinTwiceTheCapacity) {
  LirsPolicy p(16);
  BlockId id = 0;
  for (uint64_t key = 1; key <= 5000; ++key) {
    if (p.size() >= 16) {
      const BlockId v = p.Victim();
      p.Erase(v);
      id = v;
    } else {
      id = static_cast<BlockId>(p.size());
    }
    p.Insert(id, kNoBlock, key);
    // A LIR block used now and then keeps S deep, so ghosts pile up behind it.
    if (key % 7 == 0 && p.lir(0)) p.Touch(0);
    ASSERT_LE(p.ghosts(), 32u) << key;
  }
  EXPECT_GT(p.ghosts(), 0u);
}

TEST(LirsPolicy, WithoutACapacityTheBlocksItHoldsAreItsCapacity) {
  // A tenant's share of an NVMe tier is not known to its policy (capacity 0): the loop of
  // the first test through the same 100 blocks keeps the same chains.
  LirsPolicy p(0);
  EXPECT_GE(RoundRobinChains(p, 100, 15, 10, 20), 80u);
}

TEST(AdaptivePolicy, HandsLirsTheLeadWhenChainsComeBackFartherThanTheTier) {
  // As in LIRS's test above, with a tier large enough for the duel's 1/8 shadows to see
  // the loop: 60 chains of 10 blocks round robin through 400 blocks.
  AdaptivePolicy p(400);
  const size_t hits = RoundRobinChains(p, 400, 60, 10, 30);
  EXPECT_EQ(p.leader(), "prefix-lirs");
  EXPECT_GE(hits, 300u);
}

TEST(AdaptivePolicy, LeavesLirsOutWhereVictimsAreDemoted) {
  // The same loop in a tier whose victims go down to a larger one: LRU and ARC duel alone.
  AdaptivePolicy p(400, /*victims_demoted=*/true);
  RoundRobinChains(p, 400, 60, 10, 30);
  EXPECT_NE(p.leader(), "prefix-lirs");
  auto made = MakeEvictionPolicy("adaptive", 400, true);
  ASSERT_TRUE(made.ok());
  RoundRobinChains(**made, 400, 60, 10, 30);
  EXPECT_NE(dynamic_cast<AdaptivePolicy&>(**made).leader(), "prefix-lirs");
}

}  // namespace
}  // namespace kvtier
