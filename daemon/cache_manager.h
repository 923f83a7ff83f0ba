#pragma once
// CacheManager: the daemon's one owner of cache state — tiers, pages, blocks, the block
// index, eviction — and of what each session holds.
//
// Page states per tier: free -> leased (writable by one session) -> block (cached when
// no session references it, referenced otherwise) -> evicted (free again). A host page is
// in flight while the NVMe tier reads it (a spill) or fills it (a promotion). Invariant at
// all times, checked by CheckInvariants():
//   free + leased + inflight + cached + referenced + quarantined == capacity.
// Quarantined pages were leased by a session that ended (or expired) while its process
// still lives: the process may still write through its mapping, which cannot be revoked,
// so the pages are reused only once the process is gone (ReleaseQuarantine).
//
// With an NVMe tier: above the host high watermark cached blocks are demoted (spilled,
// then their host page freed) down to the low watermark; write_through spills every
// committed block in the background and keeps the host copy. A block only on NVMe lives
// in the NVMe index, not here: Lookup finds it there, Acquire promotes it into a host page
// and answers when the bytes are in and verified. Allocate of a full tier waits for
// demotions in flight to free pages instead of dropping blocks.
//
// Blocks are keyed by (namespace, hash). The namespace (tenant x model fingerprint) is set
// when a session attaches; sessions only ever see blocks of their own namespace. A
// block's pages in the GPU and host tiers are pinned while any session references it.
//
// Owned by the control thread; not thread-safe. No method blocks.

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "protocol/base/block_key.h"
#include "protocol/base/clock.h"
#include "protocol/base/layout.h"
#include "protocol/base/status.h"
#include "protocol/base/tier.h"
#include "kernels/device_backend.h"
#include "storage/eviction_policy.h"
#include "storage/nvme_tier.h"
#include "storage/tier_pool.h"

