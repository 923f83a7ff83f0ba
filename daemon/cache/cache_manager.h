#pragma once
// CacheManager: the daemon's cache, composed of parts that each own one kind of state —
//   NamespaceTable   tenants and namespaces
//   BlockTable       pages of the GPU and host tiers, the blocks on them, references and
//                    the per-tenant eviction policies
//   NvmeMover        spills, write-throughs and promotions between host and NVMe
//   LowerTierMover   puts, promotions and lookups of one lower tier (a LowerTier below
//                    NVMe), one per tier of the chain below NVMe, in order
//   ChainWalk        what waits on that chain: Lookups and Acquires past the local tiers,
//                    promotions queued and in flight
//   EvictionHistory  the blocks whose last copy left (explain, thrash)
//   CacheViews       what operators read: explain, top blocks (over the tables above)
// — and owning what is left: the sessions and what each holds, Allocates waiting for
// room, the counters and the maintenance drain. Its files: cache_manager.cc (sessions and
// requests), cache_waiting.cc (Allocates that wait, lower-tier puts), cache_pressure.cc
// (eviction and watermarks), cache_manager_admin.cc (kvctl's operations that change it).
//
// Page states per tier: free -> leased (writable by one session) -> block (cached when
// no session references it, referenced otherwise) -> evicted (free again). A host page is
// in flight while the NVMe tier reads it (a spill) or fills it (a promotion). Invariant at
// all times, checked by CheckInvariants():
//   free + leased + inflight + cached + referenced + quarantined == capacity.
// Quarantined pages were leased by a session that ended (or expired) while its process
// still lives: the process may still write through its mapping, so the pages are reused
// only once the process is gone (ReleaseQuarantine), or once every allocated page of their
// segment is quarantined: then the segment gets new memory before it is used again, and
// what the process writes lands in the old (ReclaimQuarantineOnlySegments).
//
// Below host: above the host high watermark cached blocks are demoted (spilled to NVMe,
// put into write-back lower tiers, then their host page freed) down to the low watermark;
// write-through spills and puts every committed block in the background and keeps the host
// copy. A block only on NVMe or in a lower tier is not in the block table: Lookup and
// Acquire find it through ChainWalk, which reads it back into a host page. Allocate of a
// full tier waits for spills and puts in flight to make room instead of dropping blocks.
//
// Blocks are keyed by (namespace, hash). The namespace (tenant x model fingerprint) is set
// when a session attaches; sessions only ever see blocks of their own namespace. A
// block's pages in the GPU and host tiers are pinned while any session references it.
//
// Owned by the control thread; not thread-safe. No method waits for NVMe data I/O or a
// copy, with one exception written as what it is: some reads of the NVMe index (RocksDB
// MultiGet) are made on the control thread — a Lookup's or a prefix Acquire's first 16
// hashes past the local tiers (ChainWalk::kFirstIndexProbe; the rest on the NVMe tier's
// reader thread when the caller can wait), a plain Acquire's missing blocks when there are
// at most 16 of them, Commit's duplicate check, and a slice of CacheViews::Explain.

#include <algorithm>
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

#include "daemon/cache/allocation_headroom.h"
#include "daemon/cache/block_table.h"
#include "daemon/cache/cache_types.h"
#include "daemon/cache/cache_views.h"
#include "daemon/cache/chain_walk.h"
#include "daemon/cache/eviction_history.h"
#include "daemon/cache/gpu_demoter.h"
#include "daemon/cache/lower_tier_mover.h"
#include "daemon/cache/namespace_table.h"
#include "daemon/cache/nvme_mover.h"
#include "daemon/events/kv_events.h"
#include "kernels/device_backend.h"
#include "protocol/base/clock.h"
#include "protocol/base/layout.h"
#include "protocol/base/post.h"
#include "protocol/base/status.h"
#include "protocol/framing.h"
#include "storage/lower_tier.h"
#include "storage/nvme/nvme_tier.h"
#include "storage/policy/session_table.h"
#include "storage/policy/shares.h"

namespace kvtier {

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
  std::unordered_map<BlockId, uint32_t> refs_;              // block -> references held
  uint64_t pending_ = 0;                                    // deferred requests
  uint64_t event_link_ = 0;                                 // its engine's KvEvents link (0: none)
  std::array<std::vector<uint32_t>, kTierCount> sent_gen_;  // segment -> generation sent
};

