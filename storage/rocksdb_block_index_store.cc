// RocksDbBlockIndexStore: BlockIndexStore on RocksDB, the one place rocksdb::Status is
// converted. One column family; key spaces by prefix: 'b' ‖ block key -> record,
// 's' ‖ slot (big-endian) -> block key, 'm' ‖ name -> meta value. Bloom filters make the
// Lookup of an absent key (most of a cold chain) cheap; index and filter blocks live in a
// bounded block cache so RAM does not grow with the number of blocks.
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <filesystem>

#include "storage/block_index_store.h"

namespace kvtier {
namespace {

Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return Status::Ok();
  std::string m = std::string(what) + ": " + s.ToString();
  if (s.IsNotFound()) return NotFound(m);
  if (s.IsCorruption()) return DataLoss(m);
  if (s.IsIOError()) return s.IsNoSpace() ? ResourceExhausted(m) : Internal(m);
  if (s.IsBusy() || s.IsTryAgain() || s.IsTimedOut()) return Unavailable(m);
  if (s.IsInvalidArgument()) return InvalidArgument(m);
  if (s.IsNotSupported()) return Unimplemented(m);
  return Internal(m);
}

std::string BlockKey(std::string_view key) {
  std::string k;
  k.reserve(key.size() + 1);
  k.push_back('b');
  k.append(key);
  return k;
}

std::string SlotKey(uint32_t slot) {
  std::string k(5, '\0');
  k[0] = 's';
  for (int i = 0; i < 4; ++i) k[1 + i] = static_cast<char>(slot >> (8 * (3 - i)));
  return k;
}

std::string MetaKey(std::string_view name) { return "m" + std::string(name); }

class RocksDbBlockIndexStore final : public BlockIndexStore {
 public:
  ~RocksDbBlockIndexStore() override {
    if (db_) {
      (void)db_->Close();
      delete db_;
    }
  }

  Status Open(const RocksDbIndexOptions& o) {
    std::error_code ec;
    std::filesystem::create_directories(o.path, ec);
    if (ec) return Internal("cannot create " + o.path + ": " + ec.message());
    rocksdb::Options opts;
    opts.create_if_missing = true;
    opts.write_buffer_size = o.write_buffer_bytes;
    opts.max_write_buffer_number = 2;
    opts.compression = rocksdb::kNoCompression;
    opts.max_open_files = 512;
    opts.keep_log_file_num = 2;
    opts.max_log_file_size = 4 << 20;
    opts.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
    opts.avoid_flush_during_shutdown = false;
    rocksdb::BlockBasedTableOptions t;
    cache_ = rocksdb::NewLRUCache(o.block_cache_bytes);
    t.block_cache = cache_;
    t.cache_index_and_filter_blocks = true;
    t.pin_l0_filter_and_index_blocks_in_cache = true;
    t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
    t.whole_key_filtering = true;
    opts.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
    return FromRocks(rocksdb::DB::Open(opts, o.path, &db_), "opening the block index at " + o.path);
  }

  std::string_view name() const override { return "rocksdb"; }

