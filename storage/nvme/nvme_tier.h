#pragma once
// NvmeTier: blocks spilled to slot files through an IoEngine, indexed in a
// BlockIndexStore so they survive restarts.
//
// Write order (what makes a crash safe): a block's bytes are written to a free slot (and,
// with durability strict, fdatasync'ed) before its index entry is put; a slot is handed
// out again only after the entry pointing at it is deleted. Every entry carries an XXH3
// checksum seeded with the block key, so bytes that changed on disk — or a slot reused
// for another block whose entry survived a crash — never verify: Fetch then fails with
// kDataLoss, counts a checksum failure and drops the entry. It is a cache: losing an
// entry is allowed, serving wrong bytes is not.
//
// RAM per block stays small: keys live only in the index; the tier keeps a state byte, a
// free-list slot and an eviction-policy node per slot. At Open the index is usable at once
// (Find and Fetch work); a load on the scan thread rebuilds which slots are taken and
// their recency, and only then does the tier accept spills (ready()).
//
// Threads: every method runs on the owner's (control) thread, and callbacks are delivered
// there through the `post` executor given to Open — never from inside the call that
// takes them, so a caller may finish its bookkeeping after starting an operation. Index
// writes run on an internal writer thread (grouped: one synced batch covers many blocks);
// long reads of the whole index (the restart load, the scrub, the top-N scan) run in turn
// on one scan thread (WorkerThread) that the tier owns, stops and joins before anything
// those reads use goes away. Find and FindMany read the index on the caller's thread
// (RocksDB Get/MultiGet: served from the memtable and block cache when hot, from the
// index's files when cold); FindManyAsync reads it on a reader thread of its own, so a
// cold read does not hold the control thread; nothing else waits for I/O.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "protocol/base/clock.h"
#include "protocol/base/operator_reports.h"
#include "protocol/base/post.h"
#include "protocol/base/status.h"
#include "storage/io/io_engine.h"
#include "storage/io/slot_files.h"
#include "storage/io/worker_thread.h"
#include "storage/nvme/block_index_store.h"
#include "storage/nvme/zeroed_array.h"
#include "storage/policy/eviction_policy.h"
#include "storage/policy/shares.h"
#include "storage/pool/page_allocator.h"

namespace kvtier {

class IndexWriter;

// The index meta entry recording the slot geometry the index describes.
inline constexpr const char* kNvmeGeometryMeta = "geometry";

enum class Durability {
  kStrict,   // fdatasync the data and sync the index batch before a spill counts as done
  kRelaxed,  // neither: a crash may lose recent entries (never serve wrong bytes)
};
// The config's words for them (tiers.nvme.durability).
inline constexpr std::pair<std::string_view, Durability> kDurabilityNames[] = {{"strict", Durability::kStrict},
                                                                               {"relaxed", Durability::kRelaxed}};

// The eviction policies an NVMe tier can run (the index keeps no parents, so no prefix
// order).
inline constexpr std::string_view kNvmePolicyNames[] = {"lru", "arc"};

struct NvmeTierOptions {
  std::vector<SlotFileSpec> files;
  uint64_t slot_bytes = 2ull << 20;  // = the host tier's page size
  Durability durability = Durability::kStrict;
  // Above high (fraction of slots in use) the coldest blocks are dropped down to low.
  double high_watermark = 0.95;
  double low_watermark = 0.90;
  std::string policy = "lru";
  // Most bytes per second the scrub (Verify) reads, so a scrub of a large tier leaves the
  // disk to fetches and spills. 0: as fast as the disk goes. Default: 0.
  uint64_t verify_bytes_per_s = 0;
  bool operator==(const NvmeTierOptions&) const = default;
};

// Owners (tenants) of an NVMe tier's slots, for per-owner limits. `owner_of` names the
// owner of a block key: 1..n for owners with limits, 0 for everyone else; it must be
// thread-safe (the restart load calls it on the scan thread). Null (the default): one
// owner, no limits, and no RAM per slot for them. quota_slots[o]: the most slots owner o
// holds (writing or indexed); past it its own coldest block makes room, and a spill with
// none to give fails kResourceExhausted. reserve_slots[o]: what the watermark never takes
// it below (the watermark takes from the owner holding the most above its reserve). 0: no
// limit.
struct NvmeOwners {
  std::function<uint16_t(std::string_view key)> owner_of;
  std::vector<uint32_t> quota_slots, reserve_slots;  // by owner
};

// capacity = free + inflight + cached + lost.
struct NvmeCounts {
  uint32_t capacity = 0, free = 0, inflight = 0, cached = 0;
  uint32_t lost = 0;  // slots of a file deleted or truncated under the daemon: out of use
};

struct NvmeCounters {
  uint64_t spills = 0, spill_bytes = 0, spill_failures = 0;
  uint64_t quota_refusals = 0;  // spills refused: the owner was at its quota with nothing of its own to drop
  uint64_t fetches = 0, fetch_bytes = 0, fetch_failures = 0;
  uint64_t checksum_failures = 0;
  uint64_t io_errors = 0;
  uint64_t index_errors = 0;
  uint64_t files_lost = 0;  // slot files deleted, truncated or replaced while in use
  uint64_t evictions = 0;
  uint64_t syncs = 0;
};

class NvmeTier {
 public:
  using SpillDone = std::function<void(Status, uint32_t slot)>;
  using Done = std::function<void(Status)>;

