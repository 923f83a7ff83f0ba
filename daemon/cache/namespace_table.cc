#include "daemon/cache/namespace_table.h"

#include <xxhash.h>

#include <cstdio>

#include "protocol/base/logging.h"

namespace kvtier {

NamespaceTable::NamespaceTable(std::unordered_map<std::string, TenantLimits> tenant_limits, TenantLimits unknown_limits)
    : configured_(std::move(tenant_limits)), unknown_(unknown_limits) {}

void NamespaceTable::SetLimits(std::unordered_map<std::string, TenantLimits> tenant_limits,
                               TenantLimits unknown_limits) {
  configured_ = std::move(tenant_limits);
  unknown_ = unknown_limits;
  for (Tenant& t : tenants_) {
    auto lim = configured_.find(t.name);
    t.limits = lim != configured_.end() ? lim->second : unknown_;
  }
}

TenantId NamespaceTable::InternTenant(std::string_view name) {
  auto [it, inserted] = tenant_ids_.try_emplace(std::string(name), 0);
  if (!inserted) return it->second;
  const TenantId id = static_cast<TenantId>(tenants_.size());
  it->second = id;
  auto lim = configured_.find(it->first);
  tenants_.push_back(Tenant{std::string(name), lim != configured_.end() ? lim->second : unknown_});
  return id;
}

NamespaceId NamespaceTable::Acquire(const std::string& encoded, const std::string& fingerprint, uint64_t block_bytes,
                                    std::string_view tenant, std::string_view model,
                                    std::optional<KvGeometry> kv_geometry, FloatKind float_kind, bool quantize) {
  if (auto it = ids_.find(encoded); it != ids_.end()) {
    ++namespaces_[it->second].users;
    return it->second;
  }
  NamespaceId id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<NamespaceId>(namespaces_.size());
    namespaces_.emplace_back();
  }
  namespaces_[id] = Namespace{encoded,     fingerprint,         block_bytes,
                              1,           std::string(tenant), std::string(model),
                              kv_geometry, float_kind,          quantize && kv_geometry.has_value()};
  ids_[encoded] = id;
  return id;
}

void NamespaceTable::AddUser(NamespaceId ns) {
  KVTIER_CHECK(live(ns)) << "namespace " << ns << " used after it went";
  ++namespaces_[ns].users;
}

void NamespaceTable::Release(NamespaceId ns) {
  Namespace& n = namespaces_[ns];
  KVTIER_CHECK(n.users > 0) << "namespace " << ns << " released too often";
  if (--n.users == 0) {
    ids_.erase(n.encoded);
    n = Namespace{};
    free_ids_.push_back(ns);
  }
}

std::optional<NamespaceId> NamespaceTable::Find(const std::string& encoded) const {
  auto it = ids_.find(encoded);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::string NamespaceTable::HexOf(std::string_view encoded) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(encoded.data(), encoded.size())));
  return buf;
}

std::string NamespaceTable::Hex(NamespaceId ns) const {
  return ns < namespaces_.size() ? HexOf(namespaces_[ns].encoded) : std::string();
}

}  // namespace kvtier
