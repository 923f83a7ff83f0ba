// Agentic sessions' hints through a real kvtierd (SessionHint): a live session's blocks
// outlive the tenant's others under pressure, an ended session's go first, protection is
// capped at the tenant's share and never blocks an allocation, lapses with its TTL, and is
// a tenant's own to give; bad hints are refused by name.
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "engine/control_client.h"
#include "tests/integration/engine_process.h"
#include "tests/integration/tenant_blocks.h"

namespace kvtier::testing {
namespace {

// 16 host pages of 64 KiB, one block each, evicted only to make room for an Allocate (no
// watermark, no headroom): each test's evictions are the ones it asks for.
DaemonProcess::Options SixteenPages(const std::string& extra = "") {
  DaemonProcess::Options o;
  o.host_capacity = "1MiB";
  o.page_bytes = "64KiB";
  o.segment_bytes = "1MiB";
  o.host_yaml = "    high_watermark: 1\n    low_watermark: 0.99\n    allocation_headroom: 0\n";
  o.extra_yaml = "security:\n  max_leased_share: 1\n" + extra;
  return o;
}

size_t Matched(Client& c, const std::vector<BlockHash>& chain) {
  auto l = c.Lookup(chain);
  return l.ok() ? l->matched : 0;
}

TEST(AgentSessions, ALiveSessionsBlocksOutliveTheTenantsOthersUnderPressure) {
  DaemonProcess d(SixteenPages());
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Connect(EngineOptions(d.socket_path(), "agent"));
  ASSERT_TRUE(c.ok());
  const auto x = HashChain(0xa1, 4), y = HashChain(0xb1, 4);
  ASSERT_TRUE(Store(**c, TierKind::kHost, x, 1).ok());  // x is older than y
  auto named = (*c)->Hint("agent-1", x, 60'000);
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  EXPECT_EQ(*named, 4u);
  ASSERT_TRUE(Store(**c, TierKind::kHost, y, 1).ok());
  // 12 more blocks in the 8 pages left: the 4 evicted are the oldest unprotected: y's.
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(Store(**c, TierKind::kHost, HashChain(0xc1 + i, 4), 1).ok());
  EXPECT_EQ(Matched(**c, x), 4u) << "the live session's blocks were evicted";
  EXPECT_LT(Matched(**c, y), 4u);
  const std::string url = MetricsUrl(d);
  EXPECT_GE(Metric(url, "kvtier_session_hints_total"), 1.0);
  EXPECT_EQ(Metric(url, "kvtier_protected_blocks{tier=\"host\"}"), 4.0);
  EXPECT_EQ(Metric(url, "kvtier_agent_sessions{state=\"live\"}"), 1.0);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(AgentSessions, AnEndedSessionsBlocksGoBeforeAnyoneElses) {
  DaemonProcess d(SixteenPages());
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Connect(EngineOptions(d.socket_path(), "agent"));
  ASSERT_TRUE(c.ok());
  const auto y = HashChain(0xb2, 4), x = HashChain(0xa2, 4);
  ASSERT_TRUE(Store(**c, TierKind::kHost, y, 1).ok());  // y is older than x
  ASSERT_TRUE(Store(**c, TierKind::kHost, x, 1).ok());
  ASSERT_TRUE((*c)->Hint("agent-2", x, 60'000, /*end=*/true).ok());
  // 12 more blocks in the 8 pages left: the 4 evicted are the ended session's, not y's.
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(Store(**c, TierKind::kHost, HashChain(0xc2 + i, 4), 1).ok());
  EXPECT_EQ(Matched(**c, y), 4u) << "an older block went before the ended session's";
  EXPECT_LT(Matched(**c, x), 4u);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(AgentSessions, ProtectionStopsAtTheTenantsShareNeverBlocksAnAllocationAndLapsesWithItsTtl) {
  DaemonProcess d(SixteenPages("sessions:\n  protected_share: 0.25\n"));  // 4 of 16 pages
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Connect(EngineOptions(d.socket_path(), "agent"));
  ASSERT_TRUE(c.ok());
  const auto x = HashChain(0xa3, 8);
  ASSERT_TRUE(Store(**c, TierKind::kHost, x, 1).ok());
  auto first = (*c)->Hint("agent-3", x, 60'000);
  ASSERT_TRUE(first.ok()) << first.status().ToString() << d.Log();
  const std::string url = MetricsUrl(d);
  EXPECT_EQ(Metric(url, "kvtier_protected_blocks{tier=\"host\"}"), 4.0);
  EXPECT_GE(Metric(url, "kvtier_session_protection_over_share_total"), 4.0);
  // Every page at once: protected blocks go too, last.
  auto pages = (*c)->Allocate(TierKind::kHost, 16);
  ASSERT_TRUE(pages.ok()) << pages.status().ToString();
  ASSERT_TRUE((*c)->Release(TierKind::kHost, *pages).ok());
  // A TTL that runs out lapses by itself.
  ASSERT_TRUE(Store(**c, TierKind::kHost, x, 1).ok());
  auto again = (*c)->Hint("agent-4", x, 1500);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 8u);
  EXPECT_GT(Metric(url, "kvtier_protected_blocks{tier=\"host\"}"), 0.0);
  EXPECT_TRUE(
      WaitUntil([&] { return Metric(url, "kvtier_protected_blocks{tier=\"host\"}") == 0.0; }, std::chrono::seconds(5)));
  EXPECT_GE(Metric(url, "kvtier_agent_sessions_expired_total"), 1.0);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(AgentSessions, BadHintsAreRefusedByNameAndSessionsAreBounded) {
  DaemonProcess d(SixteenPages("sessions:\n  max_per_tenant: 2\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Connect(EngineOptions(d.socket_path(), "agent"));
  ASSERT_TRUE(c.ok());
  const auto x = HashChain(0xa4, 2);
  auto empty = (*c)->Hint("", x);
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("session id"), std::string::npos);
  EXPECT_EQ((*c)->Hint(std::string(300, 's'), x).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*c)->Hint("agent", x, -5).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE((*c)->Hint("one", x, 1000).ok());
  ASSERT_TRUE((*c)->Hint("two", x, 1000).ok());
  auto third = (*c)->Hint("three", x, 1000);
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("sessions.max_per_tenant"), std::string::npos);
  EXPECT_TRUE((*c)->Hint("one", x, 1000).ok());  // a known session still is
  EXPECT_GE(Metric(MetricsUrl(d), "kvtier_session_hints_refused_total"), 1.0);
  EXPECT_TRUE((*c)->Ping().ok());  // the session serves on
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

nlohmann::json Kvctl(const DaemonProcess& d, const std::string& args, int want_code = 0) {
  CmdResult r = Sh(BinaryPath("kvctl") + " " + args + " --json --socket " + d.socket_path());
  EXPECT_EQ(r.code, want_code) << args << "\n" << r.out;
  return r.code == 0 ? nlohmann::json::parse(r.out, nullptr, false) : nlohmann::json();
}

// kvctl agents lists what hints made; kvctl hint is an operator's hint by namespace.
TEST(AgentSessions, KvctlListsSessionsAndAnOperatorEndsOne) {
  DaemonProcess d(SixteenPages());
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Connect(EngineOptions(d.socket_path(), "agent"));
  ASSERT_TRUE(c.ok());
  const auto x = HashChain(0xa6, 4);
  ASSERT_TRUE(Store(**c, TierKind::kHost, x, 1).ok());
  ASSERT_TRUE((*c)->Hint("agent-6", x, 60'000, false, /*hit_tokens=*/48).ok());
  ASSERT_TRUE((*c)->Hint("agent-6", x, -1, false, 16).ok());
  auto listed = Kvctl(d, "agents")["agent_sessions"];
  ASSERT_EQ(listed.size(), 1u) << listed.dump();
  const auto& a = listed[0];
  EXPECT_EQ(a["session"], "agent-6");
  EXPECT_EQ(a["state"], "live");
  EXPECT_GT(a["ttl_left_s"].get<double>(), 50.0);
  EXPECT_EQ(a["requests"], 2);
  EXPECT_EQ(a["hit_tokens"], 64);
  EXPECT_EQ(a["blocks"], 4);
  EXPECT_EQ(a["host_blocks"], 4);
  EXPECT_EQ(a["protected_blocks"], 4);
  EXPECT_EQ(Metric(MetricsUrl(d), "kvtier_session_hit_tokens_total"), 64.0);
  // A TTL past what nanoseconds hold (the fuzzer found one) is clamped to sessions.max_ttl
  // (1 h), not wrapped: this one's nanoseconds wrap to 0.45 ms.
  constexpr int64_t kWraps = 18'446'744'073'710;  // x 10^6 = 2^64 + 448,384
  ASSERT_TRUE((*c)->Hint("agent-long", x, kWraps).ok());
  const nlohmann::json agents = Kvctl(d, "agents")["agent_sessions"];
  ASSERT_EQ(agents.size(), 2u) << agents.dump();
  const nlohmann::json& long_one = agents[1];
  EXPECT_EQ(long_one["session"], "agent-long");
  EXPECT_EQ(long_one["state"], "live") << long_one.dump();
  EXPECT_GT(long_one["ttl_left_s"].get<double>(), 3500.0) << long_one.dump();
  EXPECT_LE(long_one["ttl_left_s"].get<double>(), 3600.0) << long_one.dump();
  ASSERT_TRUE((*c)->Hint("agent-long", x, 0, /*end=*/true).ok());
  std::string chain;
  for (const BlockHash& h : x) chain += " " + h.Hex();
  const std::string ns = (*c)->namespace_id();
  auto ended = Kvctl(d, "hint -n " + ns + " --session agent-6 --end" + chain);
  EXPECT_EQ(ended["blocks"], 4);
  const auto after = Kvctl(d, "agents")["agent_sessions"][0];
  EXPECT_EQ(after["state"], "ended");
  EXPECT_EQ(after["protected_blocks"], 0);
  Kvctl(d, "hint -n 00000000000000000000000000000000 --session s" + chain, 1);  // no such namespace
  Kvctl(d, "hint -n " + ns + " --session s nothex", 2);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// A router's prefetch hint reads a session's chain up from NVMe into free host pages before
// its next turn, and goes on after kvctl, which sent it, has gone; a hint without it moves
// nothing.
TEST(AgentSessions, APrefetchHintReadsTheChainUpFromNvmeBeforeTheNextTurn) {
  DaemonProcess::Options o = SixteenPages();
  o.host_capacity = "4MiB";  // 64 pages
  o.nvme_capacity = "8MiB";
  o.nvme_yaml = "    write_policy: write_through\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Connect(EngineOptions(d.socket_path(), "agent"));
  ASSERT_TRUE(c.ok());
  const auto x = HashChain(0xa7, 40);  // longer than the part of a walk read on the control thread
  ASSERT_TRUE(Store(**c, TierKind::kHost, x, 1).ok());
  auto nvme_blocks = [&] {
    auto s = StatsOf(d.socket_path());
    for (const auto& t : s.ok() ? s->tiers : std::vector<TierStatsInfo>{}) {
      if (t.tier == TierKind::kNvme) return t.blocks;
    }
    return uint64_t{0};
  };
  ASSERT_TRUE(WaitUntil([&] { return nvme_blocks() >= x.size(); })) << d.Log();
  auto admin = ControlClient::Connect(ControlOptions(d.socket_path()));
  ASSERT_TRUE(admin.ok());
  ASSERT_TRUE((*admin)->Evict(TierKind::kHost, 4u << 20).ok());  // the session's tool pause
  auto in = [&](TierKind tier) {
    auto l = (*c)->Lookup(x);
    if (!l.ok() || l->matched != x.size()) return size_t{0};
    return static_cast<size_t>(std::count(l->tiers.begin(), l->tiers.end(), tier));
  };
  ASSERT_EQ(in(TierKind::kNvme), x.size());
  std::string chain;
  for (const BlockHash& h : x) chain += " " + h.Hex();
  const std::string ns = (*c)->namespace_id();
  EXPECT_EQ(Kvctl(d, "hint -n " + ns + " --session agent-7 --ttl 60" + chain)["blocks"], 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(in(TierKind::kNvme), x.size()) << "a hint without --prefetch moved blocks";
  const std::string url = MetricsUrl(d);
  const double hits = Metric(url, "kvtier_block_hits_total{tier=\"nvme\"}");
  auto sent = Kvctl(d, "hint -n " + ns + " --session agent-7 --prefetch" + chain);
  EXPECT_EQ(sent["prefetch"], true);
  EXPECT_TRUE(WaitUntil([&] { return Metric(url, "kvtier_prefetches_total") == static_cast<double>(x.size()); }))
      << d.Log();
  EXPECT_EQ(Metric(url, "kvtier_block_hits_total{tier=\"nvme\"}"), hits) << "the prefetch counted as a lookup";
  EXPECT_TRUE(WaitUntil([&] { return in(TierKind::kHost) == x.size(); }, std::chrono::seconds(10)))
      << "host " << in(TierKind::kHost) << " of " << x.size() << "\n"
      << d.Log();
  // The turn arrives: its hint names the whole chain, now in the host tier, and protects it
  // up to the tenant's share (sessions.protected_share 0.5 of 64 pages).
  auto named = (*c)->Hint("agent-7", x, 60'000);
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(*named, x.size());
  EXPECT_EQ(Metric(url, "kvtier_protected_blocks{tier=\"host\"}"), 32.0);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// `body` in a child process run as `uid` in group `group` (the socket's): its exit code.
int AsUser(uid_t uid, gid_t group, const std::function<int()>& body) {
  EngineProcess p([&]() -> int {
    const gid_t groups[1] = {group};
    if (::setgroups(1, groups) != 0 || ::setgid(group) != 0 || ::setuid(uid) != 0) return 30;
    return body();
  });
  return p.Join();
}

constexpr gid_t kEngines = 41100;
constexpr uid_t kOwner = 41101, kOther = 41102;

// SixteenPages with tenants team_a (kOwner) and team_b (kOther), engines in kEngines.
DaemonProcess::Options TwoTenants(const std::string& extra = "") {
  DaemonProcess::Options o =
      SixteenPages("  tenants: [{name: team_a, uids: [41101]}, {name: team_b, uids: [41102]}]\n" + extra);
  o.socket_yaml = "  group: " + std::to_string(kEngines) + "\n";
  o.segment_bytes = "256KiB";  // a segment is one tenant's: 4 segments of 4 pages
  return o;
}

// A tenant's protection stops at its share of the tier while another tenant allocates: the
// other's allocation takes the tenant's unprotected blocks first (newer ones too), then the
// protected ones (never refused for them).
TEST(AgentSessions, ATenantsProtectionStopsAtItsShareWhileAnotherTenantAllocates) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run engines as two tenants";
  DaemonProcess d(TwoTenants("sessions:\n  protected_share: 0.25\n"));  // 4 of 16 pages
  ASSERT_EQ(::chmod(d.dir().c_str(), 0755), 0);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const auto y = HashChain(0xa8, 4), x = HashChain(0xb8, 4);
  // y (older) and x, a segment each; y's session takes the share, x's gets none of it.
  ASSERT_EQ(AsUser(kOwner, kEngines,
                   [&]() -> int {
                     auto c = Client::Connect(EngineOptions(d.socket_path(), "team-a-engine"));
                     if (!c.ok() || !Store(**c, TierKind::kHost, y, 1).ok()) return 31;
                     if (!Store(**c, TierKind::kHost, x, 1).ok()) return 32;
                     auto hy = (*c)->Hint("a-y", y, 600'000);
                     auto hx = (*c)->Hint("a-x", x, 600'000);
                     return hy.ok() && hx.ok() && *hy == 4 && *hx == 4 ? 0 : 33;
                   }),
            0);
  const std::string url = MetricsUrl(d);
  EXPECT_EQ(Metric(url, "kvtier_protected_blocks{tier=\"host\"}"), 4.0);
  EXPECT_GE(Metric(url, "kvtier_session_protection_over_share_total"), 4.0);
  auto team_b_allocates = [&](uint32_t pages) {
    return AsUser(kOther, kEngines, [&]() -> int {
      auto c = Client::Connect(EngineOptions(d.socket_path(), "team-b-engine"));
      if (!c.ok()) return 40;
      auto p = (*c)->Allocate(TierKind::kHost, pages);
      return p.ok() && p->size() == pages ? 0 : 41;
    });
  };
  auto host_blocks = [&](const std::string& session) {
    const nlohmann::json listed = Kvctl(d, "agents");
    for (const auto& s : listed["agent_sessions"]) {
      if (s["session"] == session) return s["host_blocks"].get<int>();
    }
    return -1;
  };
  // 8 free pages and one of team_a's segments: x's, though y is older.
  ASSERT_EQ(team_b_allocates(12), 0) << d.Log();
  EXPECT_EQ(host_blocks("a-y"), 4);
  EXPECT_EQ(host_blocks("a-x"), 0);
  // Every page: the protected blocks go too.
  ASSERT_EQ(team_b_allocates(16), 0) << d.Log();
  EXPECT_EQ(host_blocks("a-y"), 0);
  EXPECT_EQ(Metric(url, "kvtier_protected_blocks{tier=\"host\"}"), 0.0);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// Routers and operators hint through control sessions, for namespaces of their own tenant
// (an admin's: any); another tenant's is refused.
TEST(AgentSessions, ARouterHintsItsTenantsNamespaceAndNoOneElses) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a router as another user";
  DaemonProcess d(TwoTenants());
  ASSERT_EQ(::chmod(d.dir().c_str(), 0755), 0);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const auto x = HashChain(0xa5, 4);
  // team_a's engine stores x; its namespace is what routers name.
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  auto as = [&](uid_t uid, const std::function<int()>& body) { return AsUser(uid, kEngines, body); };
  std::string ns;
  ASSERT_EQ(as(kOwner,
               [&]() -> int {
                 auto c = Client::Connect(EngineOptions(d.socket_path(), "team-a-engine"));
                 if (!c.ok() || !Store(**c, TierKind::kHost, x, 1).ok()) return 31;
                 const std::string id = (*c)->namespace_id();
                 return ::write(report[1], id.data(), id.size()) == static_cast<ssize_t>(id.size()) ? 0 : 32;
               }),
            0);
  ::close(report[1]);
  char buf[128];
  const ssize_t n = ::read(report[0], buf, sizeof(buf));
  ::close(report[0]);
  ASSERT_GT(n, 0);
  ns.assign(buf, static_cast<size_t>(n));
  auto hint = [&](uid_t uid) {
    return as(uid, [&]() -> int {
      auto r = ControlClient::Connect(ControlOptions(d.socket_path()));
      if (!r.ok()) return 40;
      auto h = (*r)->Hint(ns, "router-session", x, 30'000);
      if (h.ok()) return *h == 4 ? 0 : 41;
      return h.status().code() == StatusCode::kPermissionDenied ? 42 : 43;
    });
  };
  EXPECT_EQ(hint(kOther), 42) << "another tenant's router hinted team_a's namespace";
  EXPECT_EQ(hint(kOwner), 0);
  // kvtierd's own uid (root here) is an admin: any namespace.
  auto admin = ControlClient::Connect(ControlOptions(d.socket_path()));
  ASSERT_TRUE(admin.ok());
  auto h = (*admin)->Hint(ns, "operator", x, 30'000, /*end=*/true);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(*h, 4u);
  EXPECT_EQ((*admin)->Hint("0000000000000000", "operator", x).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

}  // namespace
}  // namespace kvtier::testing
