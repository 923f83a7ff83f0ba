// CacheManager over a real NvmeTier (slot files, io_uring or threads, in-memory index):
// demotion, promotion, write-through, waiting allocations, failures.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "daemon/cache/cache_manager.h"
#include "engine/tools/block_pattern.h"
#include "tests/support/control_loop.h"
#include "tests/support/counting_block_index_store.h"
#include "tests/support/fake_clock.h"
#include "tests/support/test_util.h"

namespace kvtier {
namespace {

using testing::HashChain;

constexpr uint64_t kPage = 64 * 1024;

class CacheNvmeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void Open(uint32_t host_pages, double high, double low, WritePolicy policy = WritePolicy::kWriteBack,
            uint32_t nvme_slots = 64) {
    NvmeTierOptions no;
    no.files = {SlotFileSpec{dir_.File("slots"), nvme_slots * kPage}};
    no.slot_bytes = kPage;
    no.durability = Durability::kRelaxed;
    IoEngineOptions io;
    io.backend = GetParam();
    auto engine = OpenIoEngine(io);
    if (!engine.ok()) GTEST_SKIP() << engine.status().ToString();
    auto nvme =
        NvmeTier::Open(no, std::move(engine).value(), std::move(store_), loop_.Poster(), SystemClock::Default());
    ASSERT_TRUE(nvme.ok()) << nvme.status().ToString();
    CacheManager::Options o;
    TierOptions& h = o.tiers[TierIndex(TierKind::kHost)];
    h.enabled = true;
    h.page_bytes = kPage;
    h.segment_bytes = 4 * kPage;
    h.capacity_bytes = host_pages * kPage;
    h.huge_pages = HugePages::kOff;
    h.high_watermark = high;
    h.low_watermark = low;
    h.allocation_headroom = headroom_;
    CacheManager::NvmeSpec spec(std::move(nvme).value());
    spec.options.write_policy = policy;
    spec.options.load_hold_ns = load_hold_ns_;
    auto cm = CacheManager::Open(o, std::move(spec), clock_);
    ASSERT_TRUE(cm.ok()) << cm.status().ToString();
    cm_ = std::move(cm).value();
    ASSERT_TRUE(Pump([&] { return cm_->nvme()->ready(); }));
    session_ = Attach("t");
  }

  std::unique_ptr<SessionCache> Attach(const std::string& tenant) {
    auto s = std::make_unique<SessionCache>(next_id_++);
    ModelLayout l = testing::TestLayout("m", 32);  // 32 KiB blocks in 64 KiB pages
    EXPECT_TRUE(cm_->Attach(*s, tenant, l).ok());
    return s;
  }

  template <class Pred>
  bool Pump(Pred done) {
    return loop_.Pump(*cm_, done, [&] {
      if (fake_clock_) fake_clock_->Advance(completion_ns_);
    });
  }
  void Settle() {
    Pump([&] { return cm_->nvme()->pending_operations() == 0 && cm_->pending_promotions() == 0; });
  }

  std::vector<PageId> Store(SessionCache& s, const std::vector<BlockHash>& chain) {
    auto pages = cm_->Allocate(s, TierKind::kHost, static_cast<uint32_t>(chain.size()));
    EXPECT_TRUE(pages.ok()) << pages.status().ToString();
    if (!pages.ok()) return {};
    for (size_t i = 0; i < chain.size(); ++i) {
      FillBlockPattern(chain[i], {cm_->pool(TierKind::kHost)->PageAddress((*pages)[i]), 32 * 1024});
    }
    auto r = cm_->Commit(s, TierKind::kHost, *pages, chain, {}, false);
    for (const auto& e : r) EXPECT_EQ(e.status, StatusCode::kOk);
    return *pages;
  }

  // Drops every host copy (write-through: the blocks stay on NVMe).
  void EvictHost() {
    (void)cm_->Evict(TierKind::kHost, 64 * kPage);
    Settle();
  }
  // `chain` stored 8 blocks at a time (write-through), then on NVMe only.
  void StoreOnNvmeOnly(const std::vector<BlockHash>& chain) {
    for (size_t at = 0; at < chain.size(); at += 8) {
      Store(*session_, std::vector<BlockHash>(chain.begin() + at, chain.begin() + std::min(at + 8, chain.size())));
      Settle();
    }
    EvictHost();
  }

