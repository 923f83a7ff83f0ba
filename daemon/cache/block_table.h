#pragma once
// BlockTable: the pages of the GPU and host tiers and the blocks that occupy them.
//
// Per pool tier it keeps every page's state, the block on it, the counters behind the
// invariant
//   free + leased + inflight + cached + referenced + quarantined == capacity
// and one EvictionPolicy per tenant over the tier's resident blocks. Per block resident
// in a pool tier: its key (namespace, hash), parent, its page in each tier (and its NVMe
// slot, when known), its references and the moves in progress (spilling to NVMe,
// promoting from it). A block lives while it has a page in some pool tier; a copy on
// NVMe alone lives in the NVMe index, not here.
//
// Page states: free -> leased (Lease) or in flight (Take) -> block (Reside) -> free
// (RemoveResidency, Free). A spill holds a block's host page in flight without removing
// the residency (BeginSpill / EndSpill); a leased page of a session that ended while its
// process lives is quarantined until the process is gone.
//
// Counting lives in one place: a resident page counts as cached while its block has no
// references and as referenced otherwise. Every transition — a block arriving in or
// leaving a tier, its first reference taken or its last dropped, a spill starting or
// ending — goes through Enter/Leave/SetRefs and one counting step, so counters and the
// policies' evictable sets cannot drift apart. CheckInvariants() recomputes everything
// from the page arrays.
//
// Owned by the control thread; not thread-safe.

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "daemon/cache/cache_types.h"
#include "daemon/cache/namespace_table.h"
#include "kernels/device_backend.h"
#include "storage/policy/eviction_policy.h"
#include "storage/policy/flat_id_index.h"
#include "storage/policy/retention_policy.h"
#include "storage/pool/tier_pool.h"

namespace kvtier {

class BlockTable {
 public:
  enum class PageState : uint8_t { kFree, kLeased, kInFlight, kBlock, kQuarantined };
  struct Block {
    NamespaceId ns = 0;
    TenantId tenant = kNoOwner;
    BlockHash hash;
    BlockHash parent;
    std::array<PageId, kTierCount> page;  // kNoPage where not resident; [kNvme] = slot
    uint32_t refs = 0;
    uint32_t gen = 0;  // bumped on reuse of the id; async completions check it
    bool live = false;
    // What its host page is doing: being written to NVMe (a spill), or being filled from
    // NVMe or a lower tier (a promotion: not readable yet). One at a time.
    enum class Moving : uint8_t { kNone, kSpilling, kPromoting };
    Moving moving = Moving::kNone;
    bool spilling() const { return moving == Moving::kSpilling; }
    bool promoting() const { return moving == Moving::kPromoting; }
    // Moves reading the block's page, by pool tier (TierIndex: GPU, host): an NVMe spill or
    // a lower-tier put of the host page, a demotion copying the GPU page down.
    std::array<uint8_t, 2> readers{};
    uint8_t below = 0;  // bit k: lower tier k holds it (put by us, or read from it)
    uint32_t hits = 0;  // lookups and acquires that found it
    int64_t last_use_ns = 0;
  };

  // Builds the pool of each enabled tier of `tiers` (indexed by TierIndex; the NVMe entry
  // must be disabled). The GPU pool is over `device` (required when the GPU tier is
  // enabled; it outlives the table). `host_demotes`: the host tier's victims go down to
  // NVMe or a lower tier (the GPU tier's always go to the host tier when it has one); their
  // policies are told (MakeEvictionPolicy's `victims_demoted`). kInvalidArgument for options
  // that cannot work.
  static Result<std::unique_ptr<BlockTable>> Open(const std::array<TierOptions, kTierCount>& tiers,
                                                  DeviceBackend* device, int gpu_device, NamespaceTable* namespaces,
                                                  bool host_demotes = false);

