// CacheManager's operator operations that change the cache (kvctl evict, drain); what only
// reads it is CacheViews'. Same class as cache_manager.cc, same rules: control thread only.

#include <algorithm>

#include "daemon/cache/cache_manager.h"

namespace kvtier {

EvictReport CacheManager::Evict(TierKind kind, uint64_t bytes) {
  EvictReport r;
  if (kind == TierKind::kNvme) {
    if (!mover_) return r;
    const uint64_t slot = mover_->nvme().slot_bytes();
    r.blocks =
        mover_->nvme().EvictColdest(static_cast<uint32_t>(std::min<uint64_t>((bytes + slot - 1) / slot, UINT32_MAX)));
    r.bytes = r.blocks * slot;
    return r;
  }
  if (!tier_enabled(kind)) return r;
  const uint64_t page = blocks_->pool(kind)->page_bytes();
  while (r.bytes < bytes) {
    const TenantId worst = LargestCachedTenant(kind);
    if (worst == kNoOwner) break;
    const Evicted e = EvictOne(kind, worst);
    if (e == Evicted::kNone || e == Evicted::kBusy) break;
    ++r.blocks;
    r.bytes += page;
    if (e == Evicted::kDemoting) ++r.demoting;
  }
  ServePendingAllocates();
  return r;
}

void CacheManager::SetDrain(bool on) {
  if (draining_ == on) return;
  draining_ = on;
  if (on) DrainStep();
}

void CacheManager::DrainStep() {
  // GPU blocks down to host (EvictOne copies each into a host page), only while the host
  // tier has a page at hand: without one EvictOne would drop the block. When it has none,
  // host blocks are demoted to make room and the next tick goes on.
  if (tier_enabled(TierKind::kGpu) && tier_enabled(TierKind::kHost)) {
    for (TenantId t = 0; t < blocks_->tenant_limit(TierKind::kGpu); ++t) {
      while (blocks_->cached_of(TierKind::kGpu, t) > 0) {
        if (blocks_->pool(TierKind::kHost)->AvailableTo(t) == 0 && MakeRoom(TierKind::kHost, t) != Room::kNow) break;
        if (EvictOne(TierKind::kGpu, t) != Evicted::kDropped) break;
      }
    }
  }
  // Every host block without an NVMe copy gets one (kept in host: it is still served);
  // once the queue is through, blocks that arrived since (from the GPU, new commits).
  if (mover_ && mover_->write_through_idle()) {
    for (BlockId id = 0; id < blocks_->id_limit(); ++id) {
      const Block& b = blocks_->block(id);
      if (b.live && !b.spilling() && !b.promoting() && b.page[TierIndex(TierKind::kHost)] != kNoPage &&
          b.page[TierIndex(TierKind::kNvme)] == kNoPage && mover_->Spillable(b)) {
        mover_->QueueWriteThrough(id);
      }
    }
  }
  if (mover_) mover_->PumpWriteThrough();
}

DrainStatus CacheManager::Drain() const {
  DrainStatus d;
  d.draining = draining_;
  d.spills_in_flight = mover_ ? mover_->spills_in_flight() : 0;
  for (BlockId id = 0; id < blocks_->id_limit(); ++id) {
    const Block& b = blocks_->block(id);
    if (!b.live) continue;
    if (b.page[TierIndex(TierKind::kGpu)] != kNoPage) ++(b.refs > 0 ? d.gpu_blocks_pinned : d.gpu_blocks_left);
    if (mover_ && b.page[TierIndex(TierKind::kHost)] != kNoPage && b.page[TierIndex(TierKind::kNvme)] == kNoPage &&
        mover_->Spillable(b)) {
      ++d.host_blocks_unspilled;
    }
  }
  return d;
}

}  // namespace kvtier