class CacheManager {
 public:
  struct Options {
    std::array<TierOptions, kTierCount> tiers;  // indexed by TierIndex (host, GPU)
    uint32_t max_entries_per_request = kDefaultMaxEntriesPerRequest;
    // Threads that quantize, dequantize and copy blocks off the control thread, and how
    // their completions reach it (the daemon's event loop). Used by the quantized tiers.
    int block_workers = 2;
    Post post;
    // Copies a GPU page down into a host page (device -> host), run on the GPU tier's copy
    // thread (a GPU tier needs `post`): the GPU page stays readable (and pinned) until the
    // host copy is complete. Null: the GPU memory's own CopyToHost. What it uses (a
    // DeviceBackend of its own) outlives the manager.
    std::function<Status(void* dst, const uint8_t* device_src, uint64_t bytes)> gpu_copy;
    uint32_t max_gpu_demotions_in_flight = 16;
    int64_t allocate_wait_ns = 30'000'000'000;  // longest an Allocate waits for room
    // The most of a tier's pages one tenant's sessions together may hold leased (not yet
    // committed, or quarantined after their session ended) at once, as a fraction; a tenant
    // with a quota on the tier is bounded by that instead. 1: no cap (kvtierd's default is
    // security.max_leased_share, 0.5).
    double max_leased_share = 1.0;
    // Where BlockStored / BlockRemoved events go (events: in the config); null: none.
    // Outlives the manager.
    KvEvents* events = nullptr;
    // The GPU tier's memory (required when tiers[kGpu].enabled); outlives the manager.
    DeviceBackend* device_backend = nullptr;
    int gpu_device = 0;
    // Limits of configured tenants by name; every other tenant gets `unknown_limits`.
    std::unordered_map<std::string, TenantLimits> tenant_limits;
    TenantLimits unknown_limits;
    // Agentic sessions' hints (Hint; storage/policy/session_table.h).
    struct Sessions {
      int64_t max_ttl_ns = 3'600'000'000'000;  // longer TTLs are clamped
      uint32_t max_per_tenant = 4096;          // a tenant's sessions held at once (SessionTable::max_sessions)
      // The most of each pool tier one tenant's hints may protect, as a fraction of the
      // tier's pages: protection beyond it is not given (and counted), so hints cannot
      // pin a tier.
      double protected_share = 0.5;
    };
    Sessions sessions;
  };

  // The NVMe tier and how blocks move to it: spills (at least options.max_spills_in_flight
  // in flight, more where the host tier's watermark band is larger), promotions, the
  // quantized form of opted-in tenants' blocks (the tier's slots are then sized for it).
  struct NvmeSpec {
    NvmeSpec(std::unique_ptr<NvmeTier> t = nullptr) : tier(std::move(t)) {}  // NOLINT: a bare tier is a spec
    std::unique_ptr<NvmeTier> tier;
    NvmeMover::Options options;
  };
  // A tier of the chain below NVMe and how blocks move to it.
  struct LowerTierSpec {
    std::unique_ptr<LowerTier> tier;
    LowerTierMover::Options options;
  };

  // `nvme` (may be null) is the NVMe tier, whose page size must equal the host tier's;
  // `lower` the tiers below it, in chain order (at most LowerTierMover::kMaxLowerTiers).
  static Result<std::unique_ptr<CacheManager>> Open(const Options& options, NvmeSpec nvme = {},
                                                    const Clock* clock = nullptr,
                                                    std::vector<LowerTierSpec> lower = {});
  ~CacheManager();

  // Tenants' limits from a reloaded config (NamespaceTable::SetLimits): host, GPU and
  // remote quotas and reserves apply to the next allocation; the NVMe tier's were fixed
  // at start.
  // security.max_leased_share likewise: the next Allocate's cap (leases held stay).
  void SetTenantLimits(std::unordered_map<std::string, TenantLimits> tenant_limits, TenantLimits unknown_limits,
                       double max_leased_share) {
    namespaces_.SetLimits(std::move(tenant_limits), unknown_limits);
    options_.max_leased_share = max_leased_share;
  }

