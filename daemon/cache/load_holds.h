#pragma once
// LoadHolds: the NVMe index records a Lookup read, kept briefly for the load that follows
// it. An engine's scheduler looks a chain up; its worker then acquires the prefix found
// (vLLM), or the engine checks pages and then gets them (SGLang): the Acquire takes each
// record from here instead of reading the index again, so a load reads the index once per
// block. Held by (namespace, hash), not by request: vLLM's scheduler looks a chain up in
// chunks, one lookup per KV cache group, and its workers load other chunks of it, so a
// ticket per lookup would have to be mapped onto the loads; a record per block needs no
// mapping and no change to what the connector carries.
//
// A record is taken once, and lapses `hold_ns` after it was put or when `max` newer ones
// came in. It is a hint, never a promise: NvmeTier::Fetch checks that the record's slot
// still holds that block (a block evicted meanwhile is kNotFound, never another block's
// bytes; ChainWalk then looks for it in the lower tiers). Nothing is pinned.
// Control thread only; not thread-safe.

#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>

#include "daemon/cache/cache_types.h"
#include "protocol/base/block_key.h"
#include "storage/nvme/block_index_store.h"

namespace kvtier {

class LoadHolds {
 public:
  // hold_ns 0: nothing is held.
  LoadHolds(int64_t hold_ns, size_t max) : hold_ns_(hold_ns), max_(max) {}

  bool enabled() const { return hold_ns_ > 0; }
  void Put(NamespaceId ns, const BlockHash& hash, const BlockRecord& rec, int64_t now_ns) {
    if (!enabled()) return;
    Expire(now_ns);
    Held& h = held_[Key{ns, hash}];
    h = Held{rec, now_ns + hold_ns_, ++seq_};
    order_.push_back({Key{ns, hash}, h.seq});
    while (held_.size() > max_) Pop();
  }
  // The record held for (ns, hash), taken; nullopt when none is (or it lapsed).
  std::optional<BlockRecord> Take(NamespaceId ns, const BlockHash& hash, int64_t now_ns) {
    if (held_.empty()) return std::nullopt;
    Expire(now_ns);
    auto it = held_.find(Key{ns, hash});
    if (it == held_.end()) return std::nullopt;
    BlockRecord rec = std::move(it->second.rec);
    held_.erase(it);
    return rec;
  }
  size_t size() const { return held_.size(); }

 private:
  struct Key {
    NamespaceId ns;
    BlockHash hash;
    friend bool operator==(const Key&, const Key&) = default;
  };
  struct KeyHasher {
    size_t operator()(const Key& k) const { return BlockHashHasher()(k.hash) ^ (static_cast<size_t>(k.ns) << 1); }
  };
  struct Held {
    BlockRecord rec;
    int64_t expires_ns = 0;
    uint64_t seq = 0;  // which put of the key order_'s entry stands for
  };
  // Drops the oldest put (a no-op for a key taken or put again since).
  void Pop() {
    auto it = held_.find(order_.front().first);
    if (it != held_.end() && it->second.seq == order_.front().second) held_.erase(it);
    order_.pop_front();
  }
  void Expire(int64_t now_ns) {
    while (!order_.empty()) {
      auto it = held_.find(order_.front().first);
      const bool current = it != held_.end() && it->second.seq == order_.front().second;
      if (current && it->second.expires_ns > now_ns) break;  // puts are in time order
      Pop();
    }
  }

  int64_t hold_ns_;
  size_t max_;
  std::unordered_map<Key, Held, KeyHasher> held_;
  std::deque<std::pair<Key, uint64_t>> order_;  // puts, oldest first: (key, seq)
  uint64_t seq_ = 0;
};

}  // namespace kvtier
