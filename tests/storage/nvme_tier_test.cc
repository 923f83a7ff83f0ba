#include "storage/nvme/nvme_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>

#include "tests/support/fault_file_system.h"
#include "tests/support/fault_injection_io_engine.h"
#include "tests/support/test_util.h"

namespace kvtier {
namespace {

constexpr uint64_t kSlot = 64 * 1024;

// The control thread of these tests: posted callbacks queue here and run in Pump().
class Loop {
 public:
  Post Poster() {
    return [this](std::function<void()> fn) {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(fn));
    };
  }
  // Runs posted work and I/O completions until `done` or 10 s.
  template <class Pred>
  bool Pump(NvmeTier* t, Pred done, std::chrono::seconds limit = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      RunPosted();
      if (done()) return true;
      pollfd p{t->notify_fd(), POLLIN, 0};
      if (::poll(&p, 1, 2) > 0) t->OnIoReady();
    }
    return done();
  }
  void RunPosted() {
    for (;;) {
      std::function<void()> fn;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (q_.empty()) return;
        fn = std::move(q_.front());
        q_.pop_front();
      }
      fn();
    }
  }

 private:
  std::mutex mu_;
  std::deque<std::function<void()>> q_;
};

struct Page {
  explicit Page(uint8_t seed) {
    void* p = nullptr;
    EXPECT_EQ(::posix_memalign(&p, 4096, kSlot), 0);
    data = static_cast<uint8_t*>(p);
    for (size_t i = 0; i < kSlot; ++i) data[i] = static_cast<uint8_t>(seed + i * 13);
  }
  ~Page() { ::free(data); }
  std::span<uint8_t> span() { return {data, kSlot}; }
  uint8_t* data;
};

class NvmeTierTest : public ::testing::Test {
 protected:
  std::unique_ptr<NvmeTier> Open(uint32_t slots = 16, Durability d = Durability::kStrict,
                                 const std::string& faults = "", double high = 0.95, double low = 0.9,
                                 NvmeOwners owners = {}) {
    NvmeTierOptions o;
    o.files = {SlotFileSpec{dir_.File("slots0"), slots * kSlot}};
    o.slot_bytes = kSlot;
    o.durability = d;
    o.high_watermark = high;
    o.low_watermark = low;
    IoEngineOptions io;
    io.backend = "auto";
    auto engine = OpenIoEngine(io);
    EXPECT_TRUE(engine.ok());
    std::unique_ptr<IoEngine> e = std::move(engine).value();
    if (!faults.empty()) e = std::make_unique<FaultInjectionIoEngine>(std::move(e), *ParseIoFaults(faults));
    RocksDbIndexOptions ro;
    ro.path = dir_.File("index");
    ro.file_system = index_fs_;
    auto store = OpenRocksDbBlockIndexStore(ro);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    auto t = NvmeTier::Open(o, std::move(e), std::move(store).value(), loop_.Poster(), &clock_, std::move(owners));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return nullptr;
    auto tier = std::move(t).value();
    EXPECT_TRUE(loop_.Pump(tier.get(), [&] { return tier->ready(); }));
    return tier;
  }

  Result<uint32_t> Spill(NvmeTier* t, const std::string& key, Page& page, uint32_t length = kSlot) {
    BlockRecord meta;
    meta.length = length;
    bool done = false;
    Status st;
    uint32_t slot = 0;
    t->Spill(key, meta, page.span(), -1, [&](Status s, uint32_t sl) {
      st = s;
      slot = sl;
      done = true;
    });
    EXPECT_TRUE(loop_.Pump(t, [&] { return done; }));
    if (!st.ok()) return st;
    return slot;
  }

  Status Fetch(NvmeTier* t, const std::string& key, const BlockRecord& rec, Page& into) {
    bool done = false;
    Status st;
    t->Fetch(key, rec, into.span(), -1, [&](Status s) {
      st = s;
      done = true;
    });
    EXPECT_TRUE(loop_.Pump(t, [&] { return done; }));
    return st;
  }

