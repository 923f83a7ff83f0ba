// CacheManager's operator operations (kvctl explain, blocks, evict, drain) and the
// eviction history they and the thrash counter read. Same class as cache_manager.cc, same
// rules: control thread only, nothing blocks.

#include <algorithm>
#include <cstdio>

#include "daemon/cache_manager.h"

namespace kvtier {
namespace {

std::string Ago(double s) {
  char buf[64];
  if (s < 120) std::snprintf(buf, sizeof(buf), "%.1f s ago", s);
  else if (s < 7200) std::snprintf(buf, sizeof(buf), "%.0f min ago", s / 60);
  else std::snprintf(buf, sizeof(buf), "%.1f h ago", s / 3600);
  return buf;
}

}  // namespace

void CacheManager::RememberEviction(const std::string& key, TierKind tier) {
  // A key evicted again (or refetched and dropped from the map) gets a new place; its old
  // place in the order is skipped when it comes up.
  const uint64_t seq = next_eviction_seq_++;
  evicted_.insert_or_assign(key, EvictionRecord{tier, clock_->NowNanos(), seq});
  evicted_order_.emplace_back(key, seq);
  while (evicted_.size() > kEvictionHistory || evicted_order_.size() > 2 * kEvictionHistory) {
    auto& [old, old_seq] = evicted_order_.front();
    auto it = evicted_.find(old);
    if (it != evicted_.end() && it->second.seq == old_seq) evicted_.erase(it);
    evicted_order_.pop_front();
  }
}

bool CacheManager::Visible(NamespaceId ns, std::string_view ns_hex, const std::string* tenant) const {
  const Namespace& n = namespaces_[ns];
  if (n.users == 0) return false;
  if (tenant && n.tenant != *tenant) return false;
  return ns_hex.empty() || NamespaceHex(ns) == ns_hex;
}

std::vector<BlockExplanation> CacheManager::Explain(std::span<const BlockHash> hashes, std::string_view ns_hex,
                                                    const std::string* tenant) {
  std::vector<BlockExplanation> out;
  const int64_t now = clock_->NowNanos();
  for (const BlockHash& h : hashes) {
    BlockExplanation e;
    auto found_in = [&](NamespaceId ns) {
      e.namespace_hex = NamespaceHex(ns);
      e.tenant = namespaces_[ns].tenant;
      e.model = namespaces_[ns].model;
    };
    // 1. Cached (or on its way up) in an asked namespace.
    for (NamespaceId ns = 0; ns < namespaces_.size() && e.state == BlockExplanation::State::kNeverStored; ++ns) {
      if (!Visible(ns, ns_hex, tenant)) continue;
      const BlockId id = FindBlock(ns, h);
      std::optional<BlockRecord> rec;
      if (id == kNoBlock && nvme_) {
        auto r = nvme_->Find(EncodeBlockKey(namespaces_[ns].encoded, h));
        if (r.ok() && r->has_value()) rec = **r;
      }
      if (id == kNoBlock && !rec) continue;
      found_in(ns);
      if (id != kNoBlock && blocks_[id].promoting) {
        e.state = BlockExplanation::State::kInFlight;
        e.tier = TierKind::kHost;
        e.on_nvme = true;
        e.detail = "in flight: being read from NVMe into a host page; an Acquire now waits for it";
        continue;
      }
      e.state = BlockExplanation::State::kCached;
      if (id != kNoBlock) {
        const Block& b = blocks_[id];
        e.tier = *ReadableTier(b);
        e.on_nvme = b.page[TierIndex(TierKind::kNvme)] != kNoPage;
        e.writing = b.spilling;
      } else {
        e.tier = TierKind::kNvme;
        e.on_nvme = true;
      }
      e.detail = "a hit: cached in the " + std::string(TierKindName(e.tier)) + " tier" +
                 (e.tier != TierKind::kNvme && e.on_nvme ? " (and on NVMe)" : "") +
                 (e.writing ? "; its NVMe copy is being written" : "");
    }
    if (e.state != BlockExplanation::State::kNeverStored) {
      out.push_back(std::move(e));
      continue;
    }
    // 2. Evicted from an asked namespace, while the history remembers it.
    for (NamespaceId ns = 0; ns < namespaces_.size(); ++ns) {
      if (!Visible(ns, ns_hex, tenant)) continue;
      auto it = evicted_.find(EncodeBlockKey(namespaces_[ns].encoded, h));
      if (it == evicted_.end()) continue;
      found_in(ns);
      e.state = BlockExplanation::State::kEvicted;
      e.tier = it->second.tier;
      e.seconds_ago = static_cast<double>(now - it->second.at_ns) * 1e-9;
      e.detail = "evicted: its last copy left the " + std::string(TierKindName(e.tier)) + " tier " +
                 Ago(e.seconds_ago) +
                 (e.tier == TierKind::kNvme ? " (the NVMe tier was full)"
                  : nvme_                    ? " (not demoted: the NVMe tier was backing off or busy)"
                                             : " (no NVMe tier to demote it to)");
      break;
    }
    if (e.state != BlockExplanation::State::kNeverStored) {
      out.push_back(std::move(e));
      continue;
    }
    // 3. Stored under another namespace the caller may see: another model or layout (its
    // fingerprint differs), or another tenant (admins only see those).
    for (NamespaceId ns = 0; ns < namespaces_.size(); ++ns) {
      if (namespaces_[ns].users == 0 || (tenant && namespaces_[ns].tenant != *tenant)) continue;
      if (Visible(ns, ns_hex, tenant)) continue;  // asked already
      bool there = FindBlock(ns, h) != kNoBlock;
      if (!there && nvme_) {
        auto r = nvme_->Find(EncodeBlockKey(namespaces_[ns].encoded, h));
        there = r.ok() && r->has_value();
      }
      if (!there) continue;
      found_in(ns);
      e.state = BlockExplanation::State::kOtherNamespace;
      e.detail = "not in the namespace asked about, but stored under tenant '" + e.tenant + "' model '" + e.model +
                 "' (namespace " + e.namespace_hex +
                 "): engines see only blocks of their own tenant and exact layout (model, heads, dtype, "
                 "tokens per block, block bytes)";
      break;
    }
    if (e.state == BlockExplanation::State::kNeverStored) {
      e.detail = "never stored (or evicted more than " + std::to_string(kEvictionHistory) +
                 " evictions ago): no engine committed it, or it went before the history remembers";
    }
    out.push_back(std::move(e));
  }
  return out;
}

BlockInfo CacheManager::InfoOf(BlockId id) const {
  const Block& b = blocks_[id];
  BlockInfo i;
  i.hash = b.hash;
  i.namespace_hex = NamespaceHex(b.ns);
  i.tenant = namespaces_[b.ns].tenant;
  i.model = namespaces_[b.ns].model;
  i.tier = ReadableTier(b).value_or(TierKind::kNvme);
  i.on_nvme = b.page[TierIndex(TierKind::kNvme)] != kNoPage;
  i.bytes = namespaces_[b.ns].block_bytes;
  i.hits = b.hits;
  i.refs = b.refs;
  i.idle_s = static_cast<double>(clock_->NowNanos() - b.last_use_ns) * 1e-9;
  return i;
}

void CacheManager::TopBlocks(std::optional<TierKind> tier, std::string_view ns_hex, const std::string* tenant,
                             BlockOrder order, size_t limit, BlocksDone done) {
  auto better = [order](const BlockInfo& a, const BlockInfo& b) {
    if (order == BlockOrder::kHits && a.hits != b.hits) return a.hits > b.hits;
    return a.idle_s < b.idle_s;
  };
  if (tier == TierKind::kNvme) {
    if (!nvme_) return done({});
    // Only what the index knows: hit counts recorded when blocks were served from NVMe.
    const std::string want_ns(ns_hex);
    const std::optional<std::string> want_tenant = tenant ? std::optional<std::string>(*tenant) : std::nullopt;
    const double now_s = clock_->WallSeconds();
    // Ask for more than `limit`: filtering by namespace happens after the scan.
    const size_t scan_limit = want_ns.empty() && !want_tenant ? limit : std::max<size_t>(limit * 64, 4096);
    nvme_->ScanTop(scan_limit, order == BlockOrder::kRecent,
                   [this, want_ns, want_tenant, limit, now_s, done = std::move(done)](
                       std::vector<std::pair<std::string, BlockRecord>> entries) {
                     std::vector<BlockInfo> out;
                     for (const auto& [key, rec] : entries) {
                       BlockInfo i;
                       std::string encoded;
                       if (!DecodeBlockKey(key, &i.tenant, nullptr, &encoded, &i.hash)) continue;
                       if (want_tenant && i.tenant != *want_tenant) continue;
                       i.namespace_hex = NamespaceHexOf(encoded);
                       if (!want_ns.empty() && i.namespace_hex != want_ns) continue;
                       if (auto ns = namespace_ids_.find(encoded); ns != namespace_ids_.end()) {
                         i.model = namespaces_[ns->second].model;
                       }
                       i.tier = TierKind::kNvme;
                       i.on_nvme = true;
                       i.bytes = rec.length;
                       i.hits = rec.hit_count;
                       i.idle_s = std::max(0.0, now_s - rec.last_access);
                       out.push_back(std::move(i));
                       if (out.size() == limit) break;
                     }
                     done(std::move(out));
                   });
    return;
  }
  std::vector<BlockInfo> all;
  for (BlockId id = 0; id < blocks_.size(); ++id) {
    const Block& b = blocks_[id];
    if (!b.live || b.promoting || !Visible(b.ns, ns_hex, tenant)) continue;
    if (tier && b.page[TierIndex(*tier)] == kNoPage) continue;
    all.push_back(InfoOf(id));
    if (tier) all.back().tier = *tier;
  }
  const size_t n = std::min(limit, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), all.end(), better);
  all.resize(n);
  done(std::move(all));
}

