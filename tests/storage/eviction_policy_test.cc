// The EvictionPolicy conformance suite: every policy MakeEvictionPolicy knows passes the
// same contract (storage/eviction_policy.h), with and without prefix parents, against a
// model of which blocks are present and evictable.
#include "storage/eviction_policy.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>

namespace kvtier {
namespace {

class EvictionPolicyConformance : public ::testing::TestWithParam<std::string_view> {
 protected:
  std::unique_ptr<EvictionPolicy> Make(size_t capacity = 64) {
    auto p = MakeEvictionPolicy(GetParam(), capacity);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return std::move(p).value();
  }
};

TEST_P(EvictionPolicyConformance, AnEmptyPolicyHasNoVictim) {
  auto p = Make();
  EXPECT_EQ(p->Victim(), kNoBlock);
  EXPECT_EQ(p->size(), 0u);
  EXPECT_EQ(p->evictable(), 0u);
  EXPECT_EQ(p->name(), GetParam());
}

TEST_P(EvictionPolicyConformance, ErasingVictimsDrainsEveryBlockOnce) {
  auto p = Make();
  for (BlockId id = 0; id < 20; ++id) p->Insert(id, kNoBlock, 1000 + id);
  EXPECT_EQ(p->size(), 20u);
  EXPECT_EQ(p->evictable(), 20u);
  std::set<BlockId> seen;
  for (int i = 0; i < 20; ++i) {
    const BlockId v = p->Victim();
    ASSERT_NE(v, kNoBlock) << i;
    ASSERT_LT(v, 20u);
    EXPECT_TRUE(seen.insert(v).second) << "victim " << v << " twice";
    p->Erase(v);
  }
  EXPECT_EQ(p->Victim(), kNoBlock);
  EXPECT_EQ(p->size(), 0u);
}

TEST_P(EvictionPolicyConformance, PinnedBlocksAreNeverVictimsAndUnpinnedOnesAreAgain) {
  auto p = Make();
  for (BlockId id = 0; id < 8; ++id) p->Insert(id, kNoBlock, id);
  for (BlockId id = 0; id < 8; ++id) {
    if (id != 5) p->SetEvictable(id, false);
  }
  EXPECT_EQ(p->evictable(), 1u);
  EXPECT_EQ(p->Victim(), 5u);
  p->SetEvictable(5, false);
  EXPECT_EQ(p->Victim(), kNoBlock);
  EXPECT_EQ(p->size(), 8u);
  p->SetEvictable(2, true);
  EXPECT_EQ(p->Victim(), 2u);
}

TEST_P(EvictionPolicyConformance, ARecentlyTouchedBlockOutlivesAnUntouchedOne) {
  auto p = Make();
  p->Insert(1, kNoBlock, 1);
  p->Insert(2, kNoBlock, 2);
  p->Touch(1);
  p->Touch(1);
  EXPECT_EQ(p->Victim(), 2u);
}

TEST_P(EvictionPolicyConformance, IdsAreReusedAfterErase) {
  auto p = Make();
  p->Insert(3, kNoBlock, 30);
  p->Erase(3);
  p->Insert(3, kNoBlock, 31);  // another block under the same id
  EXPECT_EQ(p->size(), 1u);
  EXPECT_EQ(p->Victim(), 3u);
}

TEST_P(EvictionPolicyConformance, ARandomSequenceKeepsTheContract) {
  // Inserts (some with a resident parent), touches, pins, unpins and erases, checked after
  // every step against a model of present and evictable blocks.
  auto p = Make(32);
  std::mt19937 rng(20261203);
  std::map<BlockId, bool> present;  // id -> evictable
  uint64_t next_key = 1;
  for (int step = 0; step < 5000; ++step) {
    const BlockId id = rng() % 48;
    const auto it = present.find(id);
    switch (rng() % 6) {
      case 0:
      case 1:
        if (it == present.end()) {
          BlockId parent = kNoBlock;
          if (!present.empty() && rng() % 2) parent = std::next(present.begin(), rng() % present.size())->first;
          p->Insert(id, parent, next_key++);
          present[id] = true;
        }
        break;
      case 2:
        if (it != present.end()) p->Touch(id);
        break;
      case 3:
        if (it != present.end()) {
          const bool e = rng() % 2;
          p->SetEvictable(id, e);
          it->second = e;
        }
        break;
      case 4:
        if (it != present.end()) {
          p->Erase(id);
          present.erase(it);
        }
        break;
      case 5: {
        const BlockId v = p->Victim();
        if (v != kNoBlock) {
          ASSERT_TRUE(present.count(v)) << "step " << step << ": victim " << v << " is not resident";
          ASSERT_TRUE(present[v]) << "step " << step << ": victim " << v << " is pinned";
          p->Erase(v);
          present.erase(v);
        }
        break;
      }
    }
    size_t evictable = 0;
    for (const auto& [k, e] : present) evictable += e;
    ASSERT_EQ(p->size(), present.size()) << "step " << step;
    ASSERT_EQ(p->evictable(), evictable) << "step " << step;
    ASSERT_EQ(p->Victim() == kNoBlock, evictable == 0) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, EvictionPolicyConformance, ::testing::ValuesIn(EvictionPolicyNames()),
                         [](const auto& info) {
                           std::string n(info.param);
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

}  // namespace
}  // namespace kvtier