  bool enabled(TierKind t) const { return IsPoolTier(t) && tiers_[TierIndex(t)].pool != nullptr; }
  TierPool* pool(TierKind t) { return tiers_[TierIndex(t)].pool.get(); }
  const TierPool* pool(TierKind t) const { return tiers_[TierIndex(t)].pool.get(); }
  // REQUIRES: enabled(t) for everything that takes a tier below.
  TierCounts Counts(TierKind t) const;
  // Pages handed out of the tier's free pool (Lease and Take) since the table opened.
  uint64_t pages_taken(TierKind t) const { return T(t).taken; }
  PageState state(TierKind t, PageId p) const { return tiers_[TierIndex(t)].state[p]; }
  // The block on a page in state kBlock or kInFlight (kNoBlock otherwise).
  BlockId block_on(TierKind t, PageId p) const { return tiers_[TierIndex(t)].page_block[p]; }

  // ---- pages without blocks ----
  // A free page of `tenant`'s, now leased; nullopt when the pool has none for it.
  std::optional<PageId> Lease(TierKind t, TenantId tenant);
  // A free page of `tenant`'s, now in flight (to be filled, then Reside or Free).
  std::optional<PageId> Take(TierKind t, TenantId tenant);
  // A leased or in-flight page without a block goes back to the pool.
  void Free(TierKind t, PageId p);
  void Quarantine(TierKind t, PageId p);     // leased -> quarantined
  void EndQuarantine(TierKind t, PageId p);  // quarantined -> free
  // Segments of tier `t` whose every allocated page is quarantined, found since the last
  // call (as pages were quarantined or the others freed): no session has a right to any
  // page there, so their quarantined pages can come back with the segment's memory renewed.
  std::vector<uint32_t> TakeQuarantineOnlySegments(TierKind t);
  // Frees the quarantined pages of such a segment and retires it (TierPool::Retire: new
  // memory before anyone gets it again, so whoever still maps the old cannot reach the next
  // owner's pages). Returns the pages.
  std::vector<PageId> ReclaimQuarantineOnlySegment(TierKind t, uint32_t segment);