  // `before_load` (a test hook: a slow index) runs on the scan thread before the restart
  // load reads the index.
  static Result<std::unique_ptr<NvmeTier>> Open(const NvmeTierOptions& options, std::unique_ptr<IoEngine> io,
                                                std::unique_ptr<BlockIndexStore> store, Post post, const Clock* clock,
                                                NvmeOwners owners = {}, std::function<void()> before_load = nullptr);
  // Stops the scan thread (a scrub or scan in progress stops at its next entry), waits for
  // the index writer and flushes the index (a clean restart then replays nothing).
  // Callbacks not delivered yet are dropped.
  ~NvmeTier();

  // ---- index (synchronous reads; absent keys are cheap) ----
  Result<std::optional<BlockRecord>> Find(const std::string& key);
  Result<std::vector<std::optional<BlockRecord>>> FindMany(std::span<const std::string> keys);
  // FindMany on the reader thread: `done` runs on the control thread (never inside this
  // call) with a record per key, those whose slot no longer holds their block by then (a
  // block evicted and its slot reused since the read) absent. Reads run in the order
  // asked. Dropped when the tier goes first.
  using FindManyDone = std::function<void(Result<std::vector<std::optional<BlockRecord>>>)>;
  void FindManyAsync(std::vector<std::string> keys, FindManyDone done);

  // ---- data ----
  // Writes `data` as the block `key` (meta: parent, layout fingerprint) and indexes it;
  // done(OK, slot) once it is durable per the durability setting. Fails at once with
  // kUnavailable while !spill_available() or when no slot is free; the data must stay
  // unchanged until done runs. buf_index names the registered buffer holding data, or -1.
  void Spill(std::string key, BlockRecord meta, std::span<const uint8_t> data, int buf_index, SpillDone done);
  // Reads the block of `record` into `dst` (at least the slot-aligned length) and verifies
  // it under `key`. kNotFound when the record is stale (its slot holds no block of `key`
  // any more: evicted or reused since the record was read); kDataLoss, with the entry
  // dropped, when the bytes do not verify; the I/O error otherwise. The slot is not reused
  // while the read is in flight.
  void Fetch(std::string key, const BlockRecord& record, std::span<uint8_t> dst, int buf_index, Done done);
  // While a Batch lives, the reads and writes started are queued and go to the device in
  // one submission when the last Batch ends (the reads of one Acquire issued together).
  class Batch {
   public:
    explicit Batch(NvmeTier* tier) : tier_(tier) { ++tier_->batch_depth_; }
    ~Batch() {
      if (--tier_->batch_depth_ == 0) tier_->Submit();
    }
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

   private:
    NvmeTier* tier_;
  };
  // A use of the block in `slot` (a lookup hit): recency for eviction only.
  void Touch(uint32_t slot);
  // A block served from this tier: recency, and last access and hit count in the index.
  void RecordHit(const std::string& key, const BlockRecord& record);
  // Deletes the entry; the slot is freed once the delete is applied.
  void Drop(const std::string& key, uint32_t slot);
  // Slots owner `o` holds (writing or indexed); with no owners, owner 0 holds them all.
  uint32_t held_by(uint16_t o) const { return o < held_.size() ? held_[o] : 0; }
  // Reads and verifies every indexed block (at most verify_bytes_per_s), dropping those
  // that fail; on the scan thread, after the scans queued before it. A scrub stopped by
  // CancelScans() reports kAborted with what it checked so far.
  void Verify(std::function<void(VerifyReport)> done);
  // The `limit` entries with the most hits (or, with `by_recent`, the latest access) among
  // those `keep` takes (null: all), read from the index on the scan thread (`keep` runs
  // there); done(key, record) pairs on the control thread. A scan `cancelled` says is over
  // (checked on the scan thread; null: never) stops and never calls `done`.
  using ScanDone = std::function<void(std::vector<std::pair<std::string, BlockRecord>>)>;
  struct ScanFilter {
    std::function<bool(std::string_view key)> keep;
    std::function<bool()> cancelled;
  };
  void ScanTop(size_t limit, bool by_recent, ScanFilter filter, ScanDone done);
  // Drops up to `n` of the coldest blocks (an operator's evict); returns how many.
  uint32_t EvictColdest(uint32_t n);

