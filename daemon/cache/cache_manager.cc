// CacheManager: opening, sessions and their requests. The reads (Lookup, Acquire) are in
// cache_manager_reads.cc, the requests that wait in cache_waiting.cc, eviction in
// cache_pressure.cc, kvctl's operations in cache_manager_admin.cc.
#include "daemon/cache/cache_manager.h"

#include <algorithm>

#include "protocol/base/logging.h"

namespace kvtier {

size_t SessionCache::leased_pages() const {
  size_t n = 0;
  for (const auto& l : leased_) n += l.size();
  return n;
}

CacheManager::CacheManager(const Options& options)
    : options_(options), namespaces_(options.tenant_limits, options.unknown_limits) {}

Result<std::unique_ptr<CacheManager>> CacheManager::Open(const Options& options, NvmeSpec nvme, const Clock* clock,
                                                         std::vector<LowerTierSpec> lower) {
  std::unique_ptr<CacheManager> cm(new CacheManager(options));
  CacheManager* raw = cm.get();  // what the parts' callbacks reach; they die before it
  cm->clock_ = clock ? clock : SystemClock::Default();
  // A spill or put ended: its host page may be free, and the watermark may act again.
  auto host_copy_done = [raw] {
    raw->ServePendingAllocates();
    raw->EnforceWatermark(TierKind::kHost);
  };
  auto promoted = [raw](BlockId id, const Status& st) { raw->walk_->OnPromoted(id, st); };
  for (TierKind t : {TierKind::kGpu, TierKind::kHost}) {
    cm->headroom_[TierIndex(t)] = AllocationHeadroom(options.tiers[TierIndex(t)].allocation_headroom);
  }
  KVTIER_ASSIGN_OR_RETURN(cm->blocks_, BlockTable::Open(options.tiers, options.device_backend, options.gpu_device,
                                                        &cm->namespaces_, nvme.tier != nullptr || !lower.empty()));
  if (TierPool* host = cm->blocks_->pool(TierKind::kHost); host && options.post) {
    // A segment changing tenant is renewed off the control thread; the Allocates and
    // promotions that wait for it are served when it ends. They wait for it: nice 0.
    KVTIER_ASSIGN_OR_RETURN(cm->renewer_, BlockWorkers::Open("kvtier-renew", 1, options.post, /*nice=*/0));
    host->SetRenewalRunner(
        [renewer = cm->renewer_.get()](std::function<Status()> work, std::function<void(Status)> done) {
          renewer->Run(std::move(work), std::move(done));
        },
        [raw] { raw->ServePendingAllocates(); });
  }
  if (cm->blocks_->enabled(TierKind::kGpu)) {
    if (!options.post) return InvalidArgument("a GPU tier needs an event loop to post its demotion copies to");
    KVTIER_ASSIGN_OR_RETURN(
        cm->gpu_demoter_,
        GpuDemoter::Open({.copy = options.gpu_copy, .max_in_flight = options.max_gpu_demotions_in_flight},
                         cm->blocks_.get(), &cm->namespaces_, cm->clock_, options.post,
                         [raw](BlockId id, const Status& st, bool resident, double seconds) {
                           raw->OnGpuDemoted(id, st, resident, seconds);
                         }));
  }
  if (nvme.tier && nvme.options.quantization) {
    if (!options.post) return InvalidArgument("a quantized NVMe tier needs an event loop to post to");
    KVTIER_ASSIGN_OR_RETURN(cm->workers_, BlockWorkers::Open("kvtier-blocks", options.block_workers, options.post));
  }
  if (nvme.tier) {
    NvmeMover::Hooks hooks;
    hooks.after_spill = host_copy_done;
    hooks.after_promotion = promoted;
    hooks.last_copy_dropped = [raw](const std::string& key) { raw->RememberEviction(key, TierKind::kNvme); };
    hooks.demoted = [raw](double seconds) { raw->headroom_[TierIndex(TierKind::kHost)].NoteRoundTrip(seconds); };
    NvmeMover::Options mo = nvme.options;
    mo.clock = cm->clock_;
    // Spills in flight are bounded by the watermark's band, not by the device's queue (the
    // NVMe tier queues I/O past its depth): a spill's round trip is an I/O, an index write
    // and turns of the event loop, so under load only a deep pipeline frees host pages as
    // fast as engines allocate them (docs/architecture.md, "Allocate without waiting").
    const TierOptions& host = options.tiers[TierIndex(TierKind::kHost)];
    const uint64_t host_pages = host.page_bytes ? host.capacity_bytes / host.page_bytes : 0;
    const auto band = static_cast<uint32_t>(static_cast<double>(host_pages) * (1.0 - host.low_watermark));
    mo.max_spills_in_flight = std::max(mo.max_spills_in_flight, band);
    mo.workers = cm->workers_.get();
    KVTIER_ASSIGN_OR_RETURN(cm->mover_, NvmeMover::Open(std::move(nvme.tier), mo, cm->blocks_.get(), &cm->namespaces_,
                                                        &cm->counters_, std::move(hooks)));
  }
  for (LowerTierSpec& spec : lower) {
    LowerTierMover::Hooks hooks;
    hooks.after_put = host_copy_done;
    hooks.after_promotion = promoted;
    KVTIER_ASSIGN_OR_RETURN(auto mover, LowerTierMover::Open(std::move(spec.tier), cm->lower_.size(), spec.options,
                                                             cm->blocks_.get(), &cm->namespaces_, std::move(hooks)));
    cm->lower_.push_back(std::move(mover));
  }
  // A block entering a pool tier takes the class its tenant's sessions give it; a block
  // that goes is forgotten by them.
  cm->blocks_->SetRetentionSource([raw](TenantId tenant, BlockId id) {
    BlockTable::RetentionClass c;
    if (tenant >= raw->session_tables_.size() || !raw->session_tables_[tenant]) return c;
    const SessionTable& t = *raw->session_tables_[tenant];
    c.r = t.Class(id);
    c.expected_return = t.ExpectedReturn(id);
    c.depth = t.Depth(id);
    if (c.r == Retention::kProtected && !raw->ProtectionRoom(TierKind::kHost, tenant)) {
      ++raw->session_counts_.over_share;
      c.r = Retention::kOrdinary;
    }
    return c;
  });
  cm->blocks_->SetEraseListener([raw](TenantId tenant, BlockId id) {
    if (tenant < raw->session_tables_.size() && raw->session_tables_[tenant]) raw->session_tables_[tenant]->Forget(id);
  });
  if (KvEvents* events = options.events) {
    cm->blocks_->SetResidencyListener([events, raw](const BlockTable::Block& b, TierKind tier, bool resident) {
      const std::string& ns = raw->namespaces_.Get(b.ns).encoded;
      if (resident) {
        events->Stored(ns, tier, b.hash, b.parent, raw->committing_keys_);
      } else {
        events->Removed(ns, tier, b.hash);
      }
    });
    if (cm->mover_) {
      cm->mover_->nvme().SetIndexListener([events](const std::string& key, const BlockRecord* stored) {
        std::string ns;
        BlockHash hash;
        if (!DecodeBlockKey(key, nullptr, nullptr, &ns, &hash)) return;
        if (stored == nullptr) {
          events->Removed(ns, TierKind::kNvme, hash);
          return;
        }
        BlockHash parent;
        if (BlockHash::ValidSize(stored->parent.size())) {
          parent = BlockHash(
              std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(stored->parent.data()), stored->parent.size()));
        }
        events->Stored(ns, TierKind::kNvme, hash, parent);
      });
    }
  }
  {
    ChainWalk::Hooks hooks;
    hooks.host_room = [raw](TenantId tenant, bool may_evict) { return raw->HostRoom(tenant, may_evict); };
    hooks.ref = [raw](SessionId session, BlockId id) {
      auto s = raw->sessions_.find(session);
      if (s == raw->sessions_.end()) return false;
      raw->Ref(*s->second, id);
      return true;
    };
    hooks.answered = [raw](SessionId session) {
      if (auto s = raw->sessions_.find(session); s != raw->sessions_.end()) --s->second->pending_;
    };
    hooks.pages_freed = [raw] { raw->ServePendingAllocates(); };
    cm->walk_ = std::make_unique<ChainWalk>(cm->blocks_.get(), cm->mover_.get(), &cm->lower_, &cm->counters_,
                                            cm->clock_, options.allocate_wait_ns, std::move(hooks));
  }
  cm->views_ = std::make_unique<CacheViews>(&cm->namespaces_, cm->blocks_.get(), cm->mover_.get(), &cm->history_,
                                            cm->clock_, options.post);
  return cm;
}

