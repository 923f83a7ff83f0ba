#pragma once
// Tier identities shared by the wire (enum Tier in kvtier.fbs: the same numbers), the
// daemon and the client. Ordered fastest first.

#include <cstdint>
#include <optional>
#include <string_view>

namespace kvtier {

enum class TierKind : uint8_t { kGpu = 0, kHost = 1, kNvme = 2 };

// A page of a tier's pool (an NVMe slot for the NVMe tier), numbered from 0 across the
// pool's segments; the numbers travel in Allocate, Commit, Acquire and Release.
using PageId = uint32_t;
inline constexpr PageId kNoPage = 0xffffffffu;
inline constexpr int kTierCount = 3;
inline constexpr TierKind kAllTiers[kTierCount] = {TierKind::kGpu, TierKind::kHost, TierKind::kNvme};

inline int TierIndex(TierKind t) { return static_cast<int>(t); }

// "gpu", "host", "nvme".
inline std::string_view TierKindName(TierKind t) {
  switch (t) {
    case TierKind::kGpu:
      return "gpu";
    case TierKind::kHost:
      return "host";
    case TierKind::kNvme:
      return "nvme";
  }
  return "unknown";
}

inline std::optional<TierKind> ParseTierKind(std::string_view name) {
  for (TierKind t : kAllTiers) {
    if (TierKindName(t) == name) return t;
  }
  return std::nullopt;
}

}  // namespace kvtier
