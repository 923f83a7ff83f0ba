#pragma once
// EvictionPolicy: chooses which cached block of a tier to evict next.
//
// The cache manager tells a policy about every block resident in its tier: Insert when it
// arrives, Touch on each use, SetEvictable when its reference count drops to zero or
// rises from it, Erase when it leaves. Victim() names the evictable block to evict next;
// the caller then evicts it and calls Erase. Policies never do I/O and know nothing of
// pages or sessions, so kvtier-sim runs the very same classes over traces.
//
// Block ids are small dense integers chosen by the caller (slab indexes); a policy may
// size arrays by the largest id it has seen. Not thread-safe.

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "protocol/base/status.h"

namespace kvtier {

using BlockId = uint32_t;
inline constexpr BlockId kNoBlock = 0xffffffffu;

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  // `id` became resident. `parent` is the resident block of its prefix parent, or
  // kNoBlock; `key` is a stable digest of the block's identity (ids are reused, keys are
  // not), for policies that remember evicted blocks. A new block is evictable until
  // SetEvictable(id, false).
  virtual void Insert(BlockId id, BlockId parent, uint64_t key) = 0;
  // `id` was used (acquired, or hit by a lookup).
  virtual void Touch(BlockId id) = 0;
  // Touch(id) for each of `ids`, in order: one call for a whole matched chain, so a
  // policy pays its dispatch once and may prefetch ahead (a 128K-token chain is 8,192
  // touches in one Lookup). The end state is that of the Touch calls one by one.
  virtual void TouchMany(std::span<const BlockId> ids) {
    for (BlockId id : ids) Touch(id);
  }
  // Whether Victim() may return `id` (false while sessions reference it).
  virtual void SetEvictable(BlockId id, bool evictable) = 0;
  // `id` left the tier (evicted, demoted, dropped).
  virtual void Erase(BlockId id) = 0;
  // The evictable block to evict next, or kNoBlock when none is evictable.
  virtual BlockId Victim() = 0;

  // Resident blocks known to the policy, and how many of them are evictable.
  virtual size_t size() const = 0;
  virtual size_t evictable() const = 0;
  virtual std::string_view name() const = 0;
  // Whether the owner should touch a matched prefix deepest block first, so that a prefix
  // ends up more recently used than its extensions (prefix-aware policies).
  virtual bool touch_prefix_deepest_first() const { return false; }
};

// Policy names accepted by MakeEvictionPolicy:
//   lru         least recently used (the baseline; what vLLM's prefix cache does)
//   prefix-lru  LRU in prefix order: a prefix outlives its extensions
//   arc         ARC (recency and frequency, self-tuning, with ghost history)
//   prefix-arc  ARC in prefix order
//   prefix-lirs LIRS in prefix order (inter-reference recency: keeps a fixed set of chains
//               whole when they come back at distances larger than the tier)
//   adaptive    set dueling among prefix-lru, prefix-arc and prefix-lirs (the default:
//               never below LRU on the traces measured; docs/benchmarks.md)
// `capacity` is the number of blocks the tier holds (ARC sizes its history by it; arrays
// are sized once by it where known). `victims_demoted`: the tier's victims move down into a
// larger tier below (host over NVMe, GPU over host) instead of leaving the cache; adaptive
// then duels without LIRS (adaptive_policy.h says why).
Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name, size_t capacity = 0,
                                                           bool victims_demoted = false);
// The names above.
std::span<const std::string_view> EvictionPolicyNames();
inline constexpr std::string_view kDefaultEvictionPolicy = "adaptive";

}  // namespace kvtier
