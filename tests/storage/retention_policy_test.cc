// RetentionPolicy (classes over any policy) and SessionTable (what sessions' hints make of
// each block): protected blocks outlive ordinary ones and leave latest-expected first,
// deepest first; expendable ones go first; protection is soft; TTLs lapse and are clamped;
// shared prefixes stay protected while any user lives.
#include "storage/policy/retention_policy.h"

#include <gtest/gtest.h>

#include <map>

#include "storage/policy/session_table.h"

namespace kvtier {
namespace {

std::unique_ptr<RetentionPolicy> Lru() {
  auto p = MakeEvictionPolicy("lru", 16);
  return std::make_unique<RetentionPolicy>(std::move(*p));
}

TEST(RetentionPolicy, ClassesOrderVictimsAndProtectionNeverBlocks) {
  auto p = Lru();
  for (BlockId id = 0; id < 6; ++id) p->Insert(id, kNoBlock, id);
  // LRU alone would take 0 first. 0 and 1 protected (1 expected back later), 4 expendable.
  p->SetRetention(0, Retention::kProtected, 100, 0);
  p->SetRetention(1, Retention::kProtected, 200, 0);
  p->SetRetention(4, Retention::kExpendable);
  EXPECT_EQ(p->protected_blocks(), 2u);
  EXPECT_EQ(p->evictable(), 6u);
  std::vector<BlockId> order;
  for (BlockId v; (v = p->Victim()) != kNoBlock;) {
    order.push_back(v);
    p->Erase(v);
  }
  // expendable, then ordinary in LRU order, then protected latest-expected first
  EXPECT_EQ(order, (std::vector<BlockId>{4, 2, 3, 5, 1, 0}));
}

TEST(RetentionPolicy, ProtectedBlocksExpectedTogetherLeaveDeepestFirstAndReferencedOnesStay) {
  auto p = Lru();
  for (BlockId id = 0; id < 4; ++id) {
    p->Insert(id, id ? id - 1 : kNoBlock, id);
    p->SetRetention(id, Retention::kProtected, 500, id);  // one chain, depth = id
  }
  p->SetEvictable(3, false);  // referenced by a session
  EXPECT_EQ(p->Victim(), 2u);
  p->SetEvictable(3, true);
  EXPECT_EQ(p->Victim(), 3u);
  // Back to ordinary: the inner policy decides again.
  for (BlockId id = 0; id < 4; ++id) p->SetRetention(id, Retention::kOrdinary);
  EXPECT_EQ(p->protected_blocks(), 0u);
  EXPECT_EQ(p->Victim(), 0u);
}

TEST(RetentionPolicy, OrdinaryForAnUnclassedBlockChangesNothing) {
  // The over-share path asks an unclassed block to stay ordinary (sanitizers catch a look
  // into classed_.end()); the inner policy keeps its order and nothing is counted.
  auto p = Lru();
  for (BlockId id = 0; id < 3; ++id) p->Insert(id, kNoBlock, id);
  p->SetRetention(0, Retention::kOrdinary);
  p->SetRetention(0, Retention::kOrdinary, 7, 2);
  EXPECT_EQ(p->protected_blocks(), 0u);
  EXPECT_EQ(p->evictable(), 3u);
  EXPECT_EQ(p->Victim(), 0u);
}

struct Changes {
  std::map<uint32_t, std::pair<Retention, int64_t>> now;
  SessionTable::OnChange Sink() {
    return [this](uint32_t b, Retention r, int64_t e, uint32_t) { now[b] = {r, e}; };
  }
  Retention Of(uint32_t b) const {
    auto it = now.find(b);
    return it == now.end() ? Retention::kOrdinary : it->second.first;
  }
};

constexpr int64_t kSec = 1'000'000'000;

TEST(SessionTable, LiveSessionsProtectTheirBlocksUntilTheirTtlAndEndedOnesMakeThemExpendable) {
  Changes c;
  SessionTable t({}, c.Sink());
  const std::vector<uint32_t> system = {0, 1}, a = {0, 1, 10, 11}, b = {0, 1, 20};
  ASSERT_TRUE(t.Request("a", 0, a, 30 * kSec, false));
  ASSERT_TRUE(t.Request("b", 5 * kSec, b, 10 * kSec, false));
  EXPECT_EQ(c.Of(10), Retention::kProtected);
  EXPECT_EQ(c.now[10].second, 30 * kSec);  // a's last request + TTL
  EXPECT_EQ(c.now[0].second, 15 * kSec);   // the shared head: its earliest user's return
  // b ends: its own block is expendable, the shared head stays protected (a lives).
  ASSERT_TRUE(t.Request("b", 6 * kSec, b, -1, true));
  EXPECT_EQ(c.Of(20), Retention::kExpendable);
  EXPECT_EQ(c.Of(0), Retention::kProtected);
  EXPECT_EQ(c.now[0].second, 30 * kSec);
  // a goes quiet past its TTL: its blocks lapse to ordinary (it may still come back).
  t.Expire(31 * kSec);
  EXPECT_EQ(t.expired(), 1u);
  EXPECT_EQ(c.Of(10), Retention::kOrdinary);
  EXPECT_EQ(c.Of(0), Retention::kOrdinary);  // a lapsed user, not only ended ones
  // ... and does: protected again, to its new TTL (the last one given stands).
  ASSERT_TRUE(t.Request("a", 40 * kSec, a, -1, false));
  EXPECT_EQ(c.Of(11), Retention::kProtected);
  EXPECT_EQ(c.now[11].second, 70 * kSec);
  EXPECT_EQ(t.live_sessions(), 1u);
}

TEST(SessionTable, TtlsAreClampedAndSessionsBeyondTheBoundRefused) {
  Changes c;
  SessionTable t({.max_ttl_ns = 60 * kSec, .max_sessions = 2}, c.Sink());
  const std::vector<uint32_t> blocks = {1};
  ASSERT_TRUE(t.Request("a", 0, blocks, 3600 * kSec, false));
  EXPECT_EQ(c.now[1].second, 60 * kSec);
  EXPECT_EQ(t.clamped(), 1u);
  ASSERT_TRUE(t.Request("b", 0, blocks, 10 * kSec, false));
  EXPECT_FALSE(t.Request("c", 0, blocks, 10 * kSec, false));  // a flood of live sessions is bounded
  EXPECT_EQ(t.sessions(), 2u);
  // One that ended makes room: the newcomer takes its place, and its blocks lose the class
  // the ended session gave them.
  const std::vector<uint32_t> own = {5};
  ASSERT_TRUE(t.Request("b", kSec, own, -1, true));
  EXPECT_EQ(c.Of(5), Retention::kExpendable);
  ASSERT_TRUE(t.Request("c", 2 * kSec, {}, 10 * kSec, false));
  EXPECT_EQ(t.recycled(), 1u);
  EXPECT_EQ(t.sessions(), 2u);
  EXPECT_EQ(c.Of(5), Retention::kOrdinary);
  EXPECT_EQ(c.Of(1), Retention::kProtected);  // a still uses it
  // b is a new session if it comes back, and a full table of live ones refuses it.
  EXPECT_FALSE(t.Request("b", 3 * kSec, own, 10 * kSec, false));
  // A session back before its turn to be recycled is live again, not recycled.
  t.Expire(100 * kSec);  // a and c lapse, in that order
  ASSERT_TRUE(t.Request("a", 101 * kSec, blocks, -1, false));
  ASSERT_TRUE(t.Request("d", 102 * kSec, own, 10 * kSec, false));  // takes c's slot
  EXPECT_EQ(c.Of(1), Retention::kProtected);
  EXPECT_EQ(t.live_sessions(), 2u);
  EXPECT_FALSE(t.Request("e", 103 * kSec, own, 10 * kSec, false));
}

TEST(SessionTable, AForgottenBlockIsNoSessionsAnyMoreWhenItsKeyComesBack) {
  Changes c;
  SessionTable t({}, c.Sink());
  const std::vector<uint32_t> chain = {7, 8};
  ASSERT_TRUE(t.Request("a", 0, chain, 10 * kSec, false));
  EXPECT_EQ(t.Class(7), Retention::kProtected);
  t.Forget(7);  // evicted everywhere; key 7 now names another block
  EXPECT_EQ(t.Class(7), Retention::kOrdinary);
  ASSERT_TRUE(t.Request("a", kSec, chain, -1, true));  // a ends, naming the new block 7
  EXPECT_EQ(t.Class(7), Retention::kExpendable);       // its own use, counted once
  EXPECT_EQ(t.Class(8), Retention::kExpendable);
  t.Forget(7);
  const std::vector<uint32_t> other = {7};
  ASSERT_TRUE(t.Request("b", 2 * kSec, other, 10 * kSec, false));
  EXPECT_EQ(t.Class(7), Retention::kProtected);  // b's alone: a's ending does not reach it
}

}  // namespace
}  // namespace kvtier
