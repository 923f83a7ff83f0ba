// TenantResolver (daemon/tenants.h): who a peer is, from its credentials only.
#include "daemon/tenants.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

SecurityConfig TwoTenants(bool allow_unknown) {
  SecurityConfig s;
  s.allow_unknown = allow_unknown;
  s.admin_uids = {4000};
  TenantConfig a;
  a.name = "org_a";
  a.uids = {1000};
  a.gids = {2000};
  TenantConfig b;
  b.name = "org_b";
  b.gids = {2000, 3000};
  s.tenants = {a, b};
  return s;
}

TEST(Tenants, UidFirstThenGroupsInConfigOrder) {
  TenantResolver r(TwoTenants(true), /*daemon_uid=*/999);
  EXPECT_EQ(r.Resolve({1, 1000, 3000, {}})->tenant, "org_a");     // uid beats group
  EXPECT_EQ(r.Resolve({1, 1500, 2000, {}})->tenant, "org_a");     // first tenant naming gid 2000
  EXPECT_EQ(r.Resolve({1, 1500, 100, {3000}})->tenant, "org_b");  // a supplementary group
  EXPECT_TRUE(r.Resolve({1, 1500, 100, {3000}})->configured);
  auto unknown = r.Resolve({1, 1500, 100, {5}});
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->tenant, "uid=1500");
  EXPECT_FALSE(unknown->configured);
  // Two unknown users never share a tenant.
  EXPECT_NE(r.Resolve({1, 1501, 100, {}})->tenant, unknown->tenant);
}

TEST(Tenants, UnknownPeersAreRefusedWhenConfigSaysSo) {
  TenantResolver r(TwoTenants(false), 999);
  auto g = r.Resolve({1, 1500, 100, {}});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(g.status().message().find("uid 1500"), std::string::npos);
  EXPECT_TRUE(r.Resolve({1, 1000, 100, {}}).ok());
  // An admin is never locked out; it gets a tenant of its own.
  auto admin = r.Resolve({1, 4000, 100, {}});
  ASSERT_TRUE(admin.ok());
  EXPECT_EQ(admin->tenant, "uid=4000");
}

TEST(Tenants, AdminsAreRootTheDaemonAndTheConfiguredUids) {
  TenantResolver r(TwoTenants(true), 999);
  EXPECT_TRUE(r.IsAdmin(0));
  EXPECT_TRUE(r.IsAdmin(999));
  EXPECT_TRUE(r.IsAdmin(4000));
  EXPECT_FALSE(r.IsAdmin(1000));
  EXPECT_TRUE(r.Resolve({1, 4000, 4000, {}})->admin);
  EXPECT_FALSE(r.Resolve({1, 1000, 4000, {}})->admin);
}

}  // namespace
}  // namespace kvtier
