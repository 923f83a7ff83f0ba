// CacheManager: the requests that wait — promotions from NVMe and from the chain of lower
// tiers (and the Acquires waiting for them), Lookups answered by the lower tiers, Allocates
// waiting for room. Sessions and their immediate requests are in cache_manager.cc.
#include <algorithm>

#include "daemon/cache/cache_manager.h"
#include "protocol/base/logging.h"

namespace kvtier {

// ---- lookups past the local tiers ----------------------------------------------------------

void CacheManager::ContinueLookup(uint64_t lookup) {
  auto it = pending_lookups_.find(lookup);
  if (it == pending_lookups_.end()) return;  // its session went away
  PendingLookup& p = it->second;
  const size_t tier = AvailableLower(p.next);
  if (!p.rest.empty() && tier < lower_.size()) {
    p.next = tier + 1;
    lower_[tier]->FindPrefix(p.ns, p.rest, [this, lookup, tier](size_t found) { FinishLookup(lookup, tier, found); });
    return;
  }
  PendingLookup done = std::move(p);
  pending_lookups_.erase(it);
  for (TierKind t : done.result.tiers) ++counters_.block_hits[TierIndex(t)];
  done.result.matched = done.result.tiers.size();
  counters_.block_misses += done.asked - done.result.matched;
  done.done(std::move(done.result));
}

void CacheManager::FinishLookup(uint64_t lookup, size_t tier, size_t found) {
  auto it = pending_lookups_.find(lookup);
  if (it == pending_lookups_.end()) return;  // its session went away
  PendingLookup& p = it->second;
  p.result.tiers.insert(p.result.tiers.end(), found, lower_[tier]->kind());
  p.rest.erase(p.rest.begin(), p.rest.begin() + static_cast<ptrdiff_t>(found));
  ContinueLookup(lookup);
}

// ---- waiting requests ----------------------------------------------------------------

CacheManager::Promoted CacheManager::Promote(NamespaceId ns, TenantId tenant, const BlockHash& hash,
                                             const std::optional<BlockRecord>& rec, bool may_evict,
                                             size_t first_lower) {
  size_t lower = 0;  // without an NVMe record: the lower tier to read from
  if (!rec) {
    // The first that can be asked from first_lower on; with none, first_lower itself (it
    // answers kUnavailable); past the chain's end, nowhere.
    lower = AvailableLower(first_lower);
    if (lower == lower_.size()) lower = first_lower;
    if (lower >= lower_.size()) return Promoted{kNoBlock, Room::kNone};
  }
  Promoted p;
  if (may_evict) {
    p.room = MakeRoom(TierKind::kHost, tenant);
  } else {
    const bool free = blocks_->pool(TierKind::kHost)->AvailableTo(tenant) > 0 && !AtQuota(TierKind::kHost, tenant);
    p.room = free ? Room::kNow : Room::kNone;
  }
  if (p.room != Room::kNow) return p;
  p.id = rec ? mover_->StartPromotion(ns, tenant, hash, *rec) : lower_[lower]->StartPromotion(ns, tenant, hash);
  if (p.id == kNoBlock) {
    p.room = Room::kNone;
  } else if (!rec) {
    lower_promotions_[p.id] = LowerPromotion{ns, tenant, hash, lower};
  }
  return p;
}

size_t CacheManager::AvailableLower(size_t from) const {
  while (from < lower_.size() && !lower_[from]->available()) ++from;
  return from;
}

const LowerTierMover* CacheManager::lower_tier(TierKind kind) const {
  for (const auto& l : lower_) {
    if (l->kind() == kind) return l.get();
  }
  return nullptr;
}

size_t CacheManager::pending_promotions() const {
  size_t n = (mover_ ? mover_->promotions_in_flight() : 0) + queued_promotions_.size();
  for (const auto& l : lower_) n += l->promotions_in_flight();
  return n;
}

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

CacheResult CacheManager::ResultForWaiter(const Waiter& w, BlockId id, std::optional<TierKind> tier) {
  CacheResult r;
  auto p = pending_acquires_.find(w.first);
  auto s = p == pending_acquires_.end() ? sessions_.end() : sessions_.find(p->second.session);
  if (tier && s != sessions_.end()) {
    Ref(*s->second, id);
    r.tier = *tier;
    r.page = blocks_->block(id).page[TierIndex(*tier)];
  } else {
    r.status = StatusCode::kUnavailable;
  }
  return r;
}

void CacheManager::OnPromoted(BlockId id, const Status& st) {
  std::vector<Waiter> waiters;
  if (auto node = promotion_waiters_.extract(id)) waiters = std::move(node.mapped());
  std::optional<LowerPromotion> from;
  if (auto node = lower_promotions_.extract(id)) from = node.mapped();
  if (st.code() == StatusCode::kNotFound && from) {
    // Not in that lower tier after all: the next one may hold it.
    std::erase_if(waiters, [this](const Waiter& w) { return !pending_acquires_.count(w.first); });
    if (!waiters.empty()) {
      const Promoted next = Promote(from->ns, from->tenant, from->hash, std::nullopt, true, from->tier + 1);
      if (next.id != kNoBlock) {
        for (const Waiter& w : waiters) AddWaiter(next.id, w);
        return;
      }
    }
  }
  if (st.ok()) {
    for (const auto& w : waiters) {
      if (!pending_acquires_.count(w.first)) continue;  // its session went away
      FinishAcquireEntry(w.first, w.second, ResultForWaiter(w, id, TierKind::kHost));
    }
    return;
  }
  for (const auto& w : waiters) {
    CacheResult r;
    // A block that failed its checksum or left the tier since it was looked up is a miss.
    r.status =
        st.code() == StatusCode::kDataLoss || st.code() == StatusCode::kNotFound ? st.code() : StatusCode::kUnavailable;
    FinishAcquireEntry(w.first, w.second, r);
  }
  ServePendingAllocates();
}

void CacheManager::FinishAcquireEntry(uint64_t acq, size_t index, CacheResult r) {
  auto it = pending_acquires_.find(acq);
  if (it == pending_acquires_.end()) return;
  PendingAcquire& p = it->second;
  p.results[index] = r;
  if (--p.outstanding > 0) return;
  auto done = std::move(p.done);
  auto results = std::move(p.results);
  auto s = sessions_.find(p.session);
  if (s != sessions_.end()) --s->second->pending_;
  pending_acquires_.erase(it);
  if (done) done(std::move(results));
}

void CacheManager::ServeQueuedPromotions() {
  std::optional<NvmeTier::Batch> reads_together;
  if (mover_ && !queued_promotions_.empty()) reads_together.emplace(&mover_->nvme());
  while (!queued_promotions_.empty()) {
    QueuedPromotion& q = queued_promotions_.front();
    // Drop waiters whose sessions left; with none left there is nothing to read for.
    std::erase_if(q.waiters, [this](const auto& w) { return !pending_acquires_.count(w.first); });
    if (q.waiters.empty()) {
      queued_promotions_.pop_front();
      continue;
    }
    // While it waited, another session may have committed the block or started reading it.
    if (const BlockId existing = blocks_->Find(q.ns, q.hash); existing != kNoBlock) {
      const auto waiters = std::move(q.waiters);
      queued_promotions_.pop_front();
      if (blocks_->block(existing).promoting()) {
        for (const auto& w : waiters) AddWaiter(existing, w);
      } else {
        const auto tier = blocks_->ReadableTier(blocks_->block(existing));
        for (const auto& w : waiters) FinishAcquireEntry(w.first, w.second, ResultForWaiter(w, existing, tier));
      }
      continue;
    }
    const Promoted p = Promote(q.ns, q.tenant, q.hash, q.record, true);
    const BlockId id = p.id;
    if (id == kNoBlock) {
      // Still no page: keep waiting while spills in flight will free one, else a miss.
      if (p.room == Room::kLater && clock_->NowNanos() < q.deadline_ns) return;
      for (const auto& w : q.waiters) {
        CacheResult r;
        r.status = StatusCode::kResourceExhausted;
        FinishAcquireEntry(w.first, w.second, r);
      }
      queued_promotions_.pop_front();
      continue;
    }
    for (const auto& w : q.waiters) AddWaiter(id, w);
    queued_promotions_.pop_front();
  }
}

void CacheManager::ServePendingAllocates() {
  ServeQueuedPromotions();
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
