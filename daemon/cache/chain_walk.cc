// ChainWalk: the requests that wait on the tier chain below the local tiers (chain_walk.h).
#include "daemon/cache/chain_walk.h"

#include <algorithm>

namespace kvtier {

ChainWalk::ChainWalk(BlockTable* blocks, NvmeMover* mover, const std::vector<std::unique_ptr<LowerTierMover>>* lower,
                     CacheCounters* counters, const Clock* clock, int64_t allocate_wait_ns, Hooks hooks)
    : blocks_(blocks),
      mover_(mover),
      lower_(lower),
      counters_(counters),
      clock_(clock),
      allocate_wait_ns_(allocate_wait_ns),
      hooks_(std::move(hooks)),
      holds_(mover ? mover->options().load_hold_ns : 0, kMaxLoadHolds) {}

void ChainWalk::Forget(SessionId session) {
  std::erase_if(pending_acquires_, [&](const auto& p) { return p.second.session == session; });
  std::erase_if(pending_lookups_, [&](const auto& p) { return p.second.session == session; });
}

// ---- lookups -------------------------------------------------------------------------------

std::optional<TierKind> ChainWalk::IndexHit(NamespaceId ns, TenantId tenant, const BlockHash& hash,
                                            const std::optional<BlockRecord>& rec, bool prefetch, bool* from_index) {
  *from_index = false;
  const BlockId id = blocks_->Find(ns, hash);
  if (id != kNoBlock) {
    const Block& b = blocks_->block(id);
    auto tier = blocks_->ReadableTier(b);
    if (!tier && !b.promoting()) return std::nullopt;
    return tier ? *tier : PromotingFrom(id);
  }
  if (!rec) return std::nullopt;
  *from_index = true;
  mover_->nvme().Touch(rec->slot);
  if (prefetch && Promote(ns, tenant, hash, *rec, false).id != kNoBlock) ++counters_->prefetches;
  return TierKind::kNvme;
}

std::optional<CacheLookup> ChainWalk::LookupRest(SessionId session, NamespaceId ns, TenantId tenant,
                                                 std::span<const BlockHash> hashes, CacheLookup r, bool prefetch,
                                                 LookupDone done) {
  WalkDone answer;
  if (done) answer = [done = std::move(done)](CacheLookup l, Found) { done(std::move(l)); };
  auto now = Walk(session, ns, tenant, hashes, std::move(r), prefetch, WalkFor::kLookup, std::move(answer));
  if (!now) return std::nullopt;
  return std::move(now->first);
}

void ChainWalk::Prefetch(SessionId session, NamespaceId ns, TenantId tenant, std::span<const BlockHash> hashes,
                         size_t from) {
  CacheLookup r;
  r.tiers.assign(from, TierKind::kHost);  // where the walk starts; the answer goes to nobody
  Walk(session, ns, tenant, hashes, std::move(r), /*prefetch=*/true, WalkFor::kHint, [](CacheLookup, Found) {});
}

std::optional<std::pair<CacheLookup, ChainWalk::Found>> ChainWalk::Walk(SessionId session, NamespaceId ns,
                                                                        TenantId tenant,
                                                                        std::span<const BlockHash> hashes,
                                                                        CacheLookup r, bool prefetch, WalkFor walk_for,
                                                                        WalkDone done) {
  const bool keep = walk_for == WalkFor::kAcquire;  // the Acquire reads what the walk found
  if (keep) prefetch = false;
  Found found;
  size_t j = r.tiers.size(), chunk = kFirstIndexProbe;
  bool prefix = true;
  if (j < hashes.size() && mover_) {
    NvmeTier::Batch reads_together(&mover_->nvme());  // prefetches: one submission
    // The index is read in growing chunks, stopping at the first miss: a long cold chain
    // costs one small read, not one read of every hash. On the control thread only the
    // first when the Lookup can wait.
    for (const size_t first = j; prefix && j < hashes.size() && (!done || j == first); chunk *= 4) {
      const size_t n = std::min(chunk, hashes.size() - j);
      auto recs = mover_->FindMany(ns, hashes.subspan(j, n));
      if (!recs.ok()) {
        prefix = false;
        break;
      }
      for (size_t k = 0; k < n; ++k, ++j) {
        bool from_index = false;
        const std::optional<TierKind> tier = IndexHit(ns, tenant, hashes[j], (*recs)[k], prefetch, &from_index);
        if (!tier) {
          prefix = false;
          break;
        }
        r.tiers.push_back(*tier);
        if (keep) Keep(found, from_index ? std::move((*recs)[k]) : std::nullopt, 0);
        if (from_index && walk_for == WalkFor::kLookup) holds_.Put(ns, hashes[j], *(*recs)[k], clock_->NowNanos());
      }
    }
  }
  // The rest of the index off the control thread; what the local tiers do not hold, the
  // lower tiers may: asked without waiting here.
  const bool index_left = mover_ && prefix && j < hashes.size();
  const size_t local = r.tiers.size();
  if (done && (index_left || (local < hashes.size() && AvailableLower(0) < lower_->size()))) {
    const uint64_t id = next_pending_++;
    std::vector<BlockHash> rest(hashes.begin() + static_cast<ptrdiff_t>(local), hashes.end());
    pending_lookups_[id] =
        PendingLookup{session,         ns,     std::move(r), hashes.size(),          std::move(rest), 0,
                      std::move(done), tenant, prefetch,     index_left ? chunk : 0, walk_for,        std::move(found)};
    if (index_left) {
      ContinueIndex(id);
    } else {
      ContinueLookup(id);
    }
    return std::nullopt;
  }
  r.matched = r.tiers.size();
  Count(r, hashes.size(), walk_for);
  return std::make_pair(std::move(r), std::move(found));
}

void ChainWalk::Count(const CacheLookup& r, size_t asked, WalkFor walk_for) {
  if (walk_for != WalkFor::kLookup) return;
  for (TierKind t : r.tiers) ++counters_->block_hits[TierIndex(t)];
  counters_->block_misses += asked - r.matched;
}

void ChainWalk::ContinueIndex(uint64_t lookup) {
  PendingLookup& p = pending_lookups_.at(lookup);
  const size_t n = std::min(p.index_chunk, p.rest.size());
  p.index_chunk *= 4;
  mover_->FindManyAsync(p.ns, std::span<const BlockHash>(p.rest).first(n), [this, lookup, n](auto recs) {
    auto it = pending_lookups_.find(lookup);
    if (it == pending_lookups_.end()) return;  // its session went away
    PendingLookup& p = it->second;
    size_t hits = 0;
    bool prefix = recs.ok();
    if (prefix) {
      NvmeTier::Batch reads_together(&mover_->nvme());
      for (; hits < n; ++hits) {
        bool from_index = false;
        const std::optional<TierKind> tier =
            IndexHit(p.ns, p.tenant, p.rest[hits], (*recs)[hits], p.prefetch, &from_index);
        if (!tier) {
          prefix = false;
          break;
        }
        p.result.tiers.push_back(*tier);
        if (p.walk_for == WalkFor::kAcquire) Keep(p.found, from_index ? std::move((*recs)[hits]) : std::nullopt, 0);
        if (from_index && p.walk_for == WalkFor::kLookup) {
          holds_.Put(p.ns, p.rest[hits], *(*recs)[hits], clock_->NowNanos());
        }
      }
    }
    p.rest.erase(p.rest.begin(), p.rest.begin() + static_cast<ptrdiff_t>(hits));
    if (prefix && !p.rest.empty()) {
      ContinueIndex(lookup);
      return;
    }
    p.index_chunk = 0;
    ContinueLookup(lookup);
  });
}

void ChainWalk::ContinueLookup(uint64_t lookup) {
  auto it = pending_lookups_.find(lookup);
  if (it == pending_lookups_.end()) return;  // its session went away
  PendingLookup& p = it->second;
  const size_t tier = AvailableLower(p.next);
  if (!p.rest.empty() && tier < lower_->size()) {
    p.next = tier + 1;
    (*lower_)[tier]->FindPrefix(p.ns, p.rest,
                                [this, lookup, tier](size_t found) { FinishLookup(lookup, tier, found); });
    return;
  }
  PendingLookup done = std::move(p);
  pending_lookups_.erase(it);
  done.result.matched = done.result.tiers.size();
  Count(done.result, done.asked, done.walk_for);
  done.done(std::move(done.result), std::move(done.found));
}

void ChainWalk::FinishLookup(uint64_t lookup, size_t tier, size_t found) {
  auto it = pending_lookups_.find(lookup);
  if (it == pending_lookups_.end()) return;  // its session went away
  PendingLookup& p = it->second;
  p.result.tiers.insert(p.result.tiers.end(), found, (*lower_)[tier]->kind());
  for (size_t k = 0; p.walk_for == WalkFor::kAcquire && k < found; ++k) Keep(p.found, std::nullopt, tier);
  for (size_t k = 0; p.walk_for == WalkFor::kHint && k < found; ++k) {
    if (blocks_->Find(p.ns, p.rest[k]) != kNoBlock) continue;  // in memory or on its way up
    if (Promote(p.ns, p.tenant, p.rest[k], std::nullopt, false, tier).id != kNoBlock) ++counters_->prefetches;
  }
  p.rest.erase(p.rest.begin(), p.rest.begin() + static_cast<ptrdiff_t>(found));
  ContinueLookup(lookup);
}

ChainWalk::Promoted ChainWalk::Promote(NamespaceId ns, TenantId tenant, const BlockHash& hash,
                                       const std::optional<BlockRecord>& rec, bool may_evict, size_t first_lower) {
  size_t lower = 0;  // without an NVMe record: the lower tier to read from
  if (!rec) {
    // The first that can be asked from first_lower on; with none, first_lower itself (it
    // answers kUnavailable); past the chain's end, nowhere.
    lower = AvailableLower(first_lower);
    if (lower == lower_->size()) lower = first_lower;
    if (lower >= lower_->size()) return Promoted{kNoBlock, Room::kNone};
  }
  Promoted p;
  p.room = hooks_.host_room(tenant, may_evict);
  if (p.room != Room::kNow) return p;
  p.id = rec ? mover_->StartPromotion(ns, tenant, hash, *rec) : (*lower_)[lower]->StartPromotion(ns, tenant, hash);
  if (p.id == kNoBlock) {
    p.room = blocks_->pool(TierKind::kHost)->renewing() ? Room::kLater : Room::kNone;  // a segment is on its way
  } else if (!rec) {
    lower_promotions_[p.id] = LowerPromotion{ns, tenant, hash, lower};
  } else if (!lower_->empty()) {
    nvme_promotions_[p.id] = LowerPromotion{ns, tenant, hash, 0};
  }
  return p;
}

size_t ChainWalk::AvailableLower(size_t from) const {
  while (from < lower_->size() && !(*lower_)[from]->available()) ++from;
  return from;
}

size_t ChainWalk::pending_promotions() const {
  size_t n = (mover_ ? mover_->promotions_in_flight() : 0) + queued_promotions_.size();
  for (const auto& l : *lower_) n += l->promotions_in_flight();
  return n;
}

// ---- acquires ------------------------------------------------------------------------------

std::optional<std::vector<CacheResult>> ChainWalk::AcquireRest(SessionId session, NamespaceId ns, TenantId tenant,
                                                               std::span<const BlockHash> hashes,
                                                               std::vector<CacheResult> out,
                                                               std::vector<std::pair<size_t, BlockId>> waits,
                                                               std::span<const size_t> missing, AcquireDone done) {
  Waits w{std::move(waits), {}};
  std::vector<size_t> unheld;  // the entries whose records a Lookup did not hold for this load
  if (mover_ && !missing.empty() && holds_.size() > 0) {
    std::vector<size_t> held;
    Result<std::vector<std::optional<BlockRecord>>> recs(std::vector<std::optional<BlockRecord>>{});
    const int64_t now = clock_->NowNanos();
    for (size_t i : missing) {
      if (auto rec = holds_.Take(ns, hashes[i], now)) {
        ++counters_->load_holds_used;
        held.push_back(i);
        recs->push_back(std::move(rec));
      } else {
        unheld.push_back(i);
      }
    }
    if (!held.empty()) {
      NvmeTier::Batch reads_together(&mover_->nvme());
      ResolveMissing(session, ns, tenant, hashes, held, std::move(recs), done != nullptr, out, &w);
      missing = unheld;
    }
  }
  if (done && mover_ && missing.size() > kFirstIndexProbe) {
    // The index off the control thread: the Acquire waits for the read as for a
    // promotion, and its other entries' promotions go on meanwhile.
    const uint64_t acq = next_pending_++;
    pending_acquires_[acq] =
        PendingAcquire{session, std::move(out), w.promoting.size() + w.queued.size() + 1, std::move(done)};
    Wait(acq, ns, tenant, hashes, std::move(w));
    std::vector<BlockHash> wanted;
    wanted.reserve(missing.size());
    for (size_t i : missing) wanted.push_back(hashes[i]);
    mover_->FindManyAsync(ns, wanted,
                          [this, acq, ns, tenant, all = std::vector<BlockHash>(hashes.begin(), hashes.end()),
                           entries = std::vector<size_t>(missing.begin(), missing.end())](auto recs) {
                            auto it = pending_acquires_.find(acq);
                            if (it == pending_acquires_.end()) return;  // its session went away
                            Waits later;
                            NvmeTier::Batch reads_together(&mover_->nvme());
                            ResolveMissing(it->second.session, ns, tenant, all, entries, std::move(recs), true,
                                           it->second.results, &later);
                            it = pending_acquires_.find(acq);  // promotions may have touched the table
                            if (it == pending_acquires_.end()) return;
                            it->second.outstanding += later.promoting.size() + later.queued.size();
                            Wait(acq, ns, tenant, all, std::move(later));
                            Settle(acq);  // the read
                          });
    return std::nullopt;
  }
  Result<std::vector<std::optional<BlockRecord>>> recs(std::vector<std::optional<BlockRecord>>(missing.size()));
  std::optional<NvmeTier::Batch> reads_together;  // this Acquire's reads: one submission
  if (mover_ && !missing.empty()) {
    reads_together.emplace(&mover_->nvme());
    std::vector<BlockHash> wanted;
    wanted.reserve(missing.size());
    for (size_t i : missing) wanted.push_back(hashes[i]);
    recs = mover_->FindMany(ns, wanted);
  }
  return Resolve(session, ns, tenant, hashes, std::move(out), std::move(w), missing, std::move(recs), {},
                 std::move(done));
}

std::optional<std::vector<CacheResult>> ChainWalk::Resolve(SessionId session, NamespaceId ns, TenantId tenant,
                                                           std::span<const BlockHash> hashes,
                                                           std::vector<CacheResult> out, Waits w,
                                                           std::span<const size_t> missing,
                                                           Result<std::vector<std::optional<BlockRecord>>> recs,
                                                           std::span<const size_t> first_lower, AcquireDone done) {
  if (!missing.empty()) {
    std::optional<NvmeTier::Batch> reads_together;  // this Acquire's reads: one submission
    if (mover_) reads_together.emplace(&mover_->nvme());
    ResolveMissing(session, ns, tenant, hashes, missing, std::move(recs), done != nullptr, out, &w, first_lower);
  }
  if (w.promoting.empty() && w.queued.empty()) return out;
  const uint64_t acq = next_pending_++;
  pending_acquires_[acq] =
      PendingAcquire{session, std::move(out), w.promoting.size() + w.queued.size(), std::move(done)};
  Wait(acq, ns, tenant, hashes, std::move(w));
  return std::nullopt;
}

std::optional<std::vector<CacheResult>> ChainWalk::AcquirePrefixRest(SessionId session, NamespaceId ns, TenantId tenant,
                                                                     std::span<const BlockHash> hashes,
                                                                     std::vector<CacheResult> out,
                                                                     std::vector<size_t> recheck, AcquireDone done) {
  // What is settled once the walk answers: the entries to recheck (no record: found in
  // memory or not at all), the run of entries past the local prefix whose records a Lookup
  // held for this load (no walk for them), then what the walk finds past them.
  struct Settling {
    std::vector<CacheResult> out;
    std::vector<size_t> missing;
    Result<std::vector<std::optional<BlockRecord>>> recs{std::vector<std::optional<BlockRecord>>{}};
    std::vector<size_t> first_lower;
  };
  Settling s{std::move(out), std::move(recheck)};
  s.recs->resize(s.missing.size());
  for (size_t i = s.out.size(); mover_ && holds_.size() > 0 && i < hashes.size(); ++i) {
    auto rec = holds_.Take(ns, hashes[i], clock_->NowNanos());
    if (!rec) break;
    ++counters_->load_holds_used;
    s.missing.push_back(i);
    s.recs->push_back(std::move(rec));
    s.out.emplace_back();
  }
  s.first_lower.assign(s.missing.size(), 0);
  const size_t local = s.out.size();
  auto settle = [this, session, ns, tenant, local](std::span<const BlockHash> chain, Settling s, CacheLookup r,
                                                   Found found, AcquireDone done) {
    s.out.resize(r.matched);
    for (size_t i = local; i < r.matched; ++i) {
      s.missing.push_back(i);
      s.recs->push_back(std::move(found.records[i - local]));
      s.first_lower.push_back(found.lower[i - local]);
    }
    return Resolve(session, ns, tenant, chain.first(r.matched), std::move(s.out), Waits{}, s.missing, std::move(s.recs),
                   s.first_lower, std::move(done));
  };
  CacheLookup r;
  r.tiers.assign(local, TierKind::kHost);  // where the walk starts
  if (!done) {
    auto now = Walk(session, ns, tenant, hashes, std::move(r), false, WalkFor::kAcquire, nullptr);
    return settle(hashes, std::move(s), std::move(now->first), std::move(now->second), nullptr);
  }
  auto later = std::make_shared<std::pair<std::vector<BlockHash>, Settling>>(
      std::vector<BlockHash>(hashes.begin(), hashes.end()), std::move(s));
  auto now = Walk(session, ns, tenant, hashes, std::move(r), false, WalkFor::kAcquire,
                  [this, session, later, settle, done](CacheLookup r, Found found) {
                    auto results = settle(later->first, std::move(later->second), std::move(r), std::move(found), done);
                    if (!results) return;  // the promotions it started answer it
                    hooks_.answered(session);
                    done(std::move(*results));
                  });
  if (!now) return std::nullopt;
  return settle(hashes, std::move(later->second), std::move(now->first), std::move(now->second), std::move(done));
}

void ChainWalk::ResolveMissing(SessionId session, NamespaceId ns, TenantId tenant, std::span<const BlockHash> hashes,
                               std::span<const size_t> missing, Result<std::vector<std::optional<BlockRecord>>> recs,
                               bool can_wait, std::vector<CacheResult>& out, Waits* w,
                               std::span<const size_t> first_lower) {
  const bool ask_lower = AvailableLower(0) < lower_->size();
  for (size_t k = 0; k < missing.size(); ++k) {
    const size_t i = missing[k];
    // An earlier entry may have started it; after a read off the control thread, anyone
    // may have stored or promoted it meanwhile.
    if (const BlockId again = blocks_->Find(ns, hashes[i]); again != kNoBlock) {
      const Block& b = blocks_->block(again);
      if (b.promoting()) {
        w->promoting.emplace_back(i, again);
      } else if (auto tier = blocks_->ReadableTier(b); tier && hooks_.ref(session, again)) {
        out[i].tier = *tier;
        out[i].page = b.page[TierIndex(*tier)];
      } else {
        out[i].status = StatusCode::kUnavailable;
      }
      continue;
    }
    std::optional<BlockRecord> rec;
    if (recs.ok()) rec = std::move((*recs)[k]);
    if (!rec && !ask_lower) {
      out[i].status = StatusCode::kNotFound;
      ++counters_->acquire_misses;
      continue;
    }
    if (!can_wait) {
      // The caller cannot wait for a read: an NVMe block is there but not now; a lower-tier
      // one may not be there at all.
      out[i].status = rec ? StatusCode::kUnavailable : StatusCode::kNotFound;
      continue;
    }
    const size_t from = first_lower.empty() ? 0 : first_lower[k];
    Promoted p;
    if (queued_promotions_.empty()) {
      p = Promote(ns, tenant, hashes[i], rec, true, from);
    } else {
      p.room = Room::kLater;  // behind the queued ones
    }
    if (p.id == kNoBlock && p.room != Room::kLater) {
      // Every host page is leased or referenced and nothing in flight frees one: a miss
      // now, rather than a wait that holds this Acquire's other blocks meanwhile.
      out[i].status = StatusCode::kResourceExhausted;
      continue;
    }
    if (p.id == kNoBlock) {
      // No host page yet (spills are freeing some): read it when one frees up.
      w->queued.push_back(Queued{i, std::move(rec), from});
      continue;
    }
    w->promoting.emplace_back(i, p.id);
  }
}

void ChainWalk::Wait(uint64_t acq, NamespaceId ns, TenantId tenant, std::span<const BlockHash> hashes, Waits w) {
  for (auto [i, id] : w.promoting) AddWaiter(id, {acq, i});
  for (Queued& q : w.queued) {
    const size_t i = q.entry;
    const BlockHash& hash = hashes[i];
    auto same = std::find_if(queued_promotions_.begin(), queued_promotions_.end(),
                             [&](const QueuedPromotion& q) { return q.ns == ns && q.hash == hash; });
    if (same != queued_promotions_.end()) {
      same->waiters.emplace_back(acq, i);
    } else {
      queued_promotions_.push_back(QueuedPromotion{
          ns, tenant, hash, std::move(q.record), q.first_lower, clock_->NowNanos() + allocate_wait_ns_, {{acq, i}}});
    }
  }
}

CacheResult ChainWalk::ResultForWaiter(const Waiter& w, BlockId id, std::optional<TierKind> tier) {
  CacheResult r;
  auto p = pending_acquires_.find(w.first);
  if (tier && p != pending_acquires_.end() && hooks_.ref(p->second.session, id)) {
    r.tier = *tier;
    r.page = blocks_->block(id).page[TierIndex(*tier)];
  } else {
    r.status = StatusCode::kUnavailable;
  }
  return r;
}

void ChainWalk::OnPromoted(BlockId id, const Status& st) {
  std::vector<Waiter> waiters;
  if (auto node = promotion_waiters_.extract(id)) waiters = std::move(node.mapped());
  std::optional<LowerPromotion> from;
  size_t next_tier = 0;  // where a block not found there is looked for next
  if (auto node = lower_promotions_.extract(id)) {
    from = node.mapped();
    next_tier = from->tier + 1;
  } else if (auto stale = nvme_promotions_.extract(id)) {
    from = stale.mapped();  // its NVMe record went stale: the lower tiers, from the first
  }
  if (st.code() == StatusCode::kNotFound && from) {
    // Not in that tier after all: the next one may hold it.
    std::erase_if(waiters, [this](const Waiter& w) { return !pending_acquires_.count(w.first); });
    if (!waiters.empty()) {
      const Promoted next = Promote(from->ns, from->tenant, from->hash, std::nullopt, true, next_tier);
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
  hooks_.pages_freed();
}

void ChainWalk::FinishAcquireEntry(uint64_t acq, size_t index, CacheResult r) {
  auto it = pending_acquires_.find(acq);
  if (it == pending_acquires_.end()) return;
  it->second.results[index] = r;
  Settle(acq);
}

void ChainWalk::Settle(uint64_t acq) {
  auto it = pending_acquires_.find(acq);
  if (it == pending_acquires_.end()) return;
  PendingAcquire& p = it->second;
  if (--p.outstanding > 0) return;
  auto done = std::move(p.done);
  auto results = std::move(p.results);
  const SessionId session = p.session;
  pending_acquires_.erase(it);
  hooks_.answered(session);
  if (done) done(std::move(results));
}

void ChainWalk::ServeQueuedPromotions() {
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
    const Promoted p = Promote(q.ns, q.tenant, q.hash, q.record, true, q.first_lower);
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

}  // namespace kvtier
