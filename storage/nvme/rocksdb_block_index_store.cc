// RocksDbBlockIndexStore: BlockIndexStore on RocksDB, the one place rocksdb::Status is
// converted. One column family; key spaces by prefix: 'b' ‖ block key -> record,
// 's' ‖ slot (big-endian) -> block key, 'm' ‖ name -> meta value. Bloom filters make the
// Lookup of an absent key (most of a cold chain) cheap; index and filter blocks live in a
// bounded block cache so RAM does not grow with the number of blocks.
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <filesystem>
#include <mutex>
#include <shared_mutex>

#include "protocol/base/mutex.h"
#include "storage/nvme/block_index_store.h"

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
    WriterLock lock(&mu_);
    CloseDb();
  }

  Status Open(const RocksDbIndexOptions& o) {
    WriterLock lock(&mu_);
    options_ = o;
    return OpenDb();
  }

  std::string_view name() const override { return "rocksdb"; }

  Result<std::optional<BlockRecord>> Get(std::string_view key) override {
    ReaderLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(Available());
    return GetLocked(key);
  }

  Result<std::optional<BlockRecord>> GetLocked(std::string_view key) KVTIER_REQUIRES_SHARED(mu_) {
    std::string v;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), BlockKey(key), &v);
    if (s.IsNotFound()) return std::optional<BlockRecord>();
    KVTIER_RETURN_IF_ERROR(FromRocks(s, "index get"));
    KVTIER_ASSIGN_OR_RETURN(BlockRecord r, BlockRecord::Decode(v));
    return std::optional<BlockRecord>(std::move(r));
  }

  Result<std::vector<std::optional<BlockRecord>>> MultiGet(std::span<const std::string> keys) override {
    ReaderLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(Available());
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
    ReaderLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(Available());
    std::string v;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), SlotKey(slot), &v);
    if (s.IsNotFound()) return std::optional<std::string>();
    KVTIER_RETURN_IF_ERROR(FromRocks(s, "index slot get"));
    return std::optional<std::string>(std::move(v));
  }

  Status Apply(std::span<const IndexMutation> batch, bool sync) override {
    ReaderLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(Available());
    // Batches are applied by one writer thread, so reading the entries and then writing
    // is not raced by another batch.
    KVTIER_ASSIGN_OR_RETURN(
        auto writes, ResolveIndexMutations(batch, [this](const std::string& key) -> Result<std::optional<uint32_t>> {
          mu_.AssertReaderHeld();  // called here, under the lock
          auto r = GetLocked(key);
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
    ReaderLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(Available());
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;         // a full scan must not evict what lookups need
    ro.readahead_size = 4u << 20;  // sequential: large reads
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
    BlockRecord r;  // reused: no allocation per entry
    for (it->Seek("b"); it->Valid() && it->key().starts_with("b"); it->Next()) {
      if (!BlockRecord::DecodeInto(std::string_view(it->value().data(), it->value().size()), &r).ok()) continue;
      if (!fn(std::string_view(it->key().data() + 1, it->key().size() - 1), r)) break;
    }
    return FromRocks(it->status(), "index scan");
  }

  Result<std::optional<std::string>> GetMeta(std::string_view name) override {
    ReaderLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(Available());
    std::string v;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), MetaKey(name), &v);
    if (s.IsNotFound()) return std::optional<std::string>();
    KVTIER_RETURN_IF_ERROR(FromRocks(s, "index meta get"));
    return std::optional<std::string>(std::move(v));
  }

  Status PutMeta(std::string_view name, std::string_view value) override {
    ReaderLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(Available());
    rocksdb::WriteOptions wo;
    wo.sync = true;
    return FromRocks(db_->Put(wo, MetaKey(name), rocksdb::Slice(value.data(), value.size())), "index meta put");
  }

  Status Clear() override {
    ReaderLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(Available());
    rocksdb::WriteBatch wb;
    wb.DeleteRange("b", "c");
    wb.DeleteRange("s", "t");
    rocksdb::WriteOptions wo;
    wo.sync = true;
    KVTIER_RETURN_IF_ERROR(FromRocks(db_->Write(wo, &wb), "index clear"));
    return FromRocks(db_->CompactRange(rocksdb::CompactRangeOptions(), nullptr, nullptr), "index compact");
  }

  Status Flush() override {
    ReaderLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(Available());
    return FromRocks(db_->Flush(rocksdb::FlushOptions()), "index flush");
  }

  Status Compact() override {
    KVTIER_RETURN_IF_ERROR(Flush());
    ReaderLock lock(&mu_);
    KVTIER_RETURN_IF_ERROR(Available());
    rocksdb::CompactRangeOptions co;
    co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
    return FromRocks(db_->CompactRange(co, nullptr, nullptr), "index compaction");
  }

  // RocksDB stops taking writes after a WAL or flush error (a background error); Resume
  // clears it once the cause is gone, moving to a new WAL. A write must not be retried
  // on the failed one.
  //
  // RocksDB 7.8 cannot: its WAL writer keeps the error and asserts on the next write. So
  // the store is closed and opened again (replaying the WAL up to its last whole record),
  // under the exclusive lock that every other call takes shared.
  Status Resume() override {
    WriterLock lock(&mu_);
    CloseDb();
    return OpenDb();
  }

  uint64_t MemoryUsage() override {
    ReaderLock lock(&mu_);
    if (!db_) return cache_ ? cache_->GetUsage() : 0;
    uint64_t mem = 0, readers = 0;
    db_->GetAggregatedIntProperty("rocksdb.size-all-mem-tables", &mem);
    db_->GetAggregatedIntProperty("rocksdb.estimate-table-readers-mem", &readers);
    return mem + readers + cache_->GetUsage();
  }

 private:
  Status OpenDb() KVTIER_REQUIRES(mu_) {
    const RocksDbIndexOptions& o = options_;
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
    // No preallocation of the log: with it, a full file system surfaces only after up to
    // 1.1 x write_buffer_size more index writes, and the preallocated space is held from
    // the slot files' file system meanwhile. The index's writes are small appends.
    opts.allow_fallocate = false;
    if (o.file_system) {
      if (!env_) env_ = rocksdb::NewCompositeEnv(o.file_system);
      opts.env = env_.get();
    }
    rocksdb::BlockBasedTableOptions t;
    if (!cache_) cache_ = rocksdb::NewLRUCache(o.block_cache_bytes);
    t.block_cache = cache_;
    // Index and filter blocks partitioned (4 KiB each, the top level pinned): a table's
    // whole filter is ~1.2 MiB per million entries, more than one shard of the block
    // cache (16 MiB in 32 shards), so unpartitioned it was read back from the file, and
    // its checksum verified, for nearly every Get: 8,192 lookups of a 1M-entry index took
    // 1.4 s (kvtier-bench cold-index). A Get now reads a partition the cache keeps.
    t.cache_index_and_filter_blocks = true;
    t.cache_index_and_filter_blocks_with_high_priority = true;
    t.pin_l0_filter_and_index_blocks_in_cache = true;
    t.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
    t.partition_filters = true;
    t.metadata_block_size = 4096;
    t.pin_top_level_index_and_filter = true;
    t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
    t.whole_key_filtering = true;
    opts.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
    return FromRocks(rocksdb::DB::Open(opts, o.path, &db_), "opening the block index at " + o.path);
  }
  void CloseDb() KVTIER_REQUIRES(mu_) {
    if (db_) {
      (void)db_->Close();
      delete db_;
      db_ = nullptr;
    }
  }
  // db_ is replaced only by Resume: every other call holds this shared, and fails while
  // no database is open (a Resume that could not reopen it). A scan's callback may call
  // back in (KeyOfSlot): glibc's rwlock prefers readers, so the nested shared lock does
  // not wait behind a Resume.
  Status Available() const KVTIER_REQUIRES_SHARED(mu_) {
    return db_ ? Status::Ok() : Unavailable("the block index at " + options_.path + " is not open (being reopened)");
  }

  RocksDbIndexOptions options_;
  mutable SharedMutex mu_;
  rocksdb::DB* db_ KVTIER_GUARDED_BY(mu_) = nullptr;
  std::shared_ptr<rocksdb::Cache> cache_;
  std::unique_ptr<rocksdb::Env> env_;  // over options_.file_system; outlives db_
};

}  // namespace

Result<std::unique_ptr<BlockIndexStore>> OpenRocksDbBlockIndexStore(const RocksDbIndexOptions& options) {
  auto s = std::make_unique<RocksDbBlockIndexStore>();
  KVTIER_RETURN_IF_ERROR(s->Open(options));
  return std::unique_ptr<BlockIndexStore>(std::move(s));
}

}  // namespace kvtier
