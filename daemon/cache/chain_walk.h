#pragma once
// ChainWalk: the one owner of what waits on the tier chain below the local (GPU, host)
// tiers — Lookups whose rest is looked for in the lower tiers, Acquires whose blocks are
// read from NVMe or a lower tier into host pages (and those queued for a host page), and
// the promotions in flight they wait for. Lookup and Acquire walk the chain the same way:
// the NVMe index first, then the lower tiers from the first that can be asked; a block a
// lower tier turns out not to hold is looked for in the next. A prefix Acquire (an
// engine's load) walks it once: what the walk found is read from where it was found, with
// the index record the walk read. The records a Lookup reads are held for the load that
// follows it (LoadHolds, NvmeMover::Options::load_hold_ns), so a lookup and its load read
// each index entry once. A Lookup that can wait
// reads the index on the control thread for its first kFirstIndexProbe hashes only and
// the rest on the NVMe tier's reader thread (a cold 8,192-block chain held the control
// thread 50 ms: docs/benchmarks.md, cold index); an Acquire that can wait reads it there
// when it misses more than kFirstIndexProbe blocks in memory.
//
// CacheManager owns it, and answers its Hooks: room in the host tier, a session's
// references, the end of a session's deferred request. The tables and movers it is given
// outlive it. Control thread only; not thread-safe.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "daemon/cache/block_table.h"
#include "daemon/cache/cache_types.h"
#include "daemon/cache/load_holds.h"
#include "daemon/cache/lower_tier_mover.h"
#include "daemon/cache/nvme_mover.h"
#include "protocol/base/clock.h"

namespace kvtier {

class ChainWalk {
 public:
  using LookupDone = std::function<void(CacheLookup)>;
  using AcquireDone = std::function<void(std::vector<CacheResult>)>;
  struct Hooks {
    // Whether a host page can be had for `tenant`: now (evicting when `may_evict`), later
    // (something in flight frees one), never, or not within its quota.
    std::function<Room(TenantId tenant, bool may_evict)> host_room;
    // References `id` for `session`; false when the session is gone.
    std::function<bool(SessionId session, BlockId id)> ref;
    // `session`'s deferred Acquire was answered.
    std::function<void(SessionId session)> answered;
    // A promotion failed: the pages it held are free again.
    std::function<void()> pages_freed;
  };
  // Hashes of a chain read from the NVMe index at first by Lookup (on the control thread);
  // each further read asks for four times as many (off it, when the Lookup can wait), and
  // none follows a miss.
  static constexpr size_t kFirstIndexProbe = 16;
  // Most index records held for loads (LoadHolds): two loads of the longest chain a
  // request may name (max_entries_per_request's default), about 7 MiB.
  static constexpr size_t kMaxLoadHolds = 65'536;

  // `mover` may be null (no NVMe tier); `lower` is the chain below NVMe, in order.
  ChainWalk(BlockTable* blocks, NvmeMover* mover, const std::vector<std::unique_ptr<LowerTierMover>>* lower,
            CacheCounters* counters, const Clock* clock, int64_t allocate_wait_ns, Hooks hooks);

  // A Lookup past the `r.tiers.size()` blocks the local tiers hold: the rest of the chain
  // from the NVMe index (in growing chunks, stopping at the first miss; with `prefetch`
  // hits start their promotion), then from the lower tiers. Counts hits and misses. The
  // answer now, or nullopt when the index is read further off the control thread or a
  // lower tier was asked and `done` will have it (not at all if the session is forgotten
  // first). Without `done`, everything is read now.
  std::optional<CacheLookup> LookupRest(SessionId session, NamespaceId ns, TenantId tenant,
                                        std::span<const BlockHash> hashes, CacheLookup r, bool prefetch,
                                        LookupDone done);
  // An Acquire's entries the local tiers could not serve: `waits` (entry, block) are being
  // promoted already; `missing` are looked for on NVMe (more than kFirstIndexProbe: off
  // the control thread when there is a `done`), then in the lower tiers, and read into
  // host pages (queued for one while spills free some). `out` has the served entries. The
  // results now, or nullopt when `done` will have them.
  std::optional<std::vector<CacheResult>> AcquireRest(SessionId session, NamespaceId ns, TenantId tenant,
                                                      std::span<const BlockHash> hashes, std::vector<CacheResult> out,
                                                      std::vector<std::pair<size_t, BlockId>> waits,
                                                      std::span<const size_t> missing, AcquireDone done);

