// One conformance suite for every BlockIndexStore.
#include "storage/nvme/block_index_store.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

#include "tests/support/test_util.h"

namespace kvtier {
namespace {

BlockRecord Rec(uint32_t slot) {
  BlockRecord r;
  r.slot = slot;
  r.length = 4096 + slot;
  r.checksum = 0x1234567890ull * (slot + 1);
  r.parent = std::string(16, static_cast<char>(slot));
  r.layout_fingerprint = std::string(16, 'f');
  r.last_access = 1000 + slot;
  r.hit_count = slot * 2;
  return r;
}

class BlockIndexStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { Open(); }
  void Open() {
    store_.reset();
    if (GetParam() == "memory") {
      if (!mem_) mem_ = NewMemBlockIndexStore();
      return;
    }
    RocksDbIndexOptions o;
    o.path = dir_.File("index");
    auto s = OpenRocksDbBlockIndexStore(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
  }
  BlockIndexStore& S() { return store_ ? *store_ : *mem_; }
  static IndexMutation Mutation(IndexMutation::Kind kind, const std::string& key, uint32_t slot) {
    IndexMutation m{kind, key, {}};
    m.record.slot = slot;
    return m;
  }
  Status Put(const std::string& key, uint32_t slot) {
    return S().Apply(std::vector<IndexMutation>{{IndexMutation::Kind::kPut, key, Rec(slot)}}, true);
  }

  testing::TempDir dir_;
  std::unique_ptr<BlockIndexStore> store_;
  std::unique_ptr<BlockIndexStore> mem_;
};

TEST_P(BlockIndexStoreTest, RecordsRoundTrip) {
  ASSERT_TRUE(Put("key-a", 7).ok());
  auto r = S().Get("key-a");
  ASSERT_TRUE(r.ok() && r->has_value());
  const BlockRecord& got = **r;
  const BlockRecord want = Rec(7);
  EXPECT_EQ(got.slot, want.slot);
  EXPECT_EQ(got.length, want.length);
  EXPECT_EQ(got.checksum, want.checksum);
  EXPECT_EQ(got.parent, want.parent);
  EXPECT_EQ(got.layout_fingerprint, want.layout_fingerprint);
  EXPECT_EQ(got.last_access, want.last_access);
  EXPECT_EQ(got.hit_count, want.hit_count);
  EXPECT_FALSE(S().Get("key-b")->has_value());
  EXPECT_EQ(**S().KeyOfSlot(7), "key-a");
  EXPECT_FALSE(S().KeyOfSlot(8)->has_value());
}

TEST(BlockRecord, TheQuantizationFieldIsOptionalOnTheWire) {
  BlockRecord full = Rec(3);
  const std::string old_form = full.Encode();  // as written before the field existed
  auto back = BlockRecord::Decode(old_form);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->quantization, 0);
  for (uint8_t q : {1, 2}) {
    BlockRecord r = Rec(4);
    r.quantization = q;
    const std::string bytes = r.Encode();
    EXPECT_EQ(bytes.size(), old_form.size() + 1);
    auto d = BlockRecord::Decode(bytes);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->quantization, q);
    EXPECT_EQ(d->checksum, r.checksum);
  }
  // An unknown form, or bytes after it, is corruption: never read as something else.
  EXPECT_EQ(BlockRecord::Decode(old_form + '\x03').status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(BlockRecord::Decode(old_form + std::string("\x01\x00", 2)).status().code(), StatusCode::kDataLoss);
}

TEST_P(BlockIndexStoreTest, DeleteRemovesBothDirectionsAndRecordOnlyKeepsTheSlot) {
  ASSERT_TRUE(Put("a", 1).ok());
  ASSERT_TRUE(Put("b", 2).ok());
  IndexMutation del{IndexMutation::Kind::kDelete, "a", {}};
  del.record.slot = 1;
  ASSERT_TRUE(S().Apply(std::vector<IndexMutation>{del}, false).ok());
  EXPECT_FALSE(S().Get("a")->has_value());
  EXPECT_FALSE(S().KeyOfSlot(1)->has_value());
  ASSERT_TRUE(S().Apply(std::vector<IndexMutation>{Mutation(IndexMutation::Kind::kDeleteRecord, "b", 2)}, false).ok());
  EXPECT_FALSE(S().Get("b")->has_value());
  EXPECT_EQ(**S().KeyOfSlot(2), "b") << "a record-only delete must leave the slot map";
}

// A block spilled again lives in a new slot; what is still done about its old slot (a
// delete when that slot is evicted, a hit recorded from an old lookup) must not touch the
// newer entry.
TEST_P(BlockIndexStoreTest, MutationsAboutAnOldSlotLeaveANewerEntryAlone) {
  ASSERT_TRUE(Put("k", 1).ok());
  ASSERT_TRUE(Put("k", 5).ok());  // spilled again
  BlockRecord stale_hit = Rec(1);
  stale_hit.hit_count = 99;
  ASSERT_TRUE(S().Apply(std::vector<IndexMutation>{{IndexMutation::Kind::kPutRecord, "k", stale_hit}}, false).ok());
  ASSERT_EQ((*S().Get("k"))->slot, 5u) << "a hit recorded for the old slot rewrote the entry";
  ASSERT_TRUE(S().Apply(std::vector<IndexMutation>{Mutation(IndexMutation::Kind::kDelete, "k", 1)}, false).ok());
  EXPECT_FALSE(S().KeyOfSlot(1)->has_value()) << "the old slot's map entry goes";
  ASSERT_TRUE(S().Get("k")->has_value()) << "evicting the old slot deleted the newer entry";
  EXPECT_EQ((*S().Get("k"))->slot, 5u);
  ASSERT_TRUE(S().Apply(std::vector<IndexMutation>{Mutation(IndexMutation::Kind::kDeleteRecord, "k", 1)}, false).ok());
  EXPECT_TRUE(S().Get("k")->has_value());
  // About the current slot, they apply.
  BlockRecord hit = Rec(5);
  hit.hit_count = 7;
  ASSERT_TRUE(S().Apply(std::vector<IndexMutation>{{IndexMutation::Kind::kPutRecord, "k", hit}}, false).ok());
  EXPECT_EQ((*S().Get("k"))->hit_count, 7u);
  // In one batch, later mutations see earlier ones: put at 6, then a delete about 5 keeps it.
  ASSERT_TRUE(S().Apply(std::vector<IndexMutation>{{IndexMutation::Kind::kPut, "k", Rec(6)},
                                                   Mutation(IndexMutation::Kind::kDeleteRecord, "k", 5)},
                        false)
                  .ok());
  EXPECT_EQ((*S().Get("k"))->slot, 6u);
  ASSERT_TRUE(S().Apply(std::vector<IndexMutation>{Mutation(IndexMutation::Kind::kDelete, "k", 6)}, false).ok());
  EXPECT_FALSE(S().Get("k")->has_value());
}

TEST_P(BlockIndexStoreTest, MultiGetScanMetaAndClear) {
  for (uint32_t i = 0; i < 50; ++i) ASSERT_TRUE(Put("k" + std::to_string(100 + i), i).ok());
  std::vector<std::string> keys = {"k100", "nope", "k149"};
  auto m = S().MultiGet(keys);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ((*m)[0]->slot, 0u);
  EXPECT_FALSE((*m)[1].has_value());
  EXPECT_EQ((*m)[2]->slot, 49u);
  size_t n = 0;
  std::string prev;
  ASSERT_TRUE(S().Scan([&](std::string_view k, const BlockRecord&) {
                   EXPECT_LT(prev, std::string(k));
                   prev = std::string(k);
                   ++n;
                   return true;
                 })
                  .ok());
  EXPECT_EQ(n, 50u);
  ASSERT_TRUE(S().PutMeta("geometry", "g1").ok());
  EXPECT_EQ(**S().GetMeta("geometry"), "g1");
  ASSERT_TRUE(S().Clear().ok());
  n = 0;
  ASSERT_TRUE(S().Scan([&](std::string_view, const BlockRecord&) { return ++n, true; }).ok());
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(**S().GetMeta("geometry"), "g1") << "Clear keeps meta";
}

TEST_P(BlockIndexStoreTest, SurvivesReopen) {
  ASSERT_TRUE(Put("durable", 3).ok());
  ASSERT_TRUE(S().Flush().ok());
  Open();
  auto r = S().Get("durable");
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->slot, 3u);
}

