#pragma once
// Tenants: who a peer is, decided by the kernel's word only (SO_PEERCRED and
// SO_PEERGROUPS), never by anything the client sends.
//
// A peer belongs to the configured tenant that lists its uid; failing that, the first
// (in config order) that lists its primary or any supplementary group. A peer no tenant
// covers gets a tenant of its own, "uid=U", when security.allow_unknown is true (or it is
// an admin: kvctl as root always works), and is refused otherwise. Admin operations (verify, evict, drain, other
// sessions' details) are for root, the daemon's own uid and security.admin_uids.
//
// Value type; immutable after construction; thread-compatible.

#include <sys/types.h>

#include <string>
#include <vector>

#include "daemon/config.h"
#include "protocol/base/status.h"

namespace kvtier {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary, as SO_PEERGROUPS gives them
};

struct TenantGrant {
  std::string tenant;
  bool admin = false;
  bool configured = false;  // a tenant of security.tenants (else an unknown peer's own)
};

class TenantResolver {
 public:
  TenantResolver(const SecurityConfig& config, uid_t daemon_uid);

  // kPermissionDenied naming the uid when no tenant covers the peer and unknown peers
  // are refused.
  Result<TenantGrant> Resolve(const PeerCredentials& peer) const;
  bool IsAdmin(uid_t uid) const;

 private:
  SecurityConfig config_;
  uid_t daemon_uid_;
};

// The NVMe tier's slot owners: each configured tenant with an NVMe quota or reserve is an
// owner 1..n (names[o] its name; names[0] empty), everyone else owner 0; limits in slots of
// `slot_unit_bytes`. No tenant with NVMe limits: no owners (names empty).
NvmeOwners NvmeOwnersOf(const SecurityConfig& security, uint64_t slot_unit_bytes, std::vector<std::string>* names);

}  // namespace kvtier
