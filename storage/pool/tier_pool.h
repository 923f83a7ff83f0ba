#pragma once
// TierPool: the pages of one tier, grouped into segments that each belong to at most one
// owner (tenant) at a time.
//
// Pages are numbered across the pool: page = segment * pages_per_segment + slot. An owner
// allocates from its own segments first, then takes back a segment it emptied earlier,
// then claims a never-used or renewed one, and last claims a segment another owner
// emptied, whose memory is renewed first (SegmentMemory::Renew) so the new owner never
// maps the old owner's memory. When the last page of a segment is freed, the segment
// stops belonging to its owner. Every step is O(1).
//
// Owned by the control thread; not thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "protocol/base/status.h"
#include "storage/pool/page_allocator.h"
#include "storage/pool/segment_memory.h"

namespace kvtier {

using OwnerId = uint32_t;
inline constexpr OwnerId kNoOwner = 0xffffffffu;

class TierPool {
 public:
  // kInvalidArgument unless page_bytes divides the segment size.
  static Result<std::unique_ptr<TierPool>> Open(std::unique_ptr<SegmentMemory> memory, uint64_t page_bytes);

  // A free page for `owner`, or nullopt when every segment is full or owned by others.
  // An error only when renewing a segment's memory fails.
  Result<std::optional<PageId>> Allocate(OwnerId owner);
  // REQUIRES: page is allocated.
  void Free(PageId page);

  // Pages `owner` could get right now without anything being evicted.
  uint32_t AvailableTo(OwnerId owner) const;
  // Pages `owner` holds (allocated and not freed).
  uint32_t UsedBy(OwnerId owner) const { return owner < owners_.size() ? owners_[owner].used : 0; }

  uint32_t SegmentOf(PageId page) const { return page / pages_per_segment_; }
  uint64_t OffsetInSegment(PageId page) const { return static_cast<uint64_t>(page % pages_per_segment_) * page_bytes_; }
  OwnerId Owner(uint32_t segment) const { return segments_[segment].owner; }
  // Bumped each time the segment's memory is renewed; starts at 1.
  uint32_t Generation(uint32_t segment) const { return segments_[segment].generation; }
  // Segments `owner` holds now.
  std::vector<uint32_t> SegmentsOf(OwnerId owner) const;
  // The daemon's address of `page`, or nullptr when the memory is not host-addressable.
  uint8_t* PageAddress(PageId page) const;
  bool IsFree(PageId page) const;

  // Called after a segment's memory was renewed (e.g. to re-register I/O buffers).
  void SetRenewListener(std::function<void(uint32_t segment)> listener) { renew_listener_ = std::move(listener); }

  uint64_t page_bytes() const { return page_bytes_; }
  uint32_t pages_per_segment() const { return pages_per_segment_; }
  uint32_t segment_count() const { return static_cast<uint32_t>(segments_.size()); }
  uint32_t capacity() const { return segment_count() * pages_per_segment_; }
  uint32_t free_count() const { return free_pages_; }
  const SegmentMemory& memory() const { return *memory_; }
  SegmentMemory& memory() { return *memory_; }

 private:
  // A set of segment numbers with O(1) insert, erase and pick.
  class SegmentSet {
   public:
    void Insert(uint32_t s);
    void Erase(uint32_t s);
    bool Contains(uint32_t s) const { return s < pos_.size() && pos_[s] != kAbsent; }
    bool empty() const { return items_.empty(); }
    uint32_t Any() const { return items_.back(); }
    const std::vector<uint32_t>& items() const { return items_; }

   private:
    static constexpr uint32_t kAbsent = 0xffffffffu;
    std::vector<uint32_t> items_;
    std::vector<uint32_t> pos_;
  };
  struct Segment {
    explicit Segment(uint32_t pages) : pages(pages) {}
    PageAllocator pages;
    OwnerId owner = kNoOwner;
    OwnerId last_owner = kNoOwner;  // who emptied it, while it has not been renewed
    uint32_t generation = 1;
  };
  struct OwnerSegments {
    SegmentSet nonfull;   // owned, with free pages
    SegmentSet owned;     // every segment owned
    SegmentSet released;  // emptied by this owner, not renewed yet
    uint32_t used = 0;    // pages allocated
  };

  TierPool(std::unique_ptr<SegmentMemory> memory, uint64_t page_bytes);
  OwnerSegments& For(OwnerId owner);
  Result<bool> Claim(OwnerId owner, uint32_t segment, bool renew);

  std::unique_ptr<SegmentMemory> memory_;
  uint64_t page_bytes_;
  uint32_t pages_per_segment_;
  std::vector<Segment> segments_;
  std::vector<OwnerSegments> owners_;  // indexed by OwnerId
  SegmentSet clean_;                   // unowned and never used or renewed
  SegmentSet released_any_;            // unowned, still holding a last owner's memory
  uint32_t free_pages_ = 0;
  std::function<void(uint32_t)> renew_listener_;
};

}  // namespace kvtier
