#include "storage/lru_policy.h"

#include "protocol/base/logging.h"

namespace kvtier {

LruPolicy::Node& LruPolicy::At(BlockId id) {
  if (id >= nodes_.size()) nodes_.resize(static_cast<size_t>(id) + 1 + nodes_.size() / 2);
  return nodes_[id];
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
  Node& n = At(id);
  KVTIER_CHECK(!n.present) << "block " << id << " inserted twice";
  n.present = true;
  n.evictable = true;
  ++size_;
  Link(id);
}

void LruPolicy::Touch(BlockId id) {
  Node& n = At(id);
  if (!n.present || !n.evictable) return;  // pinned blocks re-enter at MRU when unpinned
  Unlink(id);
  Link(id);
}

void LruPolicy::SetEvictable(BlockId id, bool evictable) {
  Node& n = At(id);
  if (!n.present || n.evictable == evictable) return;
  n.evictable = evictable;
  if (evictable) Link(id); else Unlink(id);
}

void LruPolicy::Erase(BlockId id) {
  Node& n = At(id);
  if (!n.present) return;
  if (n.evictable) Unlink(id);
  n = Node{};
  --size_;
}

BlockId LruPolicy::Victim() { return tail_; }

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name) {
  if (name == "lru") return std::unique_ptr<EvictionPolicy>(new LruPolicy());
  return InvalidArgument("unknown eviction policy '" + std::string(name) + "' (known: lru)");
}

}  // namespace kvtier
