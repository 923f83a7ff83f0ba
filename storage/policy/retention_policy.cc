#include "storage/policy/retention_policy.h"

namespace kvtier {

void RetentionPolicy::Count(Retention r, int delta) {
  if (r == Retention::kProtected) protected_count_ += delta;
  if (r == Retention::kExpendable) expendable_count_ += delta;
}

void RetentionPolicy::Insert(BlockId id, BlockId parent, uint64_t key) {
  if (id >= resident_.size()) {
    resident_.resize(id + 1, false);
    unevictable_.resize(id + 1, false);
  }
  resident_[id] = true;
  unevictable_[id] = false;
  inner_->Insert(id, parent, key);
}

void RetentionPolicy::SetRetention(BlockId id, Retention r, int64_t expected_return, uint32_t depth) {
  if (!resident(id)) return;
  auto it = classed_.find(id);
  const Retention was = it == classed_.end() ? Retention::kOrdinary : it->second.r;
  if (was == r && r == Retention::kOrdinary) return;  // unclassed, and stays so: `it` is end()
  const Order order = r == Retention::kProtected ? Order{expected_return, depth}
                      : was == r                 ? it->second.order
                                                 : Order{++seq_, 0};
  if (was == r && it->second.order == order) return;
  const bool evictable = evictable_id(id);
  if (was != Retention::kOrdinary) {
    if (evictable) SetOf(was).erase({it->second.order, id});
    Count(was, -1);
  }
  if (r == Retention::kOrdinary) {
    classed_.erase(it);
    if (evictable) inner_->SetEvictable(id, true);  // the inner policy decides again
    return;
  }
  Count(r, +1);
  classed_[id] = Classed{r, order};
  if (evictable) {
    SetOf(r).insert({order, id});
    if (was == Retention::kOrdinary) inner_->SetEvictable(id, false);  // hidden from it
  }
}

void RetentionPolicy::SetEvictable(BlockId id, bool evictable) {
  if (evictable_id(id) == evictable) return;
  unevictable_[id] = !evictable;
  auto it = classed_.find(id);
  if (it == classed_.end()) {
    inner_->SetEvictable(id, evictable);
  } else if (evictable) {
    SetOf(it->second.r).insert({it->second.order, id});
  } else {
    SetOf(it->second.r).erase({it->second.order, id});
  }
}

void RetentionPolicy::Erase(BlockId id) {
  if (auto it = classed_.find(id); it != classed_.end()) {
    if (evictable_id(id)) SetOf(it->second.r).erase({it->second.order, id});
    Count(it->second.r, -1);
    classed_.erase(it);
  }
  resident_[id] = false;
  unevictable_[id] = false;
  inner_->Erase(id);
}

BlockId RetentionPolicy::Victim() {
  if (!expendable_.empty()) return expendable_.begin()->second;
  if (BlockId v = inner_->Victim(); v != kNoBlock) return v;
  if (!protected_.empty()) return protected_.rbegin()->second;  // expected back latest
  return kNoBlock;
}

}  // namespace kvtier