  // Binds a session to tenant x layout. kInvalidArgument for a bad layout or a block that
  // does not fit a page; kFailedPrecondition if already attached.
  // `source` names the engine in KV events (KvEvents).
  Status Attach(SessionCache& s, std::string_view tenant, const ModelLayout& layout, const EventSource& source = {});
  // Drops everything the session holds: references go, leased pages return to free — or,
  // with `quarantine_leases`, into quarantine until ReleaseQuarantine(returned id); 0 when
  // nothing was quarantined.
  uint64_t Detach(SessionCache& s, bool quarantine_leases = false);
  // The process behind a quarantine exited: its pages are free again.
  void ReleaseQuarantine(uint64_t id);
  // Quarantines whose pages have not all come back (released or reclaimed).
  size_t quarantine_count() const { return quarantines_.size(); }

  using AllocateDone = std::function<void(Result<std::vector<PageId>>)>;
  using AcquireDone = std::function<void(std::vector<CacheResult>)>;
  using LookupDone = std::function<void(CacheLookup)>;

  // Leases `count` free pages (all or nothing), evicting (or demoting) cached blocks of the
  // session's tenant if needed. Returns the result now, or nullopt when the request waits
  // for spills in flight to make room; `done` then runs later with the result (not at
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
  // with `retain` the existing block is referenced instead). `keys` (tokens: empty, or
  // the same number for each page; extra keys: empty, or one per page) are announced with
  // each block's BlockStored event.
  std::vector<CacheResult> Commit(SessionCache& s, TierKind tier, std::span<const PageId> pages,
                                  std::span<const BlockHash> hashes, std::span<const BlockHash> parents, bool retain,
                                  const StoredKeys& keys = {});
  // Per page then per hash: kOk, or kFailedPrecondition when the session holds nothing
  // there.
  std::vector<StatusCode> Release(SessionCache& s, TierKind tier, std::span<const PageId> pages,
                                  std::span<const BlockHash> hashes);
  // Longest present prefix of the chain in the session's namespace, on any tier. When
  // the local tiers end the prefix early and a lower tier can be asked, the answer
  // comes later through `done` (nullopt now; not at all if the session detaches first);
  // with a null `done`, or no lower tier, it is the local answer, now.
  std::optional<CacheLookup> Lookup(SessionCache& s, std::span<const BlockHash> hashes, LookupDone done);
  CacheLookup Lookup(SessionCache& s, std::span<const BlockHash> hashes) { return *Lookup(s, hashes, nullptr); }
  // References each present block (kNotFound per missing entry). Blocks only on NVMe or
  // in a lower tier are promoted into host pages first: then the results come later
  // through `done` (nullopt now), once every entry is settled; an entry whose bytes fail
  // verification is kDataLoss. With a null `done`, such blocks are kUnavailable (lower-tier
  // ones kNotFound).
  std::optional<std::vector<CacheResult>> Acquire(SessionCache& s, std::span<const BlockHash> hashes, AcquireDone done);
  std::vector<CacheResult> Acquire(SessionCache& s, std::span<const BlockHash> hashes) {
    return *Acquire(s, hashes, nullptr);
  }
  // An engine's load: the chain's present prefix referenced, in one walk of the tiers —
  // each block in a local tier, then the rest of the chain as Lookup looks for it (not
  // counted as a lookup), what it finds read into host pages from where it was found (an
  // NVMe block with the index record the walk read: one index read per block). Results for
  // the present prefix only, in chain order; later through `done` as Acquire's.
  std::optional<std::vector<CacheResult>> AcquirePrefix(SessionCache& s, std::span<const BlockHash> hashes,
                                                        AcquireDone done);
  std::vector<CacheResult> AcquirePrefix(SessionCache& s, std::span<const BlockHash> hashes) {
    return *AcquirePrefix(s, hashes, nullptr);
  }

  // Periodic housekeeping (the daemon calls it every 100 ms): resumes spilling after an
  // NVMe back-off, times out waiting Allocates, enforces watermarks, lets sessions whose
  // TTL ran out lapse.
  void Tick();

