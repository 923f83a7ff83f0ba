#include "storage/policy/retention_policy.h"

namespace kvtier {

void RetentionPolicy::Insert(BlockId id, BlockId parent, uint64_t key) {
  if (id >= state_.size()) state_.resize(id + 1);
  state_[id] = State{};
  inner_->Insert(id, parent, key);
}

void RetentionPolicy::Leave(BlockId id) {
  State& s = state_[id];
  if (s.r == Retention::kOrdinary) return;
  if (s.evictable) SetOf(s.r).erase({s.order, id});
  --(s.r == Retention::kProtected ? protected_count_ : expendable_count_);
}

void RetentionPolicy::SetRetention(BlockId id, Retention r, int64_t expected_return, uint32_t depth) {
  State& s = state_[id];
  const Order order = r == Retention::kProtected ? Order{expected_return, depth}
                      : s.r == r                 ? s.order
                                                 : Order{++seq_, 0};
  if (s.r == r && s.order == order) return;
  const Retention was = s.r;
  Leave(id);
  s.r = r;
  s.order = order;
  if (r != Retention::kOrdinary) {
    ++(r == Retention::kProtected ? protected_count_ : expendable_count_);
    if (s.evictable) SetOf(r).insert({order, id});
  }
  // The inner policy decides among ordinary blocks only.
  if (was == Retention::kOrdinary && r != Retention::kOrdinary) {
    if (s.evictable) inner_->SetEvictable(id, false);
  } else if (was != Retention::kOrdinary && r == Retention::kOrdinary) {
    if (s.evictable) inner_->SetEvictable(id, true);
  }
}

void RetentionPolicy::SetEvictable(BlockId id, bool evictable) {
  State& s = state_[id];
  if (s.evictable == evictable) return;
  s.evictable = evictable;
  if (s.r == Retention::kOrdinary) {
    inner_->SetEvictable(id, evictable);
  } else if (evictable) {
    SetOf(s.r).insert({s.order, id});
  } else {
    SetOf(s.r).erase({s.order, id});
  }
}

void RetentionPolicy::Erase(BlockId id) {
  Leave(id);
  state_[id] = State{};
  inner_->Erase(id);
}

BlockId RetentionPolicy::Victim() {
  if (!expendable_.empty()) return expendable_.begin()->second;
  if (BlockId v = inner_->Victim(); v != kNoBlock) return v;
  if (!protected_.empty()) return protected_.rbegin()->second;  // expected back latest
  return kNoBlock;
}

}  // namespace kvtier
