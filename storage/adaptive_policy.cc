#include "storage/adaptive_policy.h"

#include <algorithm>

namespace kvtier {
namespace {
constexpr uint64_t kSampleMask = 7;  // 1 key in 8
constexpr double kDecay = 0.999;     // per sampled access: a memory of about 1000 samples
// Sampling by a mix of the key, not its low bits: keys may be sequential.
bool Sampled(uint64_t key) { return ((key * 0x9e3779b97f4a7c15ull) >> 61) == 0 || (kSampleMask == 0); }
}  // namespace

bool AdaptivePolicy::Shadow::Access(uint64_t key) {
  auto it = ids_.find(key);
  if (it != ids_.end()) {
    policy_->Touch(it->second);
    return true;
  }
  if (ids_.size() >= capacity_) {
    const BlockId v = policy_->Victim();
    policy_->Erase(v);
    ids_.erase(keys_[v]);
    free_.push_back(v);
  }
  BlockId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<BlockId>(keys_.size());
    keys_.push_back(0);
  }
  keys_[id] = key;
  ids_[key] = id;
  policy_->Insert(id, kNoBlock, key);
  return false;
}

AdaptivePolicy::AdaptivePolicy(size_t capacity)
    : lru_(capacity, true),
      arc_(capacity, true),
      key_of_(capacity, 0),
      lru_shadow_(std::make_unique<LruPolicy>(capacity / 8 + 1, false), std::max<size_t>(capacity / 8, 8)),
      arc_shadow_(std::make_unique<ArcPolicy>(std::max<size_t>(capacity / 8, 8), false), std::max<size_t>(capacity / 8, 8)) {}

void AdaptivePolicy::Sample(uint64_t key) {
  if (!Sampled(key)) return;
  lru_score_ = lru_score_ * kDecay + (lru_shadow_.Access(key) ? 1 : 0);
  arc_score_ = arc_score_ * kDecay + (arc_shadow_.Access(key) ? 1 : 0);
  // A little hysteresis, so ties do not flip the leader back and forth.
  if (arc_leads_ ? arc_score_ < 0.97 * lru_score_ : arc_score_ > 1.03 * lru_score_) arc_leads_ = !arc_leads_;
}

void AdaptivePolicy::Insert(BlockId id, BlockId parent, uint64_t key) {
  if (id >= key_of_.size()) key_of_.resize(static_cast<size_t>(id) + 1 + key_of_.size() / 2);
  key_of_[id] = key;
  lru_.Insert(id, parent, key);
  arc_.Insert(id, parent, key);
  Sample(key);
}

void AdaptivePolicy::Touch(BlockId id) {
  lru_.Touch(id);
  arc_.Touch(id);
  if (id < key_of_.size()) Sample(key_of_[id]);
}

void AdaptivePolicy::SetEvictable(BlockId id, bool evictable) {
  lru_.SetEvictable(id, evictable);
  arc_.SetEvictable(id, evictable);
}

void AdaptivePolicy::Erase(BlockId id) {
  lru_.Erase(id);
  arc_.Erase(id);
}

BlockId AdaptivePolicy::Victim() { return arc_leads_ ? arc_.Victim() : lru_.Victim(); }

}  // namespace kvtier
