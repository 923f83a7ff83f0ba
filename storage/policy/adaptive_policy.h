#pragma once
// AdaptivePolicy ("adaptive"): set dueling among prefix-ordered LRU, ARC and LIRS. All
// three keep their order over every resident block (each sees every event), and the victim
// comes from whichever is winning: three shadow caches, each running one of the policies
// over a 1/8 sample of block keys at 1/8 of the capacity, count hits with exponential
// decay, and the one with the most recent hits chooses. LRU wins on conversation-like
// traces where reuse follows recency; ARC where many blocks are used once and reuse gaps
// are long (frequency matters); LIRS where chains come back at distances larger than the
// tier (agent sessions through tool pauses, loops over many prompts), where LRU keeps
// none of them. The duel follows the workload.
//
// LIRS contends only in a tier whose victims leave the cache. Where they are demoted into
// a larger tier below (host over NVMe, GPU over host), the shadows' one-tier hits are the
// wrong score: a fixed set kept in the upper tier cost hits of the two together (two tiers,
// generated agent traces at 2% capacity: up to 1.4 points below LRU; one tier: up to 10
// points above; docs/benchmarks.md). Not thread-safe.

#include <memory>
#include <vector>

#include "storage/policy/arc_policy.h"
#include "storage/policy/flat_id_index.h"
#include "storage/policy/lirs_policy.h"
#include "storage/policy/lru_policy.h"

namespace kvtier {

class AdaptivePolicy final : public EvictionPolicy {
 public:
  // `victims_demoted`: as MakeEvictionPolicy's.
  explicit AdaptivePolicy(size_t capacity, bool victims_demoted = false);

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

  // The name of the policy that chooses victims now.
  std::string_view leader() const;

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

  // The contenders, indexed as shadows_ and scores_; LRU (0) leads until another wins.
  enum Contender { kLru = 0, kArc = 1, kLirs = 2, kContenders = 3 };
  int contenders_;  // the first this many duel: kLirs without LIRS
  bool with_lirs() const { return contenders_ > kLirs; }
  LruPolicy lru_;
  ArcPolicy arc_;
  LirsPolicy lirs_;
  EvictionPolicy* const contender_[kContenders] = {&lru_, &arc_, &lirs_};
  std::vector<uint64_t> key_of_;  // by block id
  Shadow shadows_[kContenders];
  double scores_[kContenders] = {};
  Contender leader_ = kLru;
};

}  // namespace kvtier