  // From now on the index counts its reads: keys_read_ in all, key_reads_ by key.
  void CountIndexReads() {
    auto counting = std::make_unique<testing::CountingBlockIndexStore>(std::move(store_), &keys_read_);
    counting->set_key_reads(key_reads_);
    store_ = std::move(counting);
  }
  // Acquire of `hashes` once every entry is settled; with `prefix`, an engine's load (the
  // present prefix of the chain only).
  std::vector<CacheResult> AcquireAndWait(SessionCache& s, const std::vector<BlockHash>& hashes, bool prefix = false) {
    std::optional<std::vector<CacheResult>> got;
    auto answer = [&](std::vector<CacheResult> r) { got = std::move(r); };
    auto now = prefix ? cm_->AcquirePrefix(s, hashes, answer) : cm_->Acquire(s, hashes, answer);
    if (now) return *now;
    EXPECT_TRUE(Pump([&] { return got.has_value(); }));
    return got.value_or(std::vector<CacheResult>{});
  }

  void ExpectConsistent() {
    Status st = cm_->CheckInvariants();
    EXPECT_TRUE(st.ok()) << st.ToString();
  }

  // Engines storing `per_step` blocks at a time, `steps` times, each step's spills finishing
  // before the next; every completion arrives `completion_ns_` of fake time after the last.
  // The fewest host pages free after a step.
  uint32_t StoreSteps(uint64_t seed, int steps, uint32_t per_step) {
    uint32_t least_free = UINT32_MAX;
    for (int i = 0; i < steps; ++i) {
      Store(*session_, HashChain(seed + static_cast<uint64_t>(i), per_step));
      Settle();
      least_free = std::min(least_free, cm_->Counts(TierKind::kHost).free);
    }
    return least_free;
  }

