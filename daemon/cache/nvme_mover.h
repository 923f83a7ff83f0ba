#pragma once
// NvmeMover: the moves between the host tier and the NVMe tier, and what is in flight.
//
// Spills: a demotion writes a cached host block to NVMe, then frees its host page (unless
// a session took a reference meanwhile); a write-through copies a committed block and
// keeps the host copy. Promotions: an NVMe-only block is read into a fresh host page and
// verified, then becomes a host block; whoever waited for it is told through a hook.
// Copies the NVMe tier drops (eviction, failed checksums) are forgotten by their blocks.
//
// Quantized NVMe tier (Options::quantization): a block of a namespace that may be
// quantized (NamespaceTable: its tenant opted in, its layout is the kernels') is quantized
// on the way down — on the BlockWorkers, from its pinned host page into a staging buffer
// of one slot — and spilled in that form (the index record says which, and the checksum
// covers the stored bytes); on the way up it is read into its host page and dequantized
// there, on the workers, before the block is readable. The tier's slots are then smaller
// than host pages (the daemon sizes them for quantized blocks), so a block that may not be
// quantized and does not fit a slot never goes to NVMe (Spillable is false: eviction drops
// it). Records read back as full width need no worker.
//
// Owns the NvmeTier and the registration of host segments as its I/O buffers. Owned by
// the control thread; not thread-safe. NvmeTier delivers completions on the control
// thread and never inside the call that started them, so every hook runs from the event
// loop, after the caller's bookkeeping is done.

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "daemon/cache/block_table.h"
#include "daemon/cache/block_workers.h"
#include "daemon/cache/cache_types.h"
#include "daemon/cache/namespace_table.h"
#include "protocol/base/clock.h"
#include "storage/nvme/nvme_tier.h"

namespace kvtier {

class NvmeMover {
 public:
  struct Hooks {
    // A spill ended, well or not: pages may be free and blocks droppable now.
    std::function<void()> after_spill;
    // A promotion ended. OK: block `id` is readable in host; otherwise it is gone.
    std::function<void(BlockId id, const Status& status)> after_promotion;
    // The NVMe copy of `key` went and no block holds the key: its last copy left the cache.
    std::function<void(const std::string& key)> last_copy_dropped;
    // A demotion's page is free, `seconds` after the demotion started (with Options::clock).
    std::function<void(double seconds)> demoted;
  };
  struct Options {
    WritePolicy write_policy = WritePolicy::kWriteBack;
    // At least this many spills in flight (CacheManager raises it to the host tier's
    // watermark band).
    uint32_t max_spills_in_flight = 32;
    // The form blocks that may be quantized take on NVMe; nullopt: full width. Needs
    // `workers`.
    std::optional<QuantKind> quantization;
    bool prefetch = false;  // Lookup starts promoting NVMe hits (CacheManager reads it)
    // How long the index records a Lookup read are held for the Acquire that follows it
    // (ChainWalk's LoadHolds); 0: none.
    int64_t load_hold_ns = 2'000'000'000;
    BlockWorkers* workers = nullptr;  // outlives the mover
    const Clock* clock = nullptr;     // times demotions for Hooks::demoted; outlives the mover
    bool operator==(const Options&) const = default;
  };

  // kInvalidArgument unless the host tier is enabled with pages the size of the NVMe
  // tier's slots (or, with quantization, at least that size). The tables and counters
  // outlive the mover.
  static Result<std::unique_ptr<NvmeMover>> Open(std::unique_ptr<NvmeTier> nvme, const Options& options,
                                                 BlockTable* blocks, NamespaceTable* namespaces,
                                                 CacheCounters* counters, Hooks hooks);
  // Stops the NVMe tier's threads before the state its callbacks touch goes.
  ~NvmeMover();

  const Options& options() const { return options_; }
  NvmeTier& nvme() { return *nvme_; }
  const NvmeTier& nvme() const { return *nvme_; }

