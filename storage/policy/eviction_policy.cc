// The EvictionPolicy factory: every implementation, chosen by name.
#include "storage/policy/eviction_policy.h"

#include <string>

#include "storage/policy/adaptive_policy.h"
#include "storage/policy/arc_policy.h"
#include "storage/policy/lru_policy.h"

namespace kvtier {

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name, size_t capacity) {
  if (name == "lru") return std::unique_ptr<EvictionPolicy>(new LruPolicy(capacity, false));
  if (name == "prefix-lru") return std::unique_ptr<EvictionPolicy>(new LruPolicy(capacity, true));
  if (name == "arc") return std::unique_ptr<EvictionPolicy>(new ArcPolicy(capacity, false));
  if (name == "prefix-arc") return std::unique_ptr<EvictionPolicy>(new ArcPolicy(capacity, true));
  if (name == "adaptive") return std::unique_ptr<EvictionPolicy>(new AdaptivePolicy(capacity));
  return InvalidArgument("unknown eviction policy '" + std::string(name) +
                         "' (known: lru, prefix-lru, arc, prefix-arc, adaptive)");
}

std::span<const std::string_view> EvictionPolicyNames() {
  static constexpr std::string_view kNames[] = {"lru", "prefix-lru", "arc", "prefix-arc", "adaptive"};
  return kNames;
}

}  // namespace kvtier