namespace kvtier {

using SessionId = uint64_t;
using TenantId = OwnerId;
using NamespaceId = uint32_t;

struct TierOptions {
  bool enabled = false;
  uint64_t capacity_bytes = 0;
  uint64_t page_bytes = 2ull << 20;
  uint64_t segment_bytes = 256ull << 20;
  HugePages huge_pages = HugePages::kAuto;
  double high_watermark = 0.85;
  double low_watermark = 0.75;
  std::string policy = "adaptive";
};

// The outcome for one entry of a vector request.
struct CacheResult {
  StatusCode status = StatusCode::kOk;
  bool duplicate = false;            // Commit: the key existed; the page was not used
  TierKind tier = TierKind::kHost;   // where the block is readable
  PageId page = kNoPage;
};

struct CacheLookup {
  size_t matched = 0;                // blocks 0..matched-1 are present
  std::vector<TierKind> tiers;       // tier of each matched block
};

// A segment a session must map before touching pages in it.
struct SegmentGrant {
  TierKind tier;
  uint32_t index;
  uint32_t first_page;
  uint32_t num_pages;
  uint64_t bytes;
  int fd;  // owned by the pool; valid until the segment is renewed; -1: see ipc_handle
  std::vector<uint8_t> ipc_handle;  // a legacy CUDA IPC handle, for fd == -1
};

struct TierCounts {
  uint32_t capacity = 0, free = 0, leased = 0, inflight = 0, cached = 0, referenced = 0;
  uint32_t quarantined = 0;  // leased by a session that went away while its process lives
  uint64_t blocks = 0;
  uint64_t page_bytes = 0;
};

enum class WritePolicy { kWriteBack, kWriteThrough };

// Cumulative counters, exported as metrics. hit ratio = block_hits / lookup_blocks.
struct CacheCounters {
  uint64_t demotions = 0;        // host blocks moved to NVMe (host copy freed)
  uint64_t write_throughs = 0;   // blocks copied to NVMe, host copy kept
  uint64_t spill_failures = 0;   // demotions or write-throughs that did not make it
  uint64_t promotions = 0;       // NVMe blocks read back into host pages
  uint64_t promotion_failures = 0;
  uint64_t prefetches = 0;
  uint64_t gpu_demotions = 0;    // GPU blocks copied down to host pages
  uint64_t allocate_waits = 0;   // Allocate requests that waited for demotions
  uint64_t lookups = 0;
  uint64_t lookup_blocks = 0;                      // hashes asked about
  std::array<uint64_t, kTierCount> block_hits{};   // matched, by tier
  uint64_t block_misses = 0;                       // lookup_blocks - hits
  std::array<uint64_t, kTierCount> evictions{};    // blocks evicted, by tier
  uint64_t commits_stored = 0;
  uint64_t commits_duplicate = 0;
  uint64_t acquires = 0;
  uint64_t acquire_misses = 0;
  uint64_t allocate_failures = 0;
  uint64_t quota_refusals = 0;   // allocations refused by a tenant's quota
  uint64_t refetches_after_evict = 0;  // blocks committed again that the cache had evicted
};

// Why a block is or is not a hit (kvctl explain).
struct BlockExplanation {
  enum class State : uint8_t {
    kCached = 0,          // a hit: readable in `tier`
    kInFlight = 1,        // being read from NVMe into `tier` (host) right now
    kEvicted = 2,         // it was here and left `tier` (its last copy) seconds_ago
    kOtherNamespace = 3,  // not in the asked namespace, but stored under another one
    kNeverStored = 4,     // not known (or evicted before the history remembers)
  };
  State state = State::kNeverStored;
  TierKind tier = TierKind::kHost;
  bool on_nvme = false;             // kCached: an NVMe copy exists too
  bool writing = false;             // kCached: its NVMe copy is being written
  std::string namespace_hex, tenant, model;  // where it was found
  double seconds_ago = 0;           // kEvicted
  std::string detail;               // one sentence for people
};

// One block, for kvctl blocks.
struct BlockInfo {
  BlockHash hash;
  std::string namespace_hex, tenant, model;
  TierKind tier = TierKind::kHost;  // the fastest tier holding it
  bool on_nvme = false;
  uint64_t bytes = 0;
  uint32_t hits = 0;
  uint32_t refs = 0;
  double idle_s = 0;                // since its last hit (or store)
};

// The state of a maintenance drain (kvctl drain).
struct DrainStatus {
  bool draining = false;
  uint64_t gpu_blocks_left = 0;     // cached GPU blocks not yet demoted to host
  uint64_t gpu_blocks_pinned = 0;   // GPU blocks referenced by sessions: they stay
  uint64_t host_blocks_unspilled = 0;  // host blocks with no NVMe copy yet
  uint32_t spills_in_flight = 0;
};

// What an operator's evict did.
struct EvictReport {
  uint64_t blocks = 0;      // dropped or demoted
  uint64_t bytes = 0;
  uint64_t demoting = 0;    // of which still being written to NVMe (pages free after)
};

// What one session holds. Owned by the session; changed only through CacheManager.
class SessionCache {
 public:
  explicit SessionCache(SessionId id) : id_(id) {}
  SessionCache(const SessionCache&) = delete;
  SessionCache& operator=(const SessionCache&) = delete;

  SessionId id() const { return id_; }
  bool attached() const { return attached_; }
  TenantId tenant() const { return tenant_; }
  NamespaceId ns() const { return ns_; }
  size_t leased_pages() const;
  size_t referenced_blocks() const { return refs_.size(); }

 private:
  friend class CacheManager;
  SessionId id_;
  bool attached_ = false;
  TenantId tenant_ = kNoOwner;
  NamespaceId ns_ = 0;
  std::array<std::unordered_set<PageId>, kTierCount> leased_;
  std::unordered_map<BlockId, uint32_t> refs_;                // block -> references held
  uint64_t pending_ = 0;                                      // deferred requests
  std::array<std::vector<uint32_t>, kTierCount> sent_gen_;    // segment -> generation sent
};

// A tenant's share of each tier, in bytes (indexed by TierIndex); 0 = no quota / no
// reserve. quota: the most it may hold — past it, its own coldest blocks make room, and
// when it has none an Allocate fails; reserve: what other tenants' pressure (their
// allocations, the watermark) never pushes it below.
struct TenantLimits {
  std::array<uint64_t, kTierCount> quota_bytes{};
  std::array<uint64_t, kTierCount> reserve_bytes{};
};

class CacheManager {
 public:
  struct Options {
    std::array<TierOptions, kTierCount> tiers;  // indexed by TierIndex (host, GPU)
    uint32_t max_entries_per_request = 65536;
    WritePolicy write_policy = WritePolicy::kWriteBack;
    bool prefetch = false;               // Lookup starts promoting NVMe hits
    uint32_t max_spills_in_flight = 32;
    int64_t allocate_wait_ns = 30'000'000'000;  // longest an Allocate waits for room
    // The GPU tier's memory (required when tiers[kGpu].enabled); outlives the manager.
    DeviceBackend* device_backend = nullptr;
    int gpu_device = 0;
    // Limits of configured tenants by name; every other tenant gets `unknown_limits`.
    std::unordered_map<std::string, TenantLimits> tenant_limits;
    TenantLimits unknown_limits;
  };