  // ---- spills ----
  // Whether a spill may start now: the tier is loaded, not backing off, has a slot.
  bool spillable() const { return nvme_->spill_available(); }
  // Whether block `b` can go to NVMe at all: its bytes (quantized, where it may be) fit a
  // slot.
  bool Spillable(const BlockTable::Block& b) const;
  // Whether max_spills_in_flight spills are in flight.
  bool busy() const { return spills_in_flight_ >= options_.max_spills_in_flight; }
  uint32_t spills_in_flight() const { return spills_in_flight_; }
  // Spills that free their host page when done.
  uint32_t demotions_in_flight() const { return demotions_in_flight_; }
  // Writes host block `id` to NVMe; with keep_host false its host page is freed after.
  // REQUIRES: resident in host, not spilling, no NVMe copy.
  void StartSpill(BlockId id, bool keep_host);
  // Queues a spill that keeps the host copy (write-through, or a drain), started by
  // PumpWriteThrough while spills are allowed. A block that moved or got an NVMe copy
  // meanwhile is skipped.
  void QueueWriteThrough(BlockId id);
  void PumpWriteThrough();
  bool write_through_idle() const { return write_through_queue_.empty(); }
  bool write_through() const { return options_.write_policy == WritePolicy::kWriteThrough; }

  // ---- promotions ----
  // Reads `record` (the index entry of `hash` in `ns`) into a new host block of `tenant`;
  // kNoBlock when the host tier has no page for the tenant now (the caller makes room
  // first and checks quotas).
  BlockId StartPromotion(NamespaceId ns, TenantId tenant, const BlockHash& hash, const BlockRecord& record);
  size_t promotions_in_flight() const { return promotions_.size(); }

  // ---- the index (Find, FindMany on the control thread; see NvmeTier) ----
  Result<std::optional<BlockRecord>> Find(NamespaceId ns, const BlockHash& hash);
  Result<std::vector<std::optional<BlockRecord>>> FindMany(NamespaceId ns, std::span<const BlockHash> hashes);
  // FindMany off the control thread (NvmeTier::FindManyAsync).
  void FindManyAsync(NamespaceId ns, std::span<const BlockHash> hashes, NvmeTier::FindManyDone done);

 private:
  NvmeMover(std::unique_ptr<NvmeTier> nvme, const Options& options, BlockTable* blocks, NamespaceTable* namespaces,
            CacheCounters* counters, Hooks hooks);
  // The index keys of `hashes` in `ns`.
  std::vector<std::string> BlockKeys(NamespaceId ns, std::span<const BlockHash> hashes) const;
  // The registered-buffer index of the host segment holding `page` (registered on first
  // use: registration pins, and so faults in, the whole segment).
  int BufferIndex(PageId page);
  void OnSpilled(BlockId id, uint32_t gen, bool keep_host, int64_t started_ns, Status st, uint32_t slot);
  void OnPromoted(BlockId id, uint32_t gen, Status st, BlockRecord record);
  // Spills host block `id` from `data` (its page, or its quantized form in a staging
  // buffer, which goes back to the pool when the spill ends).
  void Spill(BlockId id, bool keep_host, int64_t started_ns, BlockRecord meta, std::span<const uint8_t> data, int buf,
             uint8_t* staging);
  int64_t NowNanos() const { return options_.clock ? options_.clock->NowNanos() : 0; }
  bool Quantizes(const NamespaceTable::Namespace& n) const;
  uint8_t* TakeStaging();
  void OnDropped(const std::string& key, uint32_t slot);

  std::unique_ptr<NvmeTier> nvme_;
  Options options_;
  BlockTable* blocks_;
  NamespaceTable* namespaces_;
  CacheCounters* counters_;
  Hooks hooks_;
  std::vector<bool> registered_segments_;
  uint32_t spills_in_flight_ = 0;
  uint32_t demotions_in_flight_ = 0;
  std::deque<std::pair<BlockId, uint32_t>> write_through_queue_;  // (block, gen)
  std::unordered_map<BlockId, uint32_t> promotions_;              // block -> its gen
  std::vector<uint8_t*> staging_free_;                            // slot-sized, aligned; quantized spills
  std::vector<uint8_t*> staging_all_;
};

}  // namespace kvtier
