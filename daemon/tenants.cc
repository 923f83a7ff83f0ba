#include "daemon/tenants.h"

#include <algorithm>
#include <unordered_map>

#include "protocol/base/block_key.h"
#include "storage/policy/shares.h"

namespace kvtier {

TenantResolver::TenantResolver(const SecurityConfig& config, uid_t daemon_uid)
    : config_(config), daemon_uid_(daemon_uid) {}

bool TenantResolver::IsAdmin(uid_t uid) const {
  if (uid == 0 || uid == daemon_uid_) return true;
  const auto& a = config_.admin_uids;
  return std::find(a.begin(), a.end(), uid) != a.end();
}

Result<TenantGrant> TenantResolver::Resolve(const PeerCredentials& peer) const {
  TenantGrant g;
  g.admin = IsAdmin(peer.uid);
  auto has = [](const std::vector<uint32_t>& v, uint32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); };
  for (const TenantConfig& t : config_.tenants) {
    if (has(t.uids, peer.uid)) {
      g.tenant = t.name;
      g.configured = true;
      return g;
    }
  }
  for (const TenantConfig& t : config_.tenants) {
    bool member = has(t.gids, peer.gid);
    for (gid_t x : peer.groups) member = member || has(t.gids, x);
    if (member) {
      g.tenant = t.name;
      g.configured = true;
      return g;
    }
  }
  if (!config_.allow_unknown && !g.admin) {
    return PermissionDenied("uid " + std::to_string(peer.uid) + " (gid " + std::to_string(peer.gid) +
                            ") is in no tenant of security.tenants, and security.allow_unknown is false");
  }
  // '=' cannot appear in configured names, so an unknown peer never lands in one.
  g.tenant = "uid=" + std::to_string(peer.uid);
  return g;
}

NvmeOwners NvmeOwnersOf(const SecurityConfig& security, uint64_t slot_unit_bytes, std::vector<std::string>* names) {
  NvmeOwners o;
  names->clear();
  std::unordered_map<std::string, uint16_t> owners;
  const int nvme = TierIndex(TierKind::kNvme);
  for (const TenantConfig& t : security.tenants) {
    if (t.quota[nvme] == 0 && t.reserve[nvme] == 0) continue;
    if (o.quota_slots.empty()) {
      o.quota_slots.push_back(0);
      o.reserve_slots.push_back(0);
      names->push_back("");
    }
    owners[t.name] = static_cast<uint16_t>(o.quota_slots.size());
    names->push_back(t.name);
    o.quota_slots.push_back(LimitUnits(t.quota[nvme], slot_unit_bytes));
    o.reserve_slots.push_back(LimitUnits(t.reserve[nvme], slot_unit_bytes));
  }
  if (!owners.empty()) {
    o.owner_of = [owners = std::move(owners)](std::string_view key) -> uint16_t {
      std::string tenant;
      if (!DecodeBlockKey(key, &tenant, nullptr, nullptr, nullptr)) return 0;
      auto it = owners.find(tenant);
      return it == owners.end() ? 0 : it->second;
    };
  }
  return o;
}

}  // namespace kvtier