  // `nvme` (may be null) is the NVMe tier, whose page size must equal the host tier's.
  static Result<std::unique_ptr<CacheManager>> Open(const Options& options,
                                                    std::unique_ptr<NvmeTier> nvme = nullptr,
                                                    const Clock* clock = nullptr);
  ~CacheManager();

  // Binds a session to tenant x layout. kInvalidArgument for a bad layout or a block that
  // does not fit a page; kFailedPrecondition if already attached.
  Status Attach(SessionCache& s, std::string_view tenant, const ModelLayout& layout);
  // Drops everything the session holds: references go, leased pages return to free — or,
  // with `quarantine_leases`, into quarantine until ReleaseQuarantine(returned id); 0 when
  // nothing was quarantined.
  uint64_t Detach(SessionCache& s, bool quarantine_leases = false);
  // The process behind a quarantine exited: its pages are free again.
  void ReleaseQuarantine(uint64_t id);

  using AllocateDone = std::function<void(Result<std::vector<PageId>>)>;
  using AcquireDone = std::function<void(std::vector<CacheResult>)>;

  // Leases `count` free pages (all or nothing), evicting (or demoting) cached blocks of the
  // session's tenant if needed. Returns the result now, or nullopt when the request waits
  // for demotions in flight to free pages; `done` then runs later with the result (not at
  // all if the session detaches first). With a null `done` it never waits.
  // kResourceExhausted when the tier cannot supply them.
  std::optional<Result<std::vector<PageId>>> Allocate(SessionCache& s, TierKind tier, uint32_t count,
                                                      AllocateDone done);
  Result<std::vector<PageId>> Allocate(SessionCache& s, TierKind tier, uint32_t count) {
    return *Allocate(s, tier, count, nullptr);
  }
  // pages[i] becomes block hashes[i] (parent parents[i], or none if parents is empty or
  // the parent hash is all zero). Per entry: kFailedPrecondition if the page is not
  // leased by this session; duplicate=true when the key existed (the page is freed, or
  // with `retain` the existing block is referenced instead).
  std::vector<CacheResult> Commit(SessionCache& s, TierKind tier, std::span<const PageId> pages,
                                  std::span<const BlockHash> hashes,
                                  std::span<const BlockHash> parents, bool retain);
  // Per page then per hash: kOk, or kFailedPrecondition when the session holds nothing
  // there.
  std::vector<StatusCode> Release(SessionCache& s, TierKind tier, std::span<const PageId> pages,
                                  std::span<const BlockHash> hashes);
  // Longest present prefix of the chain in the session's namespace, on any tier.
  CacheLookup Lookup(SessionCache& s, std::span<const BlockHash> hashes);
  // References each present block (kNotFound per missing entry). Blocks only on NVMe are
  // promoted into host pages first: then the results come later through `done` (nullopt
  // now), once every entry is settled; an entry whose bytes fail verification is
  // kDataLoss. With a null `done`, NVMe-only blocks are kUnavailable.
  std::optional<std::vector<CacheResult>> Acquire(SessionCache& s, std::span<const BlockHash> hashes,
                                                  AcquireDone done);
  std::vector<CacheResult> Acquire(SessionCache& s, std::span<const BlockHash> hashes) {
    return *Acquire(s, hashes, nullptr);
  }

