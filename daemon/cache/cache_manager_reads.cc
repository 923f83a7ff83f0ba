// CacheManager's reads: Lookup, Acquire, and the prefix Acquire that an engine's load makes
// (one walk of the chain). Same class as cache_manager.cc, same rules: control thread only.
#include <algorithm>

#include "daemon/cache/cache_manager.h"

namespace kvtier {

std::optional<CacheLookup> CacheManager::Lookup(SessionCache& s, std::span<const BlockHash> hashes, LookupDone done) {
  CacheLookup r;
  ++counters_.lookups;
  counters_.lookup_blocks += hashes.size();
  if (s.attached_) {
    size_t i = 0;
    std::vector<BlockTable::Use>& touched = scratch_uses_;
    touched.clear();
    r.tiers.reserve(hashes.size());
    // In-memory blocks first; then the rest of the chain from the NVMe index, in chunks.
    std::vector<BlockId>& ids = scratch_ids_;
    ids.resize(hashes.size());
    const size_t found = blocks_->FindPrefix(s.ns_, hashes, ids.data());
    const int64_t now = clock_->NowNanos();
    for (; i < found; ++i) {
      const BlockId id = ids[i];
      const Block& b = blocks_->block(id);
      auto tier = blocks_->ReadableTier(b);
      if (!tier) {
        if (!b.promoting()) break;
        tier = walk_->PromotingFrom(id);  // on its way up
      } else {
        touched.push_back({id, *tier});           // an engine wants it: it is in use
        blocks_->NoteUse(id, now, /*hit=*/true);  // while its record is at hand
      }
      r.tiers.push_back(*tier);
    }
    // Prefix-ordered policies see the deepest block first, so the chain's head ends up the
    // most recent.
    if (blocks_->PrefixOrdered(s.tenant_)) std::reverse(touched.begin(), touched.end());
    blocks_->Touch(touched);
    return walk_->LookupRest(s.id_, s.ns_, s.tenant_, hashes, std::move(r), mover_ && mover_->options().prefetch,
                             std::move(done));
  }
  counters_.block_misses += hashes.size();
  return r;
}

std::optional<std::vector<CacheResult>> CacheManager::Acquire(SessionCache& s, std::span<const BlockHash> hashes,
                                                              AcquireDone done) {
  std::vector<CacheResult> out(hashes.size());
  std::vector<std::pair<size_t, BlockId>> waits;  // entry, promoting block
  std::vector<size_t> lower;                      // entries to look for on NVMe, then in the lower tiers
  const bool reverse = s.attached_ && blocks_->PrefixOrdered(s.tenant_);  // deepest first, as Lookup
  std::vector<BlockId>& ids = scratch_ids_;
  ids.assign(hashes.size(), kNoBlock);
  std::vector<BlockTable::Use>& touched = scratch_uses_;  // readable now: referenced below
  touched.clear();
  if (s.attached_) blocks_->FindMany(s.ns_, hashes, ids.data());
  for (size_t n = 0; n < hashes.size(); ++n) {
    const size_t i = reverse ? hashes.size() - 1 - n : n;
    ++counters_.acquires;
    const BlockId id = ids[i];
    if (id != kNoBlock && blocks_->block(id).promoting()) {
      waits.emplace_back(i, id);
      continue;
    }
    std::optional<TierKind> tier;
    if (id != kNoBlock) tier = blocks_->ReadableTier(blocks_->block(id));
    if (!tier) {
      if (s.attached_ && (mover_ || !lower_.empty())) {
        lower.push_back(i);
      } else {
        out[i].status = StatusCode::kNotFound;
        ++counters_.acquire_misses;
      }
      continue;
    }
    touched.push_back({id, *tier});
    out[i].tier = *tier;
    out[i].page = blocks_->block(id).page[TierIndex(*tier)];
  }
  // Touched before referenced: a pinned block ignores Touch.
  blocks_->Touch(touched);
  for (const BlockTable::Use& u : touched) Ref(s, u.id);
  if (waits.empty() && lower.empty()) return out;
  auto now =
      walk_->AcquireRest(s.id_, s.ns_, s.tenant_, hashes, std::move(out), std::move(waits), lower, std::move(done));
  if (!now) ++s.pending_;
  return now;
}

std::optional<std::vector<CacheResult>> CacheManager::AcquirePrefix(SessionCache& s, std::span<const BlockHash> hashes,
                                                                    AcquireDone done) {
  std::vector<CacheResult> out;
  if (!s.attached_) return out;
  // The prefix in the local tiers: referenced now, or (being promoted) settled with the
  // rest of the chain.
  std::vector<size_t> recheck;
  std::vector<BlockTable::Use>& touched = scratch_uses_;
  touched.clear();
  std::vector<BlockId>& ids = scratch_ids_;
  ids.resize(hashes.size());
  const size_t found = blocks_->FindPrefix(s.ns_, hashes, ids.data());
  for (size_t i = 0; i < found; ++i) {
    const Block& b = blocks_->block(ids[i]);
    const auto tier = blocks_->ReadableTier(b);
    if (!tier && !b.promoting()) break;
    out.emplace_back();
    if (!tier) {
      recheck.push_back(i);
      continue;
    }
    touched.push_back({ids[i], *tier});
    out.back().tier = *tier;
    out.back().page = b.page[TierIndex(*tier)];
  }
  if (blocks_->PrefixOrdered(s.tenant_)) std::reverse(touched.begin(), touched.end());
  blocks_->Touch(touched);  // before referenced: a pinned block ignores Touch
  for (const BlockTable::Use& u : touched) Ref(s, u.id);
  if (recheck.empty() && (out.size() == hashes.size() || (!mover_ && lower_.empty()))) {
    counters_.acquires += out.size();
    return out;
  }
  AcquireDone counted;
  if (done) {
    counted = [this, done = std::move(done)](std::vector<CacheResult> r) {
      counters_.acquires += r.size();
      done(std::move(r));
    };
  }
  auto now =
      walk_->AcquirePrefixRest(s.id_, s.ns_, s.tenant_, hashes, std::move(out), std::move(recheck), std::move(counted));
  if (now) {
    counters_.acquires += now->size();
  } else {
    ++s.pending_;
  }
  return now;
}

}  // namespace kvtier