// The movers' threads must stop before the state their callbacks touch (and the pages
// they read) goes.
CacheManager::~CacheManager() {
  workers_.reset();  // their jobs read pages and the movers' buffers
  gpu_demoter_.reset();
  lower_.clear();
  mover_.reset();
}

// ---- sessions ------------------------------------------------------------------------

Status CacheManager::Attach(SessionCache& s, std::string_view tenant, const ModelLayout& layout,
                            const EventSource& source) {
  if (s.attached_) return FailedPrecondition("session already attached");
  KVTIER_RETURN_IF_ERROR(layout.Validate());
  for (TierKind kind : {TierKind::kGpu, TierKind::kHost}) {
    const TierPool* pool = blocks_->pool(kind);
    if (pool && layout.block_bytes > pool->page_bytes()) {
      return InvalidArgument("layout.block_bytes " + std::to_string(layout.block_bytes) + " exceeds the " +
                             std::string(TierKindName(kind)) + " tier's page of " + std::to_string(pool->page_bytes()) +
                             " bytes");
    }
  }
  const std::string fingerprint = layout.Fingerprint();
  const std::string encoded = EncodeNamespace(tenant, fingerprint);
  // Events first: the one step here that may refuse (a tenant's topic cap). A routable id
  // another tenant's engine holds costs this engine its events, not its cache: whoever
  // declared the address first may have squatted it.
  if (options_.events) {
    auto link = options_.events->AddNamespace(encoded, tenant, layout.model_id, layout.tokens_per_block, source);
    if (link.ok()) {
      s.event_link_ = *link;
    } else if (link.status().code() == StatusCode::kPermissionDenied) {
      KVTIER_LOG(WARNING) << "tenant '" << tenant << "': " << link.status().message()
                          << "; this engine's blocks are cached but not announced on that topic";
    } else {
      return link.status();
    }
  }
  s.tenant_ = namespaces_.InternTenant(tenant);
  // Blocks the kernels can quantize: the canonical page ([layer][k,v][token][head][dim]) of
  // 2-byte floats, rows a multiple of 4 bytes of codes.
  std::optional<KvGeometry> kv;
  const bool floats = layout.dtype == DType::kBFloat16 || layout.dtype == DType::kFloat16;
  if (floats && layout.block_bytes == layout.NaturalBlockBytes() && layout.head_dim % 4 == 0) {
    KvGeometry g;
    g.num_layers = layout.num_layers;
    g.num_blocks = 1;
    g.block_tokens = layout.tokens_per_block;
    g.kv_heads = layout.kv_heads;
    g.head_dim = layout.head_dim;
    g.elem_bytes = 2;
    if (g.Validate().ok()) kv = g;
  }
  s.ns_ = namespaces_.Acquire(encoded, fingerprint, layout.block_bytes, tenant, layout.model_id, kv,
                              layout.dtype == DType::kFloat16 ? FloatKind::kFp16 : FloatKind::kBf16,
                              namespaces_.limits(s.tenant_).kv_quantization);
  s.attached_ = true;
  sessions_[s.id_] = &s;
  return Status::Ok();
}