  BlockRecord Find(NvmeTier* t, const std::string& key) {
    auto r = t->Find(key);
    EXPECT_TRUE(r.ok() && r->has_value()) << key;
    return r.ok() && r->has_value() ? **r : BlockRecord{};
  }

  void Settle(NvmeTier* t) {
    loop_.Pump(t, [&] { return t->pending_operations() == 0; });
  }

  testing::TempDir dir_;
  Loop loop_;
  SystemClock clock_;
  std::shared_ptr<rocksdb::FileSystem> index_fs_;  // null: the machine's
};

TEST_F(NvmeTierTest, SpilledBlockIsIndexedAndReadsBackVerified) {
  auto t = Open();
  Page a(1), back(0);
  auto slot = Spill(t.get(), "ns|hash-a", a);
  ASSERT_TRUE(slot.ok()) << slot.status().ToString();
  BlockRecord rec = Find(t.get(), "ns|hash-a");
  EXPECT_EQ(rec.slot, *slot);
  EXPECT_EQ(rec.length, kSlot);
  ASSERT_TRUE(Fetch(t.get(), "ns|hash-a", rec, back).ok());
  EXPECT_EQ(std::memcmp(a.data, back.data, kSlot), 0);
  NvmeCounts c = t->Counts();
  EXPECT_EQ(c.cached, 1u);
  EXPECT_EQ(c.free + c.inflight + c.cached, c.capacity);
  EXPECT_GE(t->counters().syncs, 1u) << "strict durability syncs the data";
}