  Result<std::optional<BlockRecord>> Get(std::string_view key) override {
    std::string v;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), BlockKey(key), &v);
    if (s.IsNotFound()) return std::optional<BlockRecord>();
    KVTIER_RETURN_IF_ERROR(FromRocks(s, "index get"));
    KVTIER_ASSIGN_OR_RETURN(BlockRecord r, BlockRecord::Decode(v));
    return std::optional<BlockRecord>(std::move(r));
  }

  Result<std::vector<std::optional<BlockRecord>>> MultiGet(std::span<const std::string> keys) override {
    std::vector<std::string> owned;
    owned.reserve(keys.size());
    for (const std::string& k : keys) owned.push_back(BlockKey(k));
    std::vector<rocksdb::Slice> slices(owned.begin(), owned.end());
    std::vector<std::string> values;
    std::vector<rocksdb::Status> st = db_->MultiGet(rocksdb::ReadOptions(), slices, &values);
    std::vector<std::optional<BlockRecord>> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (st[i].IsNotFound()) continue;
      KVTIER_RETURN_IF_ERROR(FromRocks(st[i], "index multiget"));
      auto r = BlockRecord::Decode(values[i]);
      if (r.ok()) out[i] = std::move(r).value();  // a corrupt record is a miss
    }
    return out;
  }

  Result<std::optional<std::string>> KeyOfSlot(uint32_t slot) override {
    std::string v;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), SlotKey(slot), &v);
    if (s.IsNotFound()) return std::optional<std::string>();
    KVTIER_RETURN_IF_ERROR(FromRocks(s, "index slot get"));
    return std::optional<std::string>(std::move(v));
  }

  Status Apply(std::span<const IndexMutation> batch, bool sync) override {
    // Batches are applied by one writer thread, so reading the entries and then writing
    // is not raced by another batch.
    KVTIER_ASSIGN_OR_RETURN(
        auto writes, ResolveIndexMutations(batch, [this](const std::string& key) -> Result<std::optional<uint32_t>> {
          auto r = Get(key);
          if (!r.ok() && r.status().code() == StatusCode::kDataLoss) return std::optional<uint32_t>();  // a miss
          KVTIER_RETURN_IF_ERROR(r.status());
          return *r ? std::optional<uint32_t>((*r)->slot) : std::nullopt;
        }));
    rocksdb::WriteBatch wb;
    for (const IndexWrite& w : writes) {
      const IndexMutation& m = *w.mutation;
      switch (w.op) {
        case IndexWrite::Op::kPutSlot:
          wb.Put(SlotKey(m.record.slot), m.key);
          break;
        case IndexWrite::Op::kDeleteSlot:
          wb.Delete(SlotKey(m.record.slot));
          break;
        case IndexWrite::Op::kPutRecord:
          wb.Put(BlockKey(m.key), m.record.Encode());
          break;
        case IndexWrite::Op::kDeleteRecord:
          wb.Delete(BlockKey(m.key));
          break;
      }
    }
    rocksdb::WriteOptions wo;
    wo.sync = sync;
    return FromRocks(db_->Write(wo, &wb), "index write");
  }

  Status Scan(const std::function<bool(std::string_view, const BlockRecord&)>& fn) override {
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;  // a full scan must not evict what lookups need
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
    for (it->Seek("b"); it->Valid() && it->key().starts_with("b"); it->Next()) {
      auto r = BlockRecord::Decode(std::string_view(it->value().data(), it->value().size()));
      if (!r.ok()) continue;
      if (!fn(std::string_view(it->key().data() + 1, it->key().size() - 1), *r)) break;
    }
    return FromRocks(it->status(), "index scan");
  }

  Result<std::optional<std::string>> GetMeta(std::string_view name) override {
    std::string v;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), MetaKey(name), &v);
    if (s.IsNotFound()) return std::optional<std::string>();
    KVTIER_RETURN_IF_ERROR(FromRocks(s, "index meta get"));
    return std::optional<std::string>(std::move(v));
  }

  Status PutMeta(std::string_view name, std::string_view value) override {
    rocksdb::WriteOptions wo;
    wo.sync = true;
    return FromRocks(db_->Put(wo, MetaKey(name), rocksdb::Slice(value.data(), value.size())), "index meta put");
  }

  Status Clear() override {
    rocksdb::WriteBatch wb;
    wb.DeleteRange("b", "c");
    wb.DeleteRange("s", "t");
    rocksdb::WriteOptions wo;
    wo.sync = true;
    KVTIER_RETURN_IF_ERROR(FromRocks(db_->Write(wo, &wb), "index clear"));
    return FromRocks(db_->CompactRange(rocksdb::CompactRangeOptions(), nullptr, nullptr), "index compact");
  }

  Status Flush() override { return FromRocks(db_->Flush(rocksdb::FlushOptions()), "index flush"); }

  uint64_t MemoryUsage() override {
    uint64_t mem = 0, readers = 0;
    db_->GetAggregatedIntProperty("rocksdb.size-all-mem-tables", &mem);
    db_->GetAggregatedIntProperty("rocksdb.estimate-table-readers-mem", &readers);
    return mem + readers + cache_->GetUsage();
  }

 private:
  rocksdb::DB* db_ = nullptr;
  std::shared_ptr<rocksdb::Cache> cache_;
};

}  // namespace

Result<std::unique_ptr<BlockIndexStore>> OpenRocksDbBlockIndexStore(const RocksDbIndexOptions& options) {
  auto s = std::make_unique<RocksDbBlockIndexStore>();
  KVTIER_RETURN_IF_ERROR(s->Open(options));
  return std::unique_ptr<BlockIndexStore>(std::move(s));
}

}  // namespace kvtier
