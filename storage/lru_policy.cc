#include "storage/lru_policy.h"

#include "protocol/base/logging.h"

namespace kvtier {

LruPolicy::LruPolicy(size_t expected_ids) {
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

void LruPolicy::Unlink(BlockId id) {
  Node& n = nodes_[id];
  if (n.prev != kNoBlock) nodes_[n.prev].next = n.next; else head_ = n.next;
  if (n.next != kNoBlock) nodes_[n.next].prev = n.prev; else tail_ = n.prev;
  n.prev = n.next = kNoBlock;
  --linked_;
}

void LruPolicy::Insert(BlockId id, BlockId /*parent*/) {
  Grow(id);
  KVTIER_CHECK(!present_[id]) << "block " << id << " inserted twice";
  present_[id] = true;
  evictable_[id] = true;
  ++size_;
  Link(id);
}

void LruPolicy::Touch(BlockId id) {
  if (id >= nodes_.size() || !present_[id] || !evictable_[id]) return;  // pinned: re-enters when unpinned
  Unlink(id);
  Link(id);
}

void LruPolicy::SetEvictable(BlockId id, bool evictable) {
  if (id >= nodes_.size() || !present_[id] || evictable_[id] == evictable) return;
  evictable_[id] = evictable;
  if (evictable) Link(id); else Unlink(id);
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

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name, size_t expected_ids) {
  if (name == "lru") return std::unique_ptr<EvictionPolicy>(new LruPolicy(expected_ids));
  return InvalidArgument("unknown eviction policy '" + std::string(name) + "' (known: lru)");
}

}  // namespace kvtier
