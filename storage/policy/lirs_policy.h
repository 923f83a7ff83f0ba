#pragma once
// LirsPolicy ("prefix-lirs"): LIRS (Jiang & Zhang, SIGMETRICS 2002) over evictable blocks,
// in prefix order. A block's value is its inter-reference recency (IRR: how many other
// blocks were used between its last two uses), not its recency. Blocks of small IRR form
// the LIR set, 99% of the capacity; the rest of the tier holds HIR blocks in a queue Q, and
// victims come from Q. A block used again while its previous use is still in the stack S
// (the recency order back to the oldest LIR block) has an IRR below some LIR block's and
// joins the LIR set, whose least recent member leaves for Q. So when chains come back at
// distances larger than the tier (agent sessions round-robin through tool pauses, a loop
// over more prompts than fit), LRU keeps none of them and LIRS keeps a fixed set whole;
// when reuse follows recency it loses to LRU (a conversation's next turn is rarely the
// oldest), which is why it is one of adaptive's contenders and not the default.
//
// S also keeps "ghost" entries (the keys of HIR blocks that left while still in S), so a
// chain recomputed soon after it was evicted is recognised; at most 2 x capacity of them.
// Prefix order: the owner touches a matched prefix deepest first, and a new HIR block
// enters Q right behind its parent, so a chain leaves Q from its end.
//
// `capacity` 0: the capacity is taken to be the number of resident blocks (a tier share
// that grows and shrinks). O(1) per operation, plus a hash probe per Insert and Erase for
// the ghosts. Not thread-safe.

#include <cstdint>
#include <vector>

#include "storage/policy/eviction_policy.h"
#include "storage/policy/flat_id_index.h"

namespace kvtier {

class LirsPolicy final : public EvictionPolicy {
 public:
  explicit LirsPolicy(size_t capacity = 0);

  void Insert(BlockId id, BlockId parent, uint64_t key) override;
  void Touch(BlockId id) override;
  void TouchMany(std::span<const BlockId> ids) override;
  void SetEvictable(BlockId id, bool evictable) override;
  void Erase(BlockId id) override;
  BlockId Victim() override;
  size_t size() const override { return size_; }
  size_t evictable() const override { return evictable_; }
  std::string_view name() const override { return "prefix-lirs"; }
  bool touch_prefix_deepest_first() const override { return true; }

  // For tests: whether `id` is in the LIR set; how many ghosts S holds.
  bool lir(BlockId id) const { return id < nodes_.size() && nodes_[id].present && nodes_[id].lir; }
  size_t ghosts() const { return ghost_order_.n; }

 private:
  // An entry of S or Q names a resident block by its id, or a ghost by kGhost | its index.
  static constexpr uint32_t kGhost = 0x80000000u;
  static constexpr uint32_t kEnd = 0xffffffffu;
  struct Links {
    uint32_t prev = kEnd;  // towards the most recent end
    uint32_t next = kEnd;  // towards the oldest end
  };
  struct Node {
    Links s, q;
    uint64_t key = 0;
    bool present = false, evictable = false, lir = false, in_s = false, in_q = false;
  };
  struct Ghost {
    Links s, order;  // place in S; place in ghost_order_
    uint64_t key = 0;
  };
  struct List {
    uint32_t head = kEnd;  // most recent
    uint32_t tail = kEnd;  // oldest
    size_t n = 0;
  };
  // S's links of an entry, for SpliceRunToHead: nodes[e] for a block or a ghost.
  struct StackLinks {
    LirsPolicy* p;
    Links& operator[](uint32_t e) const { return p->SLinks(e); }
    size_t size() const { return p->nodes_.size(); }
  };

  Links& SLinks(uint32_t e) { return (e & kGhost) ? ghosts_[e & ~kGhost].s : nodes_[e].s; }
  // The three lists (S, Q, the ghosts' age order) are one kind: an entry `id` with links
  // `links`, `at(x)` the links of entry x.
  template <class At>
  static void PushFront(List& l, uint32_t id, Links& links, At&& at);
  template <class At>
  static void Unlink(List& l, Links& links, At&& at);
  void SPush(uint32_t e);    // at the top (most recent)
  void SRemove(uint32_t e);  // anywhere
  void QPush(BlockId id, BlockId parent);
  void QRemove(BlockId id);
  // Pops HIR entries off the bottom of S until a LIR block is there (the LIRS invariant).
  void Prune();
  // The least recent LIR block becomes HIR (into Q when evictable).
  void DemoteBottom();
  // The LIR set within its budget, S pruned.
  void Settle();
  // `id`, a resident HIR block leaving the tier, leaves a ghost at its place in S.
  void LeaveGhost(BlockId id);
  void DropGhost(uint32_t g);
  uint32_t FindGhost(uint64_t key) const;
  static uint64_t Slot(uint64_t key);
  size_t LirBudget() const;
  void Grow(BlockId id);

  size_t capacity_;
  std::vector<Node> nodes_;
  std::vector<Ghost> ghosts_;
  std::vector<uint32_t> free_ghosts_;
  FlatIdIndex ghost_index_;   // key -> ghost index
  List s_, q_, ghost_order_;  // ghost_order_: oldest ghost at the tail, through Ghost::order
  size_t size_ = 0, evictable_ = 0, lir_ = 0;
};

}  // namespace kvtier