  // Makes [addr, addr + len) registered buffer `index` for zero-copy I/O.
  void RegisterBuffer(uint32_t index, uint8_t* addr, size_t len);
  // Called (on the control thread) after the entry of `key` in `slot` left the index:
  // evicted or failed.
  void SetDropListener(std::function<void(const std::string& key, uint32_t slot)> listener) {
    drop_listener_ = std::move(listener);
  }
  // Called (on the control thread) when the entry of `key` becomes findable (its spill is
  // indexed: `stored` is its record) and when it stops being findable (its entry deleted:
  // `stored` is null). Entries loaded at start are not reported.
  void SetIndexListener(std::function<void(const std::string& key, const BlockRecord* stored)> listener) {
    index_listener_ = std::move(listener);
  }

  // The IoEngine's eventfd; call OnIoReady() when it is readable.
  int notify_fd() const { return io_->notify_fd(); }
  void OnIoReady();

  // Periodic work, on the control thread (the daemon's tick): retries a failed index
  // every 5 s, and checks the slot files every second — a file deleted, truncated or
  // replaced under the daemon is logged, counted (files_lost) and its blocks dropped.
  void Maintain();
  // False after an index write failed (a full or failing disk), until a retry succeeds:
  // no spills meanwhile; what is indexed is still served.
  bool index_writable() const { return !index_failed_; }

  bool ready() const { return ready_; }
  // Ready, not backing off after an I/O error, a slot free or freeable.
  bool spill_available() const;
  NvmeCounts Counts() const;
  const NvmeCounters& counters() const { return counters_; }
  std::string_view io_backend() const { return io_->name(); }
  std::string_view index_backend() const { return store_->name(); }
  std::string Describe() const;
  uint64_t slot_bytes() const { return files_->slot_bytes(); }
  double high_watermark() const { return options_.high_watermark; }
  double low_watermark() const { return options_.low_watermark; }
  // Bytes of RAM the tier's own per-slot structures and the index store hold (estimate).
  uint64_t MemoryUsage() const;
  // Stops the scrub or scan in progress at its next entry and drops those queued (kvtierd
  // shutting down). The restart load, if still running, stops too and the tier stays not
  // ready.
  void CancelScans() { scans_->Cancel(); }
  // Work a shutdown waits for: I/O and index writes in flight, scans not yet returned.
  size_t pending_operations() const { return ops_.size() + writes_outstanding_ + scans_->pending(); }
  // Spills started and not finished.
  uint32_t spills_in_flight() const { return writing_; }

 private:
  // kRetired: the entry is gone but fetches of the old bytes are still in flight; the slot
  // is free once the last of them completes.
  // kLost: in a slot file deleted or truncated under us; never used again this run.
  // kUnknown is zero: the array starts so without writing it (ZeroedArray).
  enum class SlotState : uint8_t { kUnknown = 0, kFree, kWriting, kIndexed, kDeleting, kRetired, kLost };
  struct Op {
    enum class Kind : uint8_t { kSpillWrite, kSync, kFetch } kind;
    uint32_t slot = 0;
    std::string key;
    BlockRecord record;
    SpillDone spill_done;
    Done done;
    std::span<uint8_t> dst;
    std::vector<uint64_t> batch;  // kSync: spill ops covered by this sync
    int fd = -1;
  };

