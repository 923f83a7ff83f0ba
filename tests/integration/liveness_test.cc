// Liveness through a real kvtierd, for any user: sessions of live processes that end or
// go silent leave their leased pages quarantined until the process exits; an engine in
// another PID namespace is watched by its pidfd; kvtierd speaks systemd's notify protocol.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
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

// A page leased before the engines a test forks lease theirs, by a process of the same
// tenant (root): their segment stays in use, so their quarantined pages wait for their
// process (a segment holding nothing but quarantined pages gives them back at once,
// renewed). A process of its own, so the test's stays single-threaded for its forks (TSan
// starts no thread in a child forked from a multi-threaded process).
class Keeper {
 public:
  explicit Keeper(const DaemonProcess& d)
      : proc_([this, &d]() -> int {
          auto c = Client::Connect(EngineOptions(d.socket_path(), "keeper"));
          if (!c.ok() || !(*c)->Allocate(TierKind::kHost, 1).ok()) return 10;
          leased_.Signal();
          if (end_.Wait()) {
            (*c)->Close();  // its page quarantined while this process lives
            ended_.Signal();
            exit_.Wait();
          }
          return 0;
        }) {
    EXPECT_TRUE(leased_.Wait()) << "the keeper could not lease its page";
  }
  ~Keeper() {
    exit_.Signal();
    end_.Signal();
    EXPECT_EQ(proc_.Join(), 0);
  }
  // Its session ends; the process lives.
  void EndSession() {
    end_.Signal();
    EXPECT_TRUE(ended_.Wait());
  }

 private:
  Pipe leased_, end_, ended_, exit_;
  EngineProcess proc_;
};

// Every page of the pool but the keeper's is free.
bool AllButTheKeepersFree(const TierStatsInfo& t) {
  return t.quarantined_pages == 0 && t.free_pages + 1 == t.capacity_pages;
}

