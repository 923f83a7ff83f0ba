#include "storage/pool/page_allocator.h"

namespace kvtier {

PageAllocator::PageAllocator(uint32_t capacity) : capacity_(capacity), free_bit_(capacity, true) {
  free_list_.reserve(capacity);
  // Pop order 0, 1, 2, ...: the lowest pages are used first.
  for (uint32_t i = capacity; i > 0; --i) free_list_.push_back(i - 1);
}

PageAllocator::PageAllocator(uint32_t capacity, const std::vector<bool>& used)
    : capacity_(capacity), free_bit_(capacity, true) {
  free_list_.reserve(capacity);
  for (uint32_t i = capacity; i > 0; --i) {
    if (used[i - 1]) {
      free_bit_[i - 1] = false;
    } else {
      free_list_.push_back(i - 1);
    }
  }
}

std::optional<PageId> PageAllocator::Allocate() {
  if (free_list_.empty()) return std::nullopt;
  PageId p = free_list_.back();
  free_list_.pop_back();
  free_bit_[p] = false;
  return p;
}

Status PageAllocator::Free(PageId page) {
  if (page >= capacity_) {
    return InvalidArgument("page " + std::to_string(page) + " out of range");
  }
  if (free_bit_[page]) {
    return FailedPrecondition("page " + std::to_string(page) + " is already free");
  }
  free_bit_[page] = true;
  free_list_.push_back(page);
  return Status::Ok();
}

}  // namespace kvtier