  // ---- agentic sessions' hints (cache_sessions.cc) ----
  // Session `session` of `tenant` used the present prefix of `chain` in namespace `ns` now;
  // it expects to be back within `ttl_ns` (< 0: its last TTL stands; clamped to
  // Options::sessions.max_ttl_ns) and `end` says it has ended. Blocks a live session uses are
  // evicted after every other block of the tenant (up to its protected share), an ended
  // session's blocks no live one shares before every other (SessionTable). Returns the
  // blocks the hint named (the chain's prefix resident in a pool tier). kResourceExhausted
  // when the tenant holds max_per_tenant sessions, all live (the hint is dropped).
  // `hit_tokens`: what the session's request loaded, as its engine reports it. With
  // `prefetch`, the chain past the prefix the pool tiers hold is read up from NVMe and the
  // lower tiers into free host pages (ChainWalk::Prefetch, never evicting), whether or not
  // the caller stays connected (kvctl does not); the blocks read are the session's from its
  // next hint on.
  Result<uint32_t> Hint(TenantId tenant, NamespaceId ns, std::string_view session, std::span<const BlockHash> chain,
                        int64_t ttl_ns, bool end, uint64_t hit_tokens = 0, bool prefetch = false);
  // The live namespace whose hex id is `hex` and its tenant, for a control session's hint:
  // kNotFound when none is, kPermissionDenied when `tenant` (null: an admin, any tenant) is
  // not its tenant.
  Result<std::pair<TenantId, NamespaceId>> ResolveNamespace(std::string_view hex, const std::string* tenant);
  struct SessionStats {
    uint64_t hints = 0;             // Hint calls that named a session
    uint64_t refused = 0;           // hints of a new session beyond max_per_tenant live ones
    uint64_t over_share = 0;        // protections not given: the tenant's share was full
    uint64_t expired = 0;           // sessions that lapsed (TTL ran out)
    uint64_t clamped = 0;           // TTLs above max_ttl
    uint64_t hit_tokens = 0;        // tokens sessions' requests loaded (Hint's hit_tokens)
    size_t live = 0, sessions = 0;  // sessions live now / known
    TierBytes protected_blocks{};   // blocks protected now, by pool tier (TierIndex)
  };
  SessionStats session_stats() const;
  struct AgentSessionRow {
    std::string tenant, session, state;  // state: live, ended, lapsed
    int64_t ttl_left_ns = 0;             // live: until its TTL runs out
    uint64_t requests = 0, hit_tokens = 0;
    uint32_t blocks = 0, gpu_blocks = 0, host_blocks = 0, protected_blocks = 0;  // of those it names, cached
  };
  // The agentic sessions held, of `tenant` (null: every tenant's), for kvctl agents.
  std::vector<AgentSessionRow> AgentSessions(const std::string* tenant);
  // Scrubs the NVMe tier (kvctl verify).
  void VerifyNvme(std::function<void(VerifyReport)> done);

  // ---- operator operations (kvctl; cache_manager_admin.cc) ----
  // What only reads the cache: kvctl explain, kvctl blocks.
  CacheViews& views() { return *views_; }
  const CacheViews& views() const { return *views_; }
  // Evicts cached blocks of `tier` (largest tenants first, reserves kept) until `bytes`
  // have gone or started going: GPU blocks move to host, host blocks to NVMe when they
  // have no copy there, the rest are dropped.
  EvictReport Evict(TierKind tier, uint64_t bytes);
  // Starts (or stops) a maintenance drain (kvctl drain): while it runs, new GPU leases are
  // refused, GPU blocks are demoted to host, and every host block is written to NVMe so a
  // restart keeps it.
  void SetDrain(bool on);
  DrainStatus Drain() const;
  bool draining() const { return draining_; }
  NvmeTier* nvme() { return mover_ ? &mover_->nvme() : nullptr; }
  const NvmeTier* nvme() const { return mover_ ? &mover_->nvme() : nullptr; }
  // The chain below NVMe, in order.
  const std::vector<std::unique_ptr<LowerTierMover>>& lower_tiers() const { return lower_; }
  size_t pending_promotions() const { return walk_->pending_promotions(); }
  size_t pending_allocates() const {
    size_t n = 0;
    for (const auto& q : pending_allocates_) n += q.size();
    return n;
  }

  // Segments the session has not been sent (in their current generation) among those
  // holding `pages`; marks them sent.
  std::vector<SegmentGrant> TakeSegmentGrants(SessionCache& s, TierKind tier, std::span<const PageId> pages);
  // Every segment of every tier its tenant owns now; marks them sent.
  std::vector<SegmentGrant> TakeAllSegmentGrants(SessionCache& s);

