#include "storage/policy/lru_policy.h"

#include <algorithm>

#include "protocol/base/logging.h"
#include "storage/policy/list_run.h"

namespace kvtier {

LruPolicy::LruPolicy(size_t expected_ids, bool prefix_order) : prefix_order_(prefix_order) {
  nodes_.resize(expected_ids);
  present_.resize(expected_ids);
  evictable_.resize(expected_ids);
}

void LruPolicy::Grow(BlockId id) {
  if (id < nodes_.size()) return;
  const size_t n = static_cast<size_t>(id) + 1 + nodes_.size() / 2;
  nodes_.resize(n);
  present_.resize(n);
  evictable_.resize(n);
}

void LruPolicy::Link(BlockId id) {
  Node& n = nodes_[id];
  n.prev = kNoBlock;
  n.next = head_;
  if (head_ != kNoBlock) nodes_[head_].prev = id;
  head_ = id;
  if (tail_ == kNoBlock) tail_ = id;
  ++linked_;
}

void LruPolicy::LinkBehind(BlockId at, BlockId id) {
  Node& n = nodes_[id];
  Node& a = nodes_[at];
  n.prev = at;
  n.next = a.next;
  if (a.next != kNoBlock)
    nodes_[a.next].prev = id;
  else
    tail_ = id;
  a.next = id;
  ++linked_;
}

void LruPolicy::Unlink(BlockId id) {
  Node& n = nodes_[id];
  if (n.prev != kNoBlock)
    nodes_[n.prev].next = n.next;
  else
    head_ = n.next;
  if (n.next != kNoBlock)
    nodes_[n.next].prev = n.prev;
  else
    tail_ = n.prev;
  n.prev = n.next = kNoBlock;
  --linked_;
}

void LruPolicy::Insert(BlockId id, BlockId parent, uint64_t /*key*/) {
  Grow(std::max(id, parent == kNoBlock ? 0 : parent));
  KVTIER_CHECK(!present_[id]) << "block " << id << " inserted twice";
  present_[id] = true;
  evictable_[id] = true;
  ++size_;
  if (prefix_order_ && parent != kNoBlock && parent != id && present_[parent] && evictable_[parent]) {
    LinkBehind(parent, id);
  } else {
    Link(id);
  }
}

void LruPolicy::Touch(BlockId id) {
  if (id >= nodes_.size() || !present_[id] || !evictable_[id]) return;  // pinned: re-enters when unpinned
  Unlink(id);
  Link(id);
}

void LruPolicy::TouchMany(std::span<const BlockId> ids) {
  if (SpliceRunToHead(nodes_, head_, tail_, ids, [this](BlockId id) { return present_[id] && evictable_[id]; })) return;
  for (BlockId id : ids) LruPolicy::Touch(id);
}

void LruPolicy::SetEvictable(BlockId id, bool evictable) {
  if (id >= nodes_.size() || !present_[id] || evictable_[id] == evictable) return;
  evictable_[id] = evictable;
  if (evictable)
    Link(id);
  else
    Unlink(id);
}

void LruPolicy::Erase(BlockId id) {
  if (id >= nodes_.size() || !present_[id]) return;
  if (evictable_[id]) Unlink(id);
  nodes_[id] = Node{};
  present_[id] = false;
  evictable_[id] = false;
  --size_;
}

BlockId LruPolicy::Victim() { return tail_; }

}  // namespace kvtier
