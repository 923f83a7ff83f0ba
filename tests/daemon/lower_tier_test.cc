// A tier added below NVMe through the lower-tier seam alone: FakeLowerTier
// (tests/support/fake_lower_tier.h) is given to CacheManager::Open after a real NvmeTier, and
// Lookup, Acquire, eviction (write-back), write-through and a restart reach it the way
// they reach the remote tier. Nothing in the daemon knows it exists.
#include "storage/lower_tier.h"

#include <gtest/gtest.h>

#include "daemon/cache/cache_manager.h"
#include "engine/tools/block_pattern.h"
#include "protocol/base/block_key.h"
#include "tests/support/control_loop.h"
#include "tests/support/fake_lower_tier.h"
#include "tests/support/test_util.h"

namespace kvtier {
namespace {

using testing::FakeLowerTier;
using testing::HashChain;

constexpr uint64_t kPage = 64 * 1024;
constexpr uint32_t kBlock = 32 * 1024;

class LowerTierTest : public ::testing::Test {
 protected:
  struct Below {
    std::shared_ptr<FakeLowerTier::Store> store = std::make_shared<FakeLowerTier::Store>();
    WritePolicy policy = WritePolicy::kWriteThrough;
    FakeLowerTier* tier = nullptr;  // owned by the manager
  };

  // host_pages of host over `nvme_slots` of NVMe (write-back), over `below` in order.
  void Open(uint32_t host_pages, uint32_t nvme_slots, std::vector<Below*> below) {
    cm_.reset();
    NvmeTierOptions no;
    no.files = {SlotFileSpec{dir_.File("slots" + std::to_string(opened_++)), nvme_slots * kPage}};
    no.slot_bytes = kPage;
    no.durability = Durability::kRelaxed;
    IoEngineOptions io;
    io.backend = "threads";
    auto engine = OpenIoEngine(io);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    auto nvme =
        NvmeTier::Open(no, std::move(engine).value(), NewMemBlockIndexStore(), loop_.Poster(), SystemClock::Default());
    ASSERT_TRUE(nvme.ok()) << nvme.status().ToString();
    CacheManager::Options o;
    TierOptions& h = o.tiers[TierIndex(TierKind::kHost)];
    h.enabled = true;
    h.page_bytes = kPage;
    h.segment_bytes = 4 * kPage;
    h.capacity_bytes = host_pages * kPage;
    h.huge_pages = HugePages::kOff;
    h.high_watermark = 0.75;
    h.low_watermark = 0.5;
    std::vector<CacheManager::LowerTierSpec> lower;
    for (Below* b : below) {
      auto tier = std::make_unique<FakeLowerTier>(b->store, loop_.Poster());
      b->tier = tier.get();
      CacheManager::LowerTierSpec spec;
      spec.tier = std::move(tier);
      spec.options.write_policy = b->policy;
      lower.push_back(std::move(spec));
    }
    auto cm = CacheManager::Open(o, std::move(nvme).value(), SystemClock::Default(), std::move(lower));
    ASSERT_TRUE(cm.ok()) << cm.status().ToString();
    cm_ = std::move(cm).value();
    ASSERT_TRUE(Pump([&] { return cm_->nvme()->ready(); }));
    session_ = std::make_unique<SessionCache>(next_id_++);
    ASSERT_TRUE(cm_->Attach(*session_, "t", testing::TestLayout("m", 32)).ok());  // 32 KiB blocks
  }

  template <class Pred>
  bool Pump(Pred done) {
    return loop_.Pump(*cm_, done);
  }
  void Settle() {
    ASSERT_TRUE(Pump([&] {
      size_t puts = 0;
      for (const auto& l : cm_->lower_tiers()) puts += l->puts_in_flight() + l->puts_queued();
      return cm_->nvme()->pending_operations() == 0 && cm_->pending_promotions() == 0 && puts == 0;
    }));
  }

