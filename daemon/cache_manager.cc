#include "daemon/cache_manager.h"

#include <xxhash.h>

#include <algorithm>

#include "protocol/base/logging.h"
#include "protocol/base/units.h"
#include "storage/device_segment_memory.h"

namespace kvtier {

size_t SessionCache::leased_pages() const {
  size_t n = 0;
  for (const auto& l : leased_) n += l.size();
  return n;
}

Result<std::unique_ptr<CacheManager>> CacheManager::Open(const Options& options,
                                                         std::unique_ptr<NvmeTier> nvme,
                                                         const Clock* clock) {
  std::unique_ptr<CacheManager> cm(new CacheManager(options));
  cm->clock_ = clock ? clock : SystemClock::Default();
  for (TierKind kind : kAllTiers) {
    const TierOptions& o = options.tiers[TierIndex(kind)];
    Tier& tier = cm->T(kind);
    tier.kind = kind;
    if (!o.enabled) continue;
    if (kind == TierKind::kNvme) return InvalidArgument("the NVMe tier is opened apart (NvmeTier)");
    // Validate the policy name once, here, rather than at the first tenant.
    KVTIER_RETURN_IF_ERROR(MakeEvictionPolicy(o.policy).status());
    if (o.segment_bytes == 0 || o.capacity_bytes % o.segment_bytes != 0) {
      return InvalidArgument("tier capacity must be a multiple of segment_bytes");
    }
    const uint32_t segments = static_cast<uint32_t>(o.capacity_bytes / o.segment_bytes);
    std::unique_ptr<SegmentMemory> memory;
    if (kind == TierKind::kHost) {
      HostSegmentMemory::Options mo;
      mo.name = "kvtier-host";
      mo.segment_bytes = o.segment_bytes;
      mo.segments = segments;
      mo.huge_pages = o.huge_pages;
      KVTIER_ASSIGN_OR_RETURN(memory, HostSegmentMemory::Open(mo));
    } else {
      if (options.device_backend == nullptr) return InvalidArgument("the GPU tier needs a device backend");
      const TierOptions& host = options.tiers[TierIndex(TierKind::kHost)];
      if (host.enabled && host.page_bytes != o.page_bytes) {
        return InvalidArgument("GPU pages must be the size of host pages (a demotion copies one into the other)");
      }
      KVTIER_ASSIGN_OR_RETURN(memory, DeviceSegmentMemory::Open(options.device_backend, options.gpu_device,
                                                               o.segment_bytes, segments));
    }
    KVTIER_LOG(INFO) << TierKindName(kind) << " tier: " << FormatBytes(o.capacity_bytes) << " in "
                     << memory->Describe() << ", pages of " << FormatBytes(o.page_bytes);
    KVTIER_ASSIGN_OR_RETURN(tier.pool, TierPool::Open(std::move(memory), o.page_bytes));
    tier.high = o.high_watermark;
    tier.low = o.low_watermark;
    tier.policy_name = o.policy;
    tier.state.assign(tier.pool->capacity(), PageState::kFree);
    tier.page_block.assign(tier.pool->capacity(), kNoBlock);
  }
  if (nvme) {
    TierPool* host = cm->T(TierKind::kHost).pool.get();
    if (host == nullptr) return InvalidArgument("the NVMe tier needs the host tier");
    if (nvme->slot_bytes() != host->page_bytes()) {
      return InvalidArgument("NVMe slots must be the size of host pages");
    }
    cm->nvme_ = std::move(nvme);
    cm->registered_segments_.assign(host->segment_count(), false);
    CacheManager* raw = cm.get();
    cm->nvme_->SetDropListener([raw](const std::string& key, uint32_t slot) { raw->OnNvmeDropped(key, slot); });
    host->SetRenewListener([raw](uint32_t seg) {
      // A renewed segment is new memory: its registration must follow.
      if (raw->registered_segments_[seg]) {
        TierPool* pool = raw->T(TierKind::kHost).pool.get();
        raw->nvme_->RegisterBuffer(seg, pool->memory().HostAddress(seg), pool->memory().segment_bytes());
      }
    });
    KVTIER_LOG(INFO) << "nvme tier: " << cm->nvme_->Describe() << ", "
                     << (options.write_policy == WritePolicy::kWriteThrough ? "write_through" : "write_back");
  }
  return cm;
}

CacheManager::~CacheManager() {
  // The NVMe tier's threads must stop before the state its callbacks touch goes.
  nvme_.reset();
}

// ---- tenants and namespaces --------------------------------------------------------

TenantId CacheManager::InternTenant(std::string_view name) {
  auto [it, inserted] = tenant_ids_.try_emplace(std::string(name), 0);
  if (!inserted) return it->second;
  const TenantId id = static_cast<TenantId>(tenant_ids_.size() - 1);
  it->second = id;
  tenant_names_.emplace_back(name);
  auto lim = options_.tenant_limits.find(it->first);
  const TenantLimits& l = lim != options_.tenant_limits.end() ? lim->second : options_.unknown_limits;
  for (Tier& tier : tiers_) {
    if (!tier.pool) continue;
    const uint64_t page = tier.pool->page_bytes();
    // Whole pages; a nonzero limit is at least one page.
    auto pages = [&](uint64_t bytes) { return bytes ? static_cast<uint32_t>(std::max<uint64_t>(1, bytes / page)) : 0u; };
    tier.quota_pages.resize(id + 1, 0);
    tier.reserve_pages.resize(id + 1, 0);
    tier.quota_pages[id] = pages(l.quota_bytes[TierIndex(tier.kind)]);
    tier.reserve_pages[id] = pages(l.reserve_bytes[TierIndex(tier.kind)]);
  }
  return id;
}

NamespaceId CacheManager::InternNamespace(const std::string& encoded, const std::string& fingerprint,
                                          uint64_t block_bytes, std::string_view tenant, std::string_view model) {
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
  namespaces_[id] = Namespace{encoded, fingerprint, block_bytes, 1, std::string(tenant), std::string(model)};
  namespace_ids_[encoded] = id;
  return id;
}

void CacheManager::ReleaseNamespace(NamespaceId ns) {
  Namespace& n = namespaces_[ns];
  KVTIER_CHECK(n.users > 0) << "namespace " << ns << " released too often";
  if (--n.users == 0) {
    namespace_ids_.erase(n.encoded);
    n = Namespace{};
    free_namespace_ids_.push_back(ns);
  }
}

std::string CacheManager::NamespaceHexOf(std::string_view encoded) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(encoded.data(), encoded.size())));
  return buf;
}

