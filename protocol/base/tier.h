#pragma once
// Tier identities shared by the wire (enum Tier in kvtier.fbs: the same numbers), the
// daemon and the client. Ordered fastest first. The remote tier (a Redis Cluster shared by
// a fleet) has no pages an engine sees: its blocks are read into host pages.

#include <cstdint>
#include <optional>
#include <string_view>

namespace kvtier {

enum class TierKind : uint8_t { kGpu = 0, kHost = 1, kNvme = 2, kRemote = 3 };

// A page of a tier's pool (an NVMe slot for the NVMe tier), numbered from 0 across the
// pool's segments; the numbers travel in Allocate, Commit, Acquire and Release.
using PageId = uint32_t;
inline constexpr PageId kNoPage = 0xffffffffu;
inline constexpr int kTierCount = 4;
inline constexpr TierKind kAllTiers[kTierCount] = {TierKind::kGpu, TierKind::kHost, TierKind::kNvme, TierKind::kRemote};

inline int TierIndex(TierKind t) { return static_cast<int>(t); }
// The tiers whose pages engines lease and map (GPU, host); NVMe slots and remote values
// are reached through host pages.
inline bool IsPoolTier(TierKind t) { return t == TierKind::kGpu || t == TierKind::kHost; }

// "gpu", "host", "nvme", "remote".
inline std::string_view TierKindName(TierKind t) {
  switch (t) {
    case TierKind::kGpu:
      return "gpu";
    case TierKind::kHost:
      return "host";
    case TierKind::kNvme:
      return "nvme";
    case TierKind::kRemote:
      return "remote";
  }
  return "unknown";
}

// A tier the daemon offers a session (its Welcome): what the client maps pages of.
struct TierInfo {
  TierKind tier = TierKind::kHost;
  uint64_t page_bytes = 0;
  uint32_t capacity_pages = 0;
};

inline std::optional<TierKind> ParseTierKind(std::string_view name) {
  for (TierKind t : kAllTiers) {
    if (TierKindName(t) == name) return t;
  }
  return std::nullopt;
}

}  // namespace kvtier
