#pragma once
// LruPolicy: least recently used evictable block first. The baseline (what vLLM's
// prefix cache does): O(1) per operation, an intrusive list over arrays indexed by block
// id. In prefix order ("prefix-lru") a new block enters right behind its parent instead of
// at the front, and matched prefixes are touched deepest first, so a prefix is always
// more recent than its extensions and outlives them: a prefix match stops at the first
// missing block, so an evicted parent would strand every child. Not thread-safe.

#include <vector>

#include "storage/policy/eviction_policy.h"

namespace kvtier {

class LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(size_t expected_ids = 0, bool prefix_order = false);
  void Insert(BlockId id, BlockId parent, uint64_t key) override;
  void Touch(BlockId id) override;
  void TouchMany(std::span<const BlockId> ids) override;
  void SetEvictable(BlockId id, bool evictable) override;
  void Erase(BlockId id) override;
  BlockId Victim() override;
  size_t size() const override { return size_; }
  size_t evictable() const override { return linked_; }
  std::string_view name() const override { return prefix_order_ ? "prefix-lru" : "lru"; }
  bool touch_prefix_deepest_first() const override { return prefix_order_; }

 private:
  // 8 bytes a block: the list links; membership and pinning are bit vectors.
  struct Node {
    BlockId prev = kNoBlock;
    BlockId next = kNoBlock;
  };
  void Grow(BlockId id);
  void Link(BlockId id);                    // at the MRU end
  void LinkBehind(BlockId at, BlockId id);  // right after `at`, towards the LRU end
  void Unlink(BlockId id);

  std::vector<Node> nodes_;
  std::vector<bool> present_;
  std::vector<bool> evictable_;
  BlockId head_ = kNoBlock;  // most recently used
  BlockId tail_ = kNoBlock;  // least recently used
  size_t size_ = 0;
  size_t linked_ = 0;
  bool prefix_order_ = false;
};

}  // namespace kvtier