  // A prefix Acquire past the local tiers: `out` has the results of the chain's first
  // out.size() entries, those in a local tier referenced already; `recheck` are entries
  // among them not settled yet (blocks being promoted). The rest of the chain is walked
  // once, as LookupRest walks it (without counting a lookup), and the present prefix it
  // finds is read into host pages from where it was found: an NVMe hit with the index
  // record the walk read (no second read), a lower tier's from the tier that answered.
  // Results for the present prefix only (fewer than hashes.size() when it ends early).
  // Now, or nullopt when `done` will have them.
  std::optional<std::vector<CacheResult>> AcquirePrefixRest(SessionId session, NamespaceId ns, TenantId tenant,
                                                            std::span<const BlockHash> hashes,
                                                            std::vector<CacheResult> out, std::vector<size_t> recheck,
                                                            AcquireDone done);

  // A session's prefetch hint: the rest of the chain past its first `from` hashes (those
  // the pool tiers hold) is looked for as LookupRest looks (the NVMe index, then the lower
  // tiers) and each block found is read into a free host page (never evicting: a block
  // without one stays where it is). Counts no lookup; it stops where `session` goes away.
  void Prefetch(SessionId session, NamespaceId ns, TenantId tenant, std::span<const BlockHash> hashes, size_t from);
  // A promotion ended (the movers' after_promotion).
  void OnPromoted(BlockId id, const Status& st);
  // Starts the queued promotions a host page is free for now; misses those past their wait.
  void ServeQueuedPromotions();
  // `session`'s deferred requests are answered to nobody.
  void Forget(SessionId session);

  // The tier a promoting block comes from.
  TierKind PromotingFrom(BlockId id) const {
    auto it = lower_promotions_.find(id);
    return it == lower_promotions_.end() ? TierKind::kNvme : (*lower_)[it->second.tier]->kind();
  }
  // Promotions in flight or queued.
  size_t pending_promotions() const;
  bool acquires_waiting() const { return !pending_acquires_.empty(); }
  const LoadHolds& load_holds() const { return holds_; }