  void Store(const std::vector<BlockHash>& chain) {
    // Waits while evictions in flight (puts below, spills) make room.
    std::optional<Result<std::vector<PageId>>> got;
    auto now = cm_->Allocate(*session_, TierKind::kHost, static_cast<uint32_t>(chain.size()),
                             [&](Result<std::vector<PageId>> r) { got = std::move(r); });
    if (now) got = std::move(now);
    ASSERT_TRUE(Pump([&] { return got.has_value(); }));
    Result<std::vector<PageId>>& pages = *got;
    ASSERT_TRUE(pages.ok()) << pages.status().ToString();
    for (size_t i = 0; i < chain.size(); ++i) {
      FillBlockPattern(chain[i], {cm_->pool(TierKind::kHost)->PageAddress((*pages)[i]), kBlock});
    }
    for (const auto& r : cm_->Commit(*session_, TierKind::kHost, *pages, chain, {}, false)) {
      ASSERT_EQ(r.status, StatusCode::kOk);
    }
  }
  CacheLookup LookupAndWait(const std::vector<BlockHash>& chain) {
    std::optional<CacheLookup> got;
    auto now = cm_->Lookup(*session_, chain, [&](CacheLookup l) { got = std::move(l); });
    if (now) return *now;
    EXPECT_TRUE(Pump([&] { return got.has_value(); }));
    return got.value_or(CacheLookup{});
  }
  std::vector<CacheResult> AcquireAndWait(const std::vector<BlockHash>& chain) {
    std::optional<std::vector<CacheResult>> got;
    auto now = cm_->Acquire(*session_, chain, [&](std::vector<CacheResult> r) { got = std::move(r); });
    if (now) return *now;
    EXPECT_TRUE(Pump([&] { return got.has_value(); }));
    return got.value_or(std::vector<CacheResult>{});
  }
  // `chain` (5 blocks) stored through a manager over `first` (write-back: it holds nothing
  // unless eviction puts it there) and `second` (write-through), its first two blocks then
  // moved to `first` only (as a write-back leaves them); then a restart: host and NVMe
  // empty, the two tiers kept.
  void SplitOverTwoTiers(Below& first, Below& second, const std::vector<BlockHash>& chain) {
    first.policy = WritePolicy::kWriteBack;
    Open(16, 16, {&first, &second});
    Store(chain);
    Settle();
    ASSERT_EQ(first.store->size(), 0u);
    ASSERT_EQ(second.store->size(), chain.size());
    const std::string ns = EncodeNamespace("t", second.store->begin()->second.meta.fingerprint);
    for (size_t i = 0; i < 2; ++i) {
      auto node = second.store->extract(EncodeBlockKey(ns, chain[i]));
      ASSERT_FALSE(node.empty()) << "the block key below is not the block key";
      first.store->insert(std::move(node));
    }
    Open(16, 16, {&first, &second});
  }

  // Every entry served from host with the bytes stored for its hash.
  void ExpectServed(const std::vector<BlockHash>& chain, const std::vector<CacheResult>& r) {
    ASSERT_EQ(r.size(), chain.size());
    for (size_t i = 0; i < chain.size(); ++i) {
      ASSERT_EQ(r[i].status, StatusCode::kOk) << i;
      EXPECT_EQ(r[i].tier, TierKind::kHost) << i;
      EXPECT_TRUE(CheckBlockPattern(chain[i], {cm_->pool(TierKind::kHost)->PageAddress(r[i].page), kBlock}))
          << "block " << i << " came back with other bytes";
    }
    EXPECT_TRUE(cm_->CheckInvariants().ok()) << cm_->CheckInvariants().ToString();
  }

