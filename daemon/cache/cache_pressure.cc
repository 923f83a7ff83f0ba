// CacheManager under pressure: which cached block gives way (EvictOne), the watermarks,
// making room for an allocation (quarantined pages taken back with their segment among
// it), and tenants' quotas and reserves. Same class as cache_manager.cc, same rules:
// control thread only.
#include <algorithm>

#include "daemon/cache/cache_manager.h"
#include "protocol/base/logging.h"

namespace kvtier {

uint32_t CacheManager::QuotaPages(TierKind tier, TenantId t) const {
  if (t >= namespaces_.tenant_count() || !blocks_->enabled(tier)) return 0;
  return LimitUnits(namespaces_.limits(t).quota_bytes[TierIndex(tier)], blocks_->pool(tier)->page_bytes());
}

Share CacheManager::ShareOf(TierKind tier, TenantId t) const {
  Share s;
  s.held = blocks_->pool(tier)->UsedBy(t);
  s.quota = QuotaPages(tier, t);
  if (t < namespaces_.tenant_count()) {
    s.reserve = LimitUnits(namespaces_.limits(t).reserve_bytes[TierIndex(tier)], blocks_->pool(tier)->page_bytes());
  }
  return s;
}

bool CacheManager::AtQuota(TierKind tier, TenantId t) const { return kvtier::AtQuota(ShareOf(tier, t)); }

bool CacheManager::AboveReserve(TierKind tier, TenantId t) const { return kvtier::AboveReserve(ShareOf(tier, t)); }

TenantId CacheManager::LargestCachedTenant(TierKind tier) const {
  return OwnerToShrink<TenantId>(
             static_cast<TenantId>(blocks_->tenant_limit(tier)), [&](TenantId t) { return ShareOf(tier, t); },
             [&](TenantId t) { return blocks_->cached_of(tier, t); })
      .value_or(kNoOwner);
}

bool CacheManager::StartGpuDemotion(BlockId id) {
  const Block& b = blocks_->block(id);
  if (MakeRoom(TierKind::kHost, b.tenant) != Room::kNow) return false;
  const std::optional<PageId> hp = blocks_->Take(TierKind::kHost, b.tenant);
  if (!hp) return false;
  gpu_demoter_->Start(id, *hp);
  return true;
}

void CacheManager::OnGpuDemoted(BlockId id, const Status& st, bool resident, double seconds) {
  const Block& b = blocks_->block(id);
  if (st.ok()) headroom_[TierIndex(TierKind::kGpu)].NoteRoundTrip(seconds);
  if (resident) {
    ++counters_.gpu_demotions;
    QueueLowerPuts(id);
    PumpLowerPuts();
  }
  // The GPU copy goes, as the eviction meant, unless a session took a reference meanwhile.
  if (b.refs == 0) DropCopy(id, TierKind::kGpu);
  ServePendingAllocates();
  EnforceWatermark(TierKind::kGpu);
}

void CacheManager::DropCopy(BlockId id, TierKind kind) {
  const Block& b = blocks_->block(id);
  const TierKind other = kind == TierKind::kHost ? TierKind::kGpu : TierKind::kHost;
  if (b.page[TierIndex(other)] == kNoPage && b.page[TierIndex(TierKind::kNvme)] == kNoPage) {
    RememberEviction(KeyOf(b), kind);
  }
  blocks_->RemoveResidency(id, kind);  // the other copies, if any, live on
  ++counters_.evictions[TierIndex(kind)];
}

CacheManager::Evicted CacheManager::EvictOne(TierKind kind, TenantId tenant) {
  const BlockId victim = blocks_->Victim(kind, tenant);
  if (victim == kNoBlock) return Evicted::kNone;
  if (kind == TierKind::kGpu && tier_enabled(TierKind::kHost)) {
    // GPU -> host: the block keeps living one tier down; its GPU page is freed once the
    // copy thread has put it in host.
    if (blocks_->block(victim).page[TierIndex(TierKind::kHost)] == kNoPage) {
      if (gpu_demoter_->busy()) return Evicted::kBusy;
      if (StartGpuDemotion(victim)) return Evicted::kDemoting;
    }
    DropCopy(victim, kind);
    return Evicted::kDropped;
  }
  const Block& b = blocks_->block(victim);
  // write_back to a lower tier: a block leaving host is put first into each write-back
  // lower tier not holding it (it stays pinned in host until the put is answered, then
  // goes on down as below) — skipping a tier that cannot be asked or refuses puts for
  // space, past which it goes on down at once.
  for (const auto& l : lower_) {
    if (kind != TierKind::kHost || l->write_through() || l->Holds(b) || !l->available() || l->backing_off()) continue;
    if (l->busy()) return Evicted::kBusy;
    l->StartPut(victim);
    return Evicted::kDemoting;
  }
  if (kind == TierKind::kHost && b.page[TierIndex(TierKind::kNvme)] == kNoPage && NvmeSpillable() &&
      mover_->Spillable(b)) {
    if (mover_->busy()) return Evicted::kBusy;
    mover_->StartSpill(victim, /*keep_host=*/false);
    return Evicted::kDemoting;
  }
  if (kind == TierKind::kHost && b.page[TierIndex(TierKind::kNvme)] == kNoPage &&
      b.page[TierIndex(TierKind::kGpu)] == kNoPage && NvmeSpillable() && b.below == 0) {
    // The NVMe tier quantizes and this block may not be quantized (its tenant did not opt
    // in, or its layout cannot be): lost, said once a minute, counted.
    ++counters_.unspillable_drops;
    const int64_t now = clock_->NowNanos();
    if (now - last_unspillable_log_ns_ >= 60'000'000'000) {
      last_unspillable_log_ns_ = now;
      const NamespaceTable::Namespace& n = namespaces_.Get(b.ns);
      KVTIER_LOG(WARNING) << "eviction: blocks of tenant " << n.tenant << ", model " << n.model
                          << " leave host memory without going to NVMe: tiers.nvme.quantization is on and they may "
                             "not be quantized (kvtier_unspillable_evictions_total counts them; logged once a "
                             "minute)";
    }
  }
  // Already on NVMe (so nothing is lost), or nowhere to go: the page is free at once.
  DropCopy(victim, kind);
  return Evicted::kDropped;
}

void CacheManager::EnforceWatermark(TierKind kind) {
  if (!blocks_->enabled(kind)) return;
  const TierPool& pool = *blocks_->pool(kind);
  const double cap = pool.capacity();
  const TierOptions& o = options_.tiers[TierIndex(kind)];
  // Pages being demoted are as good as free for this purpose.
  auto projected = [&] {
    const double used = pool.capacity() - pool.free_count();
    if (kind == TierKind::kGpu) return used - static_cast<double>(gpu_demoter_->in_flight());
    return used - (mover_ ? mover_->demotions_in_flight() : 0);
  };
  // Eviction starts at the high watermark, or earlier when the recent allocation rate
  // needs more pages free than that leaves (the band below it moves down with it).
  double start = o.high_watermark * cap, stop = o.low_watermark * cap;
  // Only where demotions run in the background and are timed: host over NVMe, GPU over
  // host.
  if (kind == TierKind::kHost ? mover_ != nullptr : tier_enabled(TierKind::kHost)) {
    headroom_[TierIndex(kind)].NoteTaken(clock_->NowNanos(), blocks_->pages_taken(kind));
    const double shift = static_cast<double>(headroom_pages(kind)) - (cap - start);
    if (shift > 0) {
      start -= shift;
      stop = std::max(0.0, stop - shift);
    }
  }
  bool& evicting = evicting_[TierIndex(kind)];
  if (!evicting) {
    if (projected() <= start) return;
    evicting = true;
  }
  while (projected() > stop) {
    const TenantId worst = LargestCachedTenant(kind);
    if (worst == kNoOwner) break;
    const Evicted e = EvictOne(kind, worst);
    if (e == Evicted::kBusy) return;  // resumes as spills complete
    if (e == Evicted::kNone) break;
  }
  evicting = false;
}

uint32_t CacheManager::headroom_pages(TierKind t) const {
  if (!IsPoolTier(t) || !tier_enabled(t)) return 0;
  // At most half the tier: a burst never empties the cache.
  return std::min(headroom_[TierIndex(t)].Pages(clock_->NowNanos()), blocks_->pool(t)->capacity() / 2);
}

void CacheManager::ReclaimQuarantineOnlySegments() {
  for (TierKind kind : {TierKind::kGpu, TierKind::kHost}) {
    if (!tier_enabled(kind)) continue;
    for (uint32_t seg : blocks_->TakeQuarantineOnlySegments(kind)) {
      const std::vector<PageId> pages = blocks_->ReclaimQuarantineOnlySegment(kind, seg);
      counters_.quarantine_reclaims += pages.size();
      const std::unordered_set<PageId> back(pages.begin(), pages.end());
      for (auto it = quarantines_.begin(); it != quarantines_.end();) {
        std::erase_if(it->second.pages, [&](const auto& kp) { return kp.first == kind && back.count(kp.second); });
        it = it->second.pages.empty() ? quarantines_.erase(it) : std::next(it);
      }
      KVTIER_LOG(INFO) << pages.size() << " quarantined " << TierKindName(kind) << " pages back: segment " << seg
                       << " held nothing else, and gets new memory before it is used again";
    }
  }
}

Room CacheManager::MakeRoom(TierKind kind, TenantId tenant) {
  const TierPool& pool = *blocks_->pool(kind);
  // Each page freed may leave a segment holding quarantined pages alone: they come back.
  auto available = [&] {
    ReclaimQuarantineOnlySegments();
    return pool.AvailableTo(tenant);
  };
  // Moves in flight will make room: a demotion frees its page (to NVMe; GPU to host), a
  // write-through (to NVMe or a lower tier) makes its block droppable again.
  auto spills_will_help = [&] {
    if (kind == TierKind::kGpu) return gpu_demoter_->in_flight() > 0;
    return (mover_ && mover_->spills_in_flight() > 0) || LowerPutsInFlight();
  };
  // A tenant at its quota makes room among its own blocks, or gets none.
  while (AtQuota(kind, tenant)) {
    const Evicted e = EvictOne(kind, tenant);
    if (e == Evicted::kDemoting || e == Evicted::kBusy) return Room::kLater;
    if (e == Evicted::kNone) return spills_will_help() ? Room::kLater : Room::kOverQuota;
  }
  while (available() == 0) {
    Evicted e = EvictOne(kind, tenant);
    if (e == Evicted::kDropped) continue;
    if (e == Evicted::kDemoting || e == Evicted::kBusy) return Room::kLater;
    // Nothing of ours left to evict: free other tenants' cached blocks until a segment
    // empties and can change hands.
    bool progressed = false;
    for (TenantId t = 0; t < blocks_->tenant_limit(kind) && !progressed; ++t) {
      if (t == tenant || blocks_->cached_of(kind, t) == 0 || !AboveReserve(kind, t)) continue;
      e = EvictOne(kind, t);
      if (e == Evicted::kDemoting || e == Evicted::kBusy) return Room::kLater;
      progressed = e == Evicted::kDropped;
    }
    if (!progressed) return spills_will_help() ? Room::kLater : Room::kNone;
  }
  return Room::kNow;
}

}  // namespace kvtier
