#include "daemon/cache/block_table.h"

#include <algorithm>

#include "protocol/base/logging.h"
#include "protocol/base/units.h"
#include "storage/pool/device_segment_memory.h"

namespace kvtier {

Result<std::unique_ptr<BlockTable>> BlockTable::Open(const std::array<TierOptions, kTierCount>& tiers,
                                                     DeviceBackend* device, int gpu_device, NamespaceTable* namespaces,
                                                     bool host_demotes) {
  std::unique_ptr<BlockTable> bt(new BlockTable(namespaces));
  for (TierKind kind : kAllTiers) {
    const TierOptions& o = tiers[TierIndex(kind)];
    Tier& tier = bt->T(kind);
    tier.kind = kind;
    if (!o.enabled) continue;
    if (!IsPoolTier(kind)) return InvalidArgument("only the GPU and host tiers have pools here");
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
      mo.populate = !o.overcommit;
      KVTIER_ASSIGN_OR_RETURN(memory, HostSegmentMemory::Open(mo));
    } else {
      if (device == nullptr) return InvalidArgument("the GPU tier needs a device backend");
      const TierOptions& host = tiers[TierIndex(TierKind::kHost)];
      if (host.enabled && host.page_bytes != o.page_bytes) {
        return InvalidArgument("GPU pages must be the size of host pages (a demotion copies one into the other)");
      }
      KVTIER_ASSIGN_OR_RETURN(memory, DeviceSegmentMemory::Open(device, gpu_device, o.segment_bytes, segments));
    }
    KVTIER_LOG(INFO) << TierKindName(kind) << " tier: " << FormatBytes(o.capacity_bytes) << " in " << memory->Describe()
                     << ", pages of " << FormatBytes(o.page_bytes);
    KVTIER_ASSIGN_OR_RETURN(tier.pool, TierPool::Open(std::move(memory), o.page_bytes));
    tier.policy_name = o.policy;
    tier.victims_demoted = kind == TierKind::kHost ? host_demotes : tiers[TierIndex(TierKind::kHost)].enabled;
    tier.state.assign(tier.pool->capacity(), PageState::kFree);
    tier.quarantined_in.assign(tier.pool->segment_count(), 0);
    tier.page_block.assign(tier.pool->capacity(), kNoBlock);
  }
  return bt;
}

// ---- page states ---------------------------------------------------------------------

void BlockTable::SetState(Tier& t, PageId p, PageState to) {
  auto counter = [&t](PageState s) -> uint32_t* {
    switch (s) {
      case PageState::kLeased:
        return &t.leased;
      case PageState::kInFlight:
        return &t.inflight;
      case PageState::kQuarantined:
        return &t.quarantined;
      default:
        return nullptr;  // free: the pool counts; block: Count() does
    }
  };
  if (uint32_t* c = counter(t.state[p])) --*c;
  const uint32_t seg = t.pool->SegmentOf(p);
  if (t.state[p] == PageState::kQuarantined) --t.quarantined_in[seg];
  if (to == PageState::kQuarantined) ++t.quarantined_in[seg];
  t.state[p] = to;
  if (uint32_t* c = counter(to)) ++*c;
}

void BlockTable::PoolFree(Tier& t, PageId p) {
  t.pool->Free(p);
  const uint32_t seg = t.pool->SegmentOf(p);
  if (QuarantineOnly(t, seg)) t.quarantine_only.push_back(seg);
}

std::optional<PageId> BlockTable::Allocate(TierKind kind, TenantId tenant, PageState as) {
  Tier& t = T(kind);
  auto got = t.pool->Allocate(tenant);
  if (!got.ok() || !got->has_value()) return std::nullopt;
  ++t.taken;
  SetState(t, **got, as);
  return **got;
}

std::optional<PageId> BlockTable::Lease(TierKind kind, TenantId tenant) {
  return Allocate(kind, tenant, PageState::kLeased);
}

std::optional<PageId> BlockTable::Take(TierKind kind, TenantId tenant) {
  return Allocate(kind, tenant, PageState::kInFlight);
}

void BlockTable::Free(TierKind kind, PageId p) {
  Tier& t = T(kind);
  KVTIER_CHECK(t.state[p] == PageState::kLeased || t.state[p] == PageState::kInFlight)
      << "freeing page " << p << " of " << TierKindName(kind) << " in state " << static_cast<int>(t.state[p]);
  SetState(t, p, PageState::kFree);
  t.page_block[p] = kNoBlock;
  PoolFree(t, p);
}