EvictReport CacheManager::Evict(TierKind kind, uint64_t bytes) {
  EvictReport r;
  if (kind == TierKind::kNvme) {
    if (!nvme_) return r;
    const uint64_t slot = nvme_->slot_bytes();
    r.blocks = nvme_->EvictColdest(static_cast<uint32_t>(std::min<uint64_t>((bytes + slot - 1) / slot, UINT32_MAX)));
    r.bytes = r.blocks * slot;
    return r;
  }
  if (!tier_enabled(kind)) return r;
  Tier& tier = T(kind);
  const uint64_t page = tier.pool->page_bytes();
  while (r.bytes < bytes) {
    const TenantId worst = LargestCachedTenant(tier);
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
    Tier& gpu = T(TierKind::kGpu);
    for (TenantId t = 0; t < gpu.cached_by_tenant.size(); ++t) {
      while (gpu.cached_by_tenant[t] > 0) {
        if (T(TierKind::kHost).pool->AvailableTo(t) == 0 && MakeRoom(TierKind::kHost, t) != Room::kNow) break;
        if (EvictOne(TierKind::kGpu, t) != Evicted::kDropped) break;
      }
    }
  }
  // Every host block without an NVMe copy gets one (kept in host: it is still served);
  // once the queue is through, blocks that arrived since (from the GPU, new commits).
  if (nvme_ && write_through_queue_.empty()) {
    for (BlockId id = 0; id < blocks_.size(); ++id) {
      const Block& b = blocks_[id];
      if (b.live && !b.spilling && !b.promoting && b.page[TierIndex(TierKind::kHost)] != kNoPage &&
          b.page[TierIndex(TierKind::kNvme)] == kNoPage) {
        write_through_queue_.emplace_back(id, b.gen);
      }
    }
  }
  PumpWriteThrough();
}

DrainStatus CacheManager::Drain() const {
  DrainStatus d;
  d.draining = draining_;
  d.spills_in_flight = spills_in_flight_;
  for (const Block& b : blocks_) {
    if (!b.live) continue;
    if (b.page[TierIndex(TierKind::kGpu)] != kNoPage) ++(b.refs > 0 ? d.gpu_blocks_pinned : d.gpu_blocks_left);
    if (nvme_ && b.page[TierIndex(TierKind::kHost)] != kNoPage && b.page[TierIndex(TierKind::kNvme)] == kNoPage) {
      ++d.host_blocks_unspilled;
    }
  }
  return d;
}

}  // namespace kvtier
