#include "storage/policy/arc_policy.h"

#include <algorithm>

#include "protocol/base/logging.h"
#include "storage/policy/list_run.h"

namespace kvtier {

bool ArcPolicy::Ghosts::Take(uint64_t key) {
  auto it = where_.find(key);
  if (it == where_.end()) return false;
  order_.erase(it->second);
  where_.erase(it);
  return true;
}

void ArcPolicy::Ghosts::Push(uint64_t key) {
  Take(key);
  order_.push_front(key);
  where_[key] = order_.begin();
}

void ArcPolicy::Ghosts::PopOldest() {
  if (order_.empty()) return;
  where_.erase(order_.back());
  order_.pop_back();
}

ArcPolicy::ArcPolicy(size_t capacity, bool prefix_order) : capacity_(capacity), prefix_order_(prefix_order) {
  nodes_.resize(capacity);
}

void ArcPolicy::Grow(BlockId id) {
  if (id >= nodes_.size()) nodes_.resize(static_cast<size_t>(id) + 1 + nodes_.size() / 2);
}

void ArcPolicy::Link(BlockId id) {
  Node& n = nodes_[id];
  const int l = n.list;
  n.prev = kNoBlock;
  n.next = head_[l];
  if (head_[l] != kNoBlock) nodes_[head_[l]].prev = id;
  head_[l] = id;
  if (tail_[l] == kNoBlock) tail_[l] = id;
  ++linked_[l];
}

void ArcPolicy::LinkBehind(BlockId at, BlockId id) {
  Node& n = nodes_[id];
  Node& a = nodes_[at];
  const int l = n.list;
  n.prev = at;
  n.next = a.next;
  if (a.next != kNoBlock)
    nodes_[a.next].prev = id;
  else
    tail_[l] = id;
  a.next = id;
  ++linked_[l];
}

void ArcPolicy::Unlink(BlockId id) {
  Node& n = nodes_[id];
  const int l = n.list;
  if (n.prev != kNoBlock)
    nodes_[n.prev].next = n.next;
  else
    head_[l] = n.next;
  if (n.next != kNoBlock)
    nodes_[n.next].prev = n.prev;
  else
    tail_[l] = n.prev;
  n.prev = n.next = kNoBlock;
  --linked_[l];
}

void ArcPolicy::Insert(BlockId id, BlockId parent, uint64_t key) {
  Grow(std::max(id, parent == kNoBlock ? 0 : parent));
  Node& n = nodes_[id];
  KVTIER_CHECK(n.list == 0) << "block " << id << " inserted twice";
  const size_t c = Capacity();
  uint8_t list = 1;
  if (b1_.Take(key)) {
    // Evicted from T1 too early: T1 should be larger.
    p_ = std::min(c, p_ + std::max<size_t>(b2_.size() / std::max<size_t>(b1_.size(), 1), 1));
    list = 2;
  } else if (b2_.Take(key)) {
    const size_t d = std::max<size_t>(b1_.size() / std::max<size_t>(b2_.size(), 1), 1);
    p_ = p_ > d ? p_ - d : 0;
    list = 2;
  }
  n.key = key;
  n.list = list;
  n.evictable = true;
  ++counts_[list];
  if (prefix_order_ && parent != kNoBlock && parent != id && nodes_[parent].list == list && nodes_[parent].evictable) {
    LinkBehind(parent, id);
  } else {
    Link(id);
  }
}

void ArcPolicy::Touch(BlockId id) {
  if (id >= nodes_.size() || nodes_[id].list == 0) return;
  Node& n = nodes_[id];
  if (n.evictable) Unlink(id);
  --counts_[n.list];
  n.list = 2;  // a second use: frequent from now on
  ++counts_[2];
  if (n.evictable) Link(id);
}

void ArcPolicy::TouchMany(std::span<const BlockId> ids) {
  // A run already in T2 stays there: only its place in the list changes.
  if (SpliceRunToHead(nodes_, head_[2], tail_[2], ids,
                      [this](BlockId id) { return nodes_[id].list == 2 && nodes_[id].evictable; })) {
    return;
  }
  for (BlockId id : ids) ArcPolicy::Touch(id);
}

void ArcPolicy::SetEvictable(BlockId id, bool evictable) {
  if (id >= nodes_.size() || nodes_[id].list == 0 || nodes_[id].evictable == evictable) return;
  nodes_[id].evictable = evictable;
  if (evictable)
    Link(id);
  else
    Unlink(id);
}

void ArcPolicy::Erase(BlockId id) {
  if (id >= nodes_.size() || nodes_[id].list == 0) return;
  Node& n = nodes_[id];
  if (n.evictable) Unlink(id);
  --counts_[n.list];
  (n.list == 1 ? b1_ : b2_).Push(n.key);
  const size_t limit = 4 * Capacity();
  while (b1_.size() + b2_.size() > limit) (b1_.size() > b2_.size() ? b1_ : b2_).PopOldest();
  n = Node{};
}

BlockId ArcPolicy::Victim() {
  const bool t1 = linked_[1] > 0 && (counts_[1] > p_ || linked_[2] == 0);
  if (t1) return tail_[1];
  if (linked_[2] > 0) return tail_[2];
  return tail_[1];
}

}  // namespace kvtier