  testing::TempDir dir_;
  double headroom_ = 0;  // TierOptions::allocation_headroom of the host tier
  int64_t load_hold_ns_ = NvmeMover::Options{}.load_hold_ns;
  std::atomic<uint64_t> keys_read_{0};
  std::shared_ptr<testing::CountingBlockIndexStore::KeyReads> key_reads_ =
      std::make_shared<testing::CountingBlockIndexStore::KeyReads>();
  Clock* clock_ = nullptr;  // the manager's (null: the system clock)
  FakeClock* fake_clock_ = nullptr;
  int64_t completion_ns_ = 0;
  std::unique_ptr<BlockIndexStore> store_ = NewMemBlockIndexStore();
  testing::ControlLoop loop_;
  std::unique_ptr<CacheManager> cm_;
  std::unique_ptr<SessionCache> session_;
  SessionId next_id_ = 1;
};

// A long chain whose tail nobody stored: the index is read in growing chunks from where
// the host tier's prefix ends and not past the first miss, so a cold 4,000-block lookup
// reads 16 keys of the index, not 4,000 (every one a read on the control thread).
TEST_P(CacheNvmeTest, ALongColdChainReadsTheIndexOnlyToItsFirstMiss) {
  std::atomic<uint64_t> keys_read{0};
  store_ = std::make_unique<testing::CountingBlockIndexStore>(std::move(store_), &keys_read);
  Open(/*host_pages=*/16, 0.99, 0.98, WritePolicy::kWriteThrough, /*nvme_slots=*/64);
  auto chain = HashChain(77, 4000);
  Store(*session_, std::vector<BlockHash>(chain.begin(), chain.begin() + 4));
  Settle();  // on NVMe too (write-through)
  keys_read = 0;
  EXPECT_EQ(cm_->Lookup(*session_, chain).matched, 4u);
  EXPECT_LE(keys_read.load(), ChainWalk::kFirstIndexProbe) << "read past the first miss";
  // Evicted from host, the stored prefix is found on NVMe with few reads: a prefix longer
  // than one probe takes the next, larger one.
  const auto warm = HashChain(78, 40);
  StoreOnNvmeOnly(warm);
  std::vector<BlockHash> long_chain = warm;
  long_chain.insert(long_chain.end(), chain.begin() + 100, chain.end());
  keys_read = 0;
  const CacheLookup l = cm_->Lookup(*session_, long_chain);
  EXPECT_EQ(l.matched, warm.size());
  EXPECT_LE(keys_read.load(), ChainWalk::kFirstIndexProbe * 5) << "16 then 64 at most";
  ExpectConsistent();
}

// A Lookup that can wait (the daemon's: it passes `done`) reads only its first probe of
// the index on the control thread and the rest on the NVMe tier's reader thread: it is
// answered later, with what the synchronous read answers; a chain within the first probe
// is answered at once; a session that detaches meanwhile is answered nothing.
TEST_P(CacheNvmeTest, ALookupThatCanWaitReadsTheIndexPastItsFirstProbeOffTheControlThread) {
  std::atomic<uint64_t> keys_read{0}, keys_read_here{0};
  store_ = std::make_unique<testing::CountingBlockIndexStore>(std::move(store_), &keys_read, &keys_read_here);
  Open(/*host_pages=*/16, 0.99, 0.98, WritePolicy::kWriteThrough, /*nvme_slots=*/64);
  const auto warm = HashChain(78, 40);
  StoreOnNvmeOnly(warm);
  std::vector<BlockHash> long_chain = warm;
  const auto tail = HashChain(79, 100);  // stored by nobody
  long_chain.insert(long_chain.end(), tail.begin(), tail.end());
  std::optional<CacheLookup> got;
  keys_read = keys_read_here = 0;
  const auto now = cm_->Lookup(*session_, long_chain, [&](CacheLookup l) { got = std::move(l); });
  EXPECT_FALSE(now.has_value()) << "40 indexed blocks answered on the control thread";
  ASSERT_TRUE(Pump([&] { return got.has_value(); }));
  EXPECT_EQ(got->matched, warm.size());
  EXPECT_EQ(keys_read_here.load(), ChainWalk::kFirstIndexProbe) << "read on the control thread";
  EXPECT_EQ(keys_read.load(), ChainWalk::kFirstIndexProbe * 5) << "16, then 64 off it";
  EXPECT_EQ(got->tiers.size(), warm.size());
  Settle();  // the prefetches it started
  EXPECT_EQ(cm_->Lookup(*session_, long_chain).matched, warm.size()) << "the synchronous read differs";
  // Within the first probe (the prefetched blocks are in host memory now): at once.
  const std::vector<BlockHash> head(warm.begin(), warm.begin() + 10);
  const auto at_once = cm_->Lookup(*session_, head, [](CacheLookup) { ADD_FAILURE() << "deferred"; });
  ASSERT_TRUE(at_once.has_value());
  EXPECT_EQ(at_once->matched, head.size());
  // Gone before its read comes back: no answer, nothing left waiting.
  EvictHost();
  auto other = Attach("t");
  bool answered = false;
  ASSERT_FALSE(cm_->Lookup(*other, long_chain, [&](CacheLookup) { answered = true; }).has_value());
  (void)cm_->Detach(*other);
  // Reads run and come back in the order asked: once a later Lookup is answered, the
  // detached session's read has come back too.
  got.reset();
  ASSERT_FALSE(cm_->Lookup(*session_, long_chain, [&](CacheLookup l) { got = std::move(l); }).has_value());
  ASSERT_TRUE(Pump([&] { return got.has_value(); }));
  EXPECT_EQ(got->matched, warm.size());
  EXPECT_FALSE(answered);
  ExpectConsistent();
}

// An Acquire that can wait and finds more than kFirstIndexProbe blocks nowhere in memory
// reads the index off the control thread; its blocks come back with their bytes. One of a
// few blocks reads it on the control thread, as before.
TEST_P(CacheNvmeTest, AnAcquireOfManyColdBlocksReadsTheIndexOffTheControlThread) {
  std::atomic<uint64_t> keys_read{0}, keys_read_here{0};
  store_ = std::make_unique<testing::CountingBlockIndexStore>(std::move(store_), &keys_read, &keys_read_here);
  Open(/*host_pages=*/48, 0.99, 0.98, WritePolicy::kWriteThrough, /*nvme_slots=*/64);
  const auto chain = HashChain(81, 24);
  StoreOnNvmeOnly(chain);
  ASSERT_EQ(cm_->Counts(TierKind::kHost).cached, 0u);
  auto acquire = [&](const std::vector<BlockHash>& hashes) {
    keys_read = keys_read_here = 0;
    const auto got = AcquireAndWait(*session_, hashes);
    EXPECT_EQ(got.size(), hashes.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].status, StatusCode::kOk) << i;
      if (got[i].status != StatusCode::kOk) continue;
      EXPECT_TRUE(CheckBlockPattern(hashes[i], {cm_->pool(got[i].tier)->PageAddress(got[i].page), 32 * 1024}));
    }
    (void)cm_->Release(*session_, TierKind::kHost, {}, hashes);
  };
  const std::vector<BlockHash> few(chain.begin(), chain.begin() + 8);
  acquire(few);
  EXPECT_EQ(keys_read_here.load(), few.size()) << "a few blocks: read on the control thread";
  EvictHost();
  acquire(chain);
  EXPECT_EQ(keys_read.load(), chain.size());
  EXPECT_EQ(keys_read_here.load(), 0u) << "24 blocks read on the control thread";
  // Stored again by another engine while the read is off the thread: that entry is served
  // from the host tier, never promoted into a second block of the same key.
  EvictHost();
  std::optional<std::vector<CacheResult>> got;
  ASSERT_FALSE(cm_->Acquire(*session_, chain, [&](std::vector<CacheResult> r) { got = std::move(r); }).has_value());
  auto other = Attach("t");
  Store(*other, {chain[5]});
  ASSERT_TRUE(Pump([&] { return got.has_value(); }));
  for (size_t i = 0; i < chain.size(); ++i) {
    ASSERT_EQ((*got)[i].status, StatusCode::kOk) << i;
    EXPECT_TRUE(CheckBlockPattern(chain[i], {cm_->pool((*got)[i].tier)->PageAddress((*got)[i].page), 32 * 1024}));
  }
  EXPECT_EQ((*got)[5].tier, TierKind::kHost);
  (void)cm_->Release(*session_, TierKind::kHost, {}, chain);
  ExpectConsistent();
}