// A process that opens a session, leases a page and closes it, again and again, leaves a
// quarantine each time; one descriptor watches them all (a dup of its pidfd each once took
// kvtierd to its descriptor limit), and they all end when it exits.
TEST(Liveness, OneDescriptorWatchesEveryQuarantineOfAProcess) {
  DaemonProcess::Options o;   // 64 host pages
  o.segment_bytes = "64MiB";  // in one segment, with the keeper's
  o.extra_yaml = "security:\n  max_leased_share: 1\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  Keeper keeper(d);
  const std::string url = MetricsUrl(d);
  const double fds_before = Metric(url, "process_open_fds");
  constexpr int kRounds = 40;
  Pipe done, go;
  EngineProcess churn([&]() -> int {
    for (int i = 0; i < kRounds; ++i) {
      auto c = Client::Connect(EngineOptions(d.socket_path(), "churn"));
      if (!c.ok() || !(*c)->Allocate(TierKind::kHost, 1).ok()) return 10 + i;
    }  // each session ends with its page leased, while this process lives
    done.Signal();
    go.Wait();
    return 0;
  });
  ASSERT_TRUE(done.Wait());
  EXPECT_TRUE(Eventually(d, [](const TierStatsInfo& t) { return t.quarantined_pages == kRounds; })) << d.Log();
  EXPECT_EQ(Metric(url, "kvtier_quarantines"), kRounds);
  EXPECT_EQ(Metric(url, "kvtier_quarantine_watches"), 1.0);
  EXPECT_LT(Metric(url, "process_open_fds"), fds_before + 5) << "a descriptor per quarantine";
  go.Signal();
  EXPECT_EQ(churn.Join(), 0);
  EXPECT_TRUE(Eventually(d, AllButTheKeepersFree));
  EXPECT_EQ(Metric(url, "kvtier_quarantine_watches"), 0.0);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// A process that stops running (SIGSTOP; its client's keepalive thread stops with it) is
// expired after protocol.heartbeat_ttl; its leases wait for it to exit, and it is told why.
TEST(Liveness, AStoppedSessionExpiresAndItsLeasesWaitForItsProcessToExit) {
  DaemonProcess::Options o;
  o.extra_yaml = "protocol:\n  heartbeat_ttl: 300ms\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  Keeper keeper(d);
  Pipe leased, go;
  EngineProcess hung([&]() -> int {
    auto c = Client::Connect(EngineOptions(d.socket_path(), "hung"));
    if (!c.ok() || !(*c)->Allocate(TierKind::kHost, 3).ok()) return 10;
    leased.Signal();
    go.Wait();  // stopped here, still mapping its pages
    const Status alive = (*c)->Alive();
    if (alive.code() != StatusCode::kAborted || alive.message().find("heartbeat_ttl") == std::string::npos) return 11;
    return (*c)->Ping().ok() ? 12 : 0;  // expired: the daemon closed it
  });
  ASSERT_TRUE(leased.Wait());
  ASSERT_EQ(::kill(hung.pid(), SIGSTOP), 0);
  EXPECT_TRUE(Eventually(
      d, [](const TierStatsInfo& t) { return t.leased_pages == 1 && t.quarantined_pages == 3; }))  // 1: the keeper's
      << d.Log();
  ASSERT_EQ(::kill(hung.pid(), SIGCONT), 0);
  go.Signal();
  EXPECT_EQ(hung.Join(), 0);
  // The process is gone: the pages are free again.
  EXPECT_TRUE(Eventually(d, AllButTheKeepersFree));
  EXPECT_NE(d.Log().find("heartbeat_ttl"), std::string::npos);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// A small host tier for the tests below: 16 pages of 64 KiB in one segment.
DaemonProcess::Options SmallHost(const std::string& extra_yaml = "") {
  DaemonProcess::Options o;
  o.host_capacity = "1MiB";
  o.page_bytes = "64KiB";
  o.segment_bytes = "1MiB";
  o.extra_yaml = extra_yaml;
  return o;
}

// A quiet engine (a long prefill, a GC pause, a loaded host) holds references past the
// TTL: its client's keepalives keep the session, so the blocks it reads are not re-leased
// and rewritten under it while others store (issue: 4 of 4 pages read with other bytes).
TEST(Liveness, AQuietEngineKeepsItsReferencesPastTheHeartbeatTtl) {
  DaemonProcess d(SmallHost("protocol:\n  heartbeat_ttl: 300ms\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const auto chain = HashChain(0x9e1d, 4);
  {
    auto writer = Client::Connect(EngineOptions(d.socket_path(), "writer"));
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(Store(**writer, TierKind::kHost, chain, 1).ok());
  }
  auto reader = Client::Connect(EngineOptions(d.socket_path(), "reader"));
  ASSERT_TRUE(reader.ok());
  auto held = (*reader)->Acquire(chain);
  ASSERT_TRUE(held.ok());
  for (const auto& r : *held) ASSERT_TRUE(r.status.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // four TTLs without a call
  // 32 blocks into the 12 pages the reader does not hold: every cached page is re-leased.
  {
    auto writer = Client::Connect(EngineOptions(d.socket_path(), "churn"));
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(Store(**writer, TierKind::kHost, HashChain(0xc4u, 32), 2).ok());
  }
  size_t intact = 0;
  for (size_t i = 0; i < held->size(); ++i) {
    intact += CheckPage(**reader, TierKind::kHost, (*held)[i].page, Salted(chain[i], 1), kBlock);
  }
  EXPECT_EQ(intact, chain.size()) << "pages read with other blocks' bytes";
  EXPECT_TRUE((*reader)->Alive().ok());
  EXPECT_TRUE((*reader)->Ping().ok());
  EXPECT_EQ(d.Log().find("heartbeat_ttl: expired"), std::string::npos) << d.Log();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// An engine stopped in the middle of a load (SIGSTOP past the TTL) loses its session and
// its references; the blocks' pages are re-leased and rewritten. When it runs again, the
// scatter reads whatever is there, and FinishLoad fails the load (kAborted) so that the
// engine recomputes instead of using those bytes.
TEST(Liveness, AnEngineStoppedDuringALoadFailsTheLoadItsExpiredSessionHeld) {
  DaemonProcess d(SmallHost("protocol:\n  heartbeat_ttl: 300ms\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const ModelLayout layout = TestLayout();
  const auto chain = HashChain(0x57a1, 4);
  {
    auto writer = Client::Connect(EngineOptions(d.socket_path(), "writer"));
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(Store(**writer, TierKind::kHost, chain, 1).ok());
  }
  Pipe started, go;
  EngineProcess engine([&]() -> int {
    auto c = Client::Connect(EngineOptions(d.socket_path(), "stopped"));
    if (!c.ok()) return 10;
    constexpr uint32_t kBlocks = 8;
    const uint64_t layer_bytes = layout.block_bytes / layout.num_layers * kBlocks;
    std::vector<std::vector<uint8_t>> layers(layout.num_layers, std::vector<uint8_t>(layer_bytes));
    EngineKv kv;
    kv.num_blocks = kBlocks;
    for (auto& l : layers) kv.layers.push_back(l.data());
    const std::vector<uint32_t> blocks = {0, 1, 2, 3};
    auto load = (*c)->StartLoad(kv, chain, blocks);
    if (!load.ok() || load->loaded() != chain.size()) return 11;
    started.Signal();
    go.Wait();  // stopped here, holding the blocks
    if (!(*c)->ScatterLayers(*load, 0, layout.num_layers, nullptr, true).ok()) return 12;
    const Status finished = (*c)->FinishLoad(*load);
    if (finished.code() != StatusCode::kAborted) return 13;
    // LoadBlocks says the same for a load whose session has ended.
    auto again = (*c)->LoadBlocks(kv, chain, blocks);
    return again.ok() ? 14 : 0;
  });
  ASSERT_TRUE(started.Wait());
  ASSERT_EQ(::kill(engine.pid(), SIGSTOP), 0);
  EXPECT_TRUE(
      WaitUntil([&] { return d.Log().find("heartbeat_ttl: expired") != std::string::npos; }, std::chrono::seconds(5)))
      << d.Log();
  {
    auto writer = Client::Connect(EngineOptions(d.socket_path(), "churn"));
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE(Store(**writer, TierKind::kHost, HashChain(0xc5u, 32), 2).ok());
  }
  ASSERT_EQ(::kill(engine.pid(), SIGCONT), 0);
  go.Signal();
  EXPECT_EQ(engine.Join(), 0);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// A process forked from an engine after it leased pages (multiprocessing's fork, a
// daemonizing launcher) outlives it, holding the socket. Its pool mappings were not
// inherited: its writes fault instead of landing in pages the daemon gives others, and the
// daemon keeps the exited engine's leases quarantined until the socket's last holder is
// gone (issue: 0 of 8 blocks read back intact).
TEST(Liveness, AChildForkedFromAnEngineNeverWritesPagesTheDaemonGaveOthers) {
  constexpr uint32_t kPages = 8;
  DaemonProcess::Options o = SmallHost();
  o.host_capacity = o.segment_bytes = "4MiB";  // 64 pages: the keeper's 1, the engine's 8 and the victim's 8 stay under
                                               // the watermark and the tenant's share
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  Keeper keeper(d);
  int report[2];
  ASSERT_EQ(::pipe(report), 0);  // the child writes a byte there if its writes went through
  Pipe forked, go;
  EngineProcess parent([&]() -> int {
    auto c = Client::Connect(EngineOptions(d.socket_path(), "forking"));
    if (!c.ok()) return 10;
    auto pages = (*c)->Allocate(TierKind::kHost, kPages);
    if (!pages.ok()) return 11;
    std::vector<uint8_t*> views;
    for (PageId p : *pages) views.push_back(static_cast<uint8_t*>((*c)->PageAddress(TierKind::kHost, p)));
    if (::fork() == 0) {
      ::close(report[0]);
      const rlimit no_core{0, 0};
      (void)::setrlimit(RLIMIT_CORE, &no_core);  // its fault is expected: no core file
      go.Wait();
      for (uint8_t* v : views) std::memset(v, 0x41, kBlock);  // faults: not mapped here
      const char wrote = 'w';
      (void)!::write(report[1], &wrote, 1);
      ::_exit(0);
    }
    forked.Signal();
    ::_exit(0);  // the engine ends; its child lives on with the socket
  });
  ::close(report[1]);
  ASSERT_TRUE(forked.Wait());
  EXPECT_EQ(parent.Join(), 0);
  EXPECT_TRUE(Eventually(d, [](const TierStatsInfo& t) {
    return t.quarantined_pages == kPages && t.leased_pages == 1;
  })) << d.Log();
  // Another engine of the tenant stores 8 blocks: into the engine's pages, were they free
  // (the allocator hands out the pages freed last first).
  const auto chain = HashChain(0xf0c, kPages);
  {
    auto victim = Client::Connect(EngineOptions(d.socket_path(), "victim"));
    ASSERT_TRUE(victim.ok());
    ASSERT_TRUE(Store(**victim, TierKind::kHost, chain, 1).ok());
  }
  go.Signal();
  char wrote = 0;
  EXPECT_EQ(::read(report[0], &wrote, 1), 0) << "the forked child wrote through the engine's mappings";
  ::close(report[0]);
  auto reader = Client::Connect(EngineOptions(d.socket_path(), "reader"));
  ASSERT_TRUE(reader.ok());
  const Hits h = Probe(**reader, chain, 1);
  EXPECT_EQ(h.verified, chain.size());
  EXPECT_EQ(h.foreign, 0u) << "blocks served with the forked child's bytes";
  // The child died: nothing holds the socket, the quarantine ends.
  EXPECT_TRUE(Eventually(d, [](const TierStatsInfo& t) { return t.quarantined_pages == 0; })) << d.Log();
  EXPECT_NE(d.Log().find("another process holds its socket"), std::string::npos) << d.Log();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(Liveness, AProcessThatClosesItsSocketButLivesHasItsLeasesQuarantined) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  Keeper keeper(d);
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
  EXPECT_TRUE(Eventually(d, [](const TierStatsInfo& t) { return t.quarantined_pages == 2 && t.leased_pages == 1; }));
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
  o.host_capacity = "4MiB";  // 64 pages of 64 KiB, in 4 segments
  o.page_bytes = "64KiB";
  o.segment_bytes = "1MiB";
  o.extra_yaml = "protocol:\n  heartbeat_ttl: 500ms\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  Keeper keeper(d);
  Pipe leased, go, wrote, done;
  EngineProcess stale([&]() -> int {
    auto c = Client::Connect(EngineOptions(d.socket_path(), "stale"));
    if (!c.ok()) return 10;
    auto pages = (*c)->Allocate(TierKind::kHost, kPages);
    if (!pages.ok()) return 11;
    std::vector<uint8_t*> views;
    for (PageId p : *pages) views.push_back(static_cast<uint8_t*>((*c)->PageAddress(TierKind::kHost, p)));
    leased.Signal();
    go.Wait();                                              // stopped until expired, mappings kept
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
  ASSERT_EQ(::kill(stale.pid(), SIGSTOP), 0);  // no keepalive from a stopped process: it expires
  EXPECT_TRUE(Eventually(d, [](const TierStatsInfo& t) {
    return t.quarantined_pages == kPages && t.leased_pages == 1;
  })) << d.Log();
  // Another engine of the same tenant and model stores into the pool meanwhile.
  const auto chain = HashChain(0x5ea1, kPages);
  {
    auto victim = Client::Connect(EngineOptions(d.socket_path(), "victim"));
    ASSERT_TRUE(victim.ok());
    ASSERT_TRUE(Store(**victim, TierKind::kHost, chain, 1).ok());
  }
  ASSERT_EQ(::kill(stale.pid(), SIGCONT), 0);
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
// an engine in another PID namespace: it says so once and shows the session unwatched.
// The leased pages of such a session that ended stay quarantined while their segment holds
// anything else, even after the process is gone (nothing tells when), rather than being
// re-leased under a process that may live. Once the segment holds nothing else they come
// back and the segment gets new memory first, so what the process still writes through an
// old mapping reaches no one. (Hardening round 5, item 7: eight rounds of allocate-16-and-
// close kept a tenant's whole share quarantined until a restart.)
TEST(Liveness, AnUnwatchedProcesssQuarantinedPagesComeBackWhenTheirSegmentHoldsNothingElse) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a PID namespace";
  DaemonProcess::Options o;
  o.own_pid_namespace = true;
  o.without_peer_pidfd = true;
  o.host_capacity = "4MiB";  // 64 pages of 64 KiB in 4 segments; a tenant leases at most 32
  o.page_bytes = "64KiB";
  o.segment_bytes = "1MiB";
  o.log_level = "notice";  // the polls below are control sessions, unwatched too: no hello lines
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string url = MetricsUrl(d);

  // Beside another session's lease, an ended session's pages stay out of use.
  Keeper keeper(d);
  {
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
    EXPECT_TRUE(Eventually(d, [&](const TierStatsInfo& t) { return t.quarantined_pages == 2; })) << d.Log();
    go.Signal();
    EXPECT_EQ(engine.Join(), 0);
    // The process is gone, but kvtierd cannot know: the pages stay out of use.
    EXPECT_FALSE(WaitUntil(
        [&] {
          auto t = HostStats(d);
          return t.ok() && t->quarantined_pages != 2;
        },
        std::chrono::seconds(1)));
  }
  // The keeper's session ends too (its page quarantined: its process is unwatched as
  // well): the segment holds quarantined pages alone, and they come back.
  keeper.EndSession();
  EXPECT_TRUE(Eventually(d, [&](const TierStatsInfo& t) { return t.quarantined_pages == 0; })) << d.Log();
  EXPECT_EQ(Metric(url, "kvtier_quarantine_pages_reclaimed_total"), 3.0);

  // The rounds, from a process that lives on and keeps a mapping of its first pages.
  constexpr int kRounds = 8;
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  Pipe rounds_done, write_now, wrote;
  EngineProcess churn([&]() -> int {
    uint8_t* kept = nullptr;
    int done = 0;
    for (; done < kRounds; ++done) {
      auto c = Client::Connect(EngineOptions(d.socket_path(), "churn"));
      if (!c.ok()) break;
      auto pages = (*c)->Allocate(TierKind::kHost, 16);
      if (!pages.ok()) break;
      if (done == 0) {  // a whole segment: a second mapping of it outlives the client's
        uint8_t* lo = nullptr;
        for (PageId p : *pages) {
          auto* a = static_cast<uint8_t*>((*c)->PageAddress(TierKind::kHost, p));
          if (lo == nullptr || a < lo) lo = a;
        }
        void* m = ::mremap(lo, 0, 16 * kBlock, MREMAP_MAYMOVE);
        if (m == MAP_FAILED || ::mprotect(m, 16 * kBlock, PROT_READ | PROT_WRITE) != 0) return 20;
        kept = static_cast<uint8_t*>(m);
      }
    }  // each session ends with its 16 pages leased
    (void)!::write(report[1], &done, sizeof(done));
    ::close(report[1]);
    rounds_done.Signal();
    if (!write_now.Wait()) return 21;
    std::memset(kept, 0x41, 16 * kBlock);  // the late writes of a stale engine
    wrote.Signal();
    return 0;
  });
  ::close(report[1]);
  ASSERT_TRUE(rounds_done.Wait());
  int rounds = -1;
  EXPECT_EQ(::read(report[0], &rounds, sizeof(rounds)), static_cast<ssize_t>(sizeof(rounds)));
  ::close(report[0]);
  EXPECT_EQ(rounds, kRounds) << "its ended sessions' pages counted against its share" << d.Log();
  EXPECT_TRUE(Eventually(d, [&](const TierStatsInfo& t) { return t.quarantined_pages == 0; })) << d.Log();
  // Another engine of the tenant fills three segments' worth while the process lives.
  const auto chain = HashChain(0x7e57, 48);
  {
    auto victim = Client::Connect(EngineOptions(d.socket_path(), "victim"));
    ASSERT_TRUE(victim.ok());
    ASSERT_TRUE(Store(**victim, TierKind::kHost, chain, 1).ok()) << d.Log();
  }
  write_now.Signal();
  ASSERT_TRUE(wrote.Wait());
  auto reader = Client::Connect(EngineOptions(d.socket_path(), "reader"));
  ASSERT_TRUE(reader.ok());
  const Hits h = Probe(**reader, chain, 1);
  EXPECT_EQ(h.verified, chain.size());
  EXPECT_EQ(h.foreign, 0u) << "blocks served with a stale engine's bytes";
  EXPECT_EQ(churn.Join(), 0);

  const std::string log = d.Log();
  const size_t first = log.find("cannot be watched");
  EXPECT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find("cannot be watched", first + 1), std::string::npos) << "said more than once";
  EXPECT_GE(Metric(url, "kvtier_sessions_unwatched_total"), 2.0);  // the engines, and the polls
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