void BlockTable::Quarantine(TierKind kind, PageId p) {
  Tier& t = T(kind);
  KVTIER_CHECK(t.state[p] == PageState::kLeased) << "quarantining page " << p << " that is not leased";
  SetState(t, p, PageState::kQuarantined);
  const uint32_t seg = t.pool->SegmentOf(p);
  if (QuarantineOnly(t, seg)) t.quarantine_only.push_back(seg);
}

void BlockTable::EndQuarantine(TierKind kind, PageId p) {
  Tier& t = T(kind);
  KVTIER_CHECK(t.state[p] == PageState::kQuarantined) << "page " << p << " left quarantine twice";
  SetState(t, p, PageState::kFree);
  PoolFree(t, p);
}

std::vector<uint32_t> BlockTable::TakeQuarantineOnlySegments(TierKind kind) {
  Tier& t = T(kind);
  std::vector<uint32_t> out;
  if (t.quarantine_only.empty()) return out;
  std::sort(t.quarantine_only.begin(), t.quarantine_only.end());
  t.quarantine_only.erase(std::unique(t.quarantine_only.begin(), t.quarantine_only.end()), t.quarantine_only.end());
  for (uint32_t seg : t.quarantine_only) {
    if (QuarantineOnly(t, seg)) out.push_back(seg);  // still: nothing was allocated there since
  }
  t.quarantine_only.clear();
  return out;
}

std::vector<PageId> BlockTable::ReclaimQuarantineOnlySegment(TierKind kind, uint32_t segment) {
  Tier& t = T(kind);
  KVTIER_CHECK(QuarantineOnly(t, segment)) << "segment " << segment << " holds more than quarantined pages";
  std::vector<PageId> pages;
  const PageId first = segment * t.pool->pages_per_segment();
  for (PageId p = first; p < first + t.pool->pages_per_segment(); ++p) {
    if (t.state[p] != PageState::kQuarantined) continue;
    SetState(t, p, PageState::kFree);
    t.pool->Free(p);
    pages.push_back(p);
  }
  t.pool->Retire(segment);
  return pages;
}

// ---- counting ------------------------------------------------------------------------

uint32_t& BlockTable::CachedOf(Tier& t, TenantId tenant) {
  if (t.cached_by_tenant.size() <= tenant) t.cached_by_tenant.resize(tenant + 1, 0);
  return t.cached_by_tenant[tenant];
}

uint32_t BlockTable::cached_of(TierKind kind, TenantId tenant) const {
  const Tier& t = T(kind);
  return tenant < t.cached_by_tenant.size() ? t.cached_by_tenant[tenant] : 0;
}

void BlockTable::Count(Tier& t, const Block& b, int sign) {
  if (b.refs == 0) {
    t.cached += sign;
    CachedOf(t, b.tenant) += sign;
  } else {
    t.referenced += sign;
  }
}

void BlockTable::Enter(Tier& t, BlockId id) {
  const Block& b = blocks_[id];
  Count(t, b, +1);
  BlockId parent = kNoBlock;
  if (!b.parent.empty()) {
    const BlockId p = Find(b.ns, b.parent);
    // A block named as its own parent (a client's mistake, found by fuzzing) has none.
    if (p != kNoBlock && p != id && blocks_[p].page[TierIndex(t.kind)] != kNoPage) parent = p;
  }
  RetentionPolicy& policy = Policy(t.kind, b.tenant);
  policy.Insert(id, parent, HashBytes(b.hash.bytes(), b.ns));
  if (b.refs > 0) policy.SetEvictable(id, false);
  if (retention_source_) {
    const RetentionClass c = retention_source_(b.tenant, id);
    if (c.r != Retention::kOrdinary) policy.SetRetention(id, c.r, c.expected_return, c.depth);
  }
}

void BlockTable::Leave(Tier& t, BlockId id) {
  Policy(t.kind, blocks_[id].tenant).Erase(id);
  Count(t, blocks_[id], -1);
}

