#pragma once
// Tier identities shared by the wire (enum Tier in kvtier.fbs: the same numbers), the
// daemon and the client, and the one table (kTierTable) every name, event medium, wire and
// quota conversion reads. Numbered as they were added (a wire or stored number never
// changes meaning). Pool tiers (GPU, host) have pages engines map; NVMe has slots reached
// through host pages; lower tiers (below NVMe) keep blocks under their block keys, are
// reached through a LowerTierMover (daemon/cache/lower_tier_mover.h), and are asked in the
// order of their rows in daemon/lower_tiers.cc.

#include <array>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string_view>

namespace kvtier {

enum class TierKind : uint8_t { kGpu = 0, kHost = 1, kNvme = 2, kRemote = 3, kMemory = 4 };

// What a tier is to the cache.
enum class TierClass : uint8_t { kPool, kNvme, kLower };

// One row per tier, in TierKind order.
struct TierRow {
  TierKind kind;
  std::string_view name;          // config sections (tiers.<name>), quotas, metrics' tier label, kvctl
  std::string_view event_medium;  // the medium KV events announce its blocks in
  TierClass cls;
};

inline constexpr TierRow kTierTable[] = {
    {TierKind::kGpu, "gpu", "GPU", TierClass::kPool},
    {TierKind::kHost, "host", "CPU_TIER1", TierClass::kPool},
    {TierKind::kNvme, "nvme", "CPU_TIER2", TierClass::kNvme},
    {TierKind::kRemote, "remote", "REMOTE", TierClass::kLower},
    {TierKind::kMemory, "memory", "CPU_TIER3", TierClass::kLower},
};
inline constexpr int kTierCount = static_cast<int>(std::size(kTierTable));

// The table's row of `t`. REQUIRES: t is one of TierKind's values.
constexpr const TierRow& TierRowOf(TierKind t) { return kTierTable[static_cast<int>(t)]; }
consteval bool TierTableInOrder() {
  for (int i = 0; i < kTierCount; ++i) {
    if (static_cast<int>(kTierTable[i].kind) != i) return false;
  }
  return true;
}
static_assert(TierTableInOrder(), "kTierTable rows are in TierKind order");

inline constexpr std::array<TierKind, kTierCount> kAllTiers = [] {
  std::array<TierKind, kTierCount> k{};
  for (int i = 0; i < kTierCount; ++i) k[i] = kTierTable[i].kind;
  return k;
}();

// A page of a tier's pool (an NVMe slot for the NVMe tier), numbered from 0 across the
// pool's segments; the numbers travel in Allocate, Commit, Acquire and Release.
using PageId = uint32_t;
inline constexpr PageId kNoPage = 0xffffffffu;

constexpr int TierIndex(TierKind t) { return static_cast<int>(t); }
// The tiers whose pages engines lease and map (GPU, host); NVMe slots and lower tiers'
// values are reached through host pages.
constexpr bool IsPoolTier(TierKind t) { return TierRowOf(t).cls == TierClass::kPool; }
constexpr bool IsLowerTier(TierKind t) { return TierRowOf(t).cls == TierClass::kLower; }

// "gpu", "host", "nvme", "remote", ...
constexpr std::string_view TierKindName(TierKind t) { return TierRowOf(t).name; }

// The tier of wire or stored number `n`; nullopt for a number no row has (a newer peer's).
constexpr std::optional<TierKind> TierFromNumber(uint8_t n) {
  if (n >= kTierCount) return std::nullopt;
  return kTierTable[n].kind;
}

// A tier the daemon offers a session (its Welcome): what the client maps pages of.
struct TierInfo {
  TierKind tier = TierKind::kHost;
  uint64_t page_bytes = 0;
  uint32_t capacity_pages = 0;
};

constexpr std::optional<TierKind> ParseTierKind(std::string_view name) {
  for (const TierRow& r : kTierTable) {
    if (r.name == name) return r.kind;
  }
  return std::nullopt;
}

// Bytes per tier (quotas, reserves), indexed by TierIndex; 0 means no limit or nothing
// reserved.
using TierBytes = std::array<uint64_t, kTierCount>;

}  // namespace kvtier