// An engine's load (a prefix Acquire) walks the chain once: each index entry of an
// NVMe-resident chain is read once (a Lookup, then an Acquire of its prefix, read each twice),
// the blocks come back with their bytes, and the answer ends where the chain stops being
// stored. Blocks in host memory then are not looked up in the index at all.
TEST_P(CacheNvmeTest, APrefixAcquireReadsEachIndexEntryOnce) {
  CountIndexReads();
  Open(/*host_pages=*/48, 0.99, 0.98, WritePolicy::kWriteThrough, /*nvme_slots=*/64);
  const auto chain = HashChain(85, 24);
  StoreOnNvmeOnly(chain);
  std::vector<BlockHash> asked = chain;
  const auto tail = HashChain(86, 8);  // stored by nobody
  asked.insert(asked.end(), tail.begin(), tail.end());
  key_reads_->Clear();
  auto got = AcquireAndWait(*session_, asked, /*prefix=*/true);
  ASSERT_EQ(got.size(), chain.size()) << "the answer is the stored prefix";
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].status, StatusCode::kOk) << i;
    EXPECT_TRUE(CheckBlockPattern(chain[i], {cm_->pool(got[i].tier)->PageAddress(got[i].page), 32 * 1024})) << i;
  }
  EXPECT_GE(key_reads_->keys(), chain.size() + 1) << "the walk stops at the first block the index lacks";
  EXPECT_EQ(key_reads_->most(), 1u) << "an index entry read twice in one load";
  (void)cm_->Release(*session_, TierKind::kHost, {}, chain);
  keys_read_ = 0;
  got = AcquireAndWait(*session_, chain, /*prefix=*/true);
  ASSERT_EQ(got.size(), chain.size());
  EXPECT_EQ(keys_read_.load(), 0u) << "blocks in host memory looked up in the index";
  (void)cm_->Release(*session_, TierKind::kHost, {}, chain);
  ExpectConsistent();
}