void BlockTable::SetRefs(BlockId id, uint32_t refs) {
  Block& b = blocks_[id];
  const bool pinned = refs > 0;
  if ((b.refs > 0) == pinned) {
    b.refs = refs;
    return;
  }
  // The block turns from cached to referenced (or back) in every tier where it is a
  // resident block page; a page in flight is counted when its move ends.
  std::array<Tier*, 2> resident{};
  size_t n = 0;
  for (TierKind kind : {TierKind::kGpu, TierKind::kHost}) {
    const PageId p = b.page[TierIndex(kind)];
    if (p != kNoPage && T(kind).state[p] == PageState::kBlock) resident[n++] = &T(kind);
  }
  for (size_t i = 0; i < n; ++i) Count(*resident[i], b, -1);
  b.refs = refs;
  for (size_t i = 0; i < n; ++i) {
    Count(*resident[i], b, +1);
    Policy(resident[i]->kind, b.tenant).SetEvictable(id, !pinned);
  }
}

void BlockTable::Ref(BlockId id) { SetRefs(id, blocks_[id].refs + 1); }

void BlockTable::Unref(BlockId id) {
  KVTIER_CHECK(blocks_[id].refs > 0) << "reference count underflow";
  SetRefs(id, blocks_[id].refs - 1);
}

// ---- blocks --------------------------------------------------------------------------

BlockId BlockTable::Find(NamespaceId ns, const BlockHash& hash) const {
  const uint32_t id = index_.Find(KeyHash(ns, hash), [&](uint32_t i) { return Holds(i, ns, hash); });
  return id == FlatIdIndex::kNone ? kNoBlock : id;
}

size_t BlockTable::FindGroups(NamespaceId ns, std::span<const BlockHash> hashes, BlockId* out,
                              bool stop_at_miss) const {
  // A chain stored by one Commit usually got consecutive ids (fresh ones, or ones freed by
  // evicting a chain deepest first and handed out again head first), so the id after the
  // previous entry's is tried first: one compare with a record the previous one brought
  // near, instead of hashing the key and probing the index. The head, and whatever the
  // guess misses, are hashed (in groups, their index slots loading while the group's keys
  // are hashed). A guessed id counts only if its block is live and holds the same
  // namespace and hash, as an index hit does.
  constexpr size_t kGroup = 16;
  uint64_t h[kGroup];
  size_t probe[kGroup];
  if (hashes.empty()) return 0;
  BlockId prev = out[0] = Find(ns, hashes[0]);  // the head, to guess its successors from
  if (prev == kNoBlock && stop_at_miss) return 0;
  for (size_t at = 1; at < hashes.size(); at += kGroup) {
    const size_t n = std::min(kGroup, hashes.size() - at);
    size_t probes = 0;
    for (size_t i = 0; i < n; ++i) {
      const BlockHash& hash = hashes[at + i];
      const BlockId next = prev + 1;
      if (prev != kNoBlock && next < blocks_.size() && blocks_[next].live && Holds(next, ns, hash)) {
        out[at + i] = prev = next;
        continue;
      }
      out[at + i] = prev = kNoBlock;
      h[probes] = KeyHash(ns, hash);
      index_.Prefetch(h[probes]);
      probe[probes++] = i;
    }
    for (size_t k = 0; k < probes; ++k) {
      const BlockHash& hash = hashes[at + probe[k]];
      const uint32_t id = index_.Find(h[k], [&](uint32_t b) { return Holds(b, ns, hash); });
      out[at + probe[k]] = id == FlatIdIndex::kNone ? kNoBlock : id;
    }
    if (stop_at_miss) {
      for (size_t i = 0; i < n; ++i) {
        if (out[at + i] == kNoBlock) return at + i;
      }
    }
    prev = out[at + n - 1];
  }
  return hashes.size();
}

BlockId BlockTable::Create(NamespaceId ns, TenantId tenant, const BlockHash& hash, const BlockHash& parent) {
  BlockId id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
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
  const uint64_t key_hash = KeyHash(ns, hash);
  KVTIER_CHECK(index_.Find(key_hash, [&](uint32_t i) { return Holds(i, ns, hash); }) == FlatIdIndex::kNone)
      << "a second block for one key";
  index_.Insert(key_hash, id);
  namespaces_->AddUser(ns);
  return id;
}

void BlockTable::Erase(BlockId id) {
  Block& b = blocks_[id];
  KVTIER_CHECK(b.refs == 0) << "erasing a referenced block";
  KVTIER_CHECK(index_.Erase(KeyHash(b.ns, b.hash), id)) << "erasing a block the index does not hold";
  namespaces_->Release(b.ns);
  b.live = false;
  free_ids_.push_back(id);
  if (erase_listener_) erase_listener_(b.tenant, id);
}