  NvmeTier(const NvmeTierOptions& options, std::unique_ptr<IoEngine> io, std::unique_ptr<BlockIndexStore> store,
           Post post, const Clock* clock);
  Status Start();
  // Rebuilds slot occupancy from the index on the scan thread, then OnLoaded (nvme_tier_load.cc).
  void StartLoad();
  void OnLoaded(std::vector<uint32_t> last_access, std::vector<uint64_t> tags, std::vector<uint16_t> owners,
                std::vector<std::pair<std::string, uint32_t>> stale);
  uint32_t IoLength(uint32_t length) const;
  uint64_t NewOp(Op op);
  // Hands `r` to the engine, or keeps it until the engine has room.
  void Issue(const IoRequest& r);
  void Submit();
  void IssueSyncs();
  void OnSpillWritten(uint64_t id, int32_t result);
  void OnSynced(uint64_t id, int32_t result);
  void IndexSpills(std::vector<uint64_t> ids);
  void OnFetched(uint64_t id, int32_t result);
  void FailSpill(uint64_t id, Status status);
  void NoteIoError();
  void NoteIndexError(const Status& st);
  void CheckFiles();
  void LoseSlots(uint32_t first, uint32_t count);
  bool SlotLost(uint32_t slot) const;
  // The slot is unused: back to the free list, or kLost when its file is gone.
  void ReleaseSlot(uint32_t slot);
  // Deletes the entry of `key` in `slot` (state kDeleting); frees the slot once applied.
  void DeleteEntry(const std::string& key, uint32_t slot);
  void EnforceWatermark();
  // Evicts owner `o`'s coldest slot: its block dropped, or the slot freed when no entry
  // names it any more; kNone when nothing of its is evictable.
  enum class Victim { kNone, kDropped, kFreed };
  Victim EvictVictim(uint16_t o);
  // An owner's slots against its limits; the rule that reads it is shares.h's.
  Share ShareOf(uint16_t owner) const;
  // The owner the watermark takes from: the most slots above its reserve, with something
  // evictable; nullopt when none.
  std::optional<uint16_t> WatermarkOwner() const;
  uint16_t OwnerOfKey(std::string_view key) const;
  uint16_t OwnerOfSlot(uint32_t slot) const { return owner_.empty() ? 0 : owner_[slot]; }
  EvictionPolicy& PolicyOf(uint32_t slot) { return *policies_[OwnerOfSlot(slot)]; }
  // The slot stops being held by its owner (its block is dropped, or never was indexed).
  void Unhold(uint32_t slot) { --held_[OwnerOfSlot(slot)]; }
  // True when `slot` holds the indexed block of `key` (while the index loads: unless it was
  // dropped since).
  bool Owns(uint32_t slot, const std::string& key) const;
  static uint64_t KeyTag(std::string_view key);
  // The slot's entry is gone: free it, or retire it until its reads complete.
  void FreeSlot(uint32_t slot);
  void Apply(std::vector<IndexMutation> batch, bool sync, std::function<void(Status)> done);
  // Runs `fn` on the control thread unless this tier is gone by then.
  void PostSafe(std::function<void()> fn);

  NvmeTierOptions options_;
  NvmeOwners owners_;
  std::function<void()> before_load_;
  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<BlockIndexStore> store_;
  std::unique_ptr<SlotFiles> files_;
  Post post_;
  const Clock* clock_;
  std::shared_ptr<NvmeTier*> self_;  // expires with this object (see PostSafe)
  std::unique_ptr<IndexWriter> writer_;
  std::unique_ptr<WorkerThread> scans_;   // the restart load, scrubs, top-N scans
  std::unique_ptr<WorkerThread> reader_;  // FindManyAsync's reads: never behind a scan
  bool ready_ = false;

  ZeroedArray<SlotState> state_;
  std::unique_ptr<PageAllocator> free_;
  // One policy per owner (one in all without owners; built when the index has loaded, as
  // nothing evicts before), the owner of each slot (empty without owners) and the slots
  // each holds.
  std::vector<std::unique_ptr<EvictionPolicy>> policies_;
  std::vector<uint16_t> owner_;
  std::vector<uint32_t> held_;
  ZeroedArray<uint64_t> owner_tag_;  // slot -> KeyTag of its block's key
  // slot -> writes started into it; read by the scrub thread to tell a block that changed
  // under its read from a bad one.
  std::shared_ptr<ZeroedArray<std::atomic<uint32_t>>> write_gen_;
  std::unordered_map<uint32_t, uint32_t> readers_;  // slot -> fetches in flight
  uint32_t writing_ = 0, deleting_ = 0, retired_ = 0, indexed_ = 0;

  std::unordered_map<uint64_t, Op> ops_;
  std::deque<IoRequest> backlog_;  // waiting for engine capacity
  uint32_t batch_depth_ = 0;       // live Batches: submission waits for the last
  uint64_t next_op_ = 1;
  size_t writes_outstanding_ = 0;                                // index batches not applied yet
  std::unordered_map<int, std::vector<uint64_t>> sync_waiting_;  // fd -> written spills
  std::unordered_map<int, bool> sync_in_flight_;
  int64_t backoff_until_ns_ = 0;
  bool index_failed_ = false, index_retrying_ = false;
  int64_t next_index_retry_ns_ = 0, next_file_check_ns_ = 0;
  std::vector<std::pair<std::string, uint32_t>> undeleted_;  // deletes to try again
  std::vector<bool> file_lost_;
  bool any_file_lost_ = false;
  uint32_t lost_ = 0;
  int consecutive_errors_ = 0;
  std::function<void(const std::string&, uint32_t)> drop_listener_;
  std::function<void(const std::string&, const BlockRecord*)> index_listener_;
  NvmeCounters counters_;
};

}  // namespace kvtier