TEST_F(NvmeTierTest, UnalignedBlockLengthIsPaddedOnDiskButChecksummedExactly) {
  auto t = Open(16, Durability::kRelaxed);
  Page a(2), back(9);
  ASSERT_TRUE(Spill(t.get(), "odd", a, 10'000).ok());
  BlockRecord rec = Find(t.get(), "odd");
  EXPECT_EQ(rec.length, 10'000u);
  ASSERT_TRUE(Fetch(t.get(), "odd", rec, back).ok());
  EXPECT_EQ(std::memcmp(a.data, back.data, 10'000), 0);
  EXPECT_EQ(t->counters().syncs, 0u) << "relaxed durability does not sync";
}

TEST_F(NvmeTierTest, CorruptedBytesAreDataLossAndTheEntryIsDropped) {
  auto t = Open();
  Page a(3), back(0);
  auto slot = Spill(t.get(), "victim", a);
  ASSERT_TRUE(slot.ok());
  BlockRecord rec = Find(t.get(), "victim");
  // Flip a byte of the slot on disk behind the tier's back.
  int fd = ::open(dir_.File("slots0").c_str(), O_RDWR);
  uint8_t b;
  ASSERT_EQ(::pread(fd, &b, 1, *slot * kSlot + 777), 1);
  b ^= 0xff;
  ASSERT_EQ(::pwrite(fd, &b, 1, *slot * kSlot + 777), 1);
  ::fsync(fd);
  ::close(fd);
  // Bypass any page cache: the slot file is O_DIRECT in the tier.
  Status st = Fetch(t.get(), "victim", rec, back);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(t->counters().checksum_failures, 1u);
  Settle(t.get());
  EXPECT_FALSE(t->Find("victim")->has_value());
  EXPECT_EQ(t->Counts().cached, 0u);
  EXPECT_EQ(t->Counts().free, t->Counts().capacity) << "the slot is free again";
}

TEST_F(NvmeTierTest, ARecordNamingAnotherKeysSlotIsAMissNotCorruption) {
  auto t = Open();
  Page a(4), back(0);
  ASSERT_TRUE(Spill(t.get(), "real-key", a).ok());
  BlockRecord rec = Find(t.get(), "real-key");
  EXPECT_EQ(Fetch(t.get(), "other-key", rec, back).code(), StatusCode::kNotFound);
  EXPECT_EQ(t->counters().checksum_failures, 0u);
  Settle(t.get());
  // Nothing was taken from the slot's real owner.
  EXPECT_TRUE(t->Find("real-key")->has_value());
  EXPECT_TRUE(Fetch(t.get(), "real-key", rec, back).ok());
  EXPECT_EQ(std::memcmp(a.data, back.data, kSlot), 0);
}

// A record read before its block was evicted and the slot reused (a promotion that waited
// for a host page) reads nothing: a miss, no checksum failure, the new block untouched.
TEST_F(NvmeTierTest, AStaleRecordAfterItsSlotWasReusedIsAMiss) {
  auto t = Open(1, Durability::kRelaxed, "", /*high=*/0.99, /*low=*/0.5);
  Page a(5), b(6), back(0);
  ASSERT_TRUE(Spill(t.get(), "old", a).ok());
  const BlockRecord stale = Find(t.get(), "old");
  t->Drop("old", stale.slot);
  Settle(t.get());
  auto slot = Spill(t.get(), "new", b);
  ASSERT_TRUE(slot.ok()) << slot.status().ToString();
  ASSERT_EQ(*slot, stale.slot) << "one slot: it must have been reused";
  EXPECT_EQ(Fetch(t.get(), "old", stale, back).code(), StatusCode::kNotFound);
  EXPECT_EQ(t->counters().checksum_failures, 0u);
  Settle(t.get());
  ASSERT_TRUE(Fetch(t.get(), "new", Find(t.get(), "new"), back).ok());
  EXPECT_EQ(std::memcmp(b.data, back.data, kSlot), 0);
}

// A block dropped while a read of it is in flight keeps its slot until the read is done,
// so the read sees the bytes it asked for and verifies.
TEST_F(NvmeTierTest, ASlotIsNotReusedWhileAReadOfItIsInFlight) {
  auto t = Open(2, Durability::kRelaxed, "", /*high=*/0.99, /*low=*/0.1);
  Page a(7), c1(8), c2(9), back(0);
  ASSERT_TRUE(Spill(t.get(), "a", a).ok());
  const BlockRecord rec = Find(t.get(), "a");
  bool fetched = false;
  Status fetch_status;
  t->Fetch("a", rec, back.span(), -1, [&](Status s) {
    fetch_status = s;
    fetched = true;
  });
  t->Drop("a", rec.slot);
  // Let the index apply the delete without reaping the read (no OnIoReady).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (t->pending_operations() > 1 && std::chrono::steady_clock::now() < deadline) loop_.RunPosted();
  ASSERT_EQ(t->pending_operations(), 1u) << "only the read is left";
  ASSERT_FALSE(fetched);
  EXPECT_EQ(t->Counts().free, 1u) << "the dropped slot is not free while it is read";
  // Two spills now: one gets the other slot, the second finds none.
  Status first, second;
  int answered = 0;
  t->Spill("c1", BlockRecord{0, static_cast<uint32_t>(kSlot)}, c1.span(), -1, [&](Status s, uint32_t) {
    first = s;
    ++answered;
  });
  t->Spill("c2", BlockRecord{0, static_cast<uint32_t>(kSlot)}, c2.span(), -1, [&](Status s, uint32_t) {
    second = s;
    ++answered;
  });
  ASSERT_TRUE(loop_.Pump(t.get(), [&] { return fetched && answered == 2; }));
  EXPECT_TRUE(fetch_status.ok()) << fetch_status.ToString();
  EXPECT_EQ(std::memcmp(a.data, back.data, kSlot), 0);
  EXPECT_TRUE(first.ok()) << first.ToString();
  EXPECT_EQ(second.code(), StatusCode::kUnavailable) << "the slot being read was handed out";
  Settle(t.get());
  const NvmeCounts c = t->Counts();
  EXPECT_EQ(c.free, 1u) << "the read done, the slot is free again";
  EXPECT_EQ(c.free + c.inflight + c.cached, c.capacity);
}

struct FaultCase {
  const char* spec;
  Durability durability;
};

class NvmeFaultTest : public NvmeTierTest, public ::testing::WithParamInterface<FaultCase> {};

TEST_P(NvmeFaultTest, AFailedWriteOrSyncIsNeverIndexedAndTheTierRecovers) {
  auto t = Open(16, GetParam().durability, GetParam().spec);
  Page a(5), b(6), back(0);
  auto first = Spill(t.get(), "fails", a);
  EXPECT_FALSE(first.ok()) << GetParam().spec;
  Settle(t.get());
  EXPECT_FALSE(t->Find("fails")->has_value()) << "indexed after a failed write or sync";
  NvmeCounts c = t->Counts();
  EXPECT_EQ(c.cached, 0u);
  EXPECT_EQ(c.free, c.capacity) << "the slot of the failed spill came back";
  EXPECT_GE(t->counters().io_errors, 1u);
  EXPECT_FALSE(t->spill_available()) << "backs off after an I/O error";
  // After the back-off the next spill goes through.
  ASSERT_TRUE(loop_.Pump(t.get(), [&] { return t->spill_available(); }));
  auto second = Spill(t.get(), "works", b);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_TRUE(Fetch(t.get(), "works", Find(t.get(), "works"), back).ok());
  EXPECT_EQ(std::memcmp(b.data, back.data, kSlot), 0);
}

INSTANTIATE_TEST_SUITE_P(Faults, NvmeFaultTest,
                         ::testing::Values(FaultCase{"write:1:eio", Durability::kStrict},
                                           FaultCase{"write:1:enospc", Durability::kStrict},
                                           FaultCase{"write:1:short", Durability::kRelaxed},
                                           FaultCase{"write:1:eagain", Durability::kRelaxed},
                                           FaultCase{"sync:1:eio", Durability::kStrict}),
                         [](const auto& info) {
                           std::string n = info.param.spec;
                           for (char& ch : n) {
                             if (ch == ':') ch = '_';
                           }
                           return n;
                         });

// The sweep: every fault kind at the Nth I/O of its type for N = 1..6, over a run of
// spills. Whatever fails is never indexed (now or after reopening), whatever succeeded
// reads back exactly, and nothing crashes.
TEST_F(NvmeTierTest, FaultsAtTheNthIoNeverIndexAFailedSpill) {
  const std::pair<const char*, Durability> kinds[] = {{"write:%d:eio", Durability::kStrict},
                                                      {"write:%d:enospc", Durability::kStrict},
                                                      {"write:%d:short", Durability::kRelaxed},
                                                      {"write:%d:eagain", Durability::kRelaxed},
                                                      {"sync:%d:eio", Durability::kStrict}};
  int cases = 0, failures = 0;
  for (const auto& [pattern, durability] : kinds) {
    for (int n = 1; n <= 6; ++n) {
      char spec[32];
      std::snprintf(spec, sizeof(spec), pattern, n);
      std::filesystem::remove_all(dir_.File("index"));
      std::filesystem::remove(dir_.File("slots0"));
      std::vector<std::string> ok, failed;
      std::vector<std::vector<uint8_t>> bytes;
      {
        auto t = Open(16, durability, spec);
        ASSERT_NE(t, nullptr) << spec;
        for (int i = 0; i < 8; ++i) {
          ASSERT_TRUE(loop_.Pump(t.get(), [&] { return t->spill_available(); })) << spec;
          Page p(static_cast<uint8_t>(40 + i));
          const std::string key = std::string(spec) + "/" + std::to_string(i);
          if (Spill(t.get(), key, p).ok()) {
            ok.push_back(key);
            bytes.emplace_back(p.data, p.data + kSlot);
          } else {
            failed.push_back(key);
          }
        }
        Settle(t.get());
        EXPECT_FALSE(failed.empty()) << spec << ": the fault never fired";
        for (const auto& k : failed)
          EXPECT_FALSE(t->Find(k)->has_value()) << spec << ": " << k << " indexed after failing";
      }
      // Reopened, as after a restart: the same answer.
      auto t = Open(16, durability);
      ASSERT_NE(t, nullptr);
      for (const auto& k : failed) EXPECT_FALSE(t->Find(k)->has_value()) << spec << " reopened: " << k;
      for (size_t i = 0; i < ok.size(); ++i) {
        Page back(0);
        ASSERT_TRUE(Fetch(t.get(), ok[i], Find(t.get(), ok[i]), back).ok()) << spec << ": " << ok[i];
        EXPECT_EQ(std::memcmp(back.data, bytes[i].data(), kSlot), 0) << spec << ": " << ok[i];
      }
      ++cases;
      failures += static_cast<int>(failed.size());
    }
  }
  EXPECT_EQ(cases, 30);
  RecordProperty("failed_spills", std::to_string(failures));
}

TEST_F(NvmeTierTest, AReadErrorIsAMissAndDropsTheEntry) {
  auto t = Open(16, Durability::kRelaxed, "read:1:eio");
  Page a(7), back(0);
  ASSERT_TRUE(Spill(t.get(), "k", a).ok());
  EXPECT_FALSE(Fetch(t.get(), "k", Find(t.get(), "k"), back).ok());
  Settle(t.get());
  EXPECT_FALSE(t->Find("k")->has_value());
}

TEST_F(NvmeTierTest, ReopenFindsEveryBlockAndRebuildsOccupancy) {
  std::vector<std::vector<uint8_t>> want;
  {
    auto t = Open(16);
    for (int i = 0; i < 10; ++i) {
      Page p(static_cast<uint8_t>(10 + i));
      ASSERT_TRUE(Spill(t.get(), "k" + std::to_string(i), p).ok());
      want.emplace_back(p.data, p.data + kSlot);
    }
  }
  auto t = Open(16);
  NvmeCounts c = t->Counts();
  EXPECT_EQ(c.cached, 10u);
  EXPECT_EQ(c.free, 6u);
  for (int i = 0; i < 10; ++i) {
    Page back(0);
    const std::string key = "k" + std::to_string(i);
    ASSERT_TRUE(Fetch(t.get(), key, Find(t.get(), key), back).ok()) << key;
    EXPECT_EQ(std::memcmp(want[i].data(), back.data, kSlot), 0) << key;
  }
  // New spills use the free slots, never an occupied one.
  Page extra(99);
  auto slot = Spill(t.get(), "new", extra);
  ASSERT_TRUE(slot.ok());
  for (int i = 0; i < 10; ++i) EXPECT_NE(Find(t.get(), "k" + std::to_string(i)).slot, *slot);
}

TEST_F(NvmeTierTest, ChangedGeometryDiscardsTheOldIndex) {
  {
    auto t = Open(16);
    Page p(1);
    ASSERT_TRUE(Spill(t.get(), "k", p).ok());
  }
  auto t = Open(32);  // more slots: another geometry
  EXPECT_FALSE(t->Find("k")->has_value());
  EXPECT_EQ(t->Counts().cached, 0u);
}

TEST_F(NvmeTierTest, AboveTheHighWatermarkTheColdestBlocksGo) {
  auto t = Open(10, Durability::kRelaxed, "", /*high=*/0.8, /*low=*/0.5);
  std::vector<std::string> dropped;
  t->SetDropListener([&](const std::string& k, uint32_t) { dropped.push_back(k); });
  for (int i = 0; i < 8; ++i) {
    Page p(static_cast<uint8_t>(i));
    ASSERT_TRUE(Spill(t.get(), "k" + std::to_string(i), p).ok());
  }
  Settle(t.get());
  EXPECT_TRUE(dropped.empty());
  t->Touch(Find(t.get(), "k0").slot);  // k0 is hot now
  Page p(42);
  ASSERT_TRUE(Spill(t.get(), "k8", p).ok());  // 9 of 10 > 0.8: drop down to 5
  Settle(t.get());
  EXPECT_EQ(t->Counts().cached, 5u);
  EXPECT_EQ(t->counters().evictions, 4u);
  EXPECT_TRUE(t->Find("k0")->has_value()) << "a touched block was evicted first";
  for (int i = 1; i <= 4; ++i) EXPECT_FALSE(t->Find("k" + std::to_string(i))->has_value()) << i;
  EXPECT_EQ(dropped.size(), 4u);
}

TEST_F(NvmeTierTest, VerifyScrubsAndDropsWhatFails) {
  auto t = Open(16);
  std::vector<uint32_t> slots;
  for (int i = 0; i < 4; ++i) {
    Page p(static_cast<uint8_t>(i + 1));
    slots.push_back(*Spill(t.get(), "v" + std::to_string(i), p));
  }
  int fd = ::open(dir_.File("slots0").c_str(), O_RDWR);
  const uint8_t junk[16] = {0xde, 0xad};
  ASSERT_EQ(::pwrite(fd, junk, sizeof(junk), slots[2] * kSlot), 16);
  ::close(fd);
  VerifyReport report;
  bool done = false;
  t->Verify([&](VerifyReport r) {
    report = r;
    done = true;
  });
  ASSERT_TRUE(loop_.Pump(t.get(), [&] { return done; }));
  EXPECT_TRUE(report.status.ok());
  EXPECT_EQ(report.checked, 4u);
  EXPECT_EQ(report.dropped, 1u);
  Settle(t.get());
  EXPECT_FALSE(t->Find("v2")->has_value());
  EXPECT_TRUE(t->Find("v3")->has_value());
}

// ---- a full file system under the index ------------------------------------------------

// The index's writes refused as on a full disk (injected under RocksDB, no mount): the
// failure is counted once, spilling stops with the index marked unwritable while indexed
// blocks stay readable, and once there is room again the index is reopened (tried every
// 5 s) and spills are indexed again.
TEST_F(NvmeTierTest, AnIndexOnAFullFileSystemStopsSpillsAndRecoversWithRoom) {
  auto fs = std::make_shared<testing::FullableFileSystem>();
  index_fs_ = fs;
  auto t = Open(16, Durability::kStrict);
  ASSERT_NE(t, nullptr);
  Page p(3), back(0);
  ASSERT_TRUE(Spill(t.get(), "before", p).ok());
  Settle(t.get());
  const BlockRecord before = Find(t.get(), "before");
  fs->SetFull(true);
  for (int i = 0; i < 8 && t->index_writable(); ++i) {
    (void)Spill(t.get(), "full" + std::to_string(i), p);
    Settle(t.get());
  }
  EXPECT_GT(fs->refused(), 0u);
  ASSERT_FALSE(t->index_writable()) << "the index never met the full disk";
  EXPECT_GE(t->counters().index_errors, 1u);
  EXPECT_FALSE(Spill(t.get(), "refused", p).ok()) << "a spill was taken while the index cannot be written";
  EXPECT_TRUE(Fetch(t.get(), "before", before, back).ok()) << "an indexed block stopped being served";
  EXPECT_EQ(std::memcmp(back.data, p.data, kSlot), 0);
  fs->SetFull(false);
  ASSERT_TRUE(loop_.Pump(
      t.get(),
      [&] {
        t->Maintain();
        return t->index_writable();
      },
      std::chrono::seconds(20)))
      << "the index did not come back with room";
  ASSERT_TRUE(Spill(t.get(), "after", p).ok());
  Settle(t.get());
  EXPECT_EQ(Find(t.get(), "after").length, kSlot);
}

// ---- owners (per-tenant NVMe limits) ----------------------------------------------------

// Keys "a|..." are owner 1's, "b|..." owner 2's, anything else owner 0's.
NvmeOwners TwoOwners(uint32_t quota_a, uint32_t reserve_b) {
  NvmeOwners o;
  o.owner_of = [](std::string_view key) -> uint16_t {
    return key.substr(0, 2) == "a|" ? 1 : key.substr(0, 2) == "b|" ? 2 : 0;
  };
  o.quota_slots = {0, quota_a, 0};
  o.reserve_slots = {0, 0, reserve_b};
  return o;
}

TEST_F(NvmeTierTest, AnOwnerPastItsQuotaGivesUpItsOwnColdestBlocks) {
  auto t = Open(16, Durability::kRelaxed, "", 0.95, 0.9, TwoOwners(4, 0));
  Page p(5);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(Spill(t.get(), "b|" + std::to_string(i), p).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(Spill(t.get(), "a|" + std::to_string(i), p).ok()) << i;
  Settle(t.get());
  EXPECT_EQ(t->held_by(1), 4u);
  EXPECT_EQ(t->held_by(2), 6u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(t->Find("a|" + std::to_string(i))->has_value(), i >= 6) << i;
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(t->Find("b|" + std::to_string(i))->has_value()) << i;
  EXPECT_EQ(t->counters().quota_refusals, 0u);
  const NvmeCounts c = t->Counts();
  EXPECT_EQ(c.free + c.inflight + c.cached, c.capacity);
}

TEST_F(NvmeTierTest, TheWatermarkNeverTakesAnOwnerBelowItsReserve) {
  // 16 slots, dropping above 12 down to 8; owner 2 keeps 6 whatever owner 1 does.
  auto t = Open(16, Durability::kRelaxed, "", 0.75, 0.5, TwoOwners(0, 6));
  Page p(6);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(Spill(t.get(), "b|" + std::to_string(i), p).ok());
  for (int i = 0; i < 40; ++i) (void)Spill(t.get(), "a|" + std::to_string(i), p);
  Settle(t.get());
  EXPECT_EQ(t->held_by(2), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(t->Find("b|" + std::to_string(i))->has_value()) << i;
  EXPECT_TRUE(t->Find("a|39")->has_value());
  EXPECT_LE(t->held_by(1) + t->held_by(2), 13u);
  // Without the reserve the same flood takes owner 2's blocks too.
  t.reset();
  std::filesystem::remove_all(dir_.File("index"));
  std::filesystem::remove(dir_.File("slots0"));
  t = Open(16, Durability::kRelaxed, "", 0.75, 0.5, TwoOwners(0, 0));
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(Spill(t.get(), "b|" + std::to_string(i), p).ok());
  for (int i = 0; i < 40; ++i) (void)Spill(t.get(), "a|" + std::to_string(i), p);
  Settle(t.get());
  EXPECT_LT(t->held_by(2), 6u);
}

TEST_F(NvmeTierTest, OwnersAreCountedAgainAfterARestart) {
  auto opts = TwoOwners(3, 2);
  auto t = Open(16, Durability::kStrict, "", 0.95, 0.9, opts);
  Page p(7);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Spill(t.get(), "a|" + std::to_string(i), p).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(Spill(t.get(), "b|" + std::to_string(i), p).ok());
  ASSERT_TRUE(Spill(t.get(), "c|0", p).ok());
  Settle(t.get());
  t.reset();
  t = Open(16, Durability::kStrict, "", 0.95, 0.9, opts);
  EXPECT_EQ(t->held_by(0), 1u);
  EXPECT_EQ(t->held_by(1), 3u);
  EXPECT_EQ(t->held_by(2), 2u);
  // Still at its quota: a fourth block of owner 1 takes the place of its coldest.
  ASSERT_TRUE(Spill(t.get(), "a|3", p).ok());
  Settle(t.get());
  EXPECT_EQ(t->held_by(1), 3u);
  EXPECT_FALSE(t->Find("a|0")->has_value());
}

}  // namespace
}  // namespace kvtier