 private:
  using Block = BlockTable::Block;
  // Who waits for a promotion: (a pending Acquire's id, its entry index).
  using Waiter = std::pair<uint64_t, size_t>;
  struct PendingAcquire {
    SessionId session;
    std::vector<CacheResult> results;
    size_t outstanding = 0;
    AcquireDone done;
  };
  // What a walk found past where it started, entry by entry: the index record of a block
  // read from NVMe (none for a block in memory or in a lower tier), and the lower tier that
  // answered for one found there (else 0).
  struct Found {
    std::vector<std::optional<BlockRecord>> records;
    std::vector<size_t> lower;
  };
  using WalkDone = std::function<void(CacheLookup, Found)>;
  enum class WalkFor {
    kLookup,   // an engine's Lookup: counted
    kHint,     // a prefetch hint's: not counted; lower tiers' hits promoted too
    kAcquire,  // a prefix Acquire's: not counted; no promotion started (the Acquire starts them)
  };
  struct PendingLookup {
    SessionId session;
    NamespaceId ns;
    CacheLookup result;           // what the tiers above answered
    size_t asked = 0;             // hashes in the request
    std::vector<BlockHash> rest;  // what they did not hold: for the index, then the next lower tier
    size_t next = 0;              // the lower tier to ask next
    WalkDone done;
    TenantId tenant = 0;     // while the index is read: who prefetches
    bool prefetch = false;   //   whether hits start their promotion
    size_t index_chunk = 0;  //   the next read's size; 0: the index is done with
    WalkFor walk_for = WalkFor::kLookup;
    Found found;
  };
  // A block to promote once the host tier has a page for it: from NVMe (its index
  // record), or from a lower tier (no record).
  struct QueuedPromotion {
    NamespaceId ns;
    TenantId tenant;
    BlockHash hash;
    std::optional<BlockRecord> record;
    size_t first_lower = 0;  // without a record: the lower tier to read from first
    int64_t deadline_ns;
    std::vector<Waiter> waiters;
  };
  // A promotion from a lower tier in flight: what to look for in the next one if the
  // tier does not hold the block after all.
  struct LowerPromotion {
    NamespaceId ns;
    TenantId tenant;
    BlockHash hash;
    size_t tier;  // index in lower_
  };
  // Reads a block into a host page — from NVMe (`rec`), or (no rec) from the first lower
  // tier from `first_lower` on that can be asked. `id` is kNoBlock when no page can be had
  // now (`may_evict` false: only a page free without evicting anything); `room` then says
  // whether one will free up (kLater).
  struct Promoted {
    BlockId id = kNoBlock;
    Room room = Room::kNone;
  };
  Promoted Promote(NamespaceId ns, TenantId tenant, const BlockHash& hash, const std::optional<BlockRecord>& rec,
                   bool may_evict, size_t first_lower = 0);
  // The walk of LookupRest, Prefetch and AcquirePrefixRest, from entry r.tiers.size(): the
  // answer and what was found, now, or nullopt when `done` will have them.
  std::optional<std::pair<CacheLookup, Found>> Walk(SessionId session, NamespaceId ns, TenantId tenant,
                                                    std::span<const BlockHash> hashes, CacheLookup r, bool prefetch,
                                                    WalkFor walk_for, WalkDone done);
  // A walk's end: counts a Lookup's hits and misses.
  void Count(const CacheLookup& r, size_t asked, WalkFor walk_for);
  // The first lower tier from `from` on that can be asked now, or lower_->size().
  size_t AvailableLower(size_t from) const;
  // `w` is told when the promotion of `id` ends. REQUIRES: `id` is promoting.
  void AddWaiter(BlockId id, Waiter w) { promotion_waiters_[id].push_back(w); }
  // One hash past the local tiers, found in the block table or with its index record
  // `rec`: the tier it is read from, or nullopt where the prefix ends. Touches an NVMe
  // hit's slot and, with `prefetch`, starts its promotion.
  // `from_index`: whether the record is what found it (not the block table).
  std::optional<TierKind> IndexHit(NamespaceId ns, TenantId tenant, const BlockHash& hash,
                                   const std::optional<BlockRecord>& rec, bool prefetch, bool* from_index);
  static void Keep(Found& f, std::optional<BlockRecord> record, size_t lower) {
    f.records.push_back(std::move(record));
    f.lower.push_back(lower);
  }
  // Reads the next chunk of a pending Lookup's rest from the index, off the control
  // thread; ContinueLookup once the prefix ends there.
  void ContinueIndex(uint64_t lookup);
  // Asks the next lower tier that can be asked about the rest of a Lookup; answers it
  // once none is left.
  void ContinueLookup(uint64_t lookup);
  void FinishLookup(uint64_t lookup, size_t tier, size_t found);
  void FinishAcquireEntry(uint64_t acquire, size_t index, CacheResult r);
  // What an Acquire's entries wait for: blocks being promoted, and (entry, NVMe record or
  // none) for a host page.
  struct Queued {
    size_t entry;
    std::optional<BlockRecord> record;
    size_t first_lower;
  };
  struct Waits {
    std::vector<std::pair<size_t, BlockId>> promoting;
    std::vector<Queued> queued;
  };
  // Settles each of an Acquire's `missing` entries with its index record (or none) from
  // `recs`: found in memory after all (referenced for `session`), or nowhere (in `out`),
  // or a promotion started or queued (in `w`). A block without a record is read from the
  // lower tiers from first_lower[k] on (empty: from the first).
  void ResolveMissing(SessionId session, NamespaceId ns, TenantId tenant, std::span<const BlockHash> hashes,
                      std::span<const size_t> missing, Result<std::vector<std::optional<BlockRecord>>> recs,
                      bool can_wait, std::vector<CacheResult>& out, Waits* w, std::span<const size_t> first_lower = {});
  // ResolveMissing, then the Acquire waits for what it started: its results now, or
  // nullopt when `done` will have them.
  std::optional<std::vector<CacheResult>> Resolve(SessionId session, NamespaceId ns, TenantId tenant,
                                                  std::span<const BlockHash> hashes, std::vector<CacheResult> out,
                                                  Waits w, std::span<const size_t> missing,
                                                  Result<std::vector<std::optional<BlockRecord>>> recs,
                                                  std::span<const size_t> first_lower, AcquireDone done);
  // Pending Acquire `acq` waits for `w`.
  void Wait(uint64_t acq, NamespaceId ns, TenantId tenant, std::span<const BlockHash> hashes, Waits w);
  // One of `acq`'s outstanding waits ended: answers it after the last.
  void Settle(uint64_t acq);
  // The entry of a waiter whose block is readable in `tier` (nullopt: not readable).
  CacheResult ResultForWaiter(const Waiter& w, BlockId id, std::optional<TierKind> tier);

  BlockTable* blocks_;
  NvmeMover* mover_;
  const std::vector<std::unique_ptr<LowerTierMover>>* lower_;
  CacheCounters* counters_;
  const Clock* clock_;
  int64_t allocate_wait_ns_;
  Hooks hooks_;
  std::unordered_map<uint64_t, PendingAcquire> pending_acquires_;
  std::unordered_map<uint64_t, PendingLookup> pending_lookups_;
  std::deque<QueuedPromotion> queued_promotions_;
  std::unordered_map<BlockId, std::vector<Waiter>> promotion_waiters_;
  std::unordered_map<BlockId, LowerPromotion> lower_promotions_;
  // Promotions from NVMe while lower tiers exist: a record gone stale since it was read or
  // held (the block left NVMe) is looked for in the lower tiers from the first.
  std::unordered_map<BlockId, LowerPromotion> nvme_promotions_;
  LoadHolds holds_;
  uint64_t next_pending_ = 1;
};

}  // namespace kvtier
