#include "daemon/cache/cache_manager.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <tuple>

#include "kernels/device_backend.h"
#include "tests/support/fake_clock.h"
#include "tests/support/test_util.h"

namespace kvtier {
namespace {

using testing::HashChain;
using testing::TestLayout;

class CacheManagerTest : public ::testing::Test {
 protected:
  // 8 pages of 1 MiB in 2 segments of 4 pages.
  void SetUp() override { Open(8, 4); }

  void Open(uint32_t pages, uint32_t pages_per_segment, double high = 0.85, double low = 0.75,
            const std::function<void(CacheManager::Options&)>& tweak = nullptr) {
    CacheManager::Options o;
    TierOptions& h = o.tiers[TierIndex(TierKind::kHost)];
    h.enabled = true;
    h.page_bytes = 1 << 20;
    h.segment_bytes = uint64_t{pages_per_segment} << 20;
    h.capacity_bytes = uint64_t{pages} << 20;
    h.huge_pages = HugePages::kOff;
    h.high_watermark = high;
    h.low_watermark = low;
    h.policy = "lru";  // these tests spell out LRU orders
    if (tweak) tweak(o);
    auto cm = CacheManager::Open(o);
    ASSERT_TRUE(cm.ok()) << cm.status().ToString();
    cm_ = std::move(cm).value();
  }

  std::unique_ptr<SessionCache> Attach(const std::string& tenant, const std::string& model = "m") {
    auto s = std::make_unique<SessionCache>(next_id_++);
    Status st = cm_->Attach(*s, tenant, TestLayout(model));
    EXPECT_TRUE(st.ok()) << st.ToString();
    return s;
  }

  // Allocates and commits `hashes` (one page each); returns the pages.
  std::vector<PageId> Store(SessionCache& s, const std::vector<BlockHash>& hashes, bool retain = false) {
    auto pages = cm_->Allocate(s, TierKind::kHost, static_cast<uint32_t>(hashes.size()));
    EXPECT_TRUE(pages.ok()) << pages.status().ToString();
    if (!pages.ok()) return {};
    std::vector<BlockHash> parents;
    for (size_t i = 0; i < hashes.size(); ++i) parents.push_back(i ? hashes[i - 1] : BlockHash());
    auto r = cm_->Commit(s, TierKind::kHost, *pages, hashes, parents, retain);
    for (const auto& e : r) EXPECT_EQ(e.status, StatusCode::kOk);
    return *pages;
  }

  void ExpectConsistent() {
    Status st = cm_->CheckInvariants();
    EXPECT_TRUE(st.ok()) << st.ToString();
  }