uint64_t CacheManager::Detach(SessionCache& s, bool quarantine_leases) {
  if (!s.attached_) return 0;
  uint64_t quarantine = 0;
  sessions_.erase(s.id_);
  // Its deferred requests are answered to nobody.
  walk_->Forget(s.id_);
  for (auto& q : pending_allocates_) std::erase_if(q, [&](const PendingAllocate& p) { return p.session == s.id_; });
  for (TierKind kind : kAllTiers) {
    for (PageId p : s.leased_[TierIndex(kind)]) {
      if (quarantine_leases) {
        if (quarantine == 0) quarantine = next_quarantine_++;
        blocks_->Quarantine(kind, p);
        Quarantine& q = quarantines_[quarantine];
        q.tenant = s.tenant_;
        q.pages.emplace_back(kind, p);
      } else {
        blocks_->Free(kind, p);
      }
    }
    s.leased_[TierIndex(kind)].clear();
  }
  // Drop every reference; copy first since Unref edits the map.
  std::vector<std::pair<BlockId, uint32_t>> refs(s.refs_.begin(), s.refs_.end());
  for (auto [id, n] : refs) {
    for (uint32_t i = 0; i < n; ++i) Unref(s, id);
  }
  namespaces_.Release(s.ns_);
  if (options_.events) options_.events->RemoveNamespace(s.event_link_);
  s.event_link_ = 0;
  s.attached_ = false;
  ReclaimQuarantineOnlySegments();
  ServePendingAllocates();
  return quarantines_.count(quarantine) ? quarantine : 0;
}