  bool tier_enabled(TierKind t) const {
    if (t == TierKind::kNvme) return mover_ != nullptr;
    if (IsPoolTier(t)) return blocks_->enabled(t);
    return std::any_of(lower_.begin(), lower_.end(), [t](const auto& l) { return l->kind() == t; });
  }
  const TierPool* pool(TierKind t) const { return blocks_->pool(t); }
  // The pages (NVMe: slots) of a GPU, host or NVMe tier by state; all zero for a tier that
  // is off and for a lower tier (it has no pages: its figures are LowerTier::Report's).
  TierCounts Counts(TierKind t) const;
  // The figures of a GPU, host or NVMe tier; only `kind` and zero counts for a tier that is
  // off or a lower tier.
  TierStats Stats(TierKind t) const;
  const CacheCounters& counters() const { return counters_; }
  const KvEvents* events() const { return options_.events; }
  // Pages of pool tier `t` kept free or on their way down ahead of allocations now (0: none
  // beyond the high watermark's; see TierOptions::allocation_headroom).
  uint32_t headroom_pages(TierKind t) const;
  // Hex id of a namespace, for display (of an encoded namespace: NamespaceTable::HexOf).
  std::string NamespaceHex(NamespaceId ns) const { return namespaces_.Hex(ns); }
  size_t namespace_count() const { return namespaces_.size(); }

  // kInternal describing the first broken accounting identity, if any.
  Status CheckInvariants() const;

 private:
  struct PendingAllocate {  // its tier: the queue it waits in
    SessionId session;
    uint32_t count;
    int64_t deadline_ns;
    AllocateDone done;
  };
  using Block = BlockTable::Block;

  explicit CacheManager(const Options& options);
  std::string KeyOf(const Block& b) const { return namespaces_.BlockKey(b.ns, b.hash); }
  bool NvmeSpillable() const { return mover_ && mover_->spillable(); }

  // ---- sessions' references (cache_manager.cc) ----
  void Ref(SessionCache& s, BlockId id);
  bool Unref(SessionCache& s, BlockId id);  // false if the session held no reference
  std::optional<std::vector<PageId>> TakePages(SessionCache& s, TierKind kind, uint32_t count, Room* room);
  // kResourceExhausted when `count` more leased pages would take the session over
  // max_leased_share of the tier.
  Status CheckLeaseCap(const SessionCache& s, TierKind kind, uint32_t count) const;

  // ---- waiting requests (cache_waiting.cc; what waits on the chain is ChainWalk's) ----
  // Host pages will be released soon by someone other than `s`: Acquires wait for reads,
  // reads are in flight, or other sessions reference host blocks (engines release what they
  // acquired once they have copied it). An Allocate of host pages that finds none to free
  // then waits for them (up to allocate_wait) rather than failing; a GPU Allocate does not
  // (managed-pool engines hold GPU blocks for as long as they run on them).
  bool OthersWillRelease(const SessionCache& s, TierKind tier) const {
    return tier == TierKind::kHost && (walk_->acquires_waiting() || walk_->pending_promotions() > 0 ||
                                       blocks_->Counts(tier).referenced > s.refs_.size());
  }
  // Puts `id` (just resident in host) into every write-through lower tier not holding it.
  void QueueLowerPuts(BlockId id);
  void PumpLowerPuts();
  bool LowerPutsInFlight() const;
  // Starts queued promotions and serves waiting Allocates (in that order) as pages free up.
  void ServePendingAllocates();
  void ServePendingAllocates(TierKind kind);
  // Whether a host page can be had for `tenant` now (ChainWalk's promotions).
  Room HostRoom(TenantId tenant, bool may_evict);