void BlockTable::Reside(BlockId id, TierKind kind, PageId p) {
  Tier& t = T(kind);
  KVTIER_CHECK(t.state[p] == PageState::kLeased || t.state[p] == PageState::kInFlight)
      << "page " << p << " cannot become a block in state " << static_cast<int>(t.state[p]);
  blocks_[id].page[TierIndex(kind)] = p;
  SetState(t, p, PageState::kBlock);
  t.page_block[p] = id;
  ++t.blocks;
  Enter(t, id);
  if (residency_listener_) residency_listener_(blocks_[id], kind, true);
}

void BlockTable::RemoveResidency(BlockId id, TierKind kind) {
  Tier& t = T(kind);
  Block& b = blocks_[id];
  const PageId p = b.page[TierIndex(kind)];
  KVTIER_CHECK(p != kNoPage && t.state[p] == PageState::kBlock) << "block not resident";
  if (residency_listener_) residency_listener_(b, kind, false);
  Leave(t, id);
  --t.blocks;
  b.page[TierIndex(kind)] = kNoPage;
  SetState(t, p, PageState::kFree);
  t.page_block[p] = kNoBlock;
  PoolFree(t, p);
  if (b.page[TierIndex(TierKind::kGpu)] == kNoPage && b.page[TierIndex(TierKind::kHost)] == kNoPage) {
    Erase(id);  // an NVMe copy, if any, lives on in the NVMe index alone
  }
}

void BlockTable::BeginFill(BlockId id, PageId p) {
  Tier& host = T(TierKind::kHost);
  KVTIER_CHECK(host.state[p] == PageState::kInFlight) << "a fill needs a page in flight";
  Block& b = blocks_[id];
  KVTIER_CHECK(b.moving == Block::Moving::kNone) << "a fill of a block that is moving";
  b.page[TierIndex(TierKind::kHost)] = p;
  b.moving = Block::Moving::kPromoting;
  host.page_block[p] = id;
}

void BlockTable::EndFill(BlockId id, bool ok) {
  Block& b = blocks_[id];
  KVTIER_CHECK(b.promoting()) << "a fill ended that did not begin";
  const PageId p = b.page[TierIndex(TierKind::kHost)];
  b.moving = Block::Moving::kNone;
  if (ok) {
    Reside(id, TierKind::kHost, p);
    return;
  }
  b.page[TierIndex(TierKind::kHost)] = kNoPage;
  Free(TierKind::kHost, p);
  b.page[TierIndex(TierKind::kNvme)] = kNoPage;
  Erase(id);
}

void BlockTable::BeginRead(BlockId id, TierKind kind) {
  Tier& t = T(kind);
  Block& b = blocks_[id];
  const PageId p = b.page[TierIndex(kind)];
  uint8_t& readers = b.readers[TierIndex(kind)];
  KVTIER_CHECK(p != kNoPage && !b.promoting() && readers < 255 &&
               t.state[p] == (readers == 0 ? PageState::kBlock : PageState::kInFlight))
      << "read of a block not in " << TierKindName(kind);
  if (readers++ > 0) return;
  Leave(t, id);
  SetState(t, p, PageState::kInFlight);
}

void BlockTable::EndRead(BlockId id, TierKind kind) {
  Tier& t = T(kind);
  Block& b = blocks_[id];
  uint8_t& readers = b.readers[TierIndex(kind)];
  KVTIER_CHECK(readers > 0) << "a read ended that did not begin";
  if (--readers > 0) return;
  SetState(t, b.page[TierIndex(kind)], PageState::kBlock);
  Enter(t, id);
}

void BlockTable::BeginSpill(BlockId id) {
  KVTIER_CHECK(blocks_[id].moving == Block::Moving::kNone) << "a spill of a block that is moving";
  BeginRead(id);
  blocks_[id].moving = Block::Moving::kSpilling;
}

void BlockTable::EndSpill(BlockId id) {
  KVTIER_CHECK(blocks_[id].spilling()) << "a spill ended that did not begin";
  blocks_[id].moving = Block::Moving::kNone;
  EndRead(id);
}

// ---- eviction ------------------------------------------------------------------------