  // Periodic housekeeping (the daemon calls it every 100 ms): resumes spilling after an
  // NVMe back-off, times out waiting Allocates, enforces watermarks.
  void Tick();
  // Scrubs the NVMe tier (kvctl verify).
  void VerifyNvme(std::function<void(VerifyReport)> done);

  // ---- operator operations (kvctl) ----
  // `tenant`: only that tenant's namespaces are visible; null: every namespace (admins).
  // `ns_hex`: one namespace (NamespaceHex), or empty for every visible one.
  std::vector<BlockExplanation> Explain(std::span<const BlockHash> hashes, std::string_view ns_hex,
                                        const std::string* tenant);
  enum class BlockOrder { kHits, kRecent };
  using BlocksDone = std::function<void(std::vector<BlockInfo>)>;
  // The top `limit` blocks of a tier (nullopt: the GPU and host tiers) by hits or recency.
  // For the NVMe tier the index is scanned on a thread and `done` runs later; otherwise
  // it runs before this returns.
  void TopBlocks(std::optional<TierKind> tier, std::string_view ns_hex, const std::string* tenant,
                 BlockOrder order, size_t limit, BlocksDone done);
  // Evicts cached blocks of `tier` (largest tenants first, reserves kept) until `bytes`
  // have gone or started going: GPU blocks move to host, host blocks to NVMe when they
  // have no copy there, the rest are dropped.
  EvictReport Evict(TierKind tier, uint64_t bytes);
  // Starts (or stops) a maintenance drain: while it runs, new GPU leases are refused, GPU
  // blocks are demoted to host, and every host block is written to NVMe so a restart
  // keeps it.
  void SetDrain(bool on);
  DrainStatus Drain() const;
  bool draining() const { return draining_; }
  NvmeTier* nvme() { return nvme_.get(); }
  const NvmeTier* nvme() const { return nvme_.get(); }
  size_t pending_promotions() const { return promotions_.size() + queued_promotions_.size(); }
  size_t pending_allocates() const { return pending_allocates_.size(); }

  // Segments the session has not been sent (in their current generation) among those
  // holding `pages`; marks them sent.
  std::vector<SegmentGrant> TakeSegmentGrants(SessionCache& s, TierKind tier,
                                              std::span<const PageId> pages);
  // Every segment of every tier its tenant owns now; marks them sent.
  std::vector<SegmentGrant> TakeAllSegmentGrants(SessionCache& s);

  bool tier_enabled(TierKind t) const {
    return t == TierKind::kNvme ? nvme_ != nullptr : tiers_[TierIndex(t)].pool != nullptr;
  }
  const TierPool* pool(TierKind t) const { return tiers_[TierIndex(t)].pool.get(); }
  TierCounts Counts(TierKind t) const;
  const CacheCounters& counters() const { return counters_; }
  double high_watermark(TierKind t) const { return tiers_[TierIndex(t)].high; }
  double low_watermark(TierKind t) const { return tiers_[TierIndex(t)].low; }
  // Hex id of a namespace, for display (of an encoded namespace: NamespaceHexOf).
  std::string NamespaceHex(NamespaceId ns) const;
  static std::string NamespaceHexOf(std::string_view encoded);
  size_t namespace_count() const { return namespaces_.size(); }

  // kInternal describing the first broken accounting identity, if any.
  Status CheckInvariants() const;

