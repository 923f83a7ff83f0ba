#pragma once
// AdaptivePolicy ("adaptive"): set dueling between prefix-ordered LRU and prefix-ordered
// ARC. Both keep their order over every resident block (both see every event), and the
// victim comes from whichever is winning: two shadow caches, each running one of the two
// policies over a 1/8 sample of block keys at 1/8 of the capacity, count hits with
// exponential decay, and the one with more recent hits chooses. ARC wins on traces with
// many one-use blocks and long reuse gaps (frequency matters); LRU wins on
// conversation-like traces where reuse follows recency; the duel follows the workload.
// Not thread-safe.

#include <memory>
#include <vector>

#include "storage/policy/arc_policy.h"
#include "storage/policy/flat_id_index.h"
#include "storage/policy/lru_policy.h"

namespace kvtier {

class AdaptivePolicy final : public EvictionPolicy {
 public:
  explicit AdaptivePolicy(size_t capacity);

  void Insert(BlockId id, BlockId parent, uint64_t key) override;
  void Touch(BlockId id) override;
  void TouchMany(std::span<const BlockId> ids) override;
  void SetEvictable(BlockId id, bool evictable) override;
  void Erase(BlockId id) override;
  BlockId Victim() override;
  size_t size() const override { return lru_.size(); }
  size_t evictable() const override { return lru_.evictable(); }
  std::string_view name() const override { return "adaptive"; }
  bool touch_prefix_deepest_first() const override { return true; }

  // Which policy chooses victims now: true for ARC.
  bool arc_leads() const { return arc_leads_; }

 private:
  // A sampled shadow cache running one policy.
  class Shadow {
   public:
    Shadow(std::unique_ptr<EvictionPolicy> p, size_t capacity) : policy_(std::move(p)), capacity_(capacity) {}
    // One access to a sampled key; true on a hit.
    bool Access(uint64_t key);
    // Starts loading what an Access of `key` reads first.
    void Prefetch(uint64_t key) const { ids_.Prefetch(Slot(key)); }

   private:
    // The index hash of a key: keys are digests already, but sampling picked them by their
    // high bits, so the low bits the index probes by are remixed.
    static uint64_t Slot(uint64_t key) {
      key ^= key >> 31;
      key *= 0xbf58476d1ce4e5b9ull;
      return key ^ (key >> 29);
    }
    std::unique_ptr<EvictionPolicy> policy_;
    size_t capacity_;
    FlatIdIndex ids_;  // key -> shadow id; keys_[id] holds the key
    std::vector<uint64_t> keys_;
    std::vector<BlockId> free_;
  };
  void Sample(uint64_t key);

  LruPolicy lru_;
  ArcPolicy arc_;
  std::vector<uint64_t> key_of_;  // by block id
  Shadow lru_shadow_, arc_shadow_;
  double lru_score_ = 0, arc_score_ = 0;
  bool arc_leads_ = false;
};

}  // namespace kvtier