  // ---- blocks ----
  BlockId Find(NamespaceId ns, const BlockHash& hash) const;
  // The blocks of a chain's head: ids of hashes[0..k) into out[0..k), k (returned) ending
  // at the first hash with no block. Probes a group of hashes at once.
  size_t FindPrefix(NamespaceId ns, std::span<const BlockHash> hashes, BlockId* out) const {
    return FindGroups(ns, hashes, out, /*stop_at_miss=*/true);
  }
  // Find of every hash (kNoBlock where absent), probed a group at a time.
  void FindMany(NamespaceId ns, std::span<const BlockHash> hashes, BlockId* out) const {
    FindGroups(ns, hashes, out, /*stop_at_miss=*/false);
  }
  const Block& block(BlockId id) const { return blocks_[id]; }
  // A new block with no page yet (one more user of its namespace). REQUIRES: none for
  // (ns, hash) exists.
  BlockId Create(NamespaceId ns, TenantId tenant, const BlockHash& hash, const BlockHash& parent);
  // Page `p` (leased or in flight) becomes the block's copy in tier `t`.
  void Reside(BlockId id, TierKind t, PageId p);
  // The block's copy in `t` goes (its page is freed); the block goes with its last copy.
  void RemoveResidency(BlockId id, TierKind t);
  // A promotion: the host page `p` (from Take) is being filled with the block's bytes.
  void BeginFill(BlockId id, PageId p);
  // The fill ended: the block is readable in host, or (failed) it goes with its page.
  void EndFill(BlockId id, bool ok);
  // A read of the block's page in pool tier `t` by a move (host: an NVMe spill, a lower-tier
  // put; GPU: a demotion's copy): the page is in flight and the block no victim there until
  // the last such read ends; sessions still read it. REQUIRES: resident in `t` (in state
  // block, or already being read).
  void BeginRead(BlockId id, TierKind t = TierKind::kHost);
  void EndRead(BlockId id, TierKind t = TierKind::kHost);
  uint8_t readers(BlockId id, TierKind t = TierKind::kHost) const { return blocks_[id].readers[TierIndex(t)]; }
  // A spill: a read (above) by the NVMe tier. REQUIRES: resident in host, not spilling.
  void BeginSpill(BlockId id);
  void EndSpill(BlockId id);
  void Ref(BlockId id);
  void Unref(BlockId id);  // REQUIRES: refs > 0
  void SetNvmeSlot(BlockId id, PageId slot) { blocks_[id].page[TierIndex(TierKind::kNvme)] = slot; }
  // Whether lower tier `index` (LowerTierMover) holds the block.
  void SetBelow(BlockId id, size_t index, bool on) {
    uint8_t& below = blocks_[id].below;
    below = on ? below | (1u << index) : below & ~(1u << index);
  }
  // The parent learnt once a block's bytes arrived (a lower-tier promotion). REQUIRES: not
  // resident yet (the eviction policies learn parents when a block enters a tier).
  void SetParent(BlockId id, const BlockHash& parent) { blocks_[id].parent = parent; }
  // A hit (lookup or acquire) or a store at `now_ns`.
  void NoteUse(BlockId id, int64_t now_ns, bool hit) {
    Block& b = blocks_[id];
    if (hit) ++b.hits;
    b.last_use_ns = now_ns;
  }
  // Best tier the block is readable from (GPU, then host); nullopt while it is filled.
  // Inline with NoteUse: a chain's Lookup asks both of every block.
  static std::optional<TierKind> ReadableTier(const Block& b) {
    if (b.promoting()) return std::nullopt;
    if (b.page[TierIndex(TierKind::kGpu)] != kNoPage) return TierKind::kGpu;
    if (b.page[TierIndex(TierKind::kHost)] != kNoPage) return TierKind::kHost;
    return std::nullopt;
  }
  // Every slot of the block array (live or not), for scans.
  BlockId id_limit() const { return static_cast<BlockId>(blocks_.size()); }

  // ---- eviction ----
  // The tenant's policy of tier `t`: the configured one under retention classes
  // (retention_policy.h), which sessions' hints set (SetRetention).
  RetentionPolicy& Policy(TierKind t, TenantId tenant);
  // The block's retention class in every pool tier where it is resident, and in those it
  // enters later (RetentionSource answers then).
  void SetRetention(BlockId id, Retention r, int64_t expected_return, uint32_t depth);
  // Blocks of tier `t` protected now, every tenant's.
  size_t protected_blocks(TierKind t) const {
    size_t n = 0;
    for (const auto& p : T(t).policy) n += p ? p->protected_blocks() : 0;
    return n;
  }
  struct RetentionClass {
    Retention r = Retention::kOrdinary;
    int64_t expected_return = 0;
    uint32_t depth = 0;
  };
  using RetentionSource = std::function<RetentionClass(TenantId tenant, BlockId id)>;
  void SetRetentionSource(RetentionSource source) { retention_source_ = std::move(source); }
  // Called when a block goes (its id may name another block next).
  using EraseListener = std::function<void(TenantId tenant, BlockId id)>;
  void SetEraseListener(EraseListener listener) { erase_listener_ = std::move(listener); }
  // A use of a block readable in `tier`.
  struct Use {
    BlockId id;
    TierKind tier;
  };
  // Policy(u.tier, tenant of u.id).Touch(u.id) for each of `used` in order, as one
  // TouchMany per run of one tier and tenant (a matched chain is one run).
  void Touch(std::span<const Use> used);
  // The policy's victim among the tenant's cached blocks of `t`, or kNoBlock.
  BlockId Victim(TierKind t, TenantId tenant);
  uint32_t cached_of(TierKind t, TenantId tenant) const;
  // Tenants with an entry in the per-tenant arrays of `t` (ids below this).
  TenantId tenant_limit(TierKind t) const {
    return static_cast<TenantId>(tiers_[TierIndex(t)].cached_by_tenant.size());
  }
  // Whether the tenant's host policy wants matched prefixes touched deepest first.
  bool PrefixOrdered(TenantId tenant);

