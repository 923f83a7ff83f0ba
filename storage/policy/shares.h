#pragma once
// Owners' shares of a tier: the one quota / reserve / watermark rule every tier applies
// (the host and GPU pools in the cache manager, the NVMe tier's slots). Units are the
// tier's own (pages, slots); a limit of 0 means none.
//
//   quota:    the most an owner holds; at it, its own coldest block makes room, and with
//             none to give its new block is refused.
//   reserve:  what pressure from others (their allocations, the watermark) never takes it
//             below.
//   watermark: takes from the owner with the most to give (what it holds that may be
//             evicted), among those above their reserve.
//
// Pure functions; thread-compatible.

#include <algorithm>
#include <cstdint>
#include <optional>

namespace kvtier {

struct Share {
  uint32_t held = 0;
  uint32_t quota = 0;    // 0: no quota
  uint32_t reserve = 0;  // 0: no reserve
};

// A limit in bytes as whole units; a nonzero limit is at least one unit.
inline uint32_t LimitUnits(uint64_t bytes, uint64_t unit_bytes) {
  return bytes ? static_cast<uint32_t>(std::max<uint64_t>(1, bytes / unit_bytes)) : 0u;
}

inline bool AtQuota(const Share& s) { return s.quota > 0 && s.held >= s.quota; }
inline bool AboveReserve(const Share& s) { return s.held > s.reserve; }

// Of owners [0, n), the one the watermark takes from: above its reserve (`share_of(o)`),
// with the most to give (`giveable(o)`: 0 when it has nothing); ties go to the lowest id.
// nullopt when no owner may give.
template <typename Owner, typename ShareOf, typename Giveable>
std::optional<Owner> OwnerToShrink(Owner n, ShareOf share_of, Giveable giveable) {
  std::optional<Owner> best;
  uint64_t most = 0;
  for (Owner o = 0; o < n; ++o) {
    const uint64_t g = giveable(o);
    if (g > most && AboveReserve(share_of(o))) {
      most = g;
      best = o;
    }
  }
  return best;
}

}  // namespace kvtier