// A load after a Lookup (an engine's scheduler looks the chain up, its worker loads it
// on another session; SGLang checks pages, then gets them) reads no index entry again: the
// records the Lookup read are held for it (tiers.nvme.load_hold). A hold is taken once and
// lapses; a block dropped from NVMe after the Lookup is a miss, never other bytes.
TEST_P(CacheNvmeTest, ALoadAfterALookupReadsNoIndexEntryTheLookupRead) {
  FakeClock clock;
  clock_ = fake_clock_ = &clock;
  CountIndexReads();
  Open(/*host_pages=*/48, 0.99, 0.98, WritePolicy::kWriteThrough, /*nvme_slots=*/64);
  const auto chain = HashChain(87, 20);
  StoreOnNvmeOnly(chain);
  auto worker = Attach("t");  // the same tenant and model: the same namespace
  auto load = [&](SessionCache& s, const std::vector<BlockHash>& hashes, bool prefix) {
    auto r = AcquireAndWait(s, hashes, prefix);
    EXPECT_EQ(r.size(), hashes.size());
    for (size_t i = 0; i < r.size(); ++i) {
      EXPECT_EQ(r[i].status, StatusCode::kOk) << i;
      if (r[i].status != StatusCode::kOk) continue;
      EXPECT_TRUE(CheckBlockPattern(hashes[i], {cm_->pool(r[i].tier)->PageAddress(r[i].page), 32 * 1024})) << i;
    }
    (void)cm_->Release(s, TierKind::kHost, {}, hashes);
    return r;
  };
  for (bool prefix : {true, false}) {
    SCOPED_TRACE(prefix ? "a prefix Acquire (vLLM's worker)" : "an Acquire (SGLang's get)");
    key_reads_->Clear();
    ASSERT_EQ(cm_->Lookup(*session_, chain).matched, chain.size());
    const size_t looked_up = key_reads_->keys();
    EXPECT_GE(looked_up, chain.size());
    // The worker loads the chain in two chunks, as vLLM's does.
    load(*worker, std::vector<BlockHash>(chain.begin(), chain.begin() + 12), prefix);
    load(*worker, std::vector<BlockHash>(chain.begin() + 12, chain.end()), prefix);
    EXPECT_EQ(key_reads_->keys(), looked_up) << "the load read an entry the Lookup did not";
    EXPECT_EQ(cm_->counters().load_holds_used, (prefix ? 1 : 2) * chain.size());
    EXPECT_EQ(key_reads_->most(), 1u) << "an index entry read twice for one lookup and its load";
    EvictHost();
  }
  // Lapsed: the load reads the index itself.
  ASSERT_EQ(cm_->Lookup(*session_, chain).matched, chain.size());
  clock.Advance(NvmeMover::Options{}.load_hold_ns + 1);
  key_reads_->Clear();
  load(*worker, chain, true);
  EXPECT_EQ(key_reads_->keys(), chain.size()) << "a lapsed hold was used";
  EvictHost();
  // Held, then the block leaves NVMe before the load: a miss where it was, and the prefix
  // ends there; nothing else is served in its place.
  ASSERT_EQ(cm_->Lookup(*session_, chain).matched, chain.size());
  auto other = Attach("t");
  (void)cm_->Evict(TierKind::kNvme, 64 * kPage);
  Settle();
  Store(*other, std::vector<BlockHash>(HashChain(88, 20)));  // new blocks may take the freed slots
  Settle();
  EvictHost();
  const auto got = AcquireAndWait(*worker, chain, /*prefix=*/true);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NE(got[i].status, StatusCode::kOk) << i;
  ExpectConsistent();
}

