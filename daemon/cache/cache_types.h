#pragma once
// Value types shared by the cache manager's parts and its callers (dispatcher, daemon,
// metrics): identifiers, tier options, per-entry results, counters and the reports of the
// operator operations. No behaviour; thread-compatible.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol/base/block_key.h"
#include "protocol/base/block_state.h"
#include "protocol/base/operator_reports.h"
#include "protocol/base/tier.h"
#include "storage/pool/segment_memory.h"
#include "storage/pool/tier_pool.h"

namespace kvtier {

using SessionId = uint64_t;  // the server's, from 1
// The daemon's own work on the chain (sessions' prefetch hints): no client's session.
inline constexpr SessionId kDaemonSession = ~SessionId{0};
using TenantId = OwnerId;
using NamespaceId = uint32_t;

// One pool tier (host RAM or GPU). The defaults are the daemon's (config.h uses this
// struct for tiers.host and tiers.gpu), except `enabled`: a tier is off unless asked for.
struct TierOptions {
  bool enabled = false;
  uint64_t capacity_bytes = 1ull << 30;
  uint64_t page_bytes = 2ull << 20;  // GPU pages have the host tier's size
  uint64_t segment_bytes = 256ull << 20;
  HugePages huge_pages = HugePages::kAuto;  // host only
  // Host only: the pool may be larger than the machine's memory or the cgroup's limit.
  // Without it kvtierd touches every page when it creates a segment, so the pool is
  // charged to kvtierd's memory cgroup, not to the engine that writes a page first (a
  // pool larger than memory cannot be touched whole: with it, pages are charged to
  // whoever touches them first).
  bool overcommit = false;
  double high_watermark = 0.85;
  double low_watermark = 0.75;
  std::string policy = "adaptive";
  // Keep free (or on their way down) the pages engines take in this many demotion round
  // trips at the recent allocation rate, evicting before the high watermark when that is
  // more (AllocationHeadroom). Applies where demotions run in the background: host over
  // NVMe, GPU over host with the copy thread. 0: the watermarks alone.
  double allocation_headroom = 0;
  bool operator==(const TierOptions&) const = default;
};

// The outcome for one entry of a vector request.
struct CacheResult {
  StatusCode status = StatusCode::kOk;
  bool duplicate = false;           // Commit: the key existed; the page was not used
  TierKind tier = TierKind::kHost;  // where the block is readable
  PageId page = kNoPage;
};

struct CacheLookup {
  size_t matched = 0;           // blocks 0..matched-1 are present
  std::vector<TierKind> tiers;  // tier of each matched block
};

// A segment a session must map before touching pages in it.
struct SegmentGrant {
  TierKind tier;
  uint32_t index;
  uint32_t first_page;
  uint32_t num_pages;
  uint64_t bytes;
  int fd;                           // owned by the pool; valid until the segment is renewed; -1: see ipc_handle
  std::vector<uint8_t> ipc_handle;  // a legacy CUDA IPC handle, for fd == -1
};

struct TierCounts {
  uint32_t capacity = 0, free = 0, leased = 0, inflight = 0, cached = 0, referenced = 0;
  uint32_t quarantined = 0;  // leased by a session that went away while its process lives
  uint64_t blocks = 0;
  uint64_t page_bytes = 0;
};

// One tier's figures, the same for every tier: the Stats reply and the metrics read them.
struct TierStats {
  TierKind kind = TierKind::kHost;
  TierCounts counts;
  double high_watermark = 0, low_watermark = 0;
  uint64_t evictions = 0;  // blocks removed under pressure
  // Pool tiers: segments given new memory as they changed tenant, and renewals that failed.
  uint64_t segment_renewals = 0, segment_renewal_failures = 0;
  std::string backend;        // its memory or slot files, for people
  std::string io_backend;     // NVMe: "io_uring" or "threads"; else empty
  std::string index_backend;  // NVMe: the block index; else empty
  bool ready = true;          // NVMe: its index is loaded and spills are accepted
};

enum class WritePolicy { kWriteBack, kWriteThrough };

// Whether a page of a pool tier can be had for a tenant: now, later (something in flight
// frees one), not at all, or not within the tenant's quota.
enum class Room { kNow, kLater, kNone, kOverQuota };
// The config's words for them (tiers.nvme.write_policy, tiers.remote.write_policy).
inline constexpr std::pair<std::string_view, WritePolicy> kWritePolicyNames[] = {
    {"write_back", WritePolicy::kWriteBack}, {"write_through", WritePolicy::kWriteThrough}};

// Cumulative counters, exported as metrics. hit ratio = block_hits / lookup_blocks.
struct CacheCounters {
  uint64_t demotions = 0;          // host blocks moved to NVMe (host copy freed)
  uint64_t write_throughs = 0;     // blocks copied to NVMe, host copy kept
  uint64_t spill_failures = 0;     // demotions or write-throughs that did not make it
  uint64_t unspillable_drops = 0;  // host blocks evicted past an NVMe tier they may not go to
  uint64_t promotions = 0;         // NVMe blocks read back into host pages
  uint64_t promotion_failures = 0;
  uint64_t prefetches = 0;
  uint64_t load_holds_used = 0;  // index records a load took from its Lookup's (LoadHolds) instead of reading them
  uint64_t gpu_demotions = 0;    // GPU blocks copied down to host pages
  uint64_t allocate_waits = 0;   // Allocate requests that waited for demotions
  uint64_t lookups = 0;
  uint64_t lookup_blocks = 0;                     // hashes asked about
  std::array<uint64_t, kTierCount> block_hits{};  // matched, by tier
  uint64_t block_misses = 0;                      // lookup_blocks - hits
  std::array<uint64_t, kTierCount> evictions{};   // blocks evicted, by tier
  uint64_t commits_stored = 0;
  uint64_t commits_duplicate = 0;
  uint64_t acquires = 0;
  uint64_t acquire_misses = 0;
  uint64_t allocate_failures = 0;
  uint64_t quota_refusals = 0;         // allocations refused by a tenant's quota
  uint64_t refetches_after_evict = 0;  // blocks committed again that the cache had evicted
  uint64_t quarantine_reclaims = 0;    // quarantined pages taken back with their segment renewed
};

// A tenant's share of each tier, in bytes (indexed by TierIndex); 0 = no quota / no
// reserve. quota: the most it may hold — past it, its own coldest blocks make room, and
// when it has none an Allocate fails; reserve: what other tenants' pressure (their
// allocations, the watermark) never pushes it below.
struct TenantLimits {
  TierBytes quota_bytes{};
  TierBytes reserve_bytes{};
  // Whether its blocks may be stored quantized in the cold tiers that quantize (lossy).
  bool kv_quantization = false;
};

}  // namespace kvtier
