#pragma once
// SpliceRunToHead: the shortcut of the list policies' TouchMany for a chain touched again.
//
// Touching blocks ids[0], ids[1], ..., ids[n-1] in order, each moving to the head of an
// intrusive doubly linked list (prev/next block ids in an array of nodes), ends with
// ids[n-1] at the head, then ids[n-2], ..., ids[0]. When the list already holds them as one
// consecutive run in that order (ids[i].next == ids[i-1]) — the usual state of a prefix
// that was matched before — the whole run moves to the head in O(1) pointer updates
// instead of n unlinks and links; the check reads one `next` per block. Anything else
// (a block not linked in this list, a gap, a repeat) returns false with nothing changed,
// and the caller touches one by one.

#include <span>

#include "storage/policy/eviction_policy.h"

namespace kvtier {

// `linked(id)`: whether `id` is linked in this list (present, evictable, in the list of
// `head`/`tail`); called only with ids below nodes.size().
template <class Nodes, class Linked>
bool SpliceRunToHead(Nodes& nodes, BlockId& head, BlockId& tail, std::span<const BlockId> ids, Linked linked) {
  if (ids.empty()) return true;
  const size_t n = ids.size();
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] >= nodes.size() || !linked(ids[i])) return false;
    if (i > 0 && nodes[ids[i]].next != ids[i - 1]) return false;
  }
  const BlockId first = ids[n - 1], last = ids[0];
  if (head == first) return true;  // already the most recent, in order
  const BlockId before = nodes[first].prev, after = nodes[last].next;
  nodes[before].next = after;  // `first` is not the head, so it has a predecessor
  if (after != kNoBlock)
    nodes[after].prev = before;
  else
    tail = before;
  nodes[last].next = head;
  nodes[head].prev = last;
  nodes[first].prev = kNoBlock;
  head = first;
  return true;
}

}  // namespace kvtier