RetentionPolicy& BlockTable::Policy(TierKind kind, TenantId tenant) {
  Tier& t = T(kind);
  if (t.policy.size() <= tenant) t.policy.resize(tenant + 1);
  auto& p = t.policy[tenant];
  if (!p) {
    auto made = MakeEvictionPolicy(t.policy_name, t.pool->capacity(), t.victims_demoted);
    KVTIER_CHECK(made.ok()) << made.status().ToString();  // validated in Open
    p = std::make_unique<RetentionPolicy>(std::move(made).value());
  }
  return *p;
}

void BlockTable::SetRetention(BlockId id, Retention r, int64_t expected_return, uint32_t depth) {
  const Block& b = blocks_[id];
  if (!b.live) return;
  for (TierKind kind : {TierKind::kGpu, TierKind::kHost}) {
    if (enabled(kind) && b.page[TierIndex(kind)] != kNoPage)
      Policy(kind, b.tenant).SetRetention(id, r, expected_return, depth);
  }
}

void BlockTable::Touch(std::span<const Use> used) {
  for (size_t i = 0; i < used.size();) {
    const TierKind tier = used[i].tier;
    const TenantId tenant = blocks_[used[i].id].tenant;
    touch_run_.clear();
    for (; i < used.size() && used[i].tier == tier && blocks_[used[i].id].tenant == tenant; ++i) {
      touch_run_.push_back(used[i].id);
    }
    Policy(tier, tenant).TouchMany(touch_run_);
  }
}

BlockId BlockTable::Victim(TierKind kind, TenantId tenant) {
  Tier& t = T(kind);
  if (tenant >= t.policy.size() || !t.policy[tenant]) return kNoBlock;
  return t.policy[tenant]->Victim();
}

bool BlockTable::PrefixOrdered(TenantId tenant) {
  return enabled(TierKind::kHost) && Policy(TierKind::kHost, tenant).touch_prefix_deepest_first();
}

// ---- accounting ----------------------------------------------------------------------

TierCounts BlockTable::Counts(TierKind kind) const {
  TierCounts c;
  const Tier& t = T(kind);
  if (!t.pool) return c;
  c.capacity = t.pool->capacity();
  c.free = t.pool->free_count();
  c.leased = t.leased;
  c.inflight = t.inflight;
  c.cached = t.cached;
  c.referenced = t.referenced;
  c.quarantined = t.quarantined;
  c.blocks = t.blocks;
  c.page_bytes = t.pool->page_bytes();
  return c;
}

Status BlockTable::CheckInvariants() const {
  for (TierKind kind : {TierKind::kGpu, TierKind::kHost}) {
    if (!enabled(kind)) continue;
    const TierCounts c = Counts(kind);
    const std::string name(TierKindName(kind));
    if (uint64_t{c.free} + c.leased + c.inflight + c.cached + c.referenced + c.quarantined != c.capacity) {
      return Internal(name + ": free " + std::to_string(c.free) + " + leased " + std::to_string(c.leased) +
                      " + inflight " + std::to_string(c.inflight) + " + cached " + std::to_string(c.cached) +
                      " + referenced " + std::to_string(c.referenced) + " + quarantined " +
                      std::to_string(c.quarantined) + " != capacity " + std::to_string(c.capacity));
    }
    const Tier& t = T(kind);
    uint32_t by_state[5] = {0, 0, 0, 0, 0};
    uint32_t cached = 0, referenced = 0;
    for (PageId p = 0; p < c.capacity; ++p) {
      ++by_state[static_cast<int>(t.state[p])];
      if (t.state[p] == PageState::kFree && !t.pool->IsFree(p)) {
        return Internal(name + ": page " + std::to_string(p) + " free in state but not in pool");
      }
      if (t.state[p] == PageState::kBlock || t.state[p] == PageState::kInFlight) {
        const BlockId id = t.page_block[p];
        if (t.state[p] == PageState::kInFlight && id == kNoBlock) continue;  // taken, not yet a block's
        if (id == kNoBlock || !blocks_[id].live || blocks_[id].page[TierIndex(kind)] != p) {
          return Internal(name + ": page " + std::to_string(p) + " maps to a block elsewhere");
        }
        if (t.state[p] == PageState::kBlock) ++(blocks_[id].refs == 0 ? cached : referenced);
      }
    }
    if (by_state[0] != c.free || by_state[1] != c.leased || by_state[2] != c.inflight || by_state[4] != c.quarantined ||
        cached != c.cached || referenced != c.referenced) {
      return Internal(name + ": page states disagree with counters");
    }
  }
  return Status::Ok();
}

}  // namespace kvtier
