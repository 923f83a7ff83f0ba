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
// Renewal frees a segment's pages and makes as many new, zeroed ones (a 256 MiB segment:
// about 0.2 s of kernel page work on a 2-vCPU VM, more under memory pressure). With a
// renewal runner (SetRenewalRunner) and memory that renews off its thread, it happens on
// the runner's thread: the Allocate that needs it gets no page (renewing() says one is
// coming), the segment is no one's meanwhile, and once renewed it is a clean segment that
// any owner claims; the runner's `renewed` callback says when to ask again. Without one,
// Allocate renews inline.
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

  // Empty segment `s` may still be written by a process that has no right to it any more
  // (pages taken back from a quarantine): no owner, its last one included, gets it again
  // before its memory is renewed. REQUIRES: `s` is empty.
  void Retire(uint32_t s);
  // A free page for `owner`, or nullopt when every segment is full or owned by others, or
  // when the segment it needs is being renewed (renewing()). An error only when renewing a
  // segment's memory inline fails.
  Result<std::optional<PageId>> Allocate(OwnerId owner);
  // REQUIRES: page is allocated.
  void Free(PageId page);

  // Pages `owner` could get without anything being evicted: now, or once the renewals in
  // flight end.
  uint32_t AvailableTo(OwnerId owner) const;
  // Pages `owner` holds (allocated and not freed).
  uint32_t UsedBy(OwnerId owner) const { return owner < owners_.size() ? owners_[owner].used : 0; }
  // Pages of segment `s` allocated.
  uint32_t UsedIn(uint32_t s) const { return pages_per_segment_ - segments_[s].pages.free_count(); }

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

  // Runs `work` on another thread, then `done` with its status on the owner's thread (never
  // inside the call): BlockWorkers::Run. It must not run a `done` after this pool is gone.
  using Runner = std::function<void(std::function<Status()> work, std::function<void(Status)> done)>;
  // Renews segments through `run` from now on, when the memory renews off its thread
  // (SegmentMemory::renews_off_thread); `renewed` runs on the owner's thread after each
  // renewal ends, well or not.
  void SetRenewalRunner(Runner run, std::function<void()> renewed);
  // Whether a renewal is in flight: an Allocate that got no page may get one after it.
  bool renewing() const { return !renewing_.empty(); }
  // Segments renewed, and renewals that failed (the segment stays as it was, unclaimed).
  uint64_t renewals() const { return renewals_; }
  uint64_t renewal_failures() const { return renewal_failures_; }

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
  // Takes released segment `s` from its last owner and renews it through runner_.
  void StartRenewal(uint32_t s);
  void Renewed(uint32_t s, const Status& st);

  std::unique_ptr<SegmentMemory> memory_;
  uint64_t page_bytes_;
  uint32_t pages_per_segment_;
  std::vector<Segment> segments_;
  std::vector<OwnerSegments> owners_;  // indexed by OwnerId
  SegmentSet clean_;                   // unowned and never used or renewed
  SegmentSet released_any_;            // unowned, still holding a last owner's memory
  SegmentSet renewing_;                // unowned, its memory being renewed on runner_'s thread
  uint32_t free_pages_ = 0;
  std::function<void(uint32_t)> renew_listener_;
  Runner runner_;  // null: renew inline
  std::function<void()> renewed_;
  uint64_t renewals_ = 0;
  uint64_t renewal_failures_ = 0;
  bool last_renewal_failed_ = false;
};

}  // namespace kvtier