void CacheManager::ReleaseQuarantine(uint64_t id) {
  auto it = quarantines_.find(id);
  if (it == quarantines_.end()) return;  // reclaimed meanwhile
  for (auto [kind, p] : it->second.pages) blocks_->EndQuarantine(kind, p);
  quarantines_.erase(it);
  ServePendingAllocates();
}

void CacheManager::Ref(SessionCache& s, BlockId id) {
  blocks_->Ref(id);
  ++s.refs_[id];
}

bool CacheManager::Unref(SessionCache& s, BlockId id) {
  auto it = s.refs_.find(id);
  if (it == s.refs_.end()) return false;
  if (--it->second == 0) s.refs_.erase(it);
  blocks_->Unref(id);
  return true;
}

// ---- requests ------------------------------------------------------------------------

std::optional<std::vector<PageId>> CacheManager::TakePages(SessionCache& s, TierKind kind, uint32_t count, Room* room) {
  std::vector<PageId> pages;
  pages.reserve(count);
  *room = Room::kNow;
  auto& leased = s.leased_[TierIndex(kind)];
  for (uint32_t i = 0; i < count; ++i) {
    *room = MakeRoom(kind, s.tenant_);
    std::optional<PageId> page;
    if (*room == Room::kNow) page = blocks_->Lease(kind, s.tenant_);
    if (!page) {
      for (PageId p : pages) {
        leased.erase(p);
        blocks_->Free(kind, p);
      }
      if (*room == Room::kNow) *room = blocks_->pool(kind)->renewing() ? Room::kLater : Room::kNone;
      return std::nullopt;
    }
    leased.insert(*page);
    pages.push_back(*page);
  }
  return pages;
}

Status CacheManager::CheckLeaseCap(const SessionCache& s, TierKind kind, uint32_t count) const {
  if (options_.max_leased_share >= 1.0 || QuotaPages(kind, s.tenant_) > 0) return Status::Ok();
  const uint32_t capacity = blocks_->pool(kind)->capacity();
  const auto cap = std::max<uint64_t>(1, static_cast<uint64_t>(capacity * options_.max_leased_share));
  const std::string tier(TierKindName(kind));
  const size_t held = s.leased_[TierIndex(kind)].size();
  if (held + count > cap) {
    return ResourceExhausted("this session holds " + std::to_string(held) + " leased " + tier + " pages and asks for " +
                             std::to_string(count) +
                             " more; security.max_leased_share lets one tenant's sessions hold " + std::to_string(cap) +
                             " of " + std::to_string(capacity) + ": commit or release some first");
  }
  // The tenant's sessions together, and its quarantined pages (leases of its sessions that
  // ended while their process lives): more sessions buy no more of the tier.
  size_t tenant_held = 0;
  for (const auto& [id, other] : sessions_) {
    if (other->tenant_ == s.tenant_) tenant_held += other->leased_[TierIndex(kind)].size();
  }
  for (const auto& [id, q] : quarantines_) {
    if (q.tenant != s.tenant_) continue;
    for (const auto& [k, p] : q.pages) tenant_held += k == kind;
  }
  if (tenant_held + count <= cap) return Status::Ok();
  return ResourceExhausted("tenant '" + namespaces_.tenant_name(s.tenant_) + "' holds " + std::to_string(tenant_held) +
                           " leased or quarantined " + tier + " pages across its sessions and asks for " +
                           std::to_string(count) + " more; security.max_leased_share lets one tenant hold " +
                           std::to_string(cap) + " of " + std::to_string(capacity) +
                           ": commit or release some first (quarantined pages come back when their process exits)");
}

