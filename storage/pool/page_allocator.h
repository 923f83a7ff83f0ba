#pragma once
// PageAllocator: O(1) allocation of fixed-size pages numbered [0, capacity).
//
// A LIFO free list (recently freed pages are reused first: warm in caches and TLBs) plus
// a free bitmap that turns a double free into an error instead of a corrupted list.
// Thread-compatible: owned by one thread (the daemon's control thread).

#include <cstdint>
#include <optional>
#include <vector>

#include "protocol/base/status.h"
#include "protocol/base/tier.h"  // PageId, kNoPage

namespace kvtier {

class PageAllocator {
 public:
  explicit PageAllocator(uint32_t capacity);
  // Pages with used[page] == true start allocated (a tier rebuilt from its index).
  // REQUIRES: used.size() == capacity.
  PageAllocator(uint32_t capacity, const std::vector<bool>& used);

  // A free page, or nullopt when none is left. O(1).
  std::optional<PageId> Allocate();
  // Returns `page` to the free list. O(1). kInvalidArgument when out of range,
  // kFailedPrecondition when it is already free.
  Status Free(PageId page);

  bool IsFree(PageId page) const { return page < capacity_ && free_bit_[page]; }
  uint32_t capacity() const { return capacity_; }
  uint32_t free_count() const { return static_cast<uint32_t>(free_list_.size()); }
  uint32_t used_count() const { return capacity_ - free_count(); }

 private:
  uint32_t capacity_;
  std::vector<PageId> free_list_;
  std::vector<bool> free_bit_;
};

}  // namespace kvtier