 private:
  enum class PageState : uint8_t { kFree, kLeased, kInFlight, kBlock, kQuarantined };
  struct Tier {
    TierKind kind = TierKind::kHost;
    std::unique_ptr<TierPool> pool;
    double high = 0.85, low = 0.75;
    std::string policy_name;
    std::vector<PageState> state;
    std::vector<BlockId> page_block;
    std::vector<std::unique_ptr<EvictionPolicy>> policy;  // by tenant
    std::vector<uint32_t> cached_by_tenant;
    std::vector<uint32_t> quota_pages, reserve_pages;  // by tenant; 0: none
    uint32_t leased = 0, inflight = 0, cached = 0, referenced = 0, quarantined = 0;
    bool draining = false;  // between crossing the high watermark and reaching the low one
    uint64_t blocks = 0;
  };
  struct Block {
    NamespaceId ns = 0;
    TenantId tenant = kNoOwner;
    BlockHash hash;
    BlockHash parent;
    std::array<PageId, kTierCount> page;  // kNoPage where not resident; [kNvme] = slot
    uint32_t refs = 0;
    uint32_t gen = 0;        // bumped on reuse of the id; async completions check it
    bool live = false;
    bool spilling = false;   // host page being written to NVMe
    bool promoting = false;  // host page being filled from NVMe
    uint32_t hits = 0;       // lookups and acquires that found it
    int64_t last_use_ns = 0;
  };
  struct IndexKey {
    NamespaceId ns;
    BlockHash hash;
    friend bool operator==(const IndexKey& a, const IndexKey& b) {
      return a.ns == b.ns && a.hash == b.hash;
    }
  };
  struct IndexKeyHash {
    size_t operator()(const IndexKey& k) const { return HashBytes(k.hash.bytes(), k.ns); }
  };
  struct Namespace {
    std::string encoded;
    std::string fingerprint;   // the layout's
    uint64_t block_bytes = 0;  // bytes of block data in a page
    uint32_t users = 0;        // attached sessions + blocks
    std::string tenant, model;  // for kvctl
  };
  // Blocks whose last copy left the cache, newest last, bounded: for explain and for
  // counting blocks committed again after eviction (thrash).
  struct EvictionRecord {
    TierKind tier;
    int64_t at_ns;
    uint64_t seq;  // its place in evicted_order_
  };
  static constexpr size_t kEvictionHistory = 16384;
  void RememberEviction(const std::string& key, TierKind tier);
  void DrainStep();
  BlockInfo InfoOf(BlockId id) const;
  bool Visible(NamespaceId ns, std::string_view ns_hex, const std::string* tenant) const;
  struct PendingAcquire {
    SessionId session;
    std::vector<CacheResult> results;
    size_t outstanding = 0;
    AcquireDone done;
  };
  struct PendingAllocate {
    SessionId session;
    TierKind tier;
    uint32_t count;
    int64_t deadline_ns;
    AllocateDone done;
  };
  // A block being read from NVMe, and who waits for it: (pending acquire, entry index).
  struct Promotion {
    uint32_t gen;
    std::vector<std::pair<uint64_t, size_t>> waiters;
  };
  // An NVMe block to promote once the host tier has a page for it.
  struct QueuedPromotion {
    NamespaceId ns;
    TenantId tenant;
    BlockHash hash;
    BlockRecord record;
    int64_t deadline_ns;
    std::vector<std::pair<uint64_t, size_t>> waiters;
  };
  enum class Room { kNow, kLater, kNone, kOverQuota };

  explicit CacheManager(const Options& options) : options_(options) {}
  std::string KeyOf(const Block& b) const;
  BlockRecord RecordFor(const Block& b) const;
  int BufferIndex(TierKind tier, PageId page);
  bool NvmeSpillable() const { return nvme_ && nvme_->spill_available(); }
  // Demotion and write-through.
  void StartSpill(BlockId id, bool keep_host);
  void OnSpilled(BlockId id, uint32_t gen, bool keep_host, Status st, uint32_t slot);
  void PumpWriteThrough();
  // Promotion.
  // Reads an NVMe-only block into a host page; kNoBlock when no page can be had now
  // (`may_evict` false: only a page free without evicting anything).
  BlockId StartPromotion(NamespaceId ns, TenantId tenant, const BlockHash& hash, const BlockRecord& rec,
                         bool may_evict);
  void OnPromoted(BlockId id, uint32_t gen, Status st, BlockRecord rec);
  void FinishAcquireEntry(uint64_t acquire, size_t index, CacheResult r);
  // Starts queued promotions and serves waiting Allocates (in that order) as pages free up.
  void ServePendingAllocates();
  void ServeQueuedPromotions();
  void OnNvmeDropped(const std::string& key, uint32_t slot);
  std::optional<std::vector<PageId>> TakePages(SessionCache& s, TierKind kind, uint32_t count, Room* room);
  Tier& T(TierKind t) { return tiers_[TierIndex(t)]; }
  const Tier& T(TierKind t) const { return tiers_[TierIndex(t)]; }
  EvictionPolicy& PolicyFor(Tier& tier, TenantId tenant);
  uint32_t& CachedOf(Tier& tier, TenantId tenant);