TEST_P(CacheNvmeTest, ColdBlocksAreDemotedAndPromotedBackWithTheirBytes) {
  Open(8, 0.5, 0.25);
  auto chain = HashChain(1, 5);
  Store(*session_, chain);  // 5 of 8 > 0.5: demote down to 2
  Settle();
  TierCounts host = cm_->Counts(TierKind::kHost), nvme = cm_->Counts(TierKind::kNvme);
  EXPECT_EQ(host.cached, 2u);
  EXPECT_EQ(nvme.cached, 3u);
  EXPECT_EQ(cm_->counters().demotions, 3u);
  ExpectConsistent();
  // The whole chain is still a hit, partly on NVMe.
  CacheLookup l = cm_->Lookup(*session_, chain);
  ASSERT_EQ(l.matched, 5u);
  EXPECT_EQ(std::count(l.tiers.begin(), l.tiers.end(), TierKind::kNvme), 3);
  auto other = Attach("t");
  auto r = AcquireAndWait(*other, chain);
  ASSERT_EQ(r.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_EQ(r[i].status, StatusCode::kOk) << i;
    EXPECT_EQ(r[i].tier, TierKind::kHost);
    EXPECT_TRUE(CheckBlockPattern(chain[i], {cm_->pool(TierKind::kHost)->PageAddress(r[i].page), 32 * 1024}))
        << "block " << i << " came back with other bytes";
  }
  EXPECT_EQ(cm_->counters().promotions, 3u);
  ExpectConsistent();
  EXPECT_EQ(cm_->Release(*other, TierKind::kHost, {}, chain)[4], StatusCode::kOk);
  Settle();
  ExpectConsistent();
}

TEST_P(CacheNvmeTest, WriteThroughCopiesEveryCommitAndKeepsTheHostCopy) {
  Open(8, 0.9, 0.8, WritePolicy::kWriteThrough);
  auto chain = HashChain(2, 4);
  Store(*session_, chain);
  Settle();
  EXPECT_EQ(cm_->Counts(TierKind::kHost).cached, 4u);
  EXPECT_EQ(cm_->Counts(TierKind::kNvme).cached, 4u);
  EXPECT_EQ(cm_->counters().write_throughs, 4u);
  CacheLookup l = cm_->Lookup(*session_, chain);
  EXPECT_EQ(std::count(l.tiers.begin(), l.tiers.end(), TierKind::kHost), 4);
  ExpectConsistent();
}

TEST_P(CacheNvmeTest, AFullTierMakesAllocateWaitForDemotionsNotDropBlocks) {
  Open(8, 0.99, 0.9);
  auto chain = HashChain(3, 8);
  Store(*session_, chain);  // every page cached, none on NVMe yet
  std::optional<Result<std::vector<PageId>>> got;
  auto now = cm_->Allocate(*session_, TierKind::kHost, 3, [&](Result<std::vector<PageId>> r) { got = std::move(r); });
  ASSERT_FALSE(now.has_value()) << "the tier had no free page: the request should wait";
  ASSERT_TRUE(Pump([&] { return got.has_value(); }));
  ASSERT_TRUE(got->ok()) << got->status().ToString();
  EXPECT_EQ((*got)->size(), 3u);
  Settle();
  EXPECT_EQ(cm_->counters().evictions[TierIndex(TierKind::kHost)], 0u) << "a block was dropped";
  EXPECT_EQ(cm_->Lookup(*session_, chain).matched, 8u) << "every block is still somewhere";
  ExpectConsistent();
}