std::optional<Result<std::vector<PageId>>> CacheManager::Allocate(SessionCache& s, TierKind kind, uint32_t count,
                                                                  AllocateDone done) {
  using R = Result<std::vector<PageId>>;
  if (!s.attached_) return R(FailedPrecondition("session has no namespace"));
  if (!IsPoolTier(kind)) return R(InvalidArgument(std::string(TierKindName(kind)) + " pages cannot be leased"));
  if (!tier_enabled(kind)) return R(InvalidArgument(std::string(TierKindName(kind)) + " tier is not enabled"));
  if (kind == TierKind::kGpu && draining_) {
    return R(Unavailable("kvtierd is draining for maintenance (kvctl drain): no new GPU leases"));
  }
  const TierPool& pool = *blocks_->pool(kind);
  if (count == 0) return R(std::vector<PageId>());
  if (count > options_.max_entries_per_request || count > pool.capacity()) {
    return R(InvalidArgument("cannot allocate " + std::to_string(count) + " pages at once"));
  }
  KVTIER_RETURN_IF_ERROR(CheckLeaseCap(s, kind, count));
  Room room;
  // Waiting requests of the tier go first: no overtaking them.
  auto& waiting = pending_allocates_[TierIndex(kind)];
  if (waiting.empty()) {
    if (auto pages = TakePages(s, kind, count, &room)) {
      EnforceWatermark(kind);
      return R(std::move(*pages));
    }
  } else {
    room = Room::kLater;
  }
  if ((room == Room::kLater || (room == Room::kNone && OthersWillRelease(s, kind))) && done) {
    waiting.push_back(PendingAllocate{s.id_, count, clock_->NowNanos() + options_.allocate_wait_ns, std::move(done)});
    ++s.pending_;
    ++counters_.allocate_waits;
    return std::nullopt;
  }
  ++counters_.allocate_failures;
  if (room == Room::kOverQuota) {
    ++counters_.quota_refusals;
    return R(ResourceExhausted("tenant '" + namespaces_.tenant_name(s.tenant_) + "' is at its " +
                               std::string(TierKindName(kind)) + " quota of " +
                               std::to_string(QuotaPages(kind, s.tenant_)) +
                               " pages (the rest of its pages are leased or referenced)"));
  }
  return R(ResourceExhausted(std::string(TierKindName(kind)) + " tier has no free page for " + std::to_string(count) +
                             " (" + std::to_string(pool.free_count()) +
                             " free, the rest leased, referenced or in flight)"));
}

