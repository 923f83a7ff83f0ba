// SIGHUP (systemctl reload kvtierd): the daemon keeps serving and applies what can change
// live — log_level, tenants and their quotas — names what waits for a restart, and a file
// that does not parse changes nothing.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <sstream>

#include "tests/integration/engine_process.h"

namespace kvtier::testing {
namespace {

void Rewrite(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  std::string text = all.str();
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in\n" << text;
  text.replace(at, from.size(), to);
  std::ofstream(path) << text;
}

TEST(Reload, SighupAppliesLogLevelAndQuotasNamesTheRestAndSurvivesABadFile) {
  DaemonProcess::Options o;  // 64 host pages of 1 MiB
  o.log_level = "info";
  o.extra_yaml = "security:\n  unknown_quota: {host: 0}\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Connect(EngineOptions(d.socket_path()));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto eight = (*c)->Allocate(TierKind::kHost, 8);
  ASSERT_TRUE(eight.ok()) << eight.status().ToString();
  ASSERT_TRUE((*c)->Release(TierKind::kHost, *eight, {}).ok());  // nothing held: the quota below is about new leases

  // A quota of 4 MiB for unknown tenants (this engine's), a bigger host pool, debug logs.
  Rewrite(d.config_path(), "unknown_quota: {host: 0}", "unknown_quota: {host: 4MiB}");
  Rewrite(d.config_path(), "log_level: info", "log_level: debug");
  Rewrite(d.config_path(), "capacity: 64MiB", "capacity: 128MiB");
  ASSERT_EQ(::kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitUntil([&] { return d.Log().find("SIGHUP: reloaded") != std::string::npos; })) << d.Log();
  const std::string log = d.Log();
  EXPECT_NE(log.find("changed, applied at the next restart: tiers"), std::string::npos) << log;
  auto refused = (*c)->Allocate(TierKind::kHost, 8);
  ASSERT_FALSE(refused.ok()) << "the reloaded quota applies to the session already attached";
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  EXPECT_TRUE((*c)->Allocate(TierKind::kHost, 4).ok());
  auto stats = StatsOf(d.socket_path());
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->tiers[0].capacity_pages, 64u) << "the pool's size is not reloaded";

  // A file that does not parse: an error in the log, the daemon serves on unchanged.
  Rewrite(d.config_path(), "unknown_quota: {host: 4MiB}", "unknown_quota: {host: lots}");
  ASSERT_EQ(::kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitUntil([&] { return d.Log().find("not reloaded, nothing changed") != std::string::npos; })) << d.Log();
  EXPECT_NE(d.Log().find("security.unknown_quota"), std::string::npos) << d.Log();
  EXPECT_FALSE((*c)->Allocate(TierKind::kHost, 1).ok()) << "the 4 MiB quota still holds";
  EXPECT_TRUE(StatsOf(d.socket_path()).ok());
  c->reset();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

}  // namespace
}  // namespace kvtier::testing
