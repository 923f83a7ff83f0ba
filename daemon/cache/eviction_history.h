#pragma once
// EvictionHistory: the last kCapacity blocks whose last copy left the cache, by block key,
// with the tier they left and when. kvctl explain reads it ("evicted from host 3 s ago"),
// and a block committed again while it is remembered counts as a refetch after eviction
// (thrash). About 2 MB at capacity.
//
// Owned by the control thread; not thread-safe.

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>

#include "protocol/base/tier.h"

namespace kvtier {

class EvictionHistory {
 public:
  static constexpr size_t kCapacity = 16384;
  struct Record {
    TierKind tier;
    int64_t at_ns;
    uint64_t seq;  // its place in the order
  };

  // `key` left its last tier, `tier`, at `now_ns`; the oldest record goes past kCapacity.
  void Remember(const std::string& key, TierKind tier, int64_t now_ns);
  // The record of `key`, or null.
  const Record* Find(const std::string& key) const;
  // Forgets `key`; true when it was remembered.
  bool Forget(const std::string& key);
  bool empty() const { return records_.empty(); }
  size_t size() const { return records_.size(); }

 private:
  std::unordered_map<std::string, Record> records_;
  // Oldest first. A key evicted again gets a new place; its old place (an older seq) is
  // skipped when it comes up.
  std::deque<std::pair<std::string, uint64_t>> order_;
  uint64_t next_seq_ = 0;
};

}  // namespace kvtier
