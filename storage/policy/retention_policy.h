#pragma once
// RetentionPolicy: classes of retention over any EvictionPolicy, for session hints.
//
// Every block is kOrdinary when it arrives, and the inner policy decides among ordinary
// blocks as it would alone. The owner moves a block to kProtected (a live session will use
// it again: evicted after every ordinary block, the one expected back latest first) or to
// kExpendable (the sessions that used it ended: evicted before every ordinary block, in the
// order they became so) and back. Protection is soft: a protected block is still a victim
// when nothing else is evictable, so hints never block an allocation. The inner policy keeps
// seeing every block's Insert/Touch/Erase; a block outside kOrdinary is marked unevictable
// to it. Per block this keeps two bits; a classed block's order in a map of its own.
//
// Not thread-safe (as EvictionPolicy).

#include <cstdint>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "storage/policy/eviction_policy.h"

namespace kvtier {

enum class Retention : uint8_t { kOrdinary = 0, kExpendable = 1, kProtected = 2 };

class RetentionPolicy final : public EvictionPolicy {
 public:
  explicit RetentionPolicy(std::unique_ptr<EvictionPolicy> inner) : inner_(std::move(inner)) {}

  // `id`'s class; `expected_return` (any clock, larger: later) orders kProtected blocks,
  // and among those expected back together the deepest in its chain goes first (`depth`:
  // a prefix hit ends at the first missing block, so a chain is best cut from its end).
  // Ignored for a block not resident here.
  void SetRetention(BlockId id, Retention r, int64_t expected_return = 0, uint32_t depth = 0);
  Retention retention(BlockId id) const {
    auto it = classed_.find(id);
    return it == classed_.end() ? Retention::kOrdinary : it->second.r;
  }
  size_t protected_blocks() const { return protected_count_; }
  size_t expendable_blocks() const { return expendable_count_; }

  void Insert(BlockId id, BlockId parent, uint64_t key) override;
  void Touch(BlockId id) override { inner_->Touch(id); }
  void TouchMany(std::span<const BlockId> ids) override { inner_->TouchMany(ids); }
  void SetEvictable(BlockId id, bool evictable) override;
  void Erase(BlockId id) override;
  BlockId Victim() override;
  size_t size() const override { return inner_->size(); }
  size_t evictable() const override { return inner_->evictable() + expendable_.size() + protected_.size(); }
  std::string_view name() const override { return inner_->name(); }
  bool touch_prefix_deepest_first() const override { return inner_->touch_prefix_deepest_first(); }

 private:
  // kExpendable: (when it became so, 0); kProtected: (expected return, depth).
  using Order = std::pair<int64_t, uint32_t>;
  struct Classed {
    Retention r;
    Order order;
  };
  std::set<std::pair<Order, BlockId>>& SetOf(Retention r) {
    return r == Retention::kProtected ? protected_ : expendable_;
  }
  bool resident(BlockId id) const { return id < resident_.size() && resident_[id]; }
  bool evictable_id(BlockId id) const { return !unevictable_[id]; }
  void Count(Retention r, int delta);

  std::unique_ptr<EvictionPolicy> inner_;
  std::vector<bool> resident_, unevictable_;      // by id
  std::unordered_map<BlockId, Classed> classed_;  // blocks outside kOrdinary
  // Evictable blocks outside kOrdinary, by order.
  std::set<std::pair<Order, BlockId>> expendable_, protected_;
  size_t protected_count_ = 0, expendable_count_ = 0;  // evictable or not
  int64_t seq_ = 0;
};

}  // namespace kvtier
