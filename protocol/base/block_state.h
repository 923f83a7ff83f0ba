#pragma once
// Why a block is or is not a hit, as kvctl explain reports it: the daemon's answer and the
// client's view of it (enum BlockState in kvtier.fbs has the same numbers).

#include <cstdint>
#include <string_view>

namespace kvtier {

enum class BlockState : uint8_t {
  kCached = 0,          // a hit: readable in some tier
  kInFlight = 1,        // being read from NVMe into a host page right now
  kEvicted = 2,         // it was cached and its last copy left (the eviction history remembers)
  kOtherNamespace = 3,  // not in the namespace asked about, but stored under another one
  kNeverStored = 4,     // not known (or evicted before the history remembers)
};

// "cached", "in-flight", "evicted", "other-namespace", "never-stored".
inline std::string_view BlockStateName(BlockState s) {
  switch (s) {
    case BlockState::kCached:
      return "cached";
    case BlockState::kInFlight:
      return "in-flight";
    case BlockState::kEvicted:
      return "evicted";
    case BlockState::kOtherNamespace:
      return "other-namespace";
    case BlockState::kNeverStored:
      return "never-stored";
  }
  return "unknown";
}

}  // namespace kvtier