  testing::TempDir dir_;
  int opened_ = 0;
  testing::ControlLoop loop_;
  std::unique_ptr<CacheManager> cm_;
  std::unique_ptr<SessionCache> session_;
  SessionId next_id_ = 1;
};

// Write-through puts every committed block below NVMe; after a restart with empty host and
// NVMe tiers the chain is found there and served with its bytes.
TEST_F(LowerTierTest, WriteThroughThenARestartServesTheChainFromTheTierBelowNvme) {
  Below below;
  Open(16, 16, {&below});
  const auto chain = HashChain(1, 6);
  Store(chain);
  Settle();
  EXPECT_EQ(below.store->size(), 6u);
  EXPECT_EQ(cm_->lower_tiers()[0]->counters().puts, 6u);
  // Local tiers hold it: the tier below is not asked.
  const int asked = below.tier->exists_calls;
  EXPECT_EQ(LookupAndWait(chain).matched, 6u);
  EXPECT_EQ(below.tier->exists_calls, asked);

  Open(16, 16, {&below});  // a restart: host and NVMe empty, the tier below kept
  const CacheLookup l = LookupAndWait(chain);
  ASSERT_EQ(l.matched, 6u);
  for (TierKind t : l.tiers) EXPECT_EQ(t, TierKind::kRemote);
  ExpectServed(chain, AcquireAndWait(chain));
  EXPECT_EQ(cm_->lower_tiers()[0]->counters().promotions, 6u);
  // Read from below: held there, so never put back.
  Settle();
  EXPECT_EQ(cm_->lower_tiers()[0]->counters().puts, 0u);
}

// Eviction with a write-back tier below NVMe: a host block leaving is put there first, and
// a block gone from host and NVMe is still a hit, from below.
TEST_F(LowerTierTest, WriteBackEvictionPutsBlocksBelowNvmeBeforeTheyLeave) {
  Below below;
  below.policy = WritePolicy::kWriteBack;
  Open(8, 4, {&below});
  std::vector<std::vector<BlockHash>> chains;
  for (uint64_t seed = 10; seed < 16; ++seed) {
    chains.push_back(HashChain(seed, 4));
    Store(chains.back());
    Settle();
  }
  EXPECT_GT(below.store->size(), 0u) << "nothing evicted was put below";
  EXPECT_GT(cm_->counters().demotions, 0u);
  // The first chain left host and the 4-slot NVMe tier long ago; what was put below serves.
  const CacheLookup l = LookupAndWait(chains[0]);
  ASSERT_EQ(l.matched, 4u);
  EXPECT_EQ(std::count(l.tiers.begin(), l.tiers.end(), TierKind::kRemote), 4);
  ExpectServed(chains[0], AcquireAndWait(chains[0]));
}

// Two tiers below NVMe: Lookup asks the second for what the first lacks, and Acquire
// looks for a block in the second when the first does not hold it.
TEST_F(LowerTierTest, AChainOfTwoLowerTiersIsWalkedInOrder) {
  Below first, second;
  const auto chain = HashChain(20, 5);
  ASSERT_NO_FATAL_FAILURE(SplitOverTwoTiers(first, second, chain));
  const CacheLookup l = LookupAndWait(chain);
  ASSERT_EQ(l.matched, 5u) << "the second tier was not asked for what the first lacked";
  EXPECT_EQ(first.tier->exists_calls, 1);
  EXPECT_EQ(second.tier->exists_calls, 1);
  ExpectServed(chain, AcquireAndWait(chain));
  EXPECT_EQ(first.tier->fetches, 5) << "every block is looked for in the first tier first";
  EXPECT_EQ(second.tier->fetches, 3) << "and in the second only when the first lacks it";
}

// An engine's load (a prefix Acquire) asks each lower tier once for the chain and reads
// each block from the tier that said it holds it: at most two round trips a block, however
// many tiers are above the one holding it.
TEST_F(LowerTierTest, APrefixAcquireReadsEachBlockFromTheTierThatHoldsIt) {
  Below first, second;
  const auto chain = HashChain(21, 5);
  ASSERT_NO_FATAL_FAILURE(SplitOverTwoTiers(first, second, chain));
  std::vector<BlockHash> asked = chain;
  asked.push_back(HashChain(22, 1)[0]);  // stored nowhere: the prefix ends before it
  std::optional<std::vector<CacheResult>> got;
  auto now = cm_->AcquirePrefix(*session_, asked, [&](std::vector<CacheResult> r) { got = std::move(r); });
  if (now) got = std::move(now);
  ASSERT_TRUE(Pump([&] { return got.has_value(); }));
  ExpectServed(chain, *got);
  EXPECT_EQ(first.tier->exists_calls, 1);
  EXPECT_EQ(second.tier->exists_calls, 1);
  EXPECT_EQ(first.tier->fetches, 2) << "a block read from a tier that said it lacks it";
  EXPECT_EQ(second.tier->fetches, 3);
  EXPECT_EQ(cm_->counters().lookups, 0u) << "a load counted as a lookup";
}

// A load whose NVMe record went stale after its Lookup read (and held) it — the block left
// NVMe in between — reads the block from a tier below that still holds it, not a miss.
TEST_F(LowerTierTest, ABlockGoneFromNvmeAfterItsLookupIsReadFromATierBelow) {
  Below below;  // write-through: it holds every committed block
  Open(16, 16, {&below});
  const auto chain = HashChain(23, 4);
  Store(chain);
  Settle();
  (void)cm_->Evict(TierKind::kHost, 16 * kPage);  // demoted: on NVMe, and below
  Settle();
  const CacheLookup l = LookupAndWait(chain);
  ASSERT_EQ(l.matched, chain.size());
  for (TierKind t : l.tiers) ASSERT_EQ(t, TierKind::kNvme);
  (void)cm_->Evict(TierKind::kNvme, 16 * kPage);  // gone from NVMe before the load
  Settle();
  const int fetched = below.tier->fetches;
  std::optional<std::vector<CacheResult>> got;
  auto now = cm_->AcquirePrefix(*session_, chain, [&](std::vector<CacheResult> r) { got = std::move(r); });
  if (now) got = std::move(now);
  ASSERT_TRUE(Pump([&] { return got.has_value(); }));
  ExpectServed(chain, *got);
  EXPECT_EQ(below.tier->fetches - fetched, 4);
}

// A value that does not verify below is a miss, never served; one the tier cannot be
// asked about is not waited for.
TEST_F(LowerTierTest, AValueThatDoesNotVerifyIsAMissAndAnUnavailableTierIsSkipped) {
  Below below;
  Open(16, 16, {&below});
  const auto chain = HashChain(30, 3);
  Store(chain);
  Settle();
  Open(16, 16, {&below});
  below.store->begin()->second.meta.fingerprint = "another layout";
  auto r = AcquireAndWait(chain);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(std::count_if(r.begin(), r.end(), [](const CacheResult& c) { return c.status == StatusCode::kDataLoss; }),
            1);
  EXPECT_EQ(cm_->lower_tiers()[0]->counters().promotion_failures, 1u);

  Open(16, 16, {&below});
  below.tier->available_ = false;
  const CacheLookup l = LookupAndWait(chain);  // answered now: nothing below can be asked
  EXPECT_EQ(l.matched, 0u);
  EXPECT_EQ(below.tier->exists_calls, 0);
}

}  // namespace
}  // namespace kvtier