std::vector<CacheResult> CacheManager::Commit(SessionCache& s, TierKind kind, std::span<const PageId> pages,
                                              std::span<const BlockHash> hashes, std::span<const BlockHash> parents,
                                              bool retain, const StoredKeys& keys) {
  std::vector<CacheResult> out(pages.size());
  auto& leased = s.leased_[TierIndex(kind)];
  // The NVMe index read once for the request (one MultiGet) for the hashes no block of the
  // namespace has: one already on NVMe becomes this page's copy rather than a new block.
  std::vector<std::optional<BlockRecord>> on_nvme_of(pages.size());
  if (mover_ && s.attached_) {
    std::vector<BlockHash> ask;
    std::vector<size_t> at;
    for (size_t i = 0; i < pages.size(); ++i) {
      if (blocks_->Find(s.ns_, hashes[i]) == kNoBlock) {
        ask.push_back(hashes[i]);
        at.push_back(i);
      }
    }
    if (!ask.empty()) {
      auto recs = mover_->FindMany(s.ns_, ask);
      if (recs.ok()) {
        for (size_t k = 0; k < at.size(); ++k) on_nvme_of[at[k]] = std::move((*recs)[k]);
      }
    }
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    CacheResult& r = out[i];
    const PageId page = pages[i];
    r.tier = kind;
    if (!s.attached_ || !IsPoolTier(kind) || !tier_enabled(kind) || leased.count(page) == 0) {
      r.status = StatusCode::kFailedPrecondition;
      continue;
    }
    const BlockHash& hash = hashes[i];
    BlockHash parent;
    if (!parents.empty() && !parents[i].IsZero()) parent = parents[i];
    const BlockId existing = blocks_->Find(s.ns_, hash);
    if (existing != kNoBlock && blocks_->block(existing).promoting()) {
      r.status = StatusCode::kUnavailable;  // being read from NVMe right now; retry
      continue;
    }
    leased.erase(page);
    if (existing != kNoBlock && blocks_->block(existing).page[TierIndex(kind)] != kNoPage) {
      // Already stored here: keep the old copy, free this page.
      blocks_->Free(kind, page);
      r.duplicate = true;
      r.page = blocks_->block(existing).page[TierIndex(kind)];
      if (retain) Ref(s, existing);
      blocks_->Policy(kind, s.tenant_).Touch(existing);
      ++counters_.commits_duplicate;
      continue;
    }
    std::optional<BlockRecord> on_nvme;
    if (existing == kNoBlock) on_nvme = on_nvme_of[i];
    const BlockId id = existing != kNoBlock ? existing : blocks_->Create(s.ns_, s.tenant_, hash, parent);
    // Known in another tier already: this page becomes its copy here.
    r.duplicate = existing != kNoBlock || on_nvme.has_value();
    if (on_nvme) blocks_->SetNvmeSlot(id, on_nvme->slot);
    if (retain) Ref(s, id);
    committing_keys_ = keys.Block(i, pages.size());
    blocks_->Reside(id, kind, page);
    committing_keys_ = {};
    r.page = page;
    ++(r.duplicate ? counters_.commits_duplicate : counters_.commits_stored);
    blocks_->NoteUse(id, clock_->NowNanos(), /*hit=*/false);
    if (!r.duplicate && !history_.empty() && history_.Forget(KeyOf(blocks_->block(id)))) {
      ++counters_.refetches_after_evict;
    }
    if (mover_ && mover_->write_through() && kind == TierKind::kHost &&
        blocks_->block(id).page[TierIndex(TierKind::kNvme)] == kNoPage) {
      mover_->QueueWriteThrough(id);
    }
    if (kind == TierKind::kHost) QueueLowerPuts(id);
  }
  if (mover_) mover_->PumpWriteThrough();
  PumpLowerPuts();
  // New cached blocks may be what the watermark needed to act on.
  if (IsPoolTier(kind) && tier_enabled(kind)) EnforceWatermark(kind);
  return out;
}

std::vector<StatusCode> CacheManager::Release(SessionCache& s, TierKind kind, std::span<const PageId> pages,
                                              std::span<const BlockHash> hashes) {
  std::vector<StatusCode> out;
  out.reserve(pages.size() + hashes.size());
  const bool usable = s.attached_ && IsPoolTier(kind) && tier_enabled(kind);
  for (PageId page : pages) {
    if (!usable || page >= blocks_->pool(kind)->capacity()) {
      out.push_back(StatusCode::kFailedPrecondition);
      continue;
    }
    auto& leased = s.leased_[TierIndex(kind)];
    if (leased.erase(page) > 0) {
      blocks_->Free(kind, page);
      out.push_back(StatusCode::kOk);
      continue;
    }
    const BlockId id =
        blocks_->state(kind, page) != BlockTable::PageState::kFree ? blocks_->block_on(kind, page) : kNoBlock;
    out.push_back(id != kNoBlock && Unref(s, id) ? StatusCode::kOk : StatusCode::kFailedPrecondition);
  }
  std::vector<BlockId>& ids = scratch_ids_;
  ids.assign(hashes.size(), kNoBlock);
  if (s.attached_) blocks_->FindMany(s.ns_, hashes, ids.data());  // Unref erases no block
  // Deepest first for prefix-ordered policies, as Lookup and Acquire touch: a block whose
  // last reference goes re-enters its lists as the most recent, so the chain's head must
  // come last to end up more recent than its extensions (and the chain stays one run).
  const size_t first = out.size();
  out.resize(first + ids.size(), StatusCode::kFailedPrecondition);
  const bool reverse = s.attached_ && blocks_->PrefixOrdered(s.tenant_);
  for (size_t n = 0; n < ids.size(); ++n) {
    const size_t i = reverse ? ids.size() - 1 - n : n;
    if (ids[i] != kNoBlock && Unref(s, ids[i])) out[first + i] = StatusCode::kOk;
  }
  ServePendingAllocates();
  if (usable) EnforceWatermark(kind);
  return out;
}

