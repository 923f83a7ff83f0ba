#include "daemon/tenants.h"

#include <algorithm>

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

}  // namespace kvtier
