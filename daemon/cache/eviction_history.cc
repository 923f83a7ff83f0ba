#include "daemon/cache/eviction_history.h"

namespace kvtier {

void EvictionHistory::Remember(const std::string& key, TierKind tier, int64_t now_ns) {
  const uint64_t seq = next_seq_++;
  records_.insert_or_assign(key, Record{tier, now_ns, seq});
  order_.emplace_back(key, seq);
  while (records_.size() > kCapacity || order_.size() > 2 * kCapacity) {
    auto& [old, old_seq] = order_.front();
    auto it = records_.find(old);
    if (it != records_.end() && it->second.seq == old_seq) records_.erase(it);
    order_.pop_front();
  }
}

const EvictionHistory::Record* EvictionHistory::Find(const std::string& key) const {
  auto it = records_.find(key);
  return it == records_.end() ? nullptr : &it->second;
}

bool EvictionHistory::Forget(const std::string& key) { return records_.erase(key) > 0; }

}  // namespace kvtier