  std::unique_ptr<CacheManager> cm_;
  SessionId next_id_ = 1;
};

TEST_F(CacheManagerTest, StoredBlocksAreFoundAndPinnedByAcquire) {
  auto s = Attach("t");
  auto chain = HashChain(1, 3);
  auto pages = Store(*s, chain);
  ExpectConsistent();
  TierCounts c = cm_->Counts(TierKind::kHost);
  EXPECT_EQ(c.cached, 3u);
  EXPECT_EQ(c.leased, 0u);
  EXPECT_EQ(c.blocks, 3u);

  auto other = Attach("t");
  CacheLookup l = cm_->Lookup(*other, chain);
  EXPECT_EQ(l.matched, 3u);
  auto acq = cm_->Acquire(*other, chain);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(acq[i].status, StatusCode::kOk);
    EXPECT_EQ(acq[i].page, pages[i]);
  }
  c = cm_->Counts(TierKind::kHost);
  EXPECT_EQ(c.referenced, 3u);
  EXPECT_EQ(c.cached, 0u);
  ExpectConsistent();
  auto rel = cm_->Release(*other, TierKind::kHost, {}, chain);
  for (StatusCode code : rel) EXPECT_EQ(code, StatusCode::kOk);
  EXPECT_EQ(cm_->Counts(TierKind::kHost).cached, 3u);
  // A second release of the same reference is refused.
  EXPECT_EQ(cm_->Release(*other, TierKind::kHost, {}, chain)[0], StatusCode::kFailedPrecondition);
  ExpectConsistent();
}

TEST_F(CacheManagerTest, LookupStopsAtTheFirstMissingBlock) {
  auto s = Attach("t");
  auto chain = HashChain(2, 4);
  Store(*s, {chain[0], chain[1], chain[3]});
  CacheLookup l = cm_->Lookup(*s, chain);
  EXPECT_EQ(l.matched, 2u);
  EXPECT_EQ(cm_->counters().block_misses, 2u);
  EXPECT_EQ(cm_->counters().lookup_blocks, 4u);
}

// A chain committed at once gets consecutive block ids, and Lookup tries the id after the
// previous match before hashing: an id whose block left, or that now holds another block,
// must not pass for the chain's next block.
TEST_F(CacheManagerTest, LookupOfAChainIsNotFooledByReusedIds) {
  Open(16, 4);
  auto s = Attach("t");
  auto chain = HashChain(3, 4);
  Store(*s, chain);
  auto drop_lru = [&](size_t keep_from) {  // chain[keep_from - 1] becomes the least recent, then goes
    for (size_t i = 0; i < chain.size(); ++i) {
      if (i == keep_from - 1) continue;
      ASSERT_EQ(cm_->Acquire(*s, std::vector<BlockHash>{chain[i]})[0].status, StatusCode::kOk);
      cm_->Release(*s, TierKind::kHost, {}, std::vector<BlockHash>{chain[i]});
    }
    EXPECT_EQ(cm_->Evict(TierKind::kHost, 1 << 20).blocks, 1u);
  };
  drop_lru(2);
  EXPECT_EQ(cm_->Lookup(*s, chain).matched, 1u);  // chain[1]'s id is free now
  auto other = Attach("u");                       // the same hash in another namespace takes it
  Store(*other, {chain[1]});
  EXPECT_EQ(cm_->Lookup(*s, chain).matched, 1u);
  EXPECT_EQ(cm_->Acquire(*s, chain)[1].status, StatusCode::kNotFound);
  cm_->Release(*s, TierKind::kHost, {}, chain);  // the three it did acquire
  Store(*s, {chain[1]});                         // back, under a new id: the rest is found by hash
  EXPECT_EQ(cm_->Lookup(*s, chain).matched, 4u);
  auto acq = cm_->Acquire(*s, chain);
  for (const CacheResult& r : acq) EXPECT_EQ(r.status, StatusCode::kOk);
  cm_->Release(*s, TierKind::kHost, {}, chain);
  drop_lru(3);  // chain[2]'s id goes to another block of this namespace
  Store(*s, HashChain(4, 1));
  EXPECT_EQ(cm_->Lookup(*s, chain).matched, 2u);
  ExpectConsistent();
}

TEST_F(CacheManagerTest, DuplicateCommitKeepsTheFirstCopyAndFreesThePage) {
  auto a = Attach("t");
  auto b = Attach("t");
  auto chain = HashChain(3, 1);
  auto first = Store(*a, chain);
  auto pages = cm_->Allocate(*b, TierKind::kHost, 1);
  ASSERT_TRUE(pages.ok());
  const uint32_t free_before = cm_->Counts(TierKind::kHost).free;
  auto r = cm_->Commit(*b, TierKind::kHost, *pages, chain, {}, false);
  EXPECT_EQ(r[0].status, StatusCode::kOk);
  EXPECT_TRUE(r[0].duplicate);
  EXPECT_EQ(r[0].page, first[0]);
  EXPECT_EQ(cm_->Counts(TierKind::kHost).free, free_before + 1);
  EXPECT_EQ(b->leased_pages(), 0u);
  ExpectConsistent();
}

TEST_F(CacheManagerTest, NamespacesNeverSeeEachOthersBlocks) {
  auto a = Attach("tenant-a", "model-1");
  auto chain = HashChain(4, 2);
  Store(*a, chain);
  auto other_tenant = Attach("tenant-b", "model-1");
  auto other_model = Attach("tenant-a", "model-2");
  auto same = Attach("tenant-a", "model-1");
  EXPECT_EQ(cm_->Lookup(*other_tenant, chain).matched, 0u);
  EXPECT_EQ(cm_->Lookup(*other_model, chain).matched, 0u);
  EXPECT_EQ(cm_->Acquire(*other_tenant, chain)[0].status, StatusCode::kNotFound);
  EXPECT_EQ(cm_->Lookup(*same, chain).matched, 2u);
}

TEST_F(CacheManagerTest, CommitNeedsAPageLeasedByThisSession) {
  auto a = Attach("t");
  auto b = Attach("t");
  auto pages = cm_->Allocate(*a, TierKind::kHost, 1);
  ASSERT_TRUE(pages.ok());
  auto chain = HashChain(5, 1);
  EXPECT_EQ(cm_->Commit(*b, TierKind::kHost, *pages, chain, {}, false)[0].status, StatusCode::kFailedPrecondition);
  std::vector<PageId> bogus = {12345};
  EXPECT_EQ(cm_->Commit(*a, TierKind::kHost, bogus, chain, {}, false)[0].status, StatusCode::kFailedPrecondition);
  EXPECT_EQ(cm_->Release(*b, TierKind::kHost, *pages, {})[0], StatusCode::kFailedPrecondition);
  EXPECT_EQ(cm_->Release(*a, TierKind::kHost, bogus, {})[0], StatusCode::kFailedPrecondition);
  ExpectConsistent();
}

TEST_F(CacheManagerTest, DetachReturnsLeasesAndDropsReferences) {
  auto a = Attach("t");
  auto chain = HashChain(6, 2);
  Store(*a, chain, /*retain=*/true);
  ASSERT_TRUE(cm_->Allocate(*a, TierKind::kHost, 3).ok());
  TierCounts c = cm_->Counts(TierKind::kHost);
  EXPECT_EQ(c.leased, 3u);
  EXPECT_EQ(c.referenced, 2u);
  cm_->Detach(*a);
  c = cm_->Counts(TierKind::kHost);
  EXPECT_EQ(c.leased, 0u);
  EXPECT_EQ(c.referenced, 0u);
  EXPECT_EQ(c.cached, 2u);  // committed blocks outlive the session
  EXPECT_EQ(c.free, 6u);
  ExpectConsistent();
}

TEST_F(CacheManagerTest, HighWatermarkEvictsLeastRecentlyUsedDownToLow) {
  Open(20, 4, /*high=*/0.85, /*low=*/0.5);
  auto s = Attach("t");
  std::vector<std::vector<BlockHash>> seqs;
  for (int i = 0; i < 17; ++i) {  // 17 of 20 pages: at 0.85, not above
    seqs.push_back(HashChain(100 + i, 1));
    Store(*s, seqs.back());
  }
  EXPECT_EQ(cm_->counters().evictions[TierIndex(TierKind::kHost)], 0u);
  // Touch the oldest so it survives.
  auto pinned = cm_->Acquire(*s, seqs[0]);
  ASSERT_EQ(cm_->Release(*s, TierKind::kHost, {}, seqs[0])[0], StatusCode::kOk);
  ASSERT_TRUE(cm_->Allocate(*s, TierKind::kHost, 1).ok());  // 18/20 > 0.85: evict to <= 10
  EXPECT_EQ(cm_->Counts(TierKind::kHost).capacity - cm_->Counts(TierKind::kHost).free, 10u);
  EXPECT_EQ(cm_->counters().evictions[TierIndex(TierKind::kHost)], 8u);
  EXPECT_EQ(cm_->Lookup(*s, seqs[0]).matched, 1u) << "recently used block was evicted";
  for (int i = 1; i <= 8; ++i) EXPECT_EQ(cm_->Lookup(*s, seqs[i]).matched, 0u) << i;
  for (int i = 9; i < 17; ++i) EXPECT_EQ(cm_->Lookup(*s, seqs[i]).matched, 1u) << i;
  ExpectConsistent();
}

// A prefix-ordered policy keeps a chain's head more recent than its extensions after the
// chain was acquired and released: the release drops references deepest first, so under
// pressure the deepest block goes and the rest of the prefix still matches. (Released in
// request order, the head would re-enter the lists first and be the first victim,
// stranding every block after it.)
TEST_F(CacheManagerTest, AReleasedChainGivesWayDeepestFirstUnderAPrefixOrderedPolicy) {
  for (const char* policy : {"prefix-lru", "prefix-arc", "adaptive"}) {
    Open(8, 4, 1.0, 0.75, [&](CacheManager::Options& o) { o.tiers[TierIndex(TierKind::kHost)].policy = policy; });
    auto s = Attach("t");
    const auto chain = HashChain(7, 4);
    Store(*s, chain);
    for (const auto& r : cm_->Acquire(*s, chain)) ASSERT_EQ(r.status, StatusCode::kOk) << policy;
    for (StatusCode c : cm_->Release(*s, TierKind::kHost, {}, chain)) ASSERT_EQ(c, StatusCode::kOk) << policy;
    // 4 free pages, 5 wanted: one cached block gives way.
    auto pages = cm_->Allocate(*s, TierKind::kHost, 5);
    ASSERT_TRUE(pages.ok()) << policy << ": " << pages.status().ToString();
    EXPECT_EQ(cm_->Lookup(*s, chain).matched, 3u) << policy << ": the victim was not the deepest block";
    ExpectConsistent();
    cm_->Detach(*s);
  }
}

TEST_F(CacheManagerTest, FullOfReferencedBlocksRefusesAllocationWithoutLeaking) {
  auto s = Attach("t");
  Store(*s, HashChain(7, 6), /*retain=*/true);
  auto r = cm_->Allocate(*s, TierKind::kHost, 3);  // only 2 free
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  TierCounts c = cm_->Counts(TierKind::kHost);
  EXPECT_EQ(c.free, 2u);
  EXPECT_EQ(c.leased, 0u);
  ExpectConsistent();
}

TEST_F(CacheManagerTest, ATenantCanTakeSpaceAnotherTenantOnlyCaches) {
  auto a = Attach("a");
  Store(*a, HashChain(8, 8));  // every page, both segments, all cached
  auto b = Attach("b");
  auto r = cm_->Allocate(*b, TierKind::kHost, 2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // b's pages live in a segment that a no longer holds.
  const TierPool* pool = cm_->pool(TierKind::kHost);
  for (PageId p : *r) EXPECT_EQ(pool->Owner(pool->SegmentOf(p)), b->tenant());
  ExpectConsistent();
}

TEST_F(CacheManagerTest, SegmentGrantsAreSentOncePerGeneration) {
  auto s = Attach("t");
  auto pages = cm_->Allocate(*s, TierKind::kHost, 5);  // spans both segments
  ASSERT_TRUE(pages.ok());
  auto g1 = cm_->TakeSegmentGrants(*s, TierKind::kHost, *pages);
  EXPECT_EQ(g1.size(), 2u);
  EXPECT_TRUE(cm_->TakeSegmentGrants(*s, TierKind::kHost, *pages).empty());
  auto fresh = Attach("t");
  EXPECT_EQ(cm_->TakeAllSegmentGrants(*fresh).size(), 2u);
}

TEST_F(CacheManagerTest, RandomOperationsKeepTheAccountingExact) {
  Open(32, 8, 0.8, 0.6);
  std::mt19937 rng(20261202);
  std::vector<std::unique_ptr<SessionCache>> sessions;
  for (int i = 0; i < 4; ++i) sessions.push_back(Attach(i % 2 ? "even" : "odd"));
  for (int step = 0; step < 5000; ++step) {
    SessionCache& s = *sessions[rng() % sessions.size()];
    const auto chain = HashChain(rng() % 40, 1 + rng() % 4);
    switch (rng() % 6) {
      case 0: {
        auto pages = cm_->Allocate(s, TierKind::kHost, 1 + rng() % 3);
        if (pages.ok() && rng() % 2) {
          std::vector<BlockHash> hs(chain.begin(), chain.begin() + std::min(chain.size(), pages->size()));
          std::vector<PageId> ps(pages->begin(), pages->begin() + hs.size());
          cm_->Commit(s, TierKind::kHost, ps, hs, {}, rng() % 3 == 0);
        }
        break;
      }
      case 1:
        cm_->Lookup(s, chain);
        break;
      case 2:
        cm_->Acquire(s, chain);
        break;
      case 3:
        cm_->Release(s, TierKind::kHost, {}, chain);
        break;
      case 4: {
        std::vector<PageId> ps = {static_cast<PageId>(rng() % 40)};
        cm_->Release(s, TierKind::kHost, ps, {});
        break;
      }
      case 5:
        if (rng() % 20 == 0) {
          auto& slot = sessions[rng() % sessions.size()];
          cm_->Detach(*slot);
          slot = Attach(rng() % 2 ? "even" : "odd");
        }
        break;
    }
    Status st = cm_->CheckInvariants();
    ASSERT_TRUE(st.ok()) << "step " << step << ": " << st.ToString();
  }
  for (auto& s : sessions) cm_->Detach(*s);
  TierCounts c = cm_->Counts(TierKind::kHost);
  EXPECT_EQ(c.leased, 0u);
  EXPECT_EQ(c.referenced, 0u);
  EXPECT_EQ(c.free + c.cached, c.capacity);
}

// Host limits in MiB (pages of 1 MiB here).
std::function<void(CacheManager::Options&)> HostLimits(
    std::vector<std::tuple<std::string, uint64_t, uint64_t>> tenants) {
  return [tenants](CacheManager::Options& o) {
    for (const auto& [name, quota, reserve] : tenants) {
      o.tenant_limits[name].quota_bytes[TierIndex(TierKind::kHost)] = quota << 20;
      o.tenant_limits[name].reserve_bytes[TierIndex(TierKind::kHost)] = reserve << 20;
    }
  };
}

TEST_F(CacheManagerTest, ATenantAtItsQuotaEvictsItsOwnBlocksAndIsRefusedWhenItHasNone) {
  Open(16, 4, 0.95, 0.9, HostLimits({{"a", 4, 0}}));
  auto a = Attach("a");
  auto first = HashChain(1, 4), second = HashChain(2, 4);
  Store(*a, first);
  Store(*a, second);  // past the quota: its own oldest make room, though the tier has 8 free pages
  EXPECT_EQ(cm_->Lookup(*a, first).matched, 0u);
  EXPECT_EQ(cm_->Lookup(*a, second).matched, 4u);
  EXPECT_EQ(cm_->Counts(TierKind::kHost).free, 12u);
  // Everything it holds is referenced: no room to make, a clear refusal.
  auto acq = cm_->Acquire(*a, second);
  for (const auto& r : acq) EXPECT_EQ(r.status, StatusCode::kOk);
  auto more = cm_->Allocate(*a, TierKind::kHost, 1);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(more.status().message().find("quota"), std::string::npos) << more.status().message();
  EXPECT_EQ(cm_->counters().quota_refusals, 1u);
  // Another tenant is not limited by a's quota.
  auto b = Attach("b");
  EXPECT_TRUE(cm_->Allocate(*b, TierKind::kHost, 8).ok());
  ExpectConsistent();
}

// b caches 8 pages; a floods the 16-page tier. With a reserve of 8 for b, none of b's
// blocks go; without one (the control case), a's pressure takes them.
void FloodAgainstReserve(CacheManagerTest* t, std::unique_ptr<CacheManager>& cm,
                         const std::function<std::unique_ptr<SessionCache>(const std::string&)>& attach,
                         size_t* b_left) {
  (void)t;
  auto b = attach("b");
  auto kept = HashChain(7, 8);
  {
    auto pages = cm->Allocate(*b, TierKind::kHost, 8);
    ASSERT_TRUE(pages.ok());
    std::vector<BlockHash> parents(8);
    cm->Commit(*b, TierKind::kHost, *pages, kept, parents, false);
  }
  auto a = attach("a");
  for (int round = 0; round < 6; ++round) {
    auto chain = HashChain(100 + round, 4);
    auto pages = cm->Allocate(*a, TierKind::kHost, 4);
    ASSERT_TRUE(pages.ok()) << pages.status().ToString();
    std::vector<BlockHash> parents(4);
    cm->Commit(*a, TierKind::kHost, *pages, chain, parents, false);
  }
  *b_left = 0;
  for (const BlockHash& h : kept) *b_left += cm->Lookup(*b, std::span<const BlockHash>(&h, 1)).matched;
  EXPECT_TRUE(cm->CheckInvariants().ok());
}

TEST_F(CacheManagerTest, AFloodingTenantCannotPushAnotherBelowItsReserve) {
  auto attach = [this](const std::string& t) { return Attach(t); };
  size_t left = 0;
  Open(16, 4, 0.85, 0.75, HostLimits({{"b", 0, 8}}));
  FloodAgainstReserve(this, cm_, attach, &left);
  EXPECT_EQ(left, 8u) << "b lost blocks below its reserve";
  Open(16, 4, 0.85, 0.75);
  FloodAgainstReserve(this, cm_, attach, &left);
  EXPECT_LT(left, 8u) << "without a reserve the flood should have taken some of b's blocks";
}

// Found by the dispatcher fuzzer: a commit naming a block as its own parent corrupted the
// prefix policy's list (and a later eviction found a block that was not resident).
TEST_F(CacheManagerTest, ABlockNamedAsItsOwnParentHasNoParent) {
  for (const char* policy : {"prefix-lru", "prefix-arc", "adaptive"}) {
    Open(8, 4, 0.85, 0.75, [policy](CacheManager::Options& o) { o.tiers[TierIndex(TierKind::kHost)].policy = policy; });
    auto s = Attach("t");
    auto h = HashChain(1, 3);
    auto pages = cm_->Allocate(*s, TierKind::kHost, 3);
    ASSERT_TRUE(pages.ok());
    std::vector<BlockHash> hashes = {h[0], h[1], h[1]};
    std::vector<BlockHash> parents = {h[1], h[1], h[0]};
    cm_->Commit(*s, TierKind::kHost, *pages, hashes, parents, false);
    ExpectConsistent();
    // Filling the tier evicts them; every victim must be a resident block.
    EXPECT_TRUE(cm_->Allocate(*s, TierKind::kHost, 8).ok()) << policy;
    ExpectConsistent();
  }
}

TEST_F(CacheManagerTest, QuarantinedLeasesAreReusedOnlyAfterRelease) {
  auto s = Attach("t");
  auto keeper = Attach("t");
  Store(*keeper, HashChain(5, 1));  // a block in the segment, referenced: it stays in use
  auto pages = cm_->Allocate(*s, TierKind::kHost, 3);
  ASSERT_TRUE(pages.ok());
  const TierPool* pool = cm_->pool(TierKind::kHost);
  const auto held = cm_->Acquire(*keeper, HashChain(5, 1));
  ASSERT_EQ(held[0].status, StatusCode::kOk);
  for (PageId p : *pages) ASSERT_EQ(pool->SegmentOf(p), pool->SegmentOf(held[0].page));
  const uint64_t q = cm_->Detach(*s, /*quarantine_leases=*/true);
  EXPECT_NE(q, 0u);
  TierCounts c = cm_->Counts(TierKind::kHost);
  EXPECT_EQ(c.quarantined, 3u);
  EXPECT_EQ(c.leased, 0u);
  EXPECT_EQ(c.free, 4u);
  ExpectConsistent();
  // Nobody gets those pages meanwhile: the tier has 4 to give, not 5.
  auto other = Attach("t");
  EXPECT_FALSE(cm_->Allocate(*other, TierKind::kHost, 5).ok());
  cm_->ReleaseQuarantine(q);
  c = cm_->Counts(TierKind::kHost);
  EXPECT_EQ(c.quarantined, 0u);
  EXPECT_EQ(c.free, 7u);
  EXPECT_TRUE(cm_->Allocate(*other, TierKind::kHost, 7).ok());
  ExpectConsistent();
  // A session with nothing leased leaves no quarantine behind.
  auto idle = Attach("t");
  EXPECT_EQ(cm_->Detach(*idle, true), 0u);
}

// Hardening round 5, item 7: quarantines whose process cannot be watched (a kernel before
// 6.5, an engine in another PID namespace) held their pages until a restart, so two
// tenants' ended sessions could take the whole tier. A segment where nothing but
// quarantined pages is allocated gives them back, with new memory for the next owner.
TEST_F(CacheManagerTest, QuarantinedPagesComeBackWhenTheirSegmentHoldsNothingElse) {
  const TierPool* pool = cm_->pool(TierKind::kHost);
  auto a = Attach("a");
  auto three = cm_->Allocate(*a, TierKind::kHost, 3);  // in a segment of a's alone
  ASSERT_TRUE(three.ok());
  const uint32_t seg = pool->SegmentOf((*three)[0]);
  const uint32_t gen = pool->Generation(seg);
  EXPECT_EQ(cm_->Detach(*a, /*quarantine_leases=*/true), 0u) << "no quarantine left to watch";
  TierCounts c = cm_->Counts(TierKind::kHost);
  EXPECT_EQ(c.quarantined, 0u);
  EXPECT_EQ(c.free, 8u);
  EXPECT_EQ(cm_->counters().quarantine_reclaims, 3u);
  EXPECT_EQ(cm_->quarantine_count(), 0u);
  ExpectConsistent();
  // The segment is renewed before anyone uses it again, its old tenant included.
  auto again = Attach("a");
  auto all = cm_->Allocate(*again, TierKind::kHost, 8);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(pool->Generation(seg), gen + 1);
  ExpectConsistent();

  // With a block of the tenant's beside them, the pages wait; once it goes, they come back.
  Open(8, 4);
  pool = cm_->pool(TierKind::kHost);
  auto b = Attach("b");
  Store(*b, HashChain(9, 1));  // cached
  auto ended = Attach("b");
  ASSERT_TRUE(cm_->Allocate(*ended, TierKind::kHost, 3).ok());  // the rest of its segment
  const uint64_t q = cm_->Detach(*ended, /*quarantine_leases=*/true);
  ASSERT_NE(q, 0u);
  EXPECT_EQ(cm_->Counts(TierKind::kHost).quarantined, 3u);
  // b fills the other segment and asks for one more: its cached block goes, and with it
  // the last page of the first segment that was not quarantined.
  auto next = Attach("b");
  auto four = cm_->Allocate(*next, TierKind::kHost, 4);
  ASSERT_TRUE(four.ok());
  auto one = cm_->Allocate(*next, TierKind::kHost, 1);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  c = cm_->Counts(TierKind::kHost);
  EXPECT_EQ(c.quarantined, 0u);
  EXPECT_EQ(c.leased, 5u);
  EXPECT_EQ(cm_->counters().quarantine_reclaims, 3u);
  EXPECT_EQ(pool->Generation(pool->SegmentOf((*one)[0])), 2u);
  cm_->ReleaseQuarantine(q);  // its process exits later: nothing left to free
  ExpectConsistent();
  EXPECT_EQ(cm_->Counts(TierKind::kHost).free, 3u);
}

// Options of a manager with a GPU tier over host (pages of 1 MiB, segments of 4) on the
// host-emulated device, and the queue its `post` fills: completions run when the test says.
struct GpuSetup {
  CacheManager::Options Options(DeviceBackend* device, uint32_t gpu_pages, uint32_t host_pages, double high,
                                double low) {
    CacheManager::Options o;
    for (TierKind t : {TierKind::kHost, TierKind::kGpu}) {
      TierOptions& x = o.tiers[TierIndex(t)];
      x.enabled = true;
      x.page_bytes = 1 << 20;
      x.segment_bytes = 4 << 20;
      x.capacity_bytes = uint64_t{t == TierKind::kGpu ? gpu_pages : host_pages} << 20;
      x.huge_pages = HugePages::kOff;
      x.high_watermark = high;
      x.low_watermark = low;
      x.policy = "lru";
    }
    o.device_backend = device;
    o.post = [this](std::function<void()> fn) {
      std::lock_guard<std::mutex> l(mu);
      posted.push_back(std::move(fn));
    };
    return o;
  }
  // Runs what was posted (and what that posts), each after `before_each`.
  void RunPosted(const std::function<void()>& before_each = nullptr) {
    for (;;) {
      std::function<void()> fn;
      {
        std::lock_guard<std::mutex> l(mu);
        if (posted.empty()) return;
        fn = std::move(posted.front());
        posted.pop_front();
      }
      if (before_each) before_each();
      fn();
    }
  }
  std::mutex mu;
  std::deque<std::function<void()>> posted;
};

// GPU -> host demotion on the copy thread: the control thread only starts it and finishes
// it; meanwhile the block stays readable from its GPU page (pinned there), and an
// Allocate of GPU pages waits for the copy instead of failing.
TEST(CacheManagerGpu, DemotionCopiesOffTheControlThreadAndTheGpuPageStaysReadableUntilItIsDone) {
  auto backend = OpenHostDeviceBackend();
  ASSERT_TRUE(backend.ok());
  GpuSetup gpu;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> copies{0};
  const std::thread::id control = std::this_thread::get_id();
  CacheManager::Options o = gpu.Options(backend->get(), 4, 8, 1.0, 0.75);
  o.gpu_copy = [&](void* dst, const uint8_t* src, uint64_t n) {
    EXPECT_NE(std::this_thread::get_id(), control) << "the copy ran on the control thread";
    released.wait();  // held until the test says so
    std::memcpy(dst, src, n);
    ++copies;
    return Status::Ok();
  };
  auto cm = CacheManager::Open(o);
  ASSERT_TRUE(cm.ok()) << cm.status().ToString();
  auto run_posted = [&] { gpu.RunPosted(); };
  SessionCache s(1);
  ASSERT_TRUE((*cm)->Attach(s, "t", TestLayout("m")).ok());
  // Fill the GPU tier: 4 blocks.
  const auto chain = HashChain(3, 5);
  auto pages = (*cm)->Allocate(s, TierKind::kGpu, 4);
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE((*cm)
                  ->Commit(s, TierKind::kGpu, *pages, std::span(chain).first(4), std::span<const BlockHash>(), false)[0]
                  .status == StatusCode::kOk);
  // A fifth GPU page: the coldest block must go down to host first. The Allocate waits.
  std::optional<Result<std::vector<PageId>>> later;
  auto now = (*cm)->Allocate(s, TierKind::kGpu, 1, [&](Result<std::vector<PageId>> r) { later = std::move(r); });
  EXPECT_FALSE(now.has_value()) << "the Allocate should wait for the demotion";
  EXPECT_EQ((*cm)->Counts(TierKind::kGpu).inflight, 1u) << "the demoted block's GPU page is pinned";
  // Meanwhile the block is still served from GPU, and its host copy is not visible yet.
  CacheLookup l = (*cm)->Lookup(s, std::span(chain).first(1));
  ASSERT_EQ(l.matched, 1u);
  EXPECT_EQ(l.tiers[0], TierKind::kGpu);
  EXPECT_EQ(copies.load(), 0);
  // A host Allocate meanwhile is served at once: it never queues behind a GPU one.
  bool host_waited = false;
  auto host = (*cm)->Allocate(s, TierKind::kHost, 1, [&](Result<std::vector<PageId>>) { host_waited = true; });
  ASSERT_TRUE(host.has_value()) << "a host Allocate waited behind a GPU Allocate";
  ASSERT_TRUE(host->ok()) << host->status().ToString();
  ASSERT_TRUE((*cm)->CheckInvariants().ok());
  release.set_value();
  ASSERT_TRUE(::kvtier::testing::WaitUntil([&] {
    run_posted();
    return later.has_value();
  })) << "the demotion never finished";
  ASSERT_TRUE(later->ok()) << later->status().ToString();
  EXPECT_EQ(copies.load(), 1);
  EXPECT_EQ((*cm)->counters().gpu_demotions, 1u);
  EXPECT_FALSE(host_waited);
  l = (*cm)->Lookup(s, std::span(chain).first(1));
  ASSERT_EQ(l.matched, 1u);
  EXPECT_EQ(l.tiers[0], TierKind::kHost) << "demoted: now in host only";
  EXPECT_TRUE((*cm)->CheckInvariants().ok());
  (*cm)->Detach(s);
}

// GPU pages leased faster than copies down to host free them: with allocation_headroom the
// GPU tier demotes ahead of the high watermark, so the next lease finds pages free. Each
// completion of a copy arrives 10 ms (fake) after the last: about 100 pages a second with
// 10-20 ms round trips, 16 x that is more than half the 16-page tier: capped at 8 pages,
// where the watermark alone keeps 16 - 0.9 x 16 = 1.6 free.
TEST(CacheManagerGpu, AllocationHeadroomDemotesAheadOfAFastLeaseRate) {
  auto backend = OpenHostDeviceBackend();
  ASSERT_TRUE(backend.ok());
  FakeClock clock;
  GpuSetup gpu;
  CacheManager::Options o = gpu.Options(backend->get(), 16, 256, 0.9, 0.8);
  o.tiers[TierIndex(TierKind::kGpu)].allocation_headroom = 16;
  o.gpu_copy = [](void* dst, const uint8_t* src, uint64_t n) {
    std::memcpy(dst, src, n);
    return Status::Ok();
  };
  auto cm = CacheManager::Open(o, {}, &clock);
  ASSERT_TRUE(cm.ok()) << cm.status().ToString();
  auto run_posted = [&] { gpu.RunPosted([&] { clock.Advance(10'000'000); }); };
  SessionCache s(1);
  ASSERT_TRUE((*cm)->Attach(s, "t", TestLayout("m")).ok());
  // Lease 2 GPU pages, commit them, let the copies down finish; the fewest GPU pages free
  // after a step.
  auto steps = [&](uint64_t seed, int n) {
    uint32_t least_free = UINT32_MAX;
    for (int i = 0; i < n; ++i) {
      std::optional<Result<std::vector<PageId>>> got;
      got = (*cm)->Allocate(s, TierKind::kGpu, 2, [&](Result<std::vector<PageId>> r) { got = std::move(r); });
      EXPECT_TRUE(::kvtier::testing::WaitUntil([&] {
        run_posted();
        return got.has_value();
      }));
      if (!got || !got->ok()) return 0u;
      const auto chain = HashChain(seed + static_cast<uint64_t>(i), 2);
      (*cm)->Commit(s, TierKind::kGpu, **got, chain, std::span<const BlockHash>(), false);
      EXPECT_TRUE(::kvtier::testing::WaitUntil([&] {
        run_posted();
        return (*cm)->Counts(TierKind::kGpu).inflight == 0;
      }));
      least_free = std::min(least_free, (*cm)->Counts(TierKind::kGpu).free);
    }
    return least_free;
  };
  steps(100, 60);
  EXPECT_EQ((*cm)->headroom_pages(TierKind::kGpu), 8u);
  EXPECT_GE(steps(1000, 30), 6u) << "GPU demotions did not start ahead of the leases";
  EXPECT_GT((*cm)->counters().gpu_demotions, 0u);
  EXPECT_TRUE((*cm)->CheckInvariants().ok());
  (*cm)->Detach(s);
}

}  // namespace
}  // namespace kvtier