INSTANTIATE_TEST_SUITE_P(Stores, BlockIndexStoreTest, ::testing::Values("rocksdb", "memory"),
                         [](const auto& info) { return info.param; });

TEST(BlockRecord, CorruptBytesAreDataLoss) {
  EXPECT_EQ(BlockRecord::Decode("").status().code(), StatusCode::kDataLoss);
  std::string e = Rec(1).Encode();
  EXPECT_TRUE(BlockRecord::Decode(e).ok());
  EXPECT_FALSE(BlockRecord::Decode(e.substr(0, e.size() - 3)).ok());
  e[0] = 9;  // unknown version
  EXPECT_FALSE(BlockRecord::Decode(e).ok());
}

TEST(BlockChecksum, IsSeededWithTheKey) {
  const uint8_t data[64] = {1, 2, 3};
  EXPECT_NE(BlockChecksum("key-1", data), BlockChecksum("key-2", data));
  EXPECT_EQ(BlockChecksum("key-1", data), BlockChecksum("key-1", data));
}

// Checksums are stored (index records, remote values): whichever code path computes them
// (the library's CPU dispatch), they are XXH3-64 as the portable entry point defines it,
// at every length class XXH3 treats apart and at unaligned starts, so blocks spilled by
// an older daemon or on another CPU still verify.
TEST(BlockChecksum, IsPortableXxh3SeededWithTheKeysXxh3) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf((2u << 20) + 64);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  const std::string key = "ns/0123456789abcdef";
  const uint64_t seed = XXH3_64bits(key.data(), key.size());
  for (size_t len : {size_t{0}, size_t{1}, size_t{3}, size_t{4}, size_t{8}, size_t{9}, size_t{16}, size_t{17},
                     size_t{128}, size_t{129}, size_t{240}, size_t{241}, size_t{1024}, size_t{4095}, size_t{65536 + 7},
                     size_t{256} << 10, size_t{2} << 20}) {
    for (size_t off : {size_t{0}, size_t{1}, size_t{13}, size_t{32}}) {
      const std::span<const uint8_t> data(buf.data() + off, len);
      EXPECT_EQ(BlockChecksum(key, data), XXH3_64bits_withSeed(data.data(), data.size(), seed))
          << "length " << len << ", offset " << off;
    }
  }
}

}  // namespace
}  // namespace kvtier