  // ---- pressure (cache_pressure.cc) ----
  // Frees (or starts freeing) the page of the tenant's coldest cached block: a block with
  // an NVMe copy, or with no NVMe tier to go to, is dropped at once (kDropped); one that
  // can be spilled is demoted (kDemoting: the page frees later), unless too many spills are
  // in flight (kBusy). kNone when nothing is evictable.
  enum class Evicted { kNone, kDropped, kDemoting, kBusy };
  Evicted EvictOne(TierKind tier, TenantId tenant);
  // Starts copying GPU block `id` into a host page on the GPU copy thread; false when the
  // host tier has no page for it now.
  bool StartGpuDemotion(BlockId id);
  void OnGpuDemoted(BlockId id, const Status& st, bool resident, double seconds);
  // The tenant's session table, made on first use (cache_sessions.cc).
  SessionTable& SessionsOf(TenantId tenant);
  // A block's class from its tenant's session table, in every pool tier it is resident in,
  // protection withheld where the tenant's share of the tier is full.
  void ApplyRetention(TenantId tenant, BlockId id, Retention r, int64_t expected_return, uint32_t depth);
  bool ProtectionRoom(TierKind tier, TenantId tenant);
  void ExpireSessions();
  // Drops block `id`'s copy in `tier`, remembering the eviction when it was the last.
  void DropCopy(BlockId id, TierKind tier);
  void EnforceWatermark(TierKind tier);
  // Ensures the tenant can get one page: evicts its own cached blocks, then other
  // tenants'. kLater when only spills in flight will free one.
  Room MakeRoom(TierKind tier, TenantId tenant);
  // Takes back the quarantined pages of segments where nothing else is allocated, retiring
  // the segments (BlockTable::ReclaimQuarantineOnlySegment): no process can reach the
  // next owner's pages through an old mapping. Quarantines left with no page end.
  void ReclaimQuarantineOnlySegments();
  uint32_t QuotaPages(TierKind tier, TenantId t) const;
  // The tenant's share of a pool tier, in pages; the rule that reads it is shares.h's.
  Share ShareOf(TierKind tier, TenantId t) const;
  bool AtQuota(TierKind tier, TenantId t) const;
  // Whether eviction on behalf of someone else (or of the watermark) may take from `t`.
  bool AboveReserve(TierKind tier, TenantId t) const;
  // The tenant with the most cached pages that is above its reserve (who gives first
  // under pressure), or kNoOwner.
  TenantId LargestCachedTenant(TierKind tier) const;
  void RememberEviction(const std::string& key, TierKind tier) { history_.Remember(key, tier, clock_->NowNanos()); }

  // ---- operator operations (cache_manager_admin.cc) ----
  void DrainStep();

  Options options_;
  const Clock* clock_ = nullptr;
  int64_t last_unspillable_log_ns_ = -60'000'000'000;  // clock_ time of the last such line
  NamespaceTable namespaces_;
  std::unique_ptr<BlockTable> blocks_;
  std::unique_ptr<BlockWorkers> renewer_;  // renews host segments (null without `post`)
  // The keys of the block Commit is making resident, for the residency listener's
  // BlockStored; empty at every other time.
  StoredKeys committing_keys_;
  std::unique_ptr<BlockWorkers> workers_;               // null unless a tier needs them
  std::unique_ptr<GpuDemoter> gpu_demoter_;             // null without a GPU tier
  std::unique_ptr<NvmeMover> mover_;                    // null without an NVMe tier
  std::vector<std::unique_ptr<LowerTierMover>> lower_;  // the chain below NVMe
  std::unique_ptr<ChainWalk> walk_;                     // what waits on NVMe and lower_
  EvictionHistory history_;
  std::unique_ptr<CacheViews> views_;  // reads the tables above
  // Per pool tier: between crossing the high watermark and reaching the low one.
  std::array<bool, kTierCount> evicting_{};
  // By pool tier (TierIndex: GPU, host); fed by EnforceWatermark and the demotions' round
  // trips (host: NVMe spills; GPU: copies down to host).
  std::array<AllocationHeadroom, 2> headroom_;
  std::unordered_map<SessionId, SessionCache*> sessions_;
  // Per tier: an Allocate waits behind earlier ones of its own tier only (a GPU Allocate
  // waiting for GPU demotions never holds up host Allocates).
  std::array<std::deque<PendingAllocate>, kTierCount> pending_allocates_;
  std::vector<BlockId> scratch_ids_;           // the block ids of a Lookup or Acquire, kept to spare an allocation
  std::vector<BlockTable::Use> scratch_uses_;  // the blocks a Lookup or Acquire touches, likewise
  // Leased pages of sessions that ended while their process may live, and whose they were.
  struct Quarantine {
    TenantId tenant = kNoOwner;
    std::vector<std::pair<TierKind, PageId>> pages;
  };
  std::unordered_map<uint64_t, Quarantine> quarantines_;
  uint64_t next_quarantine_ = 1;
  CacheCounters counters_;
  std::vector<std::unique_ptr<SessionTable>> session_tables_;  // by tenant (null: none yet)
  SessionStats session_counts_;                                // the counters of session_stats()
  bool draining_ = false;
};

}  // namespace kvtier
