#pragma once
// NamespaceTable: the tenants and namespaces the cache knows, by small dense ids.
//
// A tenant is a name the TenantResolver gave a peer; its id indexes per-tenant arrays
// (pool owners, eviction policies) and is never reused; its limits come from the config.
// A namespace is EncodeNamespace(tenant, layout fingerprint): the scope in which block
// hashes mean something. A namespace lives while something uses it — an attached session
// or a resident block — and its id is reused after its last user goes.
//
// Owned by the control thread; not thread-safe.

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "daemon/cache/cache_types.h"
#include "kernels/kv_layout.h"

namespace kvtier {

class NamespaceTable {
 public:
  struct Namespace {
    std::string encoded;
    std::string fingerprint;    // the layout's
    uint64_t block_bytes = 0;   // bytes of block data in a page
    uint32_t users = 0;         // attached sessions + resident blocks; 0: a free id
    std::string tenant, model;  // for kvctl
    // The block's geometry when a block is the canonical page of 2-byte floats the kernels
    // take (so it can be quantized and dequantized), with its float kind; else nullopt.
    std::optional<KvGeometry> kv_geometry;
    FloatKind float_kind = FloatKind::kBf16;
    bool quantize = false;  // the tenant opted in to quantized cold tiers (and kv_geometry is set)
  };

  // Limits of configured tenants by name; every other tenant gets `unknown_limits`.
  NamespaceTable(std::unordered_map<std::string, TenantLimits> tenant_limits, TenantLimits unknown_limits);

  // ---- tenants ----
  TenantId InternTenant(std::string_view name);
  const std::string& tenant_name(TenantId t) const { return tenants_[t].name; }
  const TenantLimits& limits(TenantId t) const { return tenants_[t].limits; }
  // New limits for configured tenants and for the others (a config reload): known
  // tenants' limits change now.
  void SetLimits(std::unordered_map<std::string, TenantLimits> tenant_limits, TenantLimits unknown_limits);
  size_t tenant_count() const { return tenants_.size(); }

  // ---- namespaces ----
  // The namespace `encoded` with one more user; created with these facts if it is new.
  NamespaceId Acquire(const std::string& encoded, const std::string& fingerprint, uint64_t block_bytes,
                      std::string_view tenant, std::string_view model,
                      std::optional<KvGeometry> kv_geometry = std::nullopt, FloatKind float_kind = FloatKind::kBf16,
                      bool quantize = false);
  // One more user of a live namespace (a block created in it).
  void AddUser(NamespaceId ns);
  // One user fewer; the namespace goes with its last. REQUIRES: ns is live.
  void Release(NamespaceId ns);

  // REQUIRES: ns < id_limit().
  const Namespace& Get(NamespaceId ns) const { return namespaces_[ns]; }
  bool live(NamespaceId ns) const { return ns < namespaces_.size() && namespaces_[ns].users > 0; }
  std::optional<NamespaceId> Find(const std::string& encoded) const;
  // Ids below this may name namespaces (live() says which do).
  NamespaceId id_limit() const { return static_cast<NamespaceId>(namespaces_.size()); }
  size_t size() const { return ids_.size(); }

  // The NVMe index key of `hash` in `ns`.
  std::string BlockKey(NamespaceId ns, const BlockHash& hash) const {
    return EncodeBlockKey(namespaces_[ns].encoded, hash);
  }
  // Hex id of a namespace for display (kvctl, Welcome): 16 hex digits of XXH3 of the
  // encoded namespace; "" for an id that names none.
  std::string Hex(NamespaceId ns) const;
  static std::string HexOf(std::string_view encoded);

 private:
  struct Tenant {
    std::string name;
    TenantLimits limits;
  };
  std::unordered_map<std::string, TenantLimits> configured_;
  TenantLimits unknown_;
  std::vector<Tenant> tenants_;  // by TenantId
  std::unordered_map<std::string, TenantId> tenant_ids_;
  std::vector<Namespace> namespaces_;  // by NamespaceId
  std::vector<NamespaceId> free_ids_;
  std::unordered_map<std::string, NamespaceId> ids_;  // encoded -> id, live only
};

}  // namespace kvtier