  BlockId FindBlock(NamespaceId ns, const BlockHash& hash) const;
  BlockId NewBlock(NamespaceId ns, TenantId tenant, const BlockHash& hash, const BlockHash& parent);
  void EraseBlock(BlockId id);
  void AddResidency(BlockId id, TierKind tier, PageId page);
  void RemoveResidency(BlockId id, TierKind tier);
  void Ref(SessionCache& s, BlockId id);
  bool Unref(SessionCache& s, BlockId id);  // false if the session held no reference
  // Best tier a block is readable from (GPU, then host), or nullopt.
  std::optional<TierKind> ReadableTier(const Block& b) const;
  // Whether the session's host policy wants matched prefixes touched deepest first.
  bool PrefixOrdered(SessionCache& s);

  // Frees (or starts freeing) the page of the tenant's coldest cached block: a block with
  // an NVMe copy, or with no NVMe tier to go to, is dropped at once (kDropped); one that
  // can be spilled is demoted (kDemoting: the page frees later), unless too many spills are
  // in flight (kBusy). kNone when nothing is evictable.
  enum class Evicted { kNone, kDropped, kDemoting, kBusy };
  Evicted EvictOne(TierKind tier, TenantId tenant);
  void EnforceWatermark(TierKind tier);
  // Ensures the tenant can get one page: evicts its own cached blocks, then other
  // tenants'. kLater when only demotions in flight will free one.
  Room MakeRoom(TierKind tier, TenantId tenant);

  NamespaceId InternNamespace(const std::string& encoded, const std::string& fingerprint,
                              uint64_t block_bytes, std::string_view tenant = {}, std::string_view model = {});
  void ReleaseNamespace(NamespaceId ns);
  TenantId InternTenant(std::string_view name);
  uint32_t QuotaPages(const Tier& tier, TenantId t) const { return t < tier.quota_pages.size() ? tier.quota_pages[t] : 0; }
  uint32_t ReservePages(const Tier& tier, TenantId t) const {
    return t < tier.reserve_pages.size() ? tier.reserve_pages[t] : 0;
  }
  // Whether eviction on behalf of someone else (or of the watermark) may take from `t`.
  bool AboveReserve(const Tier& tier, TenantId t) const { return tier.pool->UsedBy(t) > ReservePages(tier, t); }
  // The tenant with the most cached pages that is above its reserve (who gives first
  // under pressure), or kNoOwner.
  TenantId LargestCachedTenant(const Tier& tier) const;
  std::vector<std::string> tenant_names_;  // by TenantId

  Options options_;
  std::array<Tier, kTierCount> tiers_;
  std::vector<Block> blocks_;
  std::vector<BlockId> free_block_ids_;
  std::unordered_map<IndexKey, BlockId, IndexKeyHash> index_;
  std::vector<Namespace> namespaces_;
  std::vector<NamespaceId> free_namespace_ids_;
  std::unordered_map<std::string, NamespaceId> namespace_ids_;
  std::unordered_map<std::string, TenantId> tenant_ids_;
  const Clock* clock_ = nullptr;
  std::unique_ptr<NvmeTier> nvme_;
  std::vector<bool> registered_segments_;
  uint32_t spills_in_flight_ = 0;
  uint32_t demotions_in_flight_ = 0;
  std::deque<std::pair<BlockId, uint32_t>> write_through_queue_;
  std::unordered_map<BlockId, Promotion> promotions_;
  std::deque<QueuedPromotion> queued_promotions_;
  std::unordered_map<uint64_t, PendingAcquire> pending_acquires_;
  std::deque<PendingAllocate> pending_allocates_;
  std::unordered_map<SessionId, SessionCache*> sessions_;
  uint64_t next_pending_ = 1;
  std::unordered_map<uint64_t, std::vector<std::pair<TierKind, PageId>>> quarantines_;
  uint64_t next_quarantine_ = 1;
  CacheCounters counters_;
  std::unordered_map<std::string, EvictionRecord> evicted_;  // block key -> its eviction
  std::deque<std::pair<std::string, uint64_t>> evicted_order_;  // oldest first; stale entries skipped
  uint64_t next_eviction_seq_ = 0;
  bool draining_ = false;
};

}  // namespace kvtier
