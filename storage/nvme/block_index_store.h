#pragma once
// BlockIndexStore: the persistent index of blocks on the NVMe tier.
//
// Entries: block key (namespace ‖ hash) -> BlockRecord (slot, length, checksum, parent,
// layout fingerprint, last access, hit count), plus the reverse slot -> block key so the
// tier can evict a slot without holding every key in RAM, plus a few named meta values.
// A put or delete of a block writes both directions in one atomic batch.
//
// Implementations: RocksDbBlockIndexStore (the daemon's), MemBlockIndexStore (tests and
// index-less runs). Both are thread-safe: the control thread reads, the index writer
// thread applies batches, a loader thread scans.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/base/status.h"

namespace rocksdb {
class FileSystem;
}  // namespace rocksdb

namespace kvtier {

struct BlockRecord {
  uint32_t slot = 0;
  uint32_t length = 0;    // bytes of block data in the slot
  uint64_t checksum = 0;  // XXH3-64 of the data, seeded with XXH3-64 of the block key
  std::string parent;     // parent hash bytes, empty for a first block
  std::string layout_fingerprint;
  uint32_t last_access = 0;  // Unix seconds
  uint32_t hit_count = 0;
  // How the bytes are stored: 0 as the engine wrote them; 1 int8 and 2 fp8-e4m3 codes with
  // one scale per row (kernels/kv_layout.h: QuantizedBlockBytes), `length` being that size.
  uint8_t quantization = 0;

  std::string Encode() const;
  // kDataLoss for bytes that are not an encoded record.
  static Result<BlockRecord> Decode(std::string_view bytes);
  // Decode into `*rec`, reusing its strings' memory (a scan over millions of records).
  static Status DecodeInto(std::string_view bytes, BlockRecord* rec);
};

// The checksum a block's bytes must have under `key`: a slot reused for another block
// never verifies for the old key. XXH3-64 of the bytes, seeded with XXH3-64 of the key:
// part of what is stored (index records, remote values), so it never changes form.
uint64_t BlockChecksum(std::string_view key, std::span<const uint8_t> data);

// One change to the index. Everything but kPut is conditional on the entry as it stands
// when the batch is applied (after the batch's earlier mutations): a mutation about
// (key, record.slot) leaves alone an entry of `key` that names another slot by then, since
// that entry is newer (the block was spilled again) and must not lose its data or recency.
struct IndexMutation {
  enum class Kind : uint8_t {
    kPut,           // block entry and slot -> key
    kDelete,        // slot -> key; the block entry too if it names record.slot
    kPutRecord,     // block entry (last access, hit count) if it still names record.slot
    kDeleteRecord,  // block entry if it names record.slot (the slot is someone else's now)
  };
  Kind kind = Kind::kPut;
  std::string key;
  BlockRecord record;  // kDelete, kDeleteRecord: only record.slot is used
};

// The plain writes a batch comes to, its conditions resolved in order: `slot_of(key)` is
// the slot the stored entry of `key` names (nullopt: none), shadowed by the batch's own
// earlier writes. For BlockIndexStore implementations.
struct IndexWrite {
  enum class Op : uint8_t { kPutSlot, kDeleteSlot, kPutRecord, kDeleteRecord };
  Op op;
  const IndexMutation* mutation;
};
Result<std::vector<IndexWrite>> ResolveIndexMutations(
    std::span<const IndexMutation> batch,
    const std::function<Result<std::optional<uint32_t>>(const std::string& key)>& slot_of);

class BlockIndexStore {
 public:
  virtual ~BlockIndexStore() = default;

  virtual std::string_view name() const = 0;
  virtual Result<std::optional<BlockRecord>> Get(std::string_view key) = 0;
  // One entry per key, nullopt where absent.
  virtual Result<std::vector<std::optional<BlockRecord>>> MultiGet(std::span<const std::string> keys) = 0;
  virtual Result<std::optional<std::string>> KeyOfSlot(uint32_t slot) = 0;
  // Applies the batch atomically; with `sync`, durably (WAL synced) before returning.
  virtual Status Apply(std::span<const IndexMutation> batch, bool sync) = 0;
  // Calls fn(key, record) for every block in key order over a consistent snapshot, until
  // fn returns false.
  virtual Status Scan(const std::function<bool(std::string_view, const BlockRecord&)>& fn) = 0;
  virtual Result<std::optional<std::string>> GetMeta(std::string_view name) = 0;
  virtual Status PutMeta(std::string_view name, std::string_view value) = 0;
  // Removes every block (the files no longer match the index).
  virtual Status Clear() = 0;
  // Persists buffered writes so the next open replays nothing.
  virtual Status Flush() = 0;
  // After a write failed (a full or failing disk): clears the store's error state so
  // writes may be tried again; fails while the cause remains. Callers stop writing after
  // the first failure and call this before the next write.
  virtual Status Resume() = 0;
  // Approximate RAM held (caches, memtables, filters).
  virtual uint64_t MemoryUsage() = 0;
  // Flushes, then brings the store to the settled shape its background work would reach
  // in time (RocksDB: a full compaction). For a bulk load (kvtier-bench restart writes a
  // drive's worth of entries at once, where a daemon writes them over hours).
  virtual Status Compact() { return Flush(); }
};

struct RocksDbIndexOptions {
  std::string path;
  uint64_t block_cache_bytes = 16ull << 20;  // Default: 16 MiB
  uint64_t write_buffer_bytes = 8ull << 20;  // Default: 8 MiB
  // The file system the index's files are written through; null: the machine's. Tests
  // wrap it to inject faults (tests/support/fault_file_system.h).
  std::shared_ptr<rocksdb::FileSystem> file_system;
};

Result<std::unique_ptr<BlockIndexStore>> OpenRocksDbBlockIndexStore(const RocksDbIndexOptions& options);
std::unique_ptr<BlockIndexStore> NewMemBlockIndexStore();

}  // namespace kvtier
