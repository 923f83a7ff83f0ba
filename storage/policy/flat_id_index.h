#pragma once
// FlatIdIndex: a hash index from keys that live elsewhere (in an array of records) to
// their 32-bit ids. Open addressing with linear probing over a power-of-two array of
// 16-byte slots {the key's 64-bit hash, id}; the key itself is read from its record only
// when the whole hash matches, so a probe touches one cache line of the index and, almost
// always, the one record it finds. Erase shifts the entries after the hole back (no
// tombstones), so lookups of absent keys stay short however many keys came and went.
//
// Why not std::unordered_map: a node per entry and a division per probe made it the
// largest single cost of a Lookup of a long chain (docs/architecture.md, "Block index").
//
// The caller hands the 64-bit hash of a key (seeded: HashBytes) and, to Find, a predicate
// telling whether the record of an id holds the key. Load stays at most 1/2. Not
// thread-safe.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvtier {

class FlatIdIndex {
 public:
  static constexpr uint32_t kNone = 0xffffffffu;

  FlatIdIndex() : slots_(kMinSlots) {}

  size_t size() const { return size_; }
  size_t capacity() const { return slots_.size(); }

  // Starts loading the slot `hash` probes first; a Find of it soon after waits less.
  void Prefetch(uint64_t hash) const { __builtin_prefetch(&slots_[hash & mask_]); }

  // The id whose record `is(id)` holds the key hashed to `hash`, or kNone.
  template <typename Is>
  uint32_t Find(uint64_t hash, Is&& is) const {
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id == kNone) return kNone;
      if (s.hash == hash && is(s.id)) return s.id;
    }
  }

  // Adds `id` under `hash`. REQUIRES: no id with an equal key is present.
  void Insert(uint64_t hash, uint32_t id) {
    if ((size_ + 1) * 2 > slots_.size()) Grow();
    Put(Slot{hash, id});
    ++size_;
  }

  // Removes `id`, present under `hash`; false when it is not there.
  bool Erase(uint64_t hash, uint32_t id) {
    size_t i = hash & mask_;
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].id == kNone) return false;
      if (slots_[i].id == id) break;
    }
    // Backward shift: each later entry of the run moves into the hole unless its home lies
    // cyclically in (hole, its position].
    size_t hole = i;
    for (size_t j = (i + 1) & mask_; slots_[j].id != kNone; j = (j + 1) & mask_) {
      const size_t home = slots_[j].hash & mask_;
      const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (stays) continue;
      slots_[hole] = slots_[j];
      hole = j;
    }
    slots_[hole] = Slot{};
    --size_;
    return true;
  }

 private:
  static constexpr size_t kMinSlots = 1024;
  struct Slot {
    uint64_t hash = 0;
    uint32_t id = kNone;
  };
  void Put(Slot s) {
    size_t i = s.hash & mask_;
    while (slots_[i].id != kNone) i = (i + 1) & mask_;
    slots_[i] = s;
  }
  void Grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.id != kNone) Put(s);
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = kMinSlots - 1;
  size_t size_ = 0;
};

}  // namespace kvtier
