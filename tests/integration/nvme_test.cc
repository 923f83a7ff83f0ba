// The NVMe tier through a real kvtierd: warm restart, kill -9 during spills, corruption on
// disk, injected I/O errors, kvctl verify. Every test runs with io_backend io_uring and
// threads.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include "engine/tools/block_pattern.h"
#include "tests/integration/engine_process.h"
#include "tests/support/redis_cluster_process.h"

namespace kvtier::testing {
namespace {

const uint64_t kBlock = TestLayout().block_bytes;  // 16 KiB blocks in 64 KiB pages

DaemonProcess::Options NvmeDaemon(const std::string& backend, const std::string& extra_nvme = "") {
  DaemonProcess::Options o;
  o.host_capacity = "2MiB";  // 32 pages of 64 KiB
  o.page_bytes = "64KiB";
  o.segment_bytes = "512KiB";
  o.nvme_capacity = "16MiB";  // 256 slots
  o.nvme_yaml = "    io_backend: " + backend + "\n" + extra_nvme;
  return o;
}

std::unique_ptr<Client> Engine(const DaemonProcess& d, const std::string& name = "nvme-engine") {
  auto c = Client::Connect(EngineOptions(d.socket_path(), name));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Stores the chain, one block per page, with the pattern of its hash.
Status Store(Client& c, const std::vector<BlockHash>& chain) {
  KVTIER_ASSIGN_OR_RETURN(auto pages, c.Allocate(TierKind::kHost, static_cast<uint32_t>(chain.size())));
  std::vector<CommitEntry> e;
  for (size_t i = 0; i < chain.size(); ++i) {
    auto bytes = c.PageBytes(TierKind::kHost, pages[i]);
    if (bytes.size() < kBlock) return Internal("page not mapped");
    FillBlockPattern(chain[i], bytes.first(kBlock));
    e.push_back({pages[i], chain[i], i ? chain[i - 1] : BlockHash()});
  }
  KVTIER_ASSIGN_OR_RETURN(auto r, c.Commit(TierKind::kHost, e));
  for (const auto& x : r) KVTIER_RETURN_IF_ERROR(x.status);
  return Status::Ok();
}

struct Served {
  size_t hits = 0;   // blocks acquired with the right bytes
  size_t wrong = 0;  // blocks acquired with other bytes: must never happen
  size_t missing = 0;
};

// Looks each block up on its own and acquires it; counts what came back.
Served ReadBack(Client& c, const std::vector<BlockHash>& hashes) {
  Served s;
  for (const BlockHash& h : hashes) {
    std::vector<BlockHash> one = {h};
    auto a = c.Acquire(one);
    if (!a.ok() || !(*a)[0].status.ok()) {
      ++s.missing;
      continue;
    }
    auto bytes = c.PageBytes((*a)[0].tier, (*a)[0].page);
    if (bytes.size() >= kBlock && CheckBlockPattern(h, bytes.first(kBlock)))
      ++s.hits;
    else
      ++s.wrong;
    (void)c.Release(TierKind::kHost, {}, one);
  }
  return s;
}

DaemonStats Stats(const DaemonProcess& d) {
  auto c = ControlClient::Connect(ControlOptions(d.socket_path()));
  EXPECT_TRUE(c.ok());
  auto s = (*c)->Stats();
  EXPECT_TRUE(s.ok());
  return s.ok() ? *s : DaemonStats{};
}

void ExpectAccountingExact(const DaemonStats& s) {
  for (const auto& t : s.tiers) {
    EXPECT_EQ(t.free_pages + t.leased_pages + t.inflight_pages + t.cached_pages + t.referenced_pages, t.capacity_pages)
        << t.name;
  }
}

// Polls until the NVMe tier holds `n` blocks with nothing in flight (or 10 s).
bool WaitForNvmeBlocks(const DaemonProcess& d, uint64_t n) {
  return WaitUntil([&] {
    DaemonStats s = Stats(d);
    const TierStatsInfo* nv = TierOf(s, TierKind::kNvme);
    return nv && nv->ready && nv->blocks >= n && nv->inflight_pages == 0;
  });
}

uint64_t Metric(const std::string& url, const std::string& name) {
  FILE* p = ::popen(("curl -fsS " + url).c_str(), "r");
  if (!p) return 0;
  char line[1024];
  uint64_t v = 0;
  while (std::fgets(line, sizeof(line), p)) {
    std::string l(line);
    if (l.rfind(name + " ", 0) == 0) v = std::stoull(l.substr(name.size() + 1));
  }
  ::pclose(p);
  return v;
}

class NvmeDaemonTest : public ::testing::TestWithParam<std::string> {};

TEST_P(NvmeDaemonTest, WarmRestartServesDemotedBlocksWithTheirBytes) {
  DaemonProcess::Options o = NvmeDaemon(GetParam());
  o.extra_yaml = "";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  std::vector<BlockHash> all;
  {
    auto c = Engine(d);
    for (int seq = 0; seq < 12; ++seq) {  // 96 blocks through a 32-page host tier
      auto chain = HashChain(100 + seq, 8);
      ASSERT_TRUE(Store(*c, chain).ok());
      all.insert(all.end(), chain.begin(), chain.end());
    }
  }
  DaemonStats before = Stats(d);
  const TierStatsInfo* nv = TierOf(before, TierKind::kNvme);
  ASSERT_NE(nv, nullptr);
  ASSERT_TRUE(WaitForNvmeBlocks(d, 60)) << "demotions did not reach NVMe";
  before = Stats(d);
  const uint64_t on_nvme = TierOf(before, TierKind::kNvme)->blocks;
  EXPECT_GE(on_nvme, 60u);
  EXPECT_EQ(d.Stop(), 0) << d.Log();

  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ASSERT_TRUE(WaitForNvmeBlocks(d, on_nvme));
  auto c = Engine(d, "after-restart");
  auto l = c->Lookup(std::vector<BlockHash>(all.end() - 8, all.end()));
  ASSERT_TRUE(l.ok());
  Served s = ReadBack(*c, all);
  EXPECT_EQ(s.wrong, 0u);
  EXPECT_GE(s.hits, on_nvme) << "blocks on NVMe before the restart were not served after it";
  DaemonStats after = Stats(d);
  EXPECT_GE(after.promotions, on_nvme);
  ExpectAccountingExact(after);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST_P(NvmeDaemonTest, WriteThroughKeepsEveryCommittedBlockAcrossRestart) {
  DaemonProcess::Options o = NvmeDaemon(GetParam(), "    write_policy: write_through\n");
  o.extra_yaml = "security: {max_leased_share: 1}\n";  // 20 of 32 pages leased at once
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto chain = HashChain(7, 20);
  {
    auto c = Engine(d);
    ASSERT_TRUE(Store(*c, chain).ok());
  }
  ASSERT_TRUE(WaitForNvmeBlocks(d, 20));
  EXPECT_EQ(d.Stop(), 0) << d.Log();
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Engine(d);
  auto l = c->Lookup(chain);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->matched, 20u);
  for (TierKind t : l->tiers) EXPECT_EQ(t, TierKind::kNvme);
  Served s = ReadBack(*c, chain);
  EXPECT_EQ(s.hits, 20u);
  EXPECT_EQ(s.wrong, 0u);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST_P(NvmeDaemonTest, ASparseSlotFileIsSizedNotAllocatedAndServesAcrossRestart) {
  DaemonProcess::Options o = NvmeDaemon(GetParam(), "    write_policy: write_through\n");
  o.nvme_capacity = "256MiB";
  o.nvme_preallocate = false;
  o.extra_yaml = "security: {max_leased_share: 1}\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  struct stat st {};
  ASSERT_EQ(::stat(d.slot_file().c_str(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_size), 256ull << 20);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, 16ull << 20) << "the slot file was allocated";
  auto chain = HashChain(17, 20);
  {
    auto c = Engine(d);
    ASSERT_TRUE(Store(*c, chain).ok());
  }
  ASSERT_TRUE(WaitForNvmeBlocks(d, 20));
  EXPECT_EQ(d.Stop(), 0) << d.Log();
  ASSERT_TRUE(d.Start().ok()) << d.Log();  // the same file, still sparse: reopened as it is
  auto c = Engine(d);
  Served s = ReadBack(*c, chain);
  EXPECT_EQ(s.hits, 20u);
  EXPECT_EQ(s.wrong, 0u);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST_P(NvmeDaemonTest, Kill9DuringSpillsNeverServesWrongBytes) {
  // Strict durability and write-through: every committed block is being spilled (and put
  // into a remote tier, a standalone Redis that outlives the daemon) while the daemon is
  // killed at a random moment, 20 times over.
  DaemonProcess::Options o = NvmeDaemon(GetParam(), "    write_policy: write_through\n    durability: strict\n");
  std::unique_ptr<testing::RedisClusterProcess> redis;
  if (testing::RedisClusterProcess::Available()) {
    redis = std::make_unique<testing::RedisClusterProcess>(
        testing::RedisClusterProcess::Options{.masters = 1, .replicas_per_master = 0, .cluster = false});
    ASSERT_TRUE(redis->Start().ok());
    o.remote_nodes = redis->Seeds(1);
  }
  DaemonProcess d(o);
  uint64_t remote_hits = 0;
  std::mt19937 rng(20261202);
  std::vector<BlockHash> ever;
  size_t total_hits = 0;
  uint64_t verified_entries = 0;
  // 20 in make test; tests/crash/run.sh runs hundreds.
  const char* env = std::getenv("KVTIER_CRASH_ITERATIONS");
  const int iterations = env ? std::atoi(env) : 20;
  for (int iteration = 0; iteration < iterations; ++iteration) {
    ASSERT_TRUE(d.Start().ok()) << "iteration " << iteration << ": " << d.Log();
    {
      // After every restart: whatever is served is right, and the books balance.
      auto c = Engine(d, "verifier");
      ASSERT_NE(c, nullptr);
      Served s = ReadBack(*c, ever);
      EXPECT_EQ(s.wrong, 0u) << "iteration " << iteration << ": wrong bytes served";
      total_hits += s.hits;
      const DaemonStats st = Stats(d);
      ExpectAccountingExact(st);
      if (st.remote) remote_hits += st.remote->fetch_hits;
      // Every index entry the crash left verifies (strict: bytes synced before entries).
      auto control = ControlClient::Connect(ControlOptions(d.socket_path()));
      ASSERT_TRUE(control.ok());
      auto v = (*control)->Verify();
      ASSERT_TRUE(v.ok()) << v.status().ToString();
      EXPECT_EQ(v->dropped, 0u) << "iteration " << iteration << ": " << v->dropped << " of " << v->checked
                                << " index entries did not verify";
      verified_entries += v->checked;
    }
    Pipe ready;
    const uint64_t seed = 1000 + iteration;
    // Mixed load: stores (spills, with write-through) and reads of earlier chains
    // (fetches, once the host copies are gone).
    EngineProcess writer([&]() -> int {
      auto c = Client::Connect(EngineOptions(d.socket_path(), "writer"));
      if (!c.ok()) return 10;
      ready.Signal();
      for (int seq = 0;; ++seq) {
        if (!Store(**c, HashChain(seed * 1000 + seq, 4)).ok()) return 0;  // daemon died
        if (seq % 3 == 2) {
          const auto old = HashChain(seed * 1000 + seq / 2, 4);
          auto a = (*c)->Acquire(old);
          if (!a.ok()) return 0;
          for (size_t i = 0; i < a->size(); ++i) {
            if (!(*a)[i].status.ok()) continue;
            auto bytes = (*c)->PageBytes((*a)[i].tier, (*a)[i].page);
            if (!CheckBlockPattern(old[i], bytes.first(kBlock))) return 30;  // wrong bytes
          }
          if (!(*c)->Release(TierKind::kHost, {}, old).ok()) return 0;
        }
      }
    });
    ASSERT_TRUE(ready.Wait());
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + rng() % 150));
    d.Kill();
    EXPECT_NE(writer.Join(), 30) << "iteration " << iteration << ": wrong bytes served during the load";
    // The writer's blocks: 4 per sequence it may have committed.
    for (int seq = 0; seq < 400; ++seq) {
      auto chain = HashChain(seed * 1000 + seq, 4);
      ever.insert(ever.end(), chain.begin(), chain.end());
    }
    if (ever.size() > 3000) ever.erase(ever.begin(), ever.begin() + (ever.size() - 3000));
  }
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Engine(d, "final");
  Served s = ReadBack(*c, ever);
  EXPECT_EQ(s.wrong, 0u);
  total_hits += s.hits;
  EXPECT_GT(total_hits, 0u) << "nothing survived any crash: the test did not exercise the tier";
  EXPECT_GT(verified_entries, 0u);
  RecordProperty("verified_entries", std::to_string(verified_entries));
  RecordProperty("remote_hits", std::to_string(remote_hits));
  std::cout << iterations << " kills: " << total_hits << " blocks served right after restarts (" << remote_hits
            << " from the remote tier), " << verified_entries << " index entries verified, 0 wrong\n";
  ExpectAccountingExact(Stats(d));
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST_P(NvmeDaemonTest, BytesCorruptedOnDiskAreAMissAndCounted) {
  DaemonProcess d(NvmeDaemon(GetParam(), "    write_policy: write_through\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto chain = HashChain(11, 10);
  {
    auto c = Engine(d);
    ASSERT_TRUE(Store(*c, chain).ok());
  }
  ASSERT_TRUE(WaitForNvmeBlocks(d, 10));
  EXPECT_EQ(d.Stop(), 0);
  {
    // Scribble over every slot.
    std::fstream f(d.slot_file(), std::ios::in | std::ios::out | std::ios::binary);
    std::vector<char> junk(1 << 20, 0x3c);
    for (int i = 0; i < 16; ++i) f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Engine(d);
  auto l = c->Lookup(chain);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->matched, 10u) << "the index still names them";
  auto a = c->Acquire(chain);
  ASSERT_TRUE(a.ok());
  for (const auto& r : *a) EXPECT_EQ(r.status.code(), StatusCode::kDataLoss) << "corrupt block served";
  DaemonStats s = Stats(d);
  EXPECT_EQ(s.checksum_failures, 10u);
  EXPECT_EQ(Metric(s.metrics_url, "kvtier_checksum_failures_total"), 10u);
  // Dropped: a plain miss from now on.
  WaitUntil(
      [&] {
        auto again = c->Lookup(chain);
        return again.ok() && again->matched == 0;
      },
      std::chrono::seconds(1));
  EXPECT_EQ(c->Lookup(chain)->matched, 0u);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST_P(NvmeDaemonTest, InjectedIoErrorsRefuseTheSpillAndTheDaemonKeepsServing) {
  for (const char* fault : {"write:1:eio", "write:2:enospc", "sync:1:eio", "write:1:short"}) {
    DaemonProcess::Options o = NvmeDaemon(GetParam(), "    write_policy: write_through\n");
    o.kvtierd = BinaryPath("kvtierd-faulty");
    o.env = {std::string("KVTIER_IO_FAULTS=") + fault};
    DaemonProcess d(o);
    ASSERT_TRUE(d.Start().ok()) << d.Log();
    auto c = Engine(d);
    auto chain = HashChain(21, 6);
    ASSERT_TRUE(Store(*c, chain).ok()) << fault;
    // Each block is spilled once: wait until every attempt has an outcome.
    const std::string url = Stats(d).metrics_url;
    uint64_t ok = 0, failed = 0;
    WaitUntil([&] {
      ok = Metric(url, "kvtier_write_throughs_total");
      failed = Metric(url, "kvtier_spill_failures_total");
      return ok + failed >= 6;
    });
    ASSERT_EQ(ok + failed, 6u) << fault << ": " << d.Log();
    EXPECT_GE(failed, 1u) << fault << ": the injected error did not fail a spill";
    DaemonStats s = Stats(d);
    EXPECT_GE(s.io_errors, 1u) << fault;
    // Only the spills that succeeded are indexed: nothing after a failed write or sync.
    EXPECT_EQ(TierOf(s, TierKind::kNvme)->blocks, ok) << fault;
    EXPECT_TRUE(c->Ping().ok()) << fault;
    auto l = c->Lookup(chain);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(l->matched, 6u) << fault << ": the host copies are still served";
    EXPECT_EQ(ReadBack(*c, chain).wrong, 0u);
    ExpectAccountingExact(s);
    c.reset();
    EXPECT_EQ(d.Stop(), 0) << fault << ": " << d.Log();
  }
}

TEST_P(NvmeDaemonTest, KvctlVerifyScrubsAndReports) {
  DaemonProcess d(NvmeDaemon(GetParam(), "    write_policy: write_through\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  {
    auto c = Engine(d);
    ASSERT_TRUE(Store(*c, HashChain(31, 12)).ok());
  }
  ASSERT_TRUE(WaitForNvmeBlocks(d, 12));
  FILE* p = ::popen((BinaryPath("kvctl") + " verify --json --socket " + d.socket_path()).c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096] = {0};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, p);
  EXPECT_EQ(::pclose(p), 0);
  std::string out(buf, n);
  EXPECT_NE(out.find("\"checked\": 12"), std::string::npos) << out;
  EXPECT_NE(out.find("\"dropped\": 0"), std::string::npos) << out;
  FILE* t = ::popen((BinaryPath("kvctl") + " tiers --socket " + d.socket_path()).c_str(), "r");
  n = std::fread(buf, 1, sizeof(buf) - 1, t);
  ::pclose(t);
  out.assign(buf, n);
  EXPECT_NE(out.find("io       " + GetParam()), std::string::npos) << out;
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST_P(NvmeDaemonTest, StopDuringALongVerifyAndAQueuedScanShutsDownCleanly) {
  // The scrub runs on the NVMe tier's scan thread with raw pointers into the tier: a
  // SIGTERM in the middle of it once freed what it read (caught under ASan). Paced at
  // 64 KiB/s, a scrub of 48 blocks takes about 12 s; the daemon is stopped 1.5 s in, with
  // a `kvctl blocks --tier nvme` scan queued behind it.
  DaemonProcess d(NvmeDaemon(GetParam(), "    write_policy: write_through\n    verify_rate: 64KiB\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  {
    auto c = Engine(d);
    for (int seq = 0; seq < 6; ++seq) {
      Status st = Store(*c, HashChain(770 + seq, 8));
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
  }
  ASSERT_TRUE(WaitForNvmeBlocks(d, 48));
  EngineProcess verify([&]() -> int {
    auto control = ControlClient::Connect(ControlOptions(d.socket_path()));
    if (!control.ok()) return 10;
    auto v = (*control)->Verify();
    return v.ok() ? 11 : 0;  // the daemon went away first: an error, not a hang or a report
  });
  ASSERT_TRUE(WaitUntil([&] { return d.Log().find("verify of the NVMe tier started") != std::string::npos; }))
      << d.Log();
  EngineProcess blocks([&]() -> int {
    auto r = Sh(BinaryPath("kvctl") + " blocks --tier nvme --socket " + d.socket_path());
    return r.code == 0 ? 11 : 0;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
  const double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(stop_s, 5.0) << "the shutdown waited for the scrub instead of stopping it";
  EXPECT_EQ(verify.Join(), 0) << "the scrub finished before the stop: the test did not stop it midway";
  EXPECT_EQ(blocks.Join(), 0);
  const std::string log = d.Log();
  EXPECT_EQ(log.find("Sanitizer"), std::string::npos) << log;
  // The index is intact: the next start finds every block and a full scrub passes.
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ASSERT_TRUE(WaitForNvmeBlocks(d, 48));
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

INSTANTIATE_TEST_SUITE_P(IoBackends, NvmeDaemonTest, ::testing::Values("io_uring", "threads"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvtier::testing
