#include "daemon/cache_manager.h"

#include <xxhash.h>

#include <algorithm>

#include "protocol/base/logging.h"
#include "protocol/base/units.h"

namespace kvtier {

size_t SessionCache::leased_pages() const {
  size_t n = 0;
  for (const auto& l : leased_) n += l.size();
  return n;
}

Result<std::unique_ptr<CacheManager>> CacheManager::Open(const Options& options) {
  std::unique_ptr<CacheManager> cm(new CacheManager(options));
  for (TierKind kind : kAllTiers) {
    const TierOptions& o = options.tiers[TierIndex(kind)];
    Tier& tier = cm->T(kind);
    tier.kind = kind;
    if (!o.enabled) continue;
    if (kind != TierKind::kHost) {
      return Unimplemented(std::string(TierKindName(kind)) + " tier is not available in this build");
    }
    // Validate the policy name once, here, rather than at the first tenant.
    KVTIER_RETURN_IF_ERROR(MakeEvictionPolicy(o.policy).status());
    if (o.segment_bytes == 0 || o.capacity_bytes % o.segment_bytes != 0) {
      return InvalidArgument("tier capacity must be a multiple of segment_bytes");
    }
    HostSegmentMemory::Options mo;
    mo.name = "kvtier-host";
    mo.segment_bytes = o.segment_bytes;
    mo.segments = static_cast<uint32_t>(o.capacity_bytes / o.segment_bytes);
    mo.huge_pages = o.huge_pages;
    KVTIER_ASSIGN_OR_RETURN(auto memory, HostSegmentMemory::Open(mo));
    KVTIER_LOG(INFO) << "host tier: " << FormatBytes(o.capacity_bytes) << " in "
                     << memory->Describe() << ", pages of " << FormatBytes(o.page_bytes);
    KVTIER_ASSIGN_OR_RETURN(tier.pool, TierPool::Open(std::move(memory), o.page_bytes));
    tier.high = o.high_watermark;
    tier.low = o.low_watermark;
    tier.policy_name = o.policy;
    tier.state.assign(tier.pool->capacity(), PageState::kFree);
    tier.page_block.assign(tier.pool->capacity(), kNoBlock);
  }
  return cm;
}

CacheManager::~CacheManager() = default;

// ---- tenants and namespaces --------------------------------------------------------

TenantId CacheManager::InternTenant(std::string_view name) {
  auto [it, inserted] = tenant_ids_.try_emplace(std::string(name), 0);
  if (inserted) it->second = static_cast<TenantId>(tenant_ids_.size() - 1);
  return it->second;
}

NamespaceId CacheManager::InternNamespace(const std::string& encoded) {
  auto it = namespace_ids_.find(encoded);
  if (it != namespace_ids_.end()) {
    ++namespaces_[it->second].users;
    return it->second;
  }
  NamespaceId id;
  if (!free_namespace_ids_.empty()) {
    id = free_namespace_ids_.back();
    free_namespace_ids_.pop_back();
  } else {
    id = static_cast<NamespaceId>(namespaces_.size());
    namespaces_.emplace_back();
  }
  namespaces_[id] = Namespace{encoded, 1};
  namespace_ids_[encoded] = id;
  return id;
}

void CacheManager::ReleaseNamespace(NamespaceId ns) {
  Namespace& n = namespaces_[ns];
  KVTIER_CHECK(n.users > 0) << "namespace " << ns << " released too often";
  if (--n.users == 0) {
    namespace_ids_.erase(n.encoded);
    n.encoded.clear();
    free_namespace_ids_.push_back(ns);
  }
}

std::string CacheManager::NamespaceHex(NamespaceId ns) const {
  if (ns >= namespaces_.size()) return "";
  const std::string& e = namespaces_[ns].encoded;
  uint64_t h = XXH3_64bits(e.data(), e.size());
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Status CacheManager::Attach(SessionCache& s, std::string_view tenant, const ModelLayout& layout) {
  if (s.attached_) return FailedPrecondition("session already attached");
  KVTIER_RETURN_IF_ERROR(layout.Validate());
  for (TierKind kind : kAllTiers) {
    const Tier& tier = T(kind);
    if (tier.pool && layout.block_bytes > tier.pool->page_bytes()) {
      return InvalidArgument("layout.block_bytes " + std::to_string(layout.block_bytes) +
                             " exceeds the " + std::string(TierKindName(kind)) + " tier's page of " +
                             std::to_string(tier.pool->page_bytes()) + " bytes");
    }
  }
  s.tenant_ = InternTenant(tenant);
  s.ns_ = InternNamespace(EncodeNamespace(tenant, layout.Fingerprint()));
  s.attached_ = true;
  return Status::Ok();
}

void CacheManager::Detach(SessionCache& s) {
  if (!s.attached_) return;
  for (TierKind kind : kAllTiers) {
    Tier& tier = T(kind);
    for (PageId p : s.leased_[TierIndex(kind)]) {
      tier.state[p] = PageState::kFree;
      --tier.leased;
      tier.pool->Free(p);
    }
    s.leased_[TierIndex(kind)].clear();
  }
  // Drop every reference; copy first since Unref edits the map.
  std::vector<std::pair<BlockId, uint32_t>> refs(s.refs_.begin(), s.refs_.end());
  for (auto [id, n] : refs) {
    for (uint32_t i = 0; i < n; ++i) Unref(s, id);
  }
  ReleaseNamespace(s.ns_);
  s.attached_ = false;
}

// ---- blocks ------------------------------------------------------------------------

EvictionPolicy& CacheManager::PolicyFor(Tier& tier, TenantId tenant) {
  if (tier.policy.size() <= tenant) tier.policy.resize(tenant + 1);
  auto& p = tier.policy[tenant];
  if (!p) {
    auto made = MakeEvictionPolicy(tier.policy_name);
    KVTIER_CHECK(made.ok()) << made.status().ToString();  // validated in Open
    p = std::move(made).value();
  }
  return *p;
}

uint32_t& CacheManager::CachedOf(Tier& tier, TenantId tenant) {
  if (tier.cached_by_tenant.size() <= tenant) tier.cached_by_tenant.resize(tenant + 1, 0);
  return tier.cached_by_tenant[tenant];
}

BlockId CacheManager::FindBlock(NamespaceId ns, const BlockHash& hash) const {
  auto it = index_.find(IndexKey{ns, hash});
  return it == index_.end() ? kNoBlock : it->second;
}

BlockId CacheManager::NewBlock(NamespaceId ns, TenantId tenant, const BlockHash& hash,
                               const BlockHash& parent) {
  BlockId id;
  if (!free_block_ids_.empty()) {
    id = free_block_ids_.back();
    free_block_ids_.pop_back();
  } else {
    id = static_cast<BlockId>(blocks_.size());
    blocks_.emplace_back();
  }
  Block& b = blocks_[id];
  b.ns = ns;
  b.tenant = tenant;
  b.hash = hash;
  b.parent = parent;
  b.page.fill(kNoPage);
  b.refs = 0;
  b.live = true;
  index_.emplace(IndexKey{ns, hash}, id);
  ++namespaces_[ns].users;
  return id;
}

void CacheManager::EraseBlock(BlockId id) {
  Block& b = blocks_[id];
  KVTIER_CHECK(b.refs == 0) << "erasing a referenced block";
  index_.erase(IndexKey{b.ns, b.hash});
  ReleaseNamespace(b.ns);
  b.live = false;
  free_block_ids_.push_back(id);
}

std::optional<TierKind> CacheManager::ReadableTier(const Block& b) const {
  for (TierKind t : {TierKind::kGpu, TierKind::kHost}) {
    if (b.page[TierIndex(t)] != kNoPage) return t;
  }
  return std::nullopt;
}

void CacheManager::AddResidency(BlockId id, TierKind kind, PageId page) {
  Tier& tier = T(kind);
  Block& b = blocks_[id];
  b.page[TierIndex(kind)] = page;
  tier.state[page] = PageState::kBlock;
  tier.page_block[page] = id;
  ++tier.blocks;
  if (b.refs == 0) {
    ++tier.cached;
    ++CachedOf(tier, b.tenant);
  } else {
    ++tier.referenced;
  }
  BlockId parent = kNoBlock;
  if (!b.parent.empty()) {
    BlockId p = FindBlock(b.ns, b.parent);
    if (p != kNoBlock && blocks_[p].page[TierIndex(kind)] != kNoPage) parent = p;
  }
  EvictionPolicy& policy = PolicyFor(tier, b.tenant);
  policy.Insert(id, parent);
  if (b.refs > 0) policy.SetEvictable(id, false);
}

void CacheManager::RemoveResidency(BlockId id, TierKind kind) {
  Tier& tier = T(kind);
  Block& b = blocks_[id];
  const PageId page = b.page[TierIndex(kind)];
  KVTIER_CHECK(page != kNoPage) << "block not resident";
  PolicyFor(tier, b.tenant).Erase(id);
  if (b.refs == 0) {
    --tier.cached;
    --CachedOf(tier, b.tenant);
  } else {
    --tier.referenced;
  }
  --tier.blocks;
  b.page[TierIndex(kind)] = kNoPage;
  tier.state[page] = PageState::kFree;
  tier.page_block[page] = kNoBlock;
  tier.pool->Free(page);
  if (std::all_of(b.page.begin(), b.page.end(), [](PageId p) { return p == kNoPage; })) {
    EraseBlock(id);
  }
}

void CacheManager::Ref(SessionCache& s, BlockId id) {
  Block& b = blocks_[id];
  if (b.refs++ == 0) {
    for (TierKind kind : kAllTiers) {
      if (b.page[TierIndex(kind)] == kNoPage) continue;
      Tier& tier = T(kind);
      --tier.cached;
      --CachedOf(tier, b.tenant);
      ++tier.referenced;
      PolicyFor(tier, b.tenant).SetEvictable(id, false);
    }
  }
  ++s.refs_[id];
}

bool CacheManager::Unref(SessionCache& s, BlockId id) {
  auto it = s.refs_.find(id);
  if (it == s.refs_.end()) return false;
  if (--it->second == 0) s.refs_.erase(it);
  Block& b = blocks_[id];
  KVTIER_CHECK(b.refs > 0) << "reference count underflow";
  if (--b.refs == 0) {
    for (TierKind kind : kAllTiers) {
      if (b.page[TierIndex(kind)] == kNoPage) continue;
      Tier& tier = T(kind);
      --tier.referenced;
      ++tier.cached;
      ++CachedOf(tier, b.tenant);
      PolicyFor(tier, b.tenant).SetEvictable(id, true);
    }
  }
  return true;
}

// ---- eviction ----------------------------------------------------------------------

bool CacheManager::EvictOne(TierKind kind, TenantId tenant) {
  Tier& tier = T(kind);
  if (tenant >= tier.policy.size() || !tier.policy[tenant]) return false;
  const BlockId victim = tier.policy[tenant]->Victim();
  if (victim == kNoBlock) return false;
  // With no slower tier yet, an evicted block is dropped.
  RemoveResidency(victim, kind);
  ++counters_.evictions[TierIndex(kind)];
  return true;
}

void CacheManager::EnforceWatermark(TierKind kind) {
  Tier& tier = T(kind);
  const double cap = tier.pool->capacity();
  auto used = [&tier] { return static_cast<double>(tier.pool->capacity() - tier.pool->free_count()); };
  if (used() <= tier.high * cap) return;
  while (used() > tier.low * cap) {
    // The tenant with the largest cached footprint gives first.
    TenantId worst = kNoOwner;
    uint32_t most = 0;
    for (TenantId t = 0; t < tier.cached_by_tenant.size(); ++t) {
      if (tier.cached_by_tenant[t] > most) {
        most = tier.cached_by_tenant[t];
        worst = t;
      }
    }
    if (worst == kNoOwner || !EvictOne(kind, worst)) break;
  }
}

bool CacheManager::MakeRoom(TierKind kind, TenantId tenant) {
  Tier& tier = T(kind);
  while (tier.pool->AvailableTo(tenant) == 0) {
    if (EvictOne(kind, tenant)) continue;
    // Nothing of ours left to evict: free other tenants' cached blocks until a segment
    // empties and can change hands.
    bool evicted = false;
    for (TenantId t = 0; t < tier.cached_by_tenant.size() && !evicted; ++t) {
      if (t != tenant && tier.cached_by_tenant[t] > 0) evicted = EvictOne(kind, t);
    }
    if (!evicted) return false;
  }
  return true;
}

// ---- operations --------------------------------------------------------------------

Result<std::vector<PageId>> CacheManager::Allocate(SessionCache& s, TierKind kind, uint32_t count) {
  if (!s.attached_) return FailedPrecondition("session has no namespace");
  if (!tier_enabled(kind)) return InvalidArgument(std::string(TierKindName(kind)) + " tier is not enabled");
  if (kind == TierKind::kNvme) return InvalidArgument("nvme pages cannot be leased");
  Tier& tier = T(kind);
  if (count == 0) return std::vector<PageId>();
  if (count > options_.max_entries_per_request || count > tier.pool->capacity()) {
    return InvalidArgument("cannot allocate " + std::to_string(count) + " pages at once");
  }
  std::vector<PageId> pages;
  pages.reserve(count);
  auto rollback = [&] {
    for (PageId p : pages) {
      tier.state[p] = PageState::kFree;
      --tier.leased;
      s.leased_[TierIndex(kind)].erase(p);
      tier.pool->Free(p);
    }
  };
  for (uint32_t i = 0; i < count; ++i) {
    std::optional<PageId> page;
    if (MakeRoom(kind, s.tenant_)) {
      auto got = tier.pool->Allocate(s.tenant_);
      if (!got.ok()) {
        rollback();
        return got.status();
      }
      page = *got;
    }
    if (!page) {
      rollback();
      ++counters_.allocate_failures;
      return ResourceExhausted(std::string(TierKindName(kind)) + " tier has no free page for " +
                               std::to_string(count) + " (" + std::to_string(tier.pool->free_count()) +
                               " free, the rest leased or referenced)");
    }
    tier.state[*page] = PageState::kLeased;
    ++tier.leased;
    s.leased_[TierIndex(kind)].insert(*page);
    pages.push_back(*page);
  }
  EnforceWatermark(kind);
  return pages;
}

std::vector<CacheResult> CacheManager::Commit(SessionCache& s, TierKind kind,
                                              std::span<const PageId> pages,
                                              std::span<const BlockHash> hashes,
                                              std::span<const BlockHash> parents, bool retain) {
  std::vector<CacheResult> out(pages.size());
  auto& leased = s.leased_[TierIndex(kind)];
  for (size_t i = 0; i < pages.size(); ++i) {
    CacheResult& r = out[i];
    const PageId page = pages[i];
    r.tier = kind;
    if (!s.attached_ || !tier_enabled(kind) || leased.count(page) == 0) {
      r.status = StatusCode::kFailedPrecondition;
      continue;
    }
    Tier& tier = T(kind);
    const BlockHash& hash = hashes[i];
    BlockHash parent;
    if (!parents.empty() && !parents[i].IsZero()) parent = parents[i];
    leased.erase(page);
    --tier.leased;
    const BlockId existing = FindBlock(s.ns_, hash);
    if (existing != kNoBlock && blocks_[existing].page[TierIndex(kind)] != kNoPage) {
      // Already stored here: keep the old copy, free this page.
      tier.state[page] = PageState::kFree;
      tier.pool->Free(page);
      r.duplicate = true;
      r.page = blocks_[existing].page[TierIndex(kind)];
      if (retain) Ref(s, existing);
      PolicyFor(tier, s.tenant_).Touch(existing);
      ++counters_.commits_duplicate;
      continue;
    }
    BlockId id = existing;
    if (id == kNoBlock) {
      id = NewBlock(s.ns_, s.tenant_, hash, parent);
    } else {
      r.duplicate = true;  // known in another tier; this page becomes its copy here
    }
    if (retain) Ref(s, id);
    AddResidency(id, kind, page);
    r.page = page;
    ++(r.duplicate ? counters_.commits_duplicate : counters_.commits_stored);
  }
  return out;
}

std::vector<StatusCode> CacheManager::Release(SessionCache& s, TierKind kind,
                                              std::span<const PageId> pages,
                                              std::span<const BlockHash> hashes) {
  std::vector<StatusCode> out;
  out.reserve(pages.size() + hashes.size());
  const bool usable = s.attached_ && tier_enabled(kind);
  for (PageId page : pages) {
    if (!usable || page >= T(kind).pool->capacity()) {
      out.push_back(StatusCode::kFailedPrecondition);
      continue;
    }
    Tier& tier = T(kind);
    auto& leased = s.leased_[TierIndex(kind)];
    if (leased.erase(page) > 0) {
      tier.state[page] = PageState::kFree;
      --tier.leased;
      tier.pool->Free(page);
      out.push_back(StatusCode::kOk);
      continue;
    }
    const BlockId id = tier.state[page] == PageState::kBlock ? tier.page_block[page] : kNoBlock;
    out.push_back(id != kNoBlock && Unref(s, id) ? StatusCode::kOk : StatusCode::kFailedPrecondition);
  }
  for (const BlockHash& h : hashes) {
    const BlockId id = s.attached_ ? FindBlock(s.ns_, h) : kNoBlock;
    out.push_back(id != kNoBlock && Unref(s, id) ? StatusCode::kOk : StatusCode::kFailedPrecondition);
  }
  return out;
}

CacheLookup CacheManager::Lookup(SessionCache& s, std::span<const BlockHash> hashes) {
  CacheLookup r;
  ++counters_.lookups;
  counters_.lookup_blocks += hashes.size();
  if (s.attached_) {
    for (const BlockHash& h : hashes) {
      const BlockId id = FindBlock(s.ns_, h);
      if (id == kNoBlock) break;
      auto tier = ReadableTier(blocks_[id]);
      if (!tier) break;
      PolicyFor(T(*tier), blocks_[id].tenant).Touch(id);  // an engine wants it: it is in use
      r.tiers.push_back(*tier);
      ++counters_.block_hits[TierIndex(*tier)];
    }
  }
  r.matched = r.tiers.size();
  counters_.block_misses += hashes.size() - r.matched;
  return r;
}

std::vector<CacheResult> CacheManager::Acquire(SessionCache& s, std::span<const BlockHash> hashes) {
  std::vector<CacheResult> out(hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i) {
    ++counters_.acquires;
    const BlockId id = s.attached_ ? FindBlock(s.ns_, hashes[i]) : kNoBlock;
    std::optional<TierKind> tier;
    if (id != kNoBlock) tier = ReadableTier(blocks_[id]);
    if (!tier) {
      out[i].status = StatusCode::kNotFound;
      ++counters_.acquire_misses;
      continue;
    }
    Block& b = blocks_[id];
    PolicyFor(T(*tier), b.tenant).Touch(id);  // before Ref: a pinned block ignores Touch
    Ref(s, id);
    out[i].tier = *tier;
    out[i].page = b.page[TierIndex(*tier)];
  }
  return out;
}

// ---- segments ----------------------------------------------------------------------

std::vector<SegmentGrant> CacheManager::TakeSegmentGrants(SessionCache& s, TierKind kind,
                                                          std::span<const PageId> pages) {
  std::vector<SegmentGrant> out;
  if (!tier_enabled(kind)) return out;
  const TierPool& pool = *T(kind).pool;
  auto& sent = s.sent_gen_[TierIndex(kind)];
  if (sent.size() < pool.segment_count()) sent.resize(pool.segment_count(), 0);
  for (PageId p : pages) {
    if (p == kNoPage) continue;
    const uint32_t seg = pool.SegmentOf(p);
    if (sent[seg] == pool.Generation(seg)) continue;
    sent[seg] = pool.Generation(seg);
    out.push_back(SegmentGrant{kind, seg, seg * pool.pages_per_segment(), pool.pages_per_segment(),
                               pool.memory().segment_bytes(), pool.memory().ShareFd(seg)});
  }
  return out;
}

std::vector<SegmentGrant> CacheManager::TakeAllSegmentGrants(SessionCache& s) {
  std::vector<SegmentGrant> out;
  for (TierKind kind : kAllTiers) {
    if (!tier_enabled(kind)) continue;
    const TierPool& pool = *T(kind).pool;
    std::vector<PageId> firsts;
    for (uint32_t seg : pool.SegmentsOf(s.tenant_)) firsts.push_back(seg * pool.pages_per_segment());
    auto g = TakeSegmentGrants(s, kind, firsts);
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

// ---- accounting --------------------------------------------------------------------

TierCounts CacheManager::Counts(TierKind kind) const {
  const Tier& tier = T(kind);
  TierCounts c;
  if (!tier.pool) return c;
  c.capacity = tier.pool->capacity();
  c.free = tier.pool->free_count();
  c.leased = tier.leased;
  c.inflight = tier.inflight;
  c.cached = tier.cached;
  c.referenced = tier.referenced;
  c.blocks = tier.blocks;
  c.page_bytes = tier.pool->page_bytes();
  return c;
}

Status CacheManager::CheckInvariants() const {
  for (TierKind kind : kAllTiers) {
    const Tier& tier = T(kind);
    if (!tier.pool) continue;
    const TierCounts c = Counts(kind);
    const std::string name(TierKindName(kind));
    if (uint64_t{c.free} + c.leased + c.inflight + c.cached + c.referenced != c.capacity) {
      return Internal(name + ": free " + std::to_string(c.free) + " + leased " +
                      std::to_string(c.leased) + " + inflight " + std::to_string(c.inflight) +
                      " + cached " + std::to_string(c.cached) + " + referenced " +
                      std::to_string(c.referenced) + " != capacity " + std::to_string(c.capacity));
    }
    uint32_t by_state[4] = {0, 0, 0, 0};
    uint32_t cached = 0, referenced = 0;
    for (PageId p = 0; p < c.capacity; ++p) {
      ++by_state[static_cast<int>(tier.state[p])];
      if (tier.state[p] == PageState::kFree && !tier.pool->IsFree(p)) {
        return Internal(name + ": page " + std::to_string(p) + " free in state but not in pool");
      }
      if (tier.state[p] == PageState::kBlock) {
        const Block& b = blocks_[tier.page_block[p]];
        if (!b.live || b.page[TierIndex(kind)] != p) {
          return Internal(name + ": page " + std::to_string(p) + " maps to a block elsewhere");
        }
        ++(b.refs == 0 ? cached : referenced);
      }
    }
    if (by_state[0] != c.free || by_state[1] != c.leased || by_state[2] != c.inflight ||
        cached != c.cached || referenced != c.referenced) {
      return Internal(name + ": page states disagree with counters");
    }
  }
  return Status::Ok();
}

}  // namespace kvtier