  // kInternal describing the first broken accounting identity, if any.
  Status CheckInvariants() const;

  // Called when a block becomes readable in a tier (Reside, a fill that ended well:
  // `resident` true) and when its copy there goes (RemoveResidency, before the block
  // itself may go: false). Spills do not change where a block is readable.
  using ResidencyListener = std::function<void(const Block& b, TierKind tier, bool resident)>;
  void SetResidencyListener(ResidencyListener listener) { residency_listener_ = std::move(listener); }

 private:
  struct Tier {
    TierKind kind = TierKind::kHost;
    std::unique_ptr<TierPool> pool;
    std::string policy_name;
    bool victims_demoted = false;  // to a tier below
    std::vector<PageState> state;
    std::vector<BlockId> page_block;
    std::vector<std::unique_ptr<RetentionPolicy>> policy;  // by tenant
    std::vector<uint32_t> cached_by_tenant;
    uint32_t leased = 0, inflight = 0, cached = 0, referenced = 0, quarantined = 0;
    std::vector<uint32_t> quarantined_in;   // by segment
    std::vector<uint32_t> quarantine_only;  // segments that may be (see TakeQuarantineOnlySegments)
    uint64_t blocks = 0;
    uint64_t taken = 0;  // pages handed out by Allocate, ever
  };
  explicit BlockTable(NamespaceTable* namespaces) : namespaces_(namespaces) {}
  Tier& T(TierKind t) { return tiers_[TierIndex(t)]; }
  const Tier& T(TierKind t) const { return tiers_[TierIndex(t)]; }
  // A free page of the tenant's from the pool, put in state `as`.
  std::optional<PageId> Allocate(TierKind kind, TenantId tenant, PageState as);
  // Moves page `p` into state `to` and keeps the counters of the page states.
  void SetState(Tier& t, PageId p, PageState to);
  // Returns a page (state already kFree) to the pool.
  void PoolFree(Tier& t, PageId p);
  bool QuarantineOnly(const Tier& t, uint32_t segment) const {
    return t.quarantined_in[segment] > 0 && t.quarantined_in[segment] == t.pool->UsedIn(segment);
  }
  // The one counting step: a resident page of `b` enters (+1) or leaves (-1) the cached
  // or referenced count, by b.refs.
  void Count(Tier& t, const Block& b, int sign);
  // The block's page in `t` became (or stopped being) a resident block page.
  void Enter(Tier& t, BlockId id);
  void Leave(Tier& t, BlockId id);
  void SetRefs(BlockId id, uint32_t refs);
  uint32_t& CachedOf(Tier& t, TenantId tenant);
  void Erase(BlockId id);

  size_t FindGroups(NamespaceId ns, std::span<const BlockHash> hashes, BlockId* out, bool stop_at_miss) const;
  static uint64_t KeyHash(NamespaceId ns, const BlockHash& hash) { return HashBytes(hash.bytes(), ns); }
  bool Holds(BlockId id, NamespaceId ns, const BlockHash& hash) const {
    return blocks_[id].ns == ns && blocks_[id].hash == hash;
  }

  NamespaceTable* namespaces_;
  std::array<Tier, kTierCount> tiers_;  // pool tiers only: NVMe's and lower tiers' unused
  std::vector<Block> blocks_;
  std::vector<BlockId> free_ids_;
  std::vector<BlockId> touch_run_;  // Touch's current run, kept to spare an allocation
  FlatIdIndex index_;               // (ns, hash) -> live block
  ResidencyListener residency_listener_;
  RetentionSource retention_source_;
  EraseListener erase_listener_;
};

}  // namespace kvtier