void CacheManager::Tick() {
  if (draining_) DrainStep();
  if (mover_) {
    mover_->nvme().Maintain();
    mover_->PumpWriteThrough();
  }
  PumpLowerPuts();  // a lower tier may be back
  ServePendingAllocates();
  ExpireSessions();
  EnforceWatermark(TierKind::kHost);
}

void CacheManager::VerifyNvme(std::function<void(VerifyReport)> done) {
  if (!mover_) {
    VerifyReport r;
    r.status = FailedPrecondition("no NVMe tier is configured");
    done(r);
    return;
  }
  mover_->nvme().Verify(std::move(done));
}

// ---- segments ------------------------------------------------------------------------

std::vector<SegmentGrant> CacheManager::TakeSegmentGrants(SessionCache& s, TierKind kind,
                                                          std::span<const PageId> pages) {
  std::vector<SegmentGrant> out;
  if (!IsPoolTier(kind) || !tier_enabled(kind)) return out;
  const TierPool& pool = *blocks_->pool(kind);
  auto& sent = s.sent_gen_[TierIndex(kind)];
  if (sent.size() < pool.segment_count()) sent.resize(pool.segment_count(), 0);
  uint32_t last = UINT32_MAX;  // a chain's pages run in few segments: each checked once a run
  for (PageId p : pages) {
    if (p == kNoPage) continue;
    const uint32_t seg = pool.SegmentOf(p);
    if (seg == last) continue;
    last = seg;
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
    const TierPool& pool = *blocks_->pool(kind);
    std::vector<PageId> firsts;
    for (uint32_t seg : pool.SegmentsOf(s.tenant_)) firsts.push_back(seg * pool.pages_per_segment());
    auto g = TakeSegmentGrants(s, kind, firsts);
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

// ---- accounting ----------------------------------------------------------------------

TierCounts CacheManager::Counts(TierKind kind) const {
  if (IsPoolTier(kind)) return blocks_->Counts(kind);
  TierCounts c;
  if (kind != TierKind::kNvme || !mover_) return c;  // a lower tier has no pages (LowerTier::Report)
  const NvmeCounts n = mover_->nvme().Counts();
  c.capacity = n.capacity;
  c.free = n.free;
  c.inflight = n.inflight;
  c.cached = n.cached;
  c.quarantined = n.lost;
  c.blocks = n.cached;
  c.page_bytes = mover_->nvme().slot_bytes();
  return c;
}

TierStats CacheManager::Stats(TierKind kind) const {
  TierStats s;
  s.kind = kind;
  s.counts = Counts(kind);
  if (!tier_enabled(kind) || IsLowerTier(kind)) return s;
  if (kind == TierKind::kNvme) {
    const NvmeTier& n = mover_->nvme();
    s.high_watermark = n.high_watermark();
    s.low_watermark = n.low_watermark();
    s.evictions = n.counters().evictions;
    s.backend = n.Describe();
    s.io_backend = n.io_backend();
    s.index_backend = n.index_backend();
    s.ready = n.ready();
    return s;
  }
  const TierOptions& o = options_.tiers[TierIndex(kind)];
  s.high_watermark = o.high_watermark;
  s.low_watermark = o.low_watermark;
  s.evictions = counters_.evictions[TierIndex(kind)];
  const TierPool& pool = *blocks_->pool(kind);
  s.backend = pool.memory().Describe();
  s.segment_renewals = pool.renewals();
  s.segment_renewal_failures = pool.renewal_failures();
  return s;
}

Status CacheManager::CheckInvariants() const {
  if (mover_) {
    const TierCounts c = Counts(TierKind::kNvme);
    if (uint64_t{c.free} + c.inflight + c.cached + c.quarantined != c.capacity) {
      return Internal("nvme: free " + std::to_string(c.free) + " + inflight " + std::to_string(c.inflight) +
                      " + cached " + std::to_string(c.cached) + " + lost " + std::to_string(c.quarantined) +
                      " != capacity " + std::to_string(c.capacity));
    }
  }
  return blocks_->CheckInvariants();
}

}  // namespace kvtier
