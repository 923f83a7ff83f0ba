#pragma once
// CacheManager: the daemon's one owner of cache state — tiers, pages, blocks, the block
// index, eviction — and of what each session holds.
//
// Page states per tier: free -> leased (writable by one session) -> block (cached when
// no session references it, referenced otherwise) -> evicted (free again). In-flight
// pages (being read or written by the NVMe tier) arrive with it. Invariant at all times,
// checked by CheckInvariants():
//   free + leased + inflight + cached + referenced == capacity.
//
// Blocks are keyed by (namespace, hash). The namespace (tenant x model fingerprint) is set
// when a session attaches; sessions only ever see blocks of their own namespace. A
// block's pages in the GPU and host tiers are pinned while any session references it.
//
// Owned by the control thread; not thread-safe. No method blocks.

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "protocol/base/block_key.h"
#include "protocol/base/layout.h"
#include "protocol/base/status.h"
#include "protocol/base/tier.h"
#include "storage/eviction_policy.h"
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
  std::string policy = "lru";
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
  int fd;  // owned by the pool; valid until the segment is renewed
};

struct TierCounts {
  uint32_t capacity = 0, free = 0, leased = 0, inflight = 0, cached = 0, referenced = 0;
  uint64_t blocks = 0;
  uint64_t page_bytes = 0;
};

// Cumulative counters, exported as metrics. hit ratio = block_hits / lookup_blocks.
struct CacheCounters {
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
  std::array<std::vector<uint32_t>, kTierCount> sent_gen_;    // segment -> generation sent
};

class CacheManager {
 public:
  struct Options {
    std::array<TierOptions, kTierCount> tiers;  // indexed by TierIndex
    uint32_t max_entries_per_request = 65536;
  };

  static Result<std::unique_ptr<CacheManager>> Open(const Options& options);
  ~CacheManager();

  // Binds a session to tenant x layout. kInvalidArgument for a bad layout or a block that
  // does not fit a page; kFailedPrecondition if already attached.
  Status Attach(SessionCache& s, std::string_view tenant, const ModelLayout& layout);
  // Drops everything the session holds: leased pages return to free, references go.
  void Detach(SessionCache& s);

  // Leases `count` free pages (all or nothing), evicting cached blocks of the session's
  // tenant if needed. kResourceExhausted when the tier cannot supply them.
  Result<std::vector<PageId>> Allocate(SessionCache& s, TierKind tier, uint32_t count);
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
  // Longest present prefix of the chain in the session's namespace.
  CacheLookup Lookup(SessionCache& s, std::span<const BlockHash> hashes);
  // References each present block (kNotFound per missing entry).
  std::vector<CacheResult> Acquire(SessionCache& s, std::span<const BlockHash> hashes);

  // Segments the session has not been sent (in their current generation) among those
  // holding `pages`; marks them sent.
  std::vector<SegmentGrant> TakeSegmentGrants(SessionCache& s, TierKind tier,
                                              std::span<const PageId> pages);
  // Every segment of every tier its tenant owns now; marks them sent.
  std::vector<SegmentGrant> TakeAllSegmentGrants(SessionCache& s);

  bool tier_enabled(TierKind t) const { return tiers_[TierIndex(t)].pool != nullptr; }
  const TierPool* pool(TierKind t) const { return tiers_[TierIndex(t)].pool.get(); }
  TierCounts Counts(TierKind t) const;
  const CacheCounters& counters() const { return counters_; }
  double high_watermark(TierKind t) const { return tiers_[TierIndex(t)].high; }
  double low_watermark(TierKind t) const { return tiers_[TierIndex(t)].low; }
  // Hex id of a namespace, for display.
  std::string NamespaceHex(NamespaceId ns) const;
  size_t namespace_count() const { return namespaces_.size(); }

  // kInternal describing the first broken accounting identity, if any.
  Status CheckInvariants() const;

 private:
  enum class PageState : uint8_t { kFree, kLeased, kInFlight, kBlock };
  struct Tier {
    TierKind kind = TierKind::kHost;
    std::unique_ptr<TierPool> pool;
    double high = 0.85, low = 0.75;
    std::string policy_name;
    std::vector<PageState> state;
    std::vector<BlockId> page_block;
    std::vector<std::unique_ptr<EvictionPolicy>> policy;  // by tenant
    std::vector<uint32_t> cached_by_tenant;
    uint32_t leased = 0, inflight = 0, cached = 0, referenced = 0;
    uint64_t blocks = 0;
  };
  struct Block {
    NamespaceId ns = 0;
    TenantId tenant = kNoOwner;
    BlockHash hash;
    BlockHash parent;
    std::array<PageId, kTierCount> page;  // kNoPage where not resident
    uint32_t refs = 0;
    bool live = false;
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
    uint32_t users = 0;  // attached sessions + blocks
  };

  explicit CacheManager(const Options& options) : options_(options) {}
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

  bool EvictOne(TierKind tier, TenantId tenant);
  void EnforceWatermark(TierKind tier);
  // Ensures tenant can get one page: evicts its own cached blocks, then other tenants'.
  bool MakeRoom(TierKind tier, TenantId tenant);

  NamespaceId InternNamespace(const std::string& encoded);
  void ReleaseNamespace(NamespaceId ns);
  TenantId InternTenant(std::string_view name);

  Options options_;
  std::array<Tier, kTierCount> tiers_;
  std::vector<Block> blocks_;
  std::vector<BlockId> free_block_ids_;
  std::unordered_map<IndexKey, BlockId, IndexKeyHash> index_;
  std::vector<Namespace> namespaces_;
  std::vector<NamespaceId> free_namespace_ids_;
  std::unordered_map<std::string, NamespaceId> namespace_ids_;
  std::unordered_map<std::string, TenantId> tenant_ids_;
  uint64_t page_bytes_limit_ = 0;
  CacheCounters counters_;
};

}  // namespace kvtier
