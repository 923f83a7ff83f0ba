// Liveness through a real kvtierd, for any user: sessions of live processes that end or
// go silent leave their leased pages quarantined until the process exits; an engine in
// another PID namespace is watched by its pidfd; kvtierd speaks systemd's notify protocol.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "engine/control_client.h"
#include "tests/integration/engine_process.h"
#include "tests/integration/tenant_blocks.h"

namespace kvtier::testing {
namespace {

Result<TierStatsInfo> HostStats(const DaemonProcess& d) {
  KVTIER_ASSIGN_OR_RETURN(auto c, ControlClient::Connect(ControlOptions(d.socket_path())));
  KVTIER_ASSIGN_OR_RETURN(auto s, c->Stats());
  for (const auto& t : s.tiers) {
    if (t.tier == TierKind::kHost) return t;
  }
  return NotFound("no host tier");
}

// Polls until `pred` holds on the host tier's stats (5 s at most).
bool Eventually(const DaemonProcess& d, const std::function<bool(const TierStatsInfo&)>& pred) {
  return WaitUntil(
      [&] {
        auto t = HostStats(d);
        return t.ok() && pred(*t);
      },
      std::chrono::seconds(5));
}

TEST(Liveness, ASilentSessionExpiresAndItsLeasesWaitForItsProcessToExit) {
  DaemonProcess::Options o;
  o.extra_yaml = "protocol:\n  heartbeat_ttl: 300ms\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  Pipe leased, go;
  EngineProcess hung([&]() -> int {
    auto c = Client::Connect(EngineOptions(d.socket_path(), "hung"));
    if (!c.ok() || !(*c)->Allocate(TierKind::kHost, 3).ok()) return 10;
    leased.Signal();
    go.Wait();                          // silent, alive, still mapping its pages
    return (*c)->Ping().ok() ? 11 : 0;  // expired: the daemon closed it
  });
  ASSERT_TRUE(leased.Wait());
  EXPECT_TRUE(Eventually(d, [](const TierStatsInfo& t) { return t.leased_pages == 0 && t.quarantined_pages == 3; }))
      << d.Log();
  go.Signal();
  EXPECT_EQ(hung.Join(), 0);
  // The process is gone: the pages are free again.
  EXPECT_TRUE(Eventually(
      d, [](const TierStatsInfo& t) { return t.quarantined_pages == 0 && t.free_pages == t.capacity_pages; }));
  EXPECT_NE(d.Log().find("heartbeat_ttl"), std::string::npos);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(Liveness, AProcessThatClosesItsSocketButLivesHasItsLeasesQuarantined) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  Pipe closed, go;
  EngineProcess engine([&]() -> int {
    {
      auto c = Client::Connect(EngineOptions(d.socket_path(), "closer"));
      if (!c.ok() || !(*c)->Allocate(TierKind::kHost, 2).ok()) return 10;
    }  // the socket closes here; the process and its mappings live on
    closed.Signal();
    go.Wait();
    return 0;
  });
  ASSERT_TRUE(closed.Wait());
  EXPECT_TRUE(Eventually(d, [](const TierStatsInfo& t) { return t.quarantined_pages == 2 && t.leased_pages == 0; }));
  go.Signal();
  EXPECT_EQ(engine.Join(), 0);
  EXPECT_TRUE(Eventually(d, [](const TierStatsInfo& t) { return t.quarantined_pages == 0; }));
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// kvtierd in a PID namespace of its own, as a DaemonSet pod: SO_PEERCRED says pid 0 for
// every engine. An engine's session expires (heartbeat_ttl) while its process lives and
// still maps its 8 leased pages; another session stores 8 blocks; the stale process writes
// through its old mappings. The blocks read back intact (its pages were quarantined, not
// re-leased), kvctl's view names the engine by the pid it reported, and the pages come
// back once it exits.
TEST(Liveness, AnEngineInAnotherPidNamespaceKeepsItsStalePagesOutOfOthersHands) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a PID namespace";
  constexpr uint32_t kPages = 8;
  DaemonProcess::Options o;
  o.own_pid_namespace = true;
  o.host_capacity = "4MiB";  // 64 pages of 64 KiB, in 8 segments
  o.page_bytes = "64KiB";
  o.segment_bytes = "512KiB";
  o.extra_yaml = "protocol:\n  heartbeat_ttl: 2s\n";  // room to read its session before it expires
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  Pipe leased, go, wrote, done;
  EngineProcess stale([&]() -> int {
    auto c = Client::Connect(EngineOptions(d.socket_path(), "stale"));
    if (!c.ok()) return 10;
    auto pages = (*c)->Allocate(TierKind::kHost, kPages);
    if (!pages.ok()) return 11;
    std::vector<uint8_t*> views;
    for (PageId p : *pages) views.push_back(static_cast<uint8_t*>((*c)->PageAddress(TierKind::kHost, p)));
    leased.Signal();
    go.Wait();                                              // silent until expired, mappings kept
    for (uint8_t* v : views) std::memset(v, 0x41, kBlock);  // the late writes of a stale engine
    wrote.Signal();
    done.Wait();
    return 0;
  });
  ASSERT_TRUE(leased.Wait());
  // The daemon cannot see the engine's pid, yet watches its process and shows the pid the
  // engine reported.
  auto st = StatsOf(d.socket_path(), /*with_sessions=*/true);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  bool seen = false;
  for (const auto& x : st->sessions) {
    if (x.engine_name != "stale") continue;
    seen = true;
    EXPECT_EQ(x.pid, 0) << "kvtierd is in a PID namespace of its own";
    EXPECT_EQ(x.engine_pid, stale.pid());
    EXPECT_TRUE(x.watched);
  }
  EXPECT_TRUE(seen);
  EXPECT_TRUE(Eventually(d, [](const TierStatsInfo& t) {
    return t.quarantined_pages == kPages && t.leased_pages == 0;
  })) << d.Log();
  // Another engine of the same tenant and model stores into the pool meanwhile.
  const auto chain = HashChain(0x5ea1, kPages);
  {
    auto victim = Client::Connect(EngineOptions(d.socket_path(), "victim"));
    ASSERT_TRUE(victim.ok());
    ASSERT_TRUE(Store(**victim, TierKind::kHost, chain, 1).ok());
  }
  go.Signal();
  ASSERT_TRUE(wrote.Wait());
  auto reader = Client::Connect(EngineOptions(d.socket_path(), "reader"));
  ASSERT_TRUE(reader.ok());
  const Hits h = Probe(**reader, chain, 1);
  EXPECT_EQ(h.verified, kPages);
  EXPECT_EQ(h.foreign, 0u) << "blocks served with a stale engine's bytes";
  done.Signal();
  EXPECT_EQ(stale.Join(), 0);
  EXPECT_TRUE(Eventually(d, [](const TierStatsInfo& t) { return t.quarantined_pages == 0; })) << d.Log();
  EXPECT_NE(d.Log().find("in its own PID namespace"), std::string::npos) << d.Log();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// On a kernel without SO_PEERPIDFD (a seccomp filter refuses it here) kvtierd cannot watch
// an engine in another PID namespace: it says so once, shows the session unwatched, and
// keeps the pages of such a session that ended quarantined even after the process is gone
// (nothing tells it when), rather than re-leasing them under a process that may live.
TEST(Liveness, AProcessThatCannotBeWatchedKeepsItsPagesQuarantinedUntilARestart) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a PID namespace";
  DaemonProcess::Options o;
  o.own_pid_namespace = true;
  o.without_peer_pidfd = true;
  o.log_level = "notice";  // the polls below are control sessions, unwatched too: no hello lines
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  for (int round = 0; round < 2; ++round) {
    Pipe leased, close, closed, go;
    EngineProcess engine([&]() -> int {
      auto c = Client::Connect(EngineOptions(d.socket_path(), "unwatched"));
      if (!c.ok() || !(*c)->Allocate(TierKind::kHost, 2).ok()) return 10;
      leased.Signal();
      close.Wait();
      (*c)->Close();  // the session ends; the process lives
      closed.Signal();
      go.Wait();
      return 0;
    });
    ASSERT_TRUE(leased.Wait());
    auto st = StatsOf(d.socket_path(), /*with_sessions=*/true);
    ASSERT_TRUE(st.ok());
    for (const auto& x : st->sessions) {
      if (x.engine_name == "unwatched") {
        EXPECT_FALSE(x.watched);
      }
    }
    close.Signal();
    ASSERT_TRUE(closed.Wait());
    const uint32_t held = 2 * (round + 1);
    EXPECT_TRUE(Eventually(d, [&](const TierStatsInfo& t) { return t.quarantined_pages == held; })) << d.Log();
    go.Signal();
    EXPECT_EQ(engine.Join(), 0);
    // The process is gone, but kvtierd cannot know: the pages stay out of use.
    EXPECT_FALSE(WaitUntil(
        [&] {
          auto t = HostStats(d);
          return t.ok() && t->quarantined_pages != held;
        },
        std::chrono::seconds(1)));
  }
  const std::string log = d.Log();
  const size_t first = log.find("cannot be watched");
  EXPECT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find("cannot be watched", first + 1), std::string::npos) << "said more than once";
  EXPECT_GE(Metric(MetricsUrl(d), "kvtier_sessions_unwatched_total"), 2.0);  // the engines, and the polls
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(Liveness, KvtierdTellsSystemdReadyWatchdogAndStopping) {
  TempDir dir;
  const std::string path = dir.File("notify");
  int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(s, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  DaemonProcess::Options o;
  o.env = {"NOTIFY_SOCKET=" + path, "WATCHDOG_USEC=400000"};
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  std::string got;
  int watchdogs = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < until && watchdogs < 3) {
    pollfd p{s, POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) continue;
    char buf[512];
    const ssize_t n = ::recv(s, buf, sizeof(buf), 0);
    if (n <= 0) continue;
    const std::string msg(buf, static_cast<size_t>(n));
    got += msg + "\n";
    if (msg.find("WATCHDOG=1") != std::string::npos) ++watchdogs;
  }
  EXPECT_NE(got.find("READY=1"), std::string::npos) << got;
  EXPECT_EQ(watchdogs, 3) << got;  // every 200 ms: half the interval
  EXPECT_EQ(d.Stop(), 0);
  char buf[512];
  std::string tail;
  for (int i = 0; i < 20; ++i) {
    pollfd p{s, POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) break;
    const ssize_t n = ::recv(s, buf, sizeof(buf), 0);
    if (n > 0) tail.append(buf, static_cast<size_t>(n));
  }
  EXPECT_NE(tail.find("STOPPING=1"), std::string::npos) << tail;
  ::close(s);
}

}  // namespace
}  // namespace kvtier::testing