std::string CacheManager::NamespaceHex(NamespaceId ns) const {
  return ns < namespaces_.size() ? NamespaceHexOf(namespaces_[ns].encoded) : std::string();
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
  const std::string fingerprint = layout.Fingerprint();
  s.tenant_ = InternTenant(tenant);
  s.ns_ = InternNamespace(EncodeNamespace(tenant, fingerprint), fingerprint, layout.block_bytes, tenant,
                          layout.model_id);
  s.attached_ = true;
  sessions_[s.id_] = &s;
  return Status::Ok();
}

uint64_t CacheManager::Detach(SessionCache& s, bool quarantine_leases) {
  if (!s.attached_) return 0;
  uint64_t quarantine = 0;
  sessions_.erase(s.id_);
  // Its deferred requests are answered to nobody.
  for (auto it = pending_acquires_.begin(); it != pending_acquires_.end();) {
    it = it->second.session == s.id_ ? pending_acquires_.erase(it) : std::next(it);
  }
  std::erase_if(pending_allocates_, [&](const PendingAllocate& p) { return p.session == s.id_; });
  for (TierKind kind : kAllTiers) {
    Tier& tier = T(kind);
    for (PageId p : s.leased_[TierIndex(kind)]) {
      --tier.leased;
      if (quarantine_leases) {
        if (quarantine == 0) quarantine = next_quarantine_++;
        tier.state[p] = PageState::kQuarantined;
        ++tier.quarantined;
        quarantines_[quarantine].emplace_back(kind, p);
      } else {
        tier.state[p] = PageState::kFree;
        tier.pool->Free(p);
      }
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
  ServePendingAllocates();
  return quarantine;
}

void CacheManager::ReleaseQuarantine(uint64_t id) {
  auto it = quarantines_.find(id);
  if (it == quarantines_.end()) return;
  for (auto [kind, p] : it->second) {
    Tier& tier = T(kind);
    KVTIER_CHECK(tier.state[p] == PageState::kQuarantined) << "page " << p << " left quarantine twice";
    tier.state[p] = PageState::kFree;
    --tier.quarantined;
    tier.pool->Free(p);
  }
  quarantines_.erase(it);
  ServePendingAllocates();
}

// ---- blocks ------------------------------------------------------------------------

EvictionPolicy& CacheManager::PolicyFor(Tier& tier, TenantId tenant) {
  if (tier.policy.size() <= tenant) tier.policy.resize(tenant + 1);
  auto& p = tier.policy[tenant];
  if (!p) {
    auto made = MakeEvictionPolicy(tier.policy_name, tier.pool->capacity());
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
  const uint32_t gen = b.gen + 1;
  b = Block{};
  b.gen = gen;
  b.ns = ns;
  b.tenant = tenant;
  b.hash = hash;
  b.parent = parent;
  b.page.fill(kNoPage);
  b.live = true;
  const bool added = index_.emplace(IndexKey{ns, hash}, id).second;
  KVTIER_CHECK(added) << "a second block for one key";
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

std::string CacheManager::KeyOf(const Block& b) const {
  return EncodeBlockKey(namespaces_[b.ns].encoded, b.hash);
}

BlockRecord CacheManager::RecordFor(const Block& b) const {
  BlockRecord r;
  const Namespace& n = namespaces_[b.ns];
  r.length = static_cast<uint32_t>(n.block_bytes);
  r.layout_fingerprint = n.fingerprint;
  r.parent.assign(reinterpret_cast<const char*>(b.parent.bytes().data()), b.parent.size());
  return r;
}

bool CacheManager::PrefixOrdered(SessionCache& s) {
  Tier& host = T(TierKind::kHost);
  return host.pool && s.attached_ && PolicyFor(host, s.tenant_).touch_prefix_deepest_first();
}

std::optional<TierKind> CacheManager::ReadableTier(const Block& b) const {
  if (b.promoting) return std::nullopt;
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
    // A block named as its own parent (a client's mistake, found by fuzzing) has none.
    if (p != kNoBlock && p != id && blocks_[p].page[TierIndex(kind)] != kNoPage) parent = p;
  }
  EvictionPolicy& policy = PolicyFor(tier, b.tenant);
  policy.Insert(id, parent, HashBytes(b.hash.bytes(), b.ns));
  if (b.refs > 0) policy.SetEvictable(id, false);
}

void CacheManager::RemoveResidency(BlockId id, TierKind kind) {
  Tier& tier = T(kind);
  Block& b = blocks_[id];
  const PageId page = b.page[TierIndex(kind)];
  KVTIER_CHECK(page != kNoPage && tier.state[page] == PageState::kBlock) << "block not resident";
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
  if (b.page[TierIndex(TierKind::kGpu)] == kNoPage && b.page[TierIndex(TierKind::kHost)] == kNoPage) {
    EraseBlock(id);  // an NVMe copy, if any, lives on in the NVMe index alone
  }
}

void CacheManager::Ref(SessionCache& s, BlockId id) {
  Block& b = blocks_[id];
  if (b.refs++ == 0) {
    for (TierKind kind : {TierKind::kGpu, TierKind::kHost}) {
      const PageId p = b.page[TierIndex(kind)];
      if (p == kNoPage || T(kind).state[p] != PageState::kBlock) continue;  // in flight
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
    for (TierKind kind : {TierKind::kGpu, TierKind::kHost}) {
      const PageId p = b.page[TierIndex(kind)];
      if (p == kNoPage || T(kind).state[p] != PageState::kBlock) continue;
      Tier& tier = T(kind);
      --tier.referenced;
      ++tier.cached;
      ++CachedOf(tier, b.tenant);
      PolicyFor(tier, b.tenant).SetEvictable(id, true);
    }
  }
  return true;
}

int CacheManager::BufferIndex(TierKind kind, PageId page) {
  TierPool* pool = T(kind).pool.get();
  const uint32_t seg = pool->SegmentOf(page);
  if (!registered_segments_[seg]) {
    // Registered on first use: registration pins (and so faults in) the whole segment.
    nvme_->RegisterBuffer(seg, pool->memory().HostAddress(seg), pool->memory().segment_bytes());
    registered_segments_[seg] = true;
  }
  return static_cast<int>(seg);
}

// ---- eviction, demotion, write-through ---------------------------------------------

CacheManager::Evicted CacheManager::EvictOne(TierKind kind, TenantId tenant) {
  Tier& tier = T(kind);
  if (tenant >= tier.policy.size() || !tier.policy[tenant]) return Evicted::kNone;
  const BlockId victim = tier.policy[tenant]->Victim();
  if (victim == kNoBlock) return Evicted::kNone;
  const Block& b = blocks_[victim];
  if (kind == TierKind::kGpu && tier_enabled(TierKind::kHost)) {
    // GPU -> host: the block keeps living one tier down, copied on the daemon's stream.
    if (b.page[TierIndex(TierKind::kHost)] == kNoPage && MakeRoom(TierKind::kHost, b.tenant) == Room::kNow) {
      Tier& host = T(TierKind::kHost);
      auto got = host.pool->Allocate(b.tenant);
      if (got.ok() && got->has_value()) {
        const PageId hp = **got;
        Tier& gpu = T(TierKind::kGpu);
        const PageId gp = b.page[TierIndex(TierKind::kGpu)];
        Status st = gpu.pool->memory().CopyToHost(gpu.pool->SegmentOf(gp), gpu.pool->OffsetInSegment(gp),
                                                  host.pool->PageAddress(hp), host.pool->page_bytes());
        if (st.ok()) {
          AddResidency(victim, TierKind::kHost, hp);
          ++counters_.gpu_demotions;
        } else {
          KVTIER_LOG(WARNING) << "GPU demotion copy failed: " << st.ToString() << "; dropping the block";
          host.state[hp] = PageState::kFree;
          host.pool->Free(hp);
        }
      }
    }
    const Block& left = blocks_[victim];
    if (left.page[TierIndex(TierKind::kHost)] == kNoPage && left.page[TierIndex(TierKind::kNvme)] == kNoPage) {
      RememberEviction(KeyOf(left), kind);
    }
    RemoveResidency(victim, kind);  // the host copy, if any, lives on
    ++counters_.evictions[TierIndex(kind)];
    return Evicted::kDropped;
  }
  if (kind == TierKind::kHost && b.page[TierIndex(TierKind::kNvme)] == kNoPage && NvmeSpillable()) {
    if (spills_in_flight_ >= options_.max_spills_in_flight) return Evicted::kBusy;
    StartSpill(victim, /*keep_host=*/false);
    return Evicted::kDemoting;
  }
  // Already on NVMe (so nothing is lost), or nowhere to go: the page is free at once.
  if (b.page[TierIndex(TierKind::kNvme)] == kNoPage &&
      b.page[TierIndex(kind == TierKind::kHost ? TierKind::kGpu : TierKind::kHost)] == kNoPage) {
    RememberEviction(KeyOf(b), kind);
  }
  RemoveResidency(victim, kind);
  ++counters_.evictions[TierIndex(kind)];
  return Evicted::kDropped;
}

TenantId CacheManager::LargestCachedTenant(const Tier& tier) const {
  TenantId worst = kNoOwner;
  uint32_t most = 0;
  for (TenantId t = 0; t < tier.cached_by_tenant.size(); ++t) {
    if (tier.cached_by_tenant[t] > most && AboveReserve(tier, t)) {
      most = tier.cached_by_tenant[t];
      worst = t;
    }
  }
  return worst;
}

void CacheManager::EnforceWatermark(TierKind kind) {
  Tier& tier = T(kind);
  if (!tier.pool) return;
  const double cap = tier.pool->capacity();
  // Pages being demoted are as good as free for this purpose.
  auto projected = [&] {
    const double used = tier.pool->capacity() - tier.pool->free_count();
    return used - (kind == TierKind::kHost ? demotions_in_flight_ : 0);
  };
  if (!tier.draining) {
    if (projected() <= tier.high * cap) return;
    tier.draining = true;
  }
  while (projected() > tier.low * cap) {
    const TenantId worst = LargestCachedTenant(tier);
    if (worst == kNoOwner) break;
    const Evicted e = EvictOne(kind, worst);
    if (e == Evicted::kBusy) return;  // resumes as spills complete
    if (e == Evicted::kNone) break;
  }
  tier.draining = false;
}

CacheManager::Room CacheManager::MakeRoom(TierKind kind, TenantId tenant) {
  Tier& tier = T(kind);
  // A tenant at its quota makes room among its own blocks, or gets none.
  if (const uint32_t quota = QuotaPages(tier, tenant); quota > 0) {
    while (tier.pool->UsedBy(tenant) >= quota) {
      const Evicted e = EvictOne(kind, tenant);
      if (e == Evicted::kDemoting || e == Evicted::kBusy) return Room::kLater;
      if (e == Evicted::kNone) {
        return kind == TierKind::kHost && spills_in_flight_ > 0 ? Room::kLater : Room::kOverQuota;
      }
    }
  }
  while (tier.pool->AvailableTo(tenant) == 0) {
    Evicted e = EvictOne(kind, tenant);
    if (e == Evicted::kDropped) continue;
    if (e == Evicted::kDemoting || e == Evicted::kBusy) return Room::kLater;
    // Nothing of ours left to evict: free other tenants' cached blocks until a segment
    // empties and can change hands.
    bool progressed = false;
    for (TenantId t = 0; t < tier.cached_by_tenant.size() && !progressed; ++t) {
      if (t == tenant || tier.cached_by_tenant[t] == 0 || !AboveReserve(tier, t)) continue;
      e = EvictOne(kind, t);
      if (e == Evicted::kDemoting || e == Evicted::kBusy) return Room::kLater;
      progressed = e == Evicted::kDropped;
    }
    if (!progressed) {
      return kind == TierKind::kHost && spills_in_flight_ > 0 ? Room::kLater : Room::kNone;
    }
  }
  return Room::kNow;
}

void CacheManager::StartSpill(BlockId id, bool keep_host) {
  Block& b = blocks_[id];
  Tier& host = T(TierKind::kHost);
  const PageId page = b.page[TierIndex(TierKind::kHost)];
  PolicyFor(host, b.tenant).Erase(id);
  if (b.refs == 0) {
    --host.cached;
    --CachedOf(host, b.tenant);
  } else {
    --host.referenced;
  }
  host.state[page] = PageState::kInFlight;
  ++host.inflight;
  b.spilling = true;
  ++spills_in_flight_;
  if (!keep_host) ++demotions_in_flight_;
  const int buf = BufferIndex(TierKind::kHost, page);
  nvme_->Spill(KeyOf(b), RecordFor(b), {host.pool->PageAddress(page), host.pool->page_bytes()}, buf,
               [this, id, gen = b.gen, keep_host](Status st, uint32_t slot) {
                 OnSpilled(id, gen, keep_host, std::move(st), slot);
               });
}

void CacheManager::OnSpilled(BlockId id, uint32_t gen, bool keep_host, Status st, uint32_t slot) {
  --spills_in_flight_;
  if (!keep_host) --demotions_in_flight_;
  Block& b = blocks_[id];
  KVTIER_CHECK(b.live && b.gen == gen && b.spilling) << "spill completion for a block that moved";
  b.spilling = false;
  Tier& host = T(TierKind::kHost);
  const PageId page = b.page[TierIndex(TierKind::kHost)];
  --host.inflight;
  host.state[page] = PageState::kBlock;
  if (b.refs == 0) {
    ++host.cached;
    ++CachedOf(host, b.tenant);
  } else {
    ++host.referenced;
  }
  EvictionPolicy& policy = PolicyFor(host, b.tenant);
  policy.Insert(id, kNoBlock, HashBytes(b.hash.bytes(), b.ns));
  if (b.refs > 0) policy.SetEvictable(id, false);
  if (st.ok()) {
    b.page[TierIndex(TierKind::kNvme)] = slot;
    ++(keep_host ? counters_.write_throughs : counters_.demotions);
    // Demoted: the host copy goes unless someone took a reference meanwhile.
    if (!keep_host && b.refs == 0) RemoveResidency(id, TierKind::kHost);
  } else {
    ++counters_.spill_failures;
    KVTIER_LOG(DEBUG) << "spill failed: " << st.ToString();
  }
  ServePendingAllocates();
  EnforceWatermark(TierKind::kHost);
  PumpWriteThrough();
}

void CacheManager::PumpWriteThrough() {
  while (!write_through_queue_.empty() && spills_in_flight_ < options_.max_spills_in_flight &&
         NvmeSpillable()) {
    const auto [id, gen] = write_through_queue_.front();
    write_through_queue_.pop_front();
    const Block& b = blocks_[id];
    if (!b.live || b.gen != gen || b.spilling || b.promoting ||
        b.page[TierIndex(TierKind::kHost)] == kNoPage || b.page[TierIndex(TierKind::kNvme)] != kNoPage ||
        T(TierKind::kHost).state[b.page[TierIndex(TierKind::kHost)]] != PageState::kBlock) {
      continue;  // gone, or already on NVMe
    }
    StartSpill(id, /*keep_host=*/true);
  }
}

void CacheManager::OnNvmeDropped(const std::string& key, uint32_t slot) {
  std::string encoded;
  BlockHash h;
  const auto ns = DecodeBlockKey(key, nullptr, nullptr, &encoded, &h) ? namespace_ids_.find(encoded)
                                                                       : namespace_ids_.end();
  const BlockId id = ns == namespace_ids_.end() ? kNoBlock : FindBlock(ns->second, h);
  if (id == kNoBlock) {
    RememberEviction(key, TierKind::kNvme);  // that was its last copy
    return;
  }
  // Only that copy: the block may have been spilled again, to another slot.
  if (blocks_[id].page[TierIndex(TierKind::kNvme)] == slot) blocks_[id].page[TierIndex(TierKind::kNvme)] = kNoPage;
}

// ---- promotion ---------------------------------------------------------------------

BlockId CacheManager::StartPromotion(NamespaceId ns, TenantId tenant, const BlockHash& hash,
                                     const BlockRecord& rec, bool may_evict) {
  Tier& host = T(TierKind::kHost);
  if (may_evict ? MakeRoom(TierKind::kHost, tenant) != Room::kNow
               : host.pool->AvailableTo(tenant) == 0 ||
                     (QuotaPages(host, tenant) > 0 && host.pool->UsedBy(tenant) >= QuotaPages(host, tenant))) {
    return kNoBlock;
  }
  auto got = host.pool->Allocate(tenant);
  if (!got.ok() || !got->has_value()) return kNoBlock;
  const PageId page = **got;
  BlockHash parent;
  if (BlockHash::ValidSize(rec.parent.size())) {
    parent = BlockHash(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(rec.parent.data()),
                                                rec.parent.size()));
  }
  const BlockId id = NewBlock(ns, tenant, hash, parent);
  Block& b = blocks_[id];
  b.page[TierIndex(TierKind::kNvme)] = rec.slot;
  b.page[TierIndex(TierKind::kHost)] = page;
  b.promoting = true;
  host.state[page] = PageState::kInFlight;
  host.page_block[page] = id;
  ++host.inflight;
  promotions_[id] = Promotion{b.gen, {}};
  const int buf = BufferIndex(TierKind::kHost, page);
  nvme_->Fetch(KeyOf(b), rec, {host.pool->PageAddress(page), host.pool->page_bytes()}, buf,
               [this, id, gen = b.gen, rec](Status st) { OnPromoted(id, gen, std::move(st), rec); });
  return id;
}

void CacheManager::OnPromoted(BlockId id, uint32_t gen, Status st, BlockRecord rec) {
  Block& b = blocks_[id];
  KVTIER_CHECK(b.live && b.gen == gen && b.promoting) << "promotion completion for a block that moved";
  auto node = promotions_.extract(id);
  std::vector<std::pair<uint64_t, size_t>> waiters = std::move(node.mapped().waiters);
  Tier& host = T(TierKind::kHost);
  const PageId page = b.page[TierIndex(TierKind::kHost)];
  b.promoting = false;
  b.page[TierIndex(TierKind::kHost)] = kNoPage;
  --host.inflight;
  if (st.ok()) {
    AddResidency(id, TierKind::kHost, page);
    nvme_->RecordHit(KeyOf(b), rec);
    ++counters_.promotions;
    for (auto [acq, index] : waiters) {
      auto p = pending_acquires_.find(acq);
      if (p == pending_acquires_.end()) continue;  // its session went away
      auto s = sessions_.find(p->second.session);
      CacheResult r;
      if (s != sessions_.end()) {
        Ref(*s->second, id);
        r.tier = TierKind::kHost;
        r.page = page;
      } else {
        r.status = StatusCode::kUnavailable;
      }
      FinishAcquireEntry(acq, index, r);
    }
  } else {
    host.state[page] = PageState::kFree;
    host.page_block[page] = kNoPage;
    host.pool->Free(page);
    b.page[TierIndex(TierKind::kNvme)] = kNoPage;
    EraseBlock(id);
    ++counters_.promotion_failures;
    for (auto [acq, index] : waiters) {
      CacheResult r;
      // A block that failed its checksum or left the tier since it was looked up is a miss.
      r.status = st.code() == StatusCode::kDataLoss || st.code() == StatusCode::kNotFound ? st.code()
                                                                                          : StatusCode::kUnavailable;
      FinishAcquireEntry(acq, index, r);
    }
    ServePendingAllocates();
  }
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

// ---- operations --------------------------------------------------------------------

std::optional<std::vector<PageId>> CacheManager::TakePages(SessionCache& s, TierKind kind, uint32_t count,
                                                           Room* room) {
  Tier& tier = T(kind);
  std::vector<PageId> pages;
  pages.reserve(count);
  *room = Room::kNow;
  for (uint32_t i = 0; i < count; ++i) {
    *room = MakeRoom(kind, s.tenant_);
    std::optional<PageId> page;
    if (*room == Room::kNow) {
      auto got = tier.pool->Allocate(s.tenant_);
      if (got.ok()) page = *got;
    }
    if (!page) {
      for (PageId p : pages) {
        tier.state[p] = PageState::kFree;
        --tier.leased;
        s.leased_[TierIndex(kind)].erase(p);
        tier.pool->Free(p);
      }
      if (*room == Room::kNow) *room = Room::kNone;
      return std::nullopt;
    }
    tier.state[*page] = PageState::kLeased;
    ++tier.leased;
    s.leased_[TierIndex(kind)].insert(*page);
    pages.push_back(*page);
  }
  return pages;
}

std::optional<Result<std::vector<PageId>>> CacheManager::Allocate(SessionCache& s, TierKind kind,
                                                                  uint32_t count, AllocateDone done) {
  using R = Result<std::vector<PageId>>;
  if (!s.attached_) return R(FailedPrecondition("session has no namespace"));
  if (kind == TierKind::kNvme) return R(InvalidArgument("nvme pages cannot be leased"));
  if (!tier_enabled(kind)) return R(InvalidArgument(std::string(TierKindName(kind)) + " tier is not enabled"));
  if (kind == TierKind::kGpu && draining_) {
    return R(Unavailable("kvtierd is draining for maintenance (kvctl drain): no new GPU leases"));
  }
  Tier& tier = T(kind);
  if (count == 0) return R(std::vector<PageId>());
  if (count > options_.max_entries_per_request || count > tier.pool->capacity()) {
    return R(InvalidArgument("cannot allocate " + std::to_string(count) + " pages at once"));
  }
  Room room;
  // Waiting requests go first: no overtaking them.
  if (pending_allocates_.empty()) {
    if (auto pages = TakePages(s, kind, count, &room)) {
      EnforceWatermark(kind);
      return R(std::move(*pages));
    }
  } else {
    room = Room::kLater;
  }
  if (room == Room::kLater && done) {
    pending_allocates_.push_back(
        PendingAllocate{s.id_, kind, count, clock_->NowNanos() + options_.allocate_wait_ns, std::move(done)});
    ++s.pending_;
    ++counters_.allocate_waits;
    return std::nullopt;
  }
  ++counters_.allocate_failures;
  if (room == Room::kOverQuota) {
    ++counters_.quota_refusals;
    return R(ResourceExhausted("tenant '" + tenant_names_[s.tenant_] + "' is at its " + std::string(TierKindName(kind)) +
                               " quota of " + std::to_string(QuotaPages(tier, s.tenant_)) +
                               " pages (the rest of its pages are leased or referenced)"));
  }
  return R(ResourceExhausted(std::string(TierKindName(kind)) + " tier has no free page for " +
                             std::to_string(count) + " (" + std::to_string(tier.pool->free_count()) +
                             " free, the rest leased, referenced or in flight)"));
}

void CacheManager::ServeQueuedPromotions() {
  while (!queued_promotions_.empty()) {
    QueuedPromotion& q = queued_promotions_.front();
    // Drop waiters whose sessions left; with none left there is nothing to read for.
    std::erase_if(q.waiters, [this](const auto& w) { return !pending_acquires_.count(w.first); });
    if (q.waiters.empty()) {
      queued_promotions_.pop_front();
      continue;
    }
    // While it waited, another session may have committed the block or started reading it.
    if (const BlockId existing = FindBlock(q.ns, q.hash); existing != kNoBlock) {
      const auto waiters = std::move(q.waiters);
      queued_promotions_.pop_front();
      if (blocks_[existing].promoting) {
        auto& w = promotions_[existing].waiters;
        w.insert(w.end(), waiters.begin(), waiters.end());
      } else {
        const auto tier = ReadableTier(blocks_[existing]);
        for (auto [acq, index] : waiters) {
          auto p = pending_acquires_.find(acq);
          auto s = p == pending_acquires_.end() ? sessions_.end() : sessions_.find(p->second.session);
          CacheResult r;
          if (tier && s != sessions_.end()) {
            Ref(*s->second, existing);
            r.tier = *tier;
            r.page = blocks_[existing].page[TierIndex(*tier)];
          } else {
            r.status = StatusCode::kUnavailable;
          }
          FinishAcquireEntry(acq, index, r);
        }
      }
      continue;
    }
    const BlockId id = StartPromotion(q.ns, q.tenant, q.hash, q.record, true);
    if (id == kNoBlock) {
      if (clock_->NowNanos() < q.deadline_ns) return;  // still no page: keep waiting
      for (auto [acq, index] : q.waiters) {
        CacheResult r;
        r.status = StatusCode::kResourceExhausted;
        FinishAcquireEntry(acq, index, r);
      }
      queued_promotions_.pop_front();
      continue;
    }
    auto& w = promotions_[id].waiters;
    w.insert(w.end(), q.waiters.begin(), q.waiters.end());
    queued_promotions_.pop_front();
  }
}

void CacheManager::ServePendingAllocates() {
  ServeQueuedPromotions();
  while (!pending_allocates_.empty()) {
    PendingAllocate& p = pending_allocates_.front();
    auto s = sessions_.find(p.session);
    if (s == sessions_.end()) {
      pending_allocates_.pop_front();
      continue;
    }
    Room room;
    auto pages = TakePages(*s->second, p.tier, p.count, &room);
    if (!pages && room == Room::kLater && clock_->NowNanos() < p.deadline_ns) return;
    PendingAllocate done = std::move(p);
    pending_allocates_.pop_front();
    --s->second->pending_;
    if (pages) {
      EnforceWatermark(done.tier);
      done.done(std::move(*pages));
    } else if (room == Room::kOverQuota) {
      ++counters_.allocate_failures;
      ++counters_.quota_refusals;
      done.done(ResourceExhausted("tenant '" + tenant_names_[s->second->tenant_] + "' is at its " +
                                  std::string(TierKindName(done.tier)) + " quota"));
    } else {
      ++counters_.allocate_failures;
      done.done(ResourceExhausted(std::string(TierKindName(done.tier)) + " tier could not free " +
                                  std::to_string(done.count) + " pages in time"));
    }
  }
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
    if (!s.attached_ || !tier_enabled(kind) || kind == TierKind::kNvme || leased.count(page) == 0) {
      r.status = StatusCode::kFailedPrecondition;
      continue;
    }
    Tier& tier = T(kind);
    const BlockHash& hash = hashes[i];
    BlockHash parent;
    if (!parents.empty() && !parents[i].IsZero()) parent = parents[i];
    BlockId existing = FindBlock(s.ns_, hash);
    if (existing != kNoBlock && blocks_[existing].promoting) {
      r.status = StatusCode::kUnavailable;  // being read from NVMe right now; retry
      continue;
    }
    leased.erase(page);
    --tier.leased;
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
    std::optional<BlockRecord> on_nvme;
    if (existing == kNoBlock && nvme_) {
      auto rec = nvme_->Find(EncodeBlockKey(namespaces_[s.ns_].encoded, hash));
      if (rec.ok()) on_nvme = *rec;
    }
    BlockId id = existing;
    if (id == kNoBlock) id = NewBlock(s.ns_, s.tenant_, hash, parent);
    // Known in another tier already: this page becomes its copy here.
    r.duplicate = existing != kNoBlock || on_nvme.has_value();
    if (on_nvme) blocks_[id].page[TierIndex(TierKind::kNvme)] = on_nvme->slot;
    if (retain) Ref(s, id);
    AddResidency(id, kind, page);
    r.page = page;
    ++(r.duplicate ? counters_.commits_duplicate : counters_.commits_stored);
    blocks_[id].last_use_ns = clock_->NowNanos();
    if (!r.duplicate && !evicted_.empty()) {
      if (evicted_.erase(KeyOf(blocks_[id])) > 0) ++counters_.refetches_after_evict;
    }
    if (nvme_ && options_.write_policy == WritePolicy::kWriteThrough && kind == TierKind::kHost &&
        blocks_[id].page[TierIndex(TierKind::kNvme)] == kNoPage) {
      write_through_queue_.emplace_back(id, blocks_[id].gen);
    }
  }
  PumpWriteThrough();
  // New cached blocks may be what the watermark needed to act on.
  if (tier_enabled(kind) && kind != TierKind::kNvme) EnforceWatermark(kind);
  return out;
}

std::vector<StatusCode> CacheManager::Release(SessionCache& s, TierKind kind,
                                              std::span<const PageId> pages,
                                              std::span<const BlockHash> hashes) {
  std::vector<StatusCode> out;
  out.reserve(pages.size() + hashes.size());
  const bool usable = s.attached_ && tier_enabled(kind) && kind != TierKind::kNvme;
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
    const BlockId id = tier.state[page] != PageState::kFree ? tier.page_block[page] : kNoBlock;
    out.push_back(id != kNoBlock && Unref(s, id) ? StatusCode::kOk : StatusCode::kFailedPrecondition);
  }
  for (const BlockHash& h : hashes) {
    const BlockId id = s.attached_ ? FindBlock(s.ns_, h) : kNoBlock;
    out.push_back(id != kNoBlock && Unref(s, id) ? StatusCode::kOk : StatusCode::kFailedPrecondition);
  }
  ServePendingAllocates();
  if (usable) EnforceWatermark(kind);
  return out;
}

CacheLookup CacheManager::Lookup(SessionCache& s, std::span<const BlockHash> hashes) {
  CacheLookup r;
  ++counters_.lookups;
  counters_.lookup_blocks += hashes.size();
  if (s.attached_) {
    size_t i = 0;
    std::vector<std::pair<BlockId, TierKind>> touched;
    // In-memory blocks first; the rest of the chain from the NVMe index in one batch.
    for (; i < hashes.size(); ++i) {
      const BlockId id = FindBlock(s.ns_, hashes[i]);
      if (id == kNoBlock) break;
      const Block& b = blocks_[id];
      auto tier = ReadableTier(b);
      if (!tier) {
        if (!b.promoting) break;
        tier = TierKind::kNvme;  // on its way up
      } else {
        touched.emplace_back(id, *tier);  // an engine wants it: it is in use
      }
      r.tiers.push_back(*tier);
    }
    // Prefix-ordered policies see the deepest block first, so the chain's head ends up the
    // most recent.
    if (PrefixOrdered(s)) std::reverse(touched.begin(), touched.end());
    const int64_t now = clock_->NowNanos();
    for (auto [id, tier] : touched) {
      PolicyFor(T(tier), blocks_[id].tenant).Touch(id);
      ++blocks_[id].hits;
      blocks_[id].last_use_ns = now;
    }
    if (i < hashes.size() && nvme_) {
      const std::string& ns = namespaces_[s.ns_].encoded;
      std::vector<std::string> keys;
      for (size_t j = i; j < hashes.size(); ++j) keys.push_back(EncodeBlockKey(ns, hashes[j]));
      auto recs = nvme_->FindMany(keys);
      for (size_t j = i; recs.ok() && j < hashes.size(); ++j) {
        const BlockId id = FindBlock(s.ns_, hashes[j]);
        if (id != kNoBlock) {
          auto tier = ReadableTier(blocks_[id]);
          if (!tier && !blocks_[id].promoting) break;
          r.tiers.push_back(tier ? *tier : TierKind::kNvme);
          continue;
        }
        const auto& rec = (*recs)[j - i];
        if (!rec) break;
        r.tiers.push_back(TierKind::kNvme);
        nvme_->Touch(rec->slot);
        if (options_.prefetch && StartPromotion(s.ns_, s.tenant_, hashes[j], *rec, false) != kNoBlock) {
          ++counters_.prefetches;
        }
      }
    }
    for (TierKind t : r.tiers) ++counters_.block_hits[TierIndex(t)];
  }
  r.matched = r.tiers.size();
  counters_.block_misses += hashes.size() - r.matched;
  return r;
}

std::optional<std::vector<CacheResult>> CacheManager::Acquire(SessionCache& s,
                                                              std::span<const BlockHash> hashes,
                                                              AcquireDone done) {
  std::vector<CacheResult> out(hashes.size());
  std::vector<std::pair<size_t, BlockId>> waits;  // entry, promoting block
  std::vector<size_t> on_nvme;                    // entries to look for in the NVMe index
  std::vector<std::pair<size_t, BlockRecord>> queued;  // entries waiting for a host page
  const bool reverse = PrefixOrdered(s);  // deepest first, as Lookup
  for (size_t n = 0; n < hashes.size(); ++n) {
    const size_t i = reverse ? hashes.size() - 1 - n : n;
    ++counters_.acquires;
    const BlockId id = s.attached_ ? FindBlock(s.ns_, hashes[i]) : kNoBlock;
    if (id != kNoBlock && blocks_[id].promoting) {
      waits.emplace_back(i, id);
      continue;
    }
    std::optional<TierKind> tier;
    if (id != kNoBlock) tier = ReadableTier(blocks_[id]);
    if (!tier) {
      if (s.attached_ && nvme_) {
        on_nvme.push_back(i);
      } else {
        out[i].status = StatusCode::kNotFound;
        ++counters_.acquire_misses;
      }
      continue;
    }
    Block& b = blocks_[id];
    PolicyFor(T(*tier), b.tenant).Touch(id);  // before Ref: a pinned block ignores Touch
    Ref(s, id);
    out[i].tier = *tier;
    out[i].page = b.page[TierIndex(*tier)];
  }
  if (!on_nvme.empty()) {
    const std::string& ns = namespaces_[s.ns_].encoded;
    std::vector<std::string> keys;
    for (size_t i : on_nvme) keys.push_back(EncodeBlockKey(ns, hashes[i]));
    auto recs = nvme_->FindMany(keys);
    for (size_t k = 0; k < on_nvme.size(); ++k) {
      const size_t i = on_nvme[k];
      const BlockId again = FindBlock(s.ns_, hashes[i]);  // an earlier entry may have started it
      if (again != kNoBlock && blocks_[again].promoting) {
        waits.emplace_back(i, again);
        continue;
      }
      if (!recs.ok() || !(*recs)[k]) {
        out[i].status = StatusCode::kNotFound;
        ++counters_.acquire_misses;
        continue;
      }
      if (!done) {
        out[i].status = StatusCode::kUnavailable;  // the caller cannot wait for NVMe
        continue;
      }
      const BlockId id = queued_promotions_.empty()
                             ? StartPromotion(s.ns_, s.tenant_, hashes[i], *(*recs)[k], true)
                             : kNoBlock;
      if (id == kNoBlock) {
        // No host page yet (demotions are freeing some): read it when one frees up.
        queued.emplace_back(i, *(*recs)[k]);
        continue;
      }
      waits.emplace_back(i, id);
    }
  }
  if (waits.empty() && queued.empty()) return out;
  const uint64_t acq = next_pending_++;
  for (auto [i, id] : waits) promotions_[id].waiters.emplace_back(acq, i);
  for (auto& [i, rec] : queued) {
    const BlockHash& hash = hashes[i];
    auto same = std::find_if(queued_promotions_.begin(), queued_promotions_.end(), [&](const QueuedPromotion& q) {
      return q.ns == s.ns_ && q.hash == hash;
    });
    if (same != queued_promotions_.end()) {
      same->waiters.emplace_back(acq, i);
    } else {
      queued_promotions_.push_back(QueuedPromotion{s.ns_, s.tenant_, hashes[i], std::move(rec),
                                                   clock_->NowNanos() + options_.allocate_wait_ns, {{acq, i}}});
    }
  }
  pending_acquires_[acq] = PendingAcquire{s.id_, std::move(out), waits.size() + queued.size(), std::move(done)};
  ++s.pending_;
  return std::nullopt;
}

void CacheManager::Tick() {
  if (draining_) DrainStep();
  PumpWriteThrough();
  ServePendingAllocates();
  EnforceWatermark(TierKind::kHost);
}

void CacheManager::VerifyNvme(std::function<void(VerifyReport)> done) {
  if (!nvme_) {
    VerifyReport r;
    r.status = FailedPrecondition("no NVMe tier is configured");
    done(r);
    return;
  }
  nvme_->Verify(std::move(done));
}

// ---- segments ----------------------------------------------------------------------

std::vector<SegmentGrant> CacheManager::TakeSegmentGrants(SessionCache& s, TierKind kind,
                                                          std::span<const PageId> pages) {
  std::vector<SegmentGrant> out;
  if (kind == TierKind::kNvme || !tier_enabled(kind)) return out;
  const TierPool& pool = *T(kind).pool;
  auto& sent = s.sent_gen_[TierIndex(kind)];
  if (sent.size() < pool.segment_count()) sent.resize(pool.segment_count(), 0);
  for (PageId p : pages) {
    if (p == kNoPage) continue;
    const uint32_t seg = pool.SegmentOf(p);
    if (sent[seg] == pool.Generation(seg)) continue;
    sent[seg] = pool.Generation(seg);
    auto handle = pool.memory().IpcHandle(seg);
    out.push_back(SegmentGrant{kind, seg, seg * pool.pages_per_segment(), pool.pages_per_segment(),
                               pool.memory().segment_bytes(), pool.memory().ShareFd(seg),
                               std::vector<uint8_t>(handle.begin(), handle.end())});
  }
  return out;
}

std::vector<SegmentGrant> CacheManager::TakeAllSegmentGrants(SessionCache& s) {
  std::vector<SegmentGrant> out;
  for (TierKind kind : {TierKind::kGpu, TierKind::kHost}) {
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
  TierCounts c;
  if (kind == TierKind::kNvme) {
    if (!nvme_) return c;
    const NvmeCounts n = nvme_->Counts();
    c.capacity = n.capacity;
    c.free = n.free;
    c.inflight = n.inflight;
    c.cached = n.cached;
    c.blocks = n.cached;
    c.page_bytes = nvme_->slot_bytes();
    return c;
  }
  const Tier& tier = T(kind);
  if (!tier.pool) return c;
  c.capacity = tier.pool->capacity();
  c.free = tier.pool->free_count();
  c.leased = tier.leased;
  c.inflight = tier.inflight;
  c.cached = tier.cached;
  c.referenced = tier.referenced;
  c.quarantined = tier.quarantined;
  c.blocks = tier.blocks;
  c.page_bytes = tier.pool->page_bytes();
  return c;
}

Status CacheManager::CheckInvariants() const {
  for (TierKind kind : kAllTiers) {
    if (!tier_enabled(kind)) continue;
    const TierCounts c = Counts(kind);
    const std::string name(TierKindName(kind));
    if (uint64_t{c.free} + c.leased + c.inflight + c.cached + c.referenced + c.quarantined != c.capacity) {
      return Internal(name + ": free " + std::to_string(c.free) + " + leased " +
                      std::to_string(c.leased) + " + inflight " + std::to_string(c.inflight) +
                      " + cached " + std::to_string(c.cached) + " + referenced " +
                      std::to_string(c.referenced) + " + quarantined " + std::to_string(c.quarantined) +
                      " != capacity " + std::to_string(c.capacity));
    }
    if (kind == TierKind::kNvme) continue;
    const Tier& tier = T(kind);
    uint32_t by_state[5] = {0, 0, 0, 0, 0};
    uint32_t cached = 0, referenced = 0;
    for (PageId p = 0; p < c.capacity; ++p) {
      ++by_state[static_cast<int>(tier.state[p])];
      if (tier.state[p] == PageState::kFree && !tier.pool->IsFree(p)) {
        return Internal(name + ": page " + std::to_string(p) + " free in state but not in pool");
      }
      if (tier.state[p] == PageState::kBlock || tier.state[p] == PageState::kInFlight) {
        const BlockId id = tier.page_block[p];
        if (id == kNoBlock || !blocks_[id].live || blocks_[id].page[TierIndex(kind)] != p) {
          return Internal(name + ": page " + std::to_string(p) + " maps to a block elsewhere");
        }
        if (tier.state[p] == PageState::kBlock) ++(blocks_[id].refs == 0 ? cached : referenced);
      }
    }
    if (by_state[0] != c.free || by_state[1] != c.leased || by_state[2] != c.inflight ||
        by_state[4] != c.quarantined || cached != c.cached || referenced != c.referenced) {
      return Internal(name + ": page states disagree with counters");
    }
  }
  return Status::Ok();
}

}  // namespace kvtier