// Each completion 10 ms after the last: engines storing 4 blocks a step see a spill round
// trip of tens of ms and about 100 pages a second, 16 x that = more than half the tier:
// capped at 32 pages, where the watermarks alone keep 64 - 0.9 x 64 = 6.4 free.
TEST_P(CacheNvmeTest, AllocationHeadroomKeepsPagesFreeAheadOfAFastAllocationRate) {
  FakeClock clock;
  clock_ = fake_clock_ = &clock;
  completion_ns_ = 10'000'000;
  headroom_ = 16;
  Open(64, 0.9, 0.8, WritePolicy::kWriteBack, 512);
  StoreSteps(1000, 80, 4);  // the rate estimate (1 s window) settles
  EXPECT_EQ(cm_->headroom_pages(TierKind::kHost), 32u);
  EXPECT_GE(StoreSteps(2000, 40, 4), 28u) << "eviction did not start ahead of the allocations";
  ExpectConsistent();
  // Idle: the headroom decays, and a trickle of blocks caches up to the watermarks again.
  clock.Advance(20'000'000'000);
  EXPECT_LE(cm_->headroom_pages(TierKind::kHost), 1u);
  for (uint64_t i = 0; i < 30; ++i) {
    clock.Advance(1'000'000'000);
    StoreSteps(3000 + i, 1, 1);
  }
  EXPECT_LE(cm_->headroom_pages(TierKind::kHost), 2u);  // 16 x about 1.6 pages/s x tens of ms
  EXPECT_LE(cm_->Counts(TierKind::kHost).free, 13u) << "an idle tier kept pages empty";
  ExpectConsistent();
}

TEST_P(CacheNvmeTest, WithoutAllocationHeadroomOnlyTheWatermarksEvict) {
  FakeClock clock;
  clock_ = fake_clock_ = &clock;
  completion_ns_ = 10'000'000;
  Open(64, 0.9, 0.8, WritePolicy::kWriteBack, 512);
  const uint32_t least_free = StoreSteps(1000, 120, 4);
  EXPECT_EQ(cm_->headroom_pages(TierKind::kHost), 0u);
  EXPECT_LE(least_free, 13u);
  EXPECT_LE(cm_->Counts(TierKind::kHost).free, 13u);
  ExpectConsistent();
}

TEST_P(CacheNvmeTest, ABlockThatFailsVerificationIsAMissAndGone) {
  Open(8, 0.3, 0.1);
  auto chain = HashChain(4, 3);
  Store(*session_, chain);
  Settle();
  ASSERT_EQ(cm_->Counts(TierKind::kNvme).cached, 3u);
  // Corrupt every slot on disk.
  int fd = ::open(dir_.File("slots").c_str(), O_RDWR);
  std::vector<uint8_t> junk(64 * kPage, 0x5a);
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
  ::close(fd);
  auto nvme_hashes = std::vector<BlockHash>(chain.begin(), chain.begin() + 1);
  CacheLookup l = cm_->Lookup(*session_, chain);
  ASSERT_GE(l.matched, 1u);
  auto r = AcquireAndWait(*session_, chain);
  int data_loss = 0;
  for (const auto& e : r) data_loss += e.status == StatusCode::kDataLoss;
  EXPECT_GE(data_loss, 1);
  EXPECT_GE(cm_->nvme()->counters().checksum_failures, 1u);
  Settle();
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i].status == StatusCode::kDataLoss) {
      EXPECT_EQ(cm_->Lookup(*session_, std::vector<BlockHash>{chain[i]}).matched, 0u) << "still a hit";
    }
  }
  ExpectConsistent();
}

TEST_P(CacheNvmeTest, ASessionThatLeavesMidPromotionLeavesNothingBehind) {
  Open(8, 0.3, 0.1);
  auto chain = HashChain(5, 3);
  Store(*session_, chain);
  Settle();
  auto gone = Attach("t");
  bool called = false;
  auto now = cm_->Acquire(*gone, chain, [&](std::vector<CacheResult>) { called = true; });
  cm_->Detach(*gone);
  Settle();
  EXPECT_FALSE(called) << "a detached session got a response";
  TierCounts host = cm_->Counts(TierKind::kHost);
  EXPECT_EQ(host.referenced, 0u);
  EXPECT_EQ(host.leased, 0u);
  (void)now;
  ExpectConsistent();
}

INSTANTIATE_TEST_SUITE_P(Backends, CacheNvmeTest, ::testing::Values("io_uring", "threads"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvtier
