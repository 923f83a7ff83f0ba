// The EvictionPolicy conformance suite: every policy MakeEvictionPolicy knows passes the
// same contract (storage/policy/eviction_policy.h), with and without prefix parents, against a
// model of which blocks are present and evictable.
#include "storage/policy/eviction_policy.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "storage/policy/adaptive_policy.h"

namespace kvtier {
namespace {

// A random id among `present`'s. REQUIRES: not empty.
BlockId AnyOf(const std::map<BlockId, bool>& present, std::mt19937& rng) {
  return std::next(present.begin(), rng() % present.size())->first;
}

// A parent for a new block: half the time one of `present`, else none.
BlockId MaybeParent(const std::map<BlockId, bool>& present, std::mt19937& rng) {
  return !present.empty() && rng() % 2 ? AnyOf(present, rng) : kNoBlock;
}

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
          const BlockId parent = MaybeParent(present, rng);
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

TEST_P(EvictionPolicyConformance, TouchManyEndsWhereTouchesOneByOneEnd) {
  // Two copies of a policy see the same random history, except that one gets each run of
  // touches as one TouchMany (chains, repeats and pinned blocks included) and the other as
  // Touch calls; then both are drained and must give up the same victims in the same order.
  // Adaptive's duel is part of that state: its shadows pick the policy that names victims.
  auto one = Make(256), many = Make(256);
  std::mt19937 rng(20261204);
  std::map<BlockId, bool> present;
  std::vector<BlockId> last_run;
  uint64_t next_key = 1;
  for (int step = 0; step < 4000; ++step) {
    const BlockId id = rng() % 320;
    const auto it = present.find(id);
    switch (rng() % 5) {
      case 0:
        if (it == present.end()) {
          const BlockId parent = MaybeParent(present, rng);
          one->Insert(id, parent, next_key);
          many->Insert(id, parent, next_key++);
          present[id] = true;
        }
        break;
      case 1:
      case 2: {
        // A run of up to 40 present ids, consecutive from a random one (a chain) or random.
        std::vector<BlockId> run;
        const bool chain = rng() % 2;
        BlockId at = id;
        for (size_t n = 1 + rng() % 40; run.size() < n && !present.empty(); ++at) {
          const BlockId pick = chain ? at % 320 : AnyOf(present, rng);
          if (present.count(pick)) run.push_back(pick);
          if (chain && at > id + 400) break;
        }
        // A run touched before comes again (what SpliceRunToHead moves at once: at the head
        // already, or further back with others touched since), sometimes twice in a row.
        if (rng() % 3 == 0 && !last_run.empty()) {
          run.clear();
          for (BlockId b : last_run) {
            if (present.count(b)) run.push_back(b);
          }
        }
        for (int again = rng() % 2; again >= 0; --again) {
          for (BlockId b : run) one->Touch(b);
          many->TouchMany(run);
        }
        last_run = run;
        break;
      }
      case 3:
        if (it != present.end()) {
          const bool e = rng() % 3 != 0;
          one->SetEvictable(id, e);
          many->SetEvictable(id, e);
          it->second = e;
        }
        break;
      case 4: {
        const BlockId v = one->Victim();
        ASSERT_EQ(many->Victim(), v) << "step " << step;
        if (v != kNoBlock && rng() % 2) {
          one->Erase(v);
          many->Erase(v);
          present.erase(v);
        }
        break;
      }
    }
  }
  for (auto& [id, e] : present) {
    one->SetEvictable(id, true);
    many->SetEvictable(id, true);
  }
  size_t drained = 0;
  for (BlockId v = one->Victim(); v != kNoBlock; v = one->Victim(), ++drained) {
    ASSERT_EQ(many->Victim(), v) << "after " << drained << " victims";
    one->Erase(v);
    many->Erase(v);
  }
  EXPECT_EQ(many->Victim(), kNoBlock);
  EXPECT_EQ(drained, present.size());
}

// A hot set touched every round between scans of one-use blocks: ARC and LIRS keep the hot
// set, LRU loses it to each scan, so adaptive's duel hands one of them the lead. Nothing is evicted, so
// the duel learns of reuse from the touches alone; it must learn the same whether they come
// one by one or as one TouchMany per round.
TEST(AdaptivePolicy, TouchManyFeedsTheDuelAsTouchesDo) {
  constexpr size_t kCapacity = 128, kHot = 64, kScan = 256;
  auto key = [](uint64_t k) { return k * 0x9e3779b97f4a7c15ull; };
  for (bool batched : {false, true}) {
    AdaptivePolicy p(kCapacity);
    std::vector<BlockId> hot;
    BlockId next = 0;
    for (uint64_t k = 1; k <= kHot; ++k) {
      p.Insert(next, kNoBlock, key(k));
      hot.push_back(next++);
    }
    for (int round = 0; round < 200; ++round) {
      if (batched) {
        p.TouchMany(hot);
      } else {
        for (BlockId id : hot) p.Touch(id);
      }
      for (size_t i = 0; i < kScan; ++i, ++next) p.Insert(next, kNoBlock, key(1'000'000 + next));
    }
    EXPECT_NE(p.leader(), "prefix-lru") << (batched ? "TouchMany" : "Touch") << ": LRU should not lead on scans";
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
