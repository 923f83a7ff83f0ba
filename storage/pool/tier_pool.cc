#include "storage/pool/tier_pool.h"

#include "protocol/base/logging.h"

namespace kvtier {

void TierPool::SegmentSet::Insert(uint32_t s) {
  if (Contains(s)) return;
  if (pos_.size() <= s) pos_.resize(s + 1, kAbsent);
  pos_[s] = static_cast<uint32_t>(items_.size());
  items_.push_back(s);
}

void TierPool::SegmentSet::Erase(uint32_t s) {
  if (!Contains(s)) return;
  const uint32_t i = pos_[s];
  const uint32_t last = items_.back();
  items_[i] = last;
  pos_[last] = i;
  items_.pop_back();
  pos_[s] = kAbsent;
}

Result<std::unique_ptr<TierPool>> TierPool::Open(std::unique_ptr<SegmentMemory> memory, uint64_t page_bytes) {
  if (page_bytes == 0 || memory->segment_bytes() % page_bytes != 0) {
    return InvalidArgument("page_bytes must divide segment_bytes");
  }
  if (memory->segment_bytes() / page_bytes > (1u << 24)) {
    return InvalidArgument("too many pages per segment");
  }
  return std::unique_ptr<TierPool>(new TierPool(std::move(memory), page_bytes));
}

TierPool::TierPool(std::unique_ptr<SegmentMemory> memory, uint64_t page_bytes)
    : memory_(std::move(memory)),
      page_bytes_(page_bytes),
      pages_per_segment_(static_cast<uint32_t>(memory_->segment_bytes() / page_bytes)) {
  segments_.reserve(memory_->segment_count());
  for (uint32_t s = 0; s < memory_->segment_count(); ++s) {
    segments_.emplace_back(pages_per_segment_);
    clean_.Insert(s);
  }
  free_pages_ = capacity();
}

TierPool::OwnerSegments& TierPool::For(OwnerId owner) {
  if (owners_.size() <= owner) owners_.resize(owner + 1);
  return owners_[owner];
}

void TierPool::SetRenewalRunner(Runner run, std::function<void()> renewed) {
  if (!memory_->renews_off_thread()) return;
  runner_ = std::move(run);
  renewed_ = std::move(renewed);
}

void TierPool::StartRenewal(uint32_t s) {
  Segment& seg = segments_[s];
  if (seg.last_owner != kNoOwner) For(seg.last_owner).released.Erase(s);
  released_any_.Erase(s);
  renewing_.Insert(s);
  runner_([memory = memory_.get(), s] { return memory->Renew(s); }, [this, s](Status st) { Renewed(s, st); });
}

void TierPool::Renewed(uint32_t s, const Status& st) {
  Segment& seg = segments_[s];
  renewing_.Erase(s);
  if (st.ok()) {
    ++renewals_;
    last_renewal_failed_ = false;
    ++seg.generation;
    seg.last_owner = kNoOwner;
    clean_.Insert(s);
    if (renew_listener_) renew_listener_(s);
  } else {
    // Still the old memory: another owner may not have it, its last owner may.
    ++renewal_failures_;
    last_renewal_failed_ = true;  // the next claim renews inline and reports its error
    KVTIER_LOG(WARNING) << "renewing segment " << s << ": " << st.ToString();
    if (seg.last_owner != kNoOwner) For(seg.last_owner).released.Insert(s);
    released_any_.Insert(s);
  }
  if (renewed_) renewed_();
}

Result<bool> TierPool::Claim(OwnerId owner, uint32_t s, bool renew) {
  Segment& seg = segments_[s];
  if (renew) {
    Status st = memory_->Renew(s);
    if (!st.ok()) {
      ++renewal_failures_;
      return st;
    }
    ++renewals_;
    last_renewal_failed_ = false;
    ++seg.generation;
    if (renew_listener_) renew_listener_(s);
  }
  if (seg.last_owner != kNoOwner) For(seg.last_owner).released.Erase(s);
  clean_.Erase(s);
  released_any_.Erase(s);
  seg.owner = owner;
  seg.last_owner = kNoOwner;
  OwnerSegments& o = For(owner);
  o.owned.Insert(s);
  o.nonfull.Insert(s);
  return true;
}

Result<std::optional<PageId>> TierPool::Allocate(OwnerId owner) {
  OwnerSegments& o = For(owner);
  if (o.nonfull.empty()) {
    if (!o.released.empty()) {
      KVTIER_RETURN_IF_ERROR(Claim(owner, o.released.Any(), /*renew=*/false).status());
    } else if (!clean_.empty()) {
      KVTIER_RETURN_IF_ERROR(Claim(owner, clean_.Any(), /*renew=*/false).status());
    } else if (runner_ && !last_renewal_failed_ && (!renewing_.empty() || !released_any_.empty())) {
      // One renewal at a time: a segment is many pages, and each takes a thread a while.
      if (renewing_.empty()) StartRenewal(released_any_.Any());
      return std::optional<PageId>();
    } else if (!released_any_.empty()) {
      KVTIER_RETURN_IF_ERROR(Claim(owner, released_any_.Any(), /*renew=*/true).status());
    } else {
      return std::optional<PageId>();
    }
  }
  OwnerSegments& oo = For(owner);  // For() may have grown owners_
  const uint32_t s = oo.nonfull.Any();
  Segment& seg = segments_[s];
  std::optional<PageId> slot = seg.pages.Allocate();
  KVTIER_CHECK(slot.has_value()) << "segment " << s << " in nonfull set is full";
  if (seg.pages.free_count() == 0) oo.nonfull.Erase(s);
  ++oo.used;
  --free_pages_;
  return std::optional<PageId>(s * pages_per_segment_ + *slot);
}

void TierPool::Free(PageId page) {
  const uint32_t s = SegmentOf(page);
  KVTIER_CHECK(s < segments_.size()) << "page " << page;
  Segment& seg = segments_[s];
  Status st = seg.pages.Free(page % pages_per_segment_);
  KVTIER_CHECK(st.ok()) << st.ToString();
  ++free_pages_;
  OwnerSegments& o = For(seg.owner);
  --o.used;
  o.nonfull.Insert(s);
  if (seg.pages.free_count() == pages_per_segment_) {
    // Empty: it no longer belongs to its owner, who may take it back cheaply.
    o.nonfull.Erase(s);
    o.owned.Erase(s);
    o.released.Insert(s);
    released_any_.Insert(s);
    seg.last_owner = seg.owner;
    seg.owner = kNoOwner;
  }
}

void TierPool::Retire(uint32_t s) {
  Segment& seg = segments_[s];
  KVTIER_CHECK(seg.owner == kNoOwner && UsedIn(s) == 0) << "retiring segment " << s << " in use";
  if (seg.last_owner != kNoOwner) For(seg.last_owner).released.Erase(s);
  seg.last_owner = kNoOwner;
  if (!renewing_.Contains(s)) released_any_.Insert(s);
}

uint32_t TierPool::AvailableTo(OwnerId owner) const {
  uint32_t n = static_cast<uint32_t>(clean_.items().size() + released_any_.items().size() + renewing_.items().size()) *
               pages_per_segment_;
  if (owner < owners_.size()) {
    for (uint32_t s : owners_[owner].nonfull.items()) n += segments_[s].pages.free_count();
  }
  return n;
}

std::vector<uint32_t> TierPool::SegmentsOf(OwnerId owner) const {
  if (owner >= owners_.size()) return {};
  return owners_[owner].owned.items();
}

uint8_t* TierPool::PageAddress(PageId page) const {
  uint8_t* base = memory_->HostAddress(SegmentOf(page));
  return base ? base + OffsetInSegment(page) : nullptr;
}

bool TierPool::IsFree(PageId page) const {
  const uint32_t s = SegmentOf(page);
  return s < segments_.size() && segments_[s].pages.IsFree(page % pages_per_segment_);
}

}  // namespace kvtier
