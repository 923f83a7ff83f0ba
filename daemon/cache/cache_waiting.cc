// CacheManager: the requests that wait here — Allocates waiting for room — and the puts
// into the lower tiers; what waits on the chain (promotions, and the Acquires and Lookups
// waiting for them or for a lower tier) is ChainWalk's. Sessions and their immediate
// requests are in cache_manager.cc.
#include <algorithm>

#include "daemon/cache/cache_manager.h"
#include "protocol/base/logging.h"

namespace kvtier {

void CacheManager::QueueLowerPuts(BlockId id) {
  for (const auto& l : lower_) {
    if (l->write_through() && !l->Holds(blocks_->block(id))) l->QueuePut(id);
  }
}

void CacheManager::PumpLowerPuts() {
  for (const auto& l : lower_) l->PumpPuts();
}

bool CacheManager::LowerPutsInFlight() const {
  for (const auto& l : lower_) {
    if (l->puts_in_flight() > 0) return true;
  }
  return false;
}

Room CacheManager::HostRoom(TenantId tenant, bool may_evict) {
  if (may_evict) return MakeRoom(TierKind::kHost, tenant);
  const bool free = blocks_->pool(TierKind::kHost)->AvailableTo(tenant) > 0 && !AtQuota(TierKind::kHost, tenant);
  return free ? Room::kNow : Room::kNone;
}

void CacheManager::ServePendingAllocates() {
  walk_->ServeQueuedPromotions();
  for (TierKind kind : {TierKind::kGpu, TierKind::kHost}) ServePendingAllocates(kind);
}

void CacheManager::ServePendingAllocates(TierKind kind) {
  auto& waiting = pending_allocates_[TierIndex(kind)];
  while (!waiting.empty()) {
    PendingAllocate& p = waiting.front();
    auto s = sessions_.find(p.session);
    if (s == sessions_.end()) {
      waiting.pop_front();
      continue;
    }
    if (Status cap = CheckLeaseCap(*s->second, kind, p.count); !cap.ok()) {
      // Over the cap since it queued (it leased more meanwhile): refused, not waited for.
      PendingAllocate done = std::move(p);
      waiting.pop_front();
      --s->second->pending_;
      ++counters_.allocate_failures;
      done.done(cap);
      continue;
    }
    Room room;
    auto pages = TakePages(*s->second, kind, p.count, &room);
    if (!pages && (room == Room::kLater || (room == Room::kNone && OthersWillRelease(*s->second, kind))) &&
        clock_->NowNanos() < p.deadline_ns) {
      return;
    }
    PendingAllocate done = std::move(p);
    waiting.pop_front();
    --s->second->pending_;
    if (pages) {
      EnforceWatermark(kind);
      done.done(std::move(*pages));
    } else if (room == Room::kOverQuota) {
      ++counters_.allocate_failures;
      ++counters_.quota_refusals;
      done.done(ResourceExhausted("tenant '" + namespaces_.tenant_name(s->second->tenant_) + "' is at its " +
                                  std::string(TierKindName(kind)) + " quota"));
    } else {
      ++counters_.allocate_failures;
      done.done(ResourceExhausted(std::string(TierKindName(kind)) + " tier could not free " +
                                  std::to_string(done.count) + " pages in time"));
    }
  }
}

}  // namespace kvtier
