// The EvictionPolicy factory: every implementation, chosen by name, from one table.
#include "storage/policy/eviction_policy.h"

#include <array>
#include <string>

#include "storage/policy/adaptive_policy.h"
#include "storage/policy/arc_policy.h"
#include "storage/policy/lirs_policy.h"
#include "storage/policy/lru_policy.h"

namespace kvtier {
namespace {

struct PolicyRow {
  std::string_view name;
  std::unique_ptr<EvictionPolicy> (*make)(size_t capacity, bool victims_demoted);
};

constexpr PolicyRow kPolicies[] = {
    {"lru", [](size_t n, bool) -> std::unique_ptr<EvictionPolicy> { return std::make_unique<LruPolicy>(n, false); }},
    {"prefix-lru",
     [](size_t n, bool) -> std::unique_ptr<EvictionPolicy> { return std::make_unique<LruPolicy>(n, true); }},
    {"arc", [](size_t n, bool) -> std::unique_ptr<EvictionPolicy> { return std::make_unique<ArcPolicy>(n, false); }},
    {"prefix-arc",
     [](size_t n, bool) -> std::unique_ptr<EvictionPolicy> { return std::make_unique<ArcPolicy>(n, true); }},
    {"prefix-lirs", [](size_t n, bool) -> std::unique_ptr<EvictionPolicy> { return std::make_unique<LirsPolicy>(n); }},
    {"adaptive",
     [](size_t n, bool demoted) -> std::unique_ptr<EvictionPolicy> {
       return std::make_unique<AdaptivePolicy>(n, demoted);
     }},
};

constexpr auto kNames = [] {
  std::array<std::string_view, std::size(kPolicies)> names{};
  for (size_t i = 0; i < names.size(); ++i) names[i] = kPolicies[i].name;
  return names;
}();

}  // namespace

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name, size_t capacity,
                                                           bool victims_demoted) {
  for (const PolicyRow& row : kPolicies) {
    if (row.name == name) return row.make(capacity, victims_demoted);
  }
  std::string known;
  for (std::string_view n : kNames) known += (known.empty() ? "" : ", ") + std::string(n);
  return InvalidArgument("unknown eviction policy '" + std::string(name) + "' (known: " + known + ")");
}

std::span<const std::string_view> EvictionPolicyNames() { return kNames; }

}  // namespace kvtier
