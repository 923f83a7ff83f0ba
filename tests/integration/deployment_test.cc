// kvtierd as it is deployed beside engines: in memory cgroups of its own (a pod, a systemd
// slice). The host pool is kvtierd's memory: its pages are charged to kvtierd's cgroup
// when a segment is made, not to the engine that writes a page first, so an engine pod
// needs no room for the pool and is not charged for it after it exits.
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "engine/tools/block_pattern.h"
#include "tests/integration/engine_process.h"
#include "tests/support/memory_cgroup.h"

namespace kvtier::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// Blocks of 64 KiB, the pool's page size: an engine writes every byte of a page.
ModelLayout WholePage() { return TestLayout("cgroup-model", 64); }

ClientOptions Engine(const std::string& socket, const std::string& name) {
  ClientOptions o = EngineOptions(socket, name);
  o.layout = WholePage();
  return o;
}

// Memory charged to each cgroup (memory.usage_in_bytes / memory.current: exact, where
// memory.stat's shmem may lag by the kernel's stats flush period).
struct Charges {
  uint64_t engine = 0, daemon = 0, daemon_before = 0;
  uint32_t stored = 0, verified = 0;
};

// A daemon with a 64 MiB pool of 64 KiB pages in cgroup D; an engine in cgroup E writes 48
// MiB of blocks (every byte of each page) and exits; a reader checks them.
Charges StoreFromAnotherCgroup(const std::string& host_yaml) {
  Charges c;
  auto dcg = MemoryCgroup::Make("kvtier-test-daemon");
  auto ecg = MemoryCgroup::Make("kvtier-test-engine");
  if (!dcg.ok() || !ecg.ok()) {
    ADD_FAILURE() << (dcg.ok() ? ecg.status() : dcg.status()).ToString();
    return c;
  }
  DaemonProcess::Options o;
  o.host_capacity = "64MiB";
  o.page_bytes = "64KiB";
  o.segment_bytes = "16MiB";
  o.host_yaml = "    huge_pages: off\n" + host_yaml;
  o.cgroup = (*dcg)->path();
  o.log_level = "info";
  DaemonProcess d(o);
  if (Status st = d.Start(); !st.ok()) {
    ADD_FAILURE() << st.ToString();
    return c;
  }
  c.daemon_before = (*dcg)->UsageBytes();
  const auto chain = HashChain(0xc6, 768);  // 48 MiB
  EngineProcess engine([&]() -> int {
    if (!(*ecg)->Join()) return 30;
    auto cl = Client::Connect(Engine(d.socket_path(), "cgroup-engine"));
    if (!cl.ok()) return 31;
    const uint64_t block = WholePage().block_bytes;
    for (size_t from = 0; from < chain.size(); from += 64) {
      auto pages = (*cl)->Allocate(TierKind::kHost, 64);
      if (!pages.ok()) return 32;
      std::vector<CommitEntry> e;
      for (size_t i = 0; i < 64; ++i) {
        auto* p = static_cast<uint8_t*>((*cl)->PageAddress(TierKind::kHost, (*pages)[i]));
        FillBlockPattern(chain[from + i], {p, block});
        e.push_back({(*pages)[i], chain[from + i], from + i ? chain[from + i - 1] : BlockHash()});
      }
      auto r = (*cl)->Commit(TierKind::kHost, e);
      if (!r.ok()) return 33;
    }
    return 0;
  });
  EXPECT_EQ(engine.Join(), 0) << d.Log();
  c.engine = (*ecg)->UsageBytes();  // the engine has exited: what is left is page cache and shmem
  c.daemon = (*dcg)->UsageBytes();
  auto reader = Client::Connect(Engine(d.socket_path(), "reader"));
  if (reader.ok()) {
    auto acq = (*reader)->Acquire(chain);
    if (acq.ok()) {
      std::vector<BlockHash> held;
      for (size_t i = 0; i < acq->size(); ++i) {
        if (!(*acq)[i].status.ok()) continue;
        ++c.stored;
        held.push_back(chain[i]);
        auto* p = static_cast<const uint8_t*>((*reader)->PageAddress((*acq)[i].tier, (*acq)[i].page));
        if (p && CheckBlockPattern(chain[i], {p, WholePage().block_bytes})) ++c.verified;
      }
      (void)(*reader)->Release(TierKind::kHost, {}, held);
    }
  }
  EXPECT_EQ(d.Stop(), 0) << d.Log();
  return c;
}

TEST(Cgroups, ThePoolIsChargedToKvtierdNotToTheEngineThatWritesIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make memory cgroups";
  if (auto probe = MemoryCgroup::Make("kvtier-test-probe"); !probe.ok()) GTEST_SKIP() << probe.status().ToString();
  const Charges c = StoreFromAnotherCgroup("");
  EXPECT_EQ(c.stored, 768u);
  EXPECT_EQ(c.verified, 768u);
  // The whole pool was charged to kvtierd when it made the segments, before any engine.
  EXPECT_GE(c.daemon_before, 64 * kMiB);
  EXPECT_GE(c.daemon, 64 * kMiB);
  EXPECT_LT(c.engine, 4 * kMiB) << "the engine's cgroup is charged for pool pages it wrote";
}

// With tiers.host.overcommit the pool is not touched at start (it may be larger than
// memory): pages are then charged to whoever writes them first, as the docs say.
TEST(Cgroups, AnOvercommittedPoolIsChargedToWhoWritesItFirst) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make memory cgroups";
  if (auto probe = MemoryCgroup::Make("kvtier-test-probe"); !probe.ok()) GTEST_SKIP() << probe.status().ToString();
  const Charges c = StoreFromAnotherCgroup("    overcommit: true\n");
  EXPECT_EQ(c.verified, 768u);
  if (!kSanitized) {  // a sanitizer's own memory is charged there too
    EXPECT_LT(c.daemon_before, 40 * kMiB);
  }
  EXPECT_GE(c.engine, 48 * kMiB) << "daemon " << c.daemon_before << " -> " << c.daemon;
}

// Hardening round 5, item 3: a segment that changes tenant gets new memory, and the old
// tenant's engine, which still maps the old memory (it is not sent the segment again),
// kept it alive and charged to kvtierd: 2x the pool with two tenants churning. Now the old
// pages are released from every mapping when the segment is renewed.
TEST(Cgroups, ASegmentThatChangesTenantLeavesNoOldMemoryChargedToKvtierd) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make memory cgroups and run a second tenant";
  auto dcg = MemoryCgroup::Make("kvtier-test-daemon");
  if (!dcg.ok()) GTEST_SKIP() << dcg.status().ToString();
  constexpr gid_t kGroup = 41000;
  constexpr uid_t kOldTenant = 41031;
  DaemonProcess::Options o;
  o.host_capacity = "32MiB";  // two segments of 256 pages
  o.page_bytes = "64KiB";
  o.segment_bytes = "16MiB";
  o.host_yaml = "    huge_pages: off\n";
  o.socket_yaml = "  group: " + std::to_string(kGroup) + "\n";
  o.cgroup = (*dcg)->path();
  o.log_level = "info";
  DaemonProcess d(o);
  ASSERT_EQ(::chmod(d.dir().c_str(), 0755), 0);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const uint64_t before = (*dcg)->UsageBytes();
  const uint64_t block = WholePage().block_bytes;

  // The old tenant leases a whole segment, writes it, gives it back, and keeps its mapping.
  Pipe leased, checked, done;
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  EngineProcess old_tenant([&]() -> int {
    const gid_t groups[1] = {kGroup};
    if (::setgroups(1, groups) != 0 || ::setgid(kGroup) != 0 || ::setuid(kOldTenant) != 0) return 20;
    auto cl = Client::Connect(Engine(d.socket_path(), "old-tenant"));
    if (!cl.ok()) return 21;
    std::vector<uint8_t*> mine;
    for (int round = 0; round < 4; ++round) {
      auto pages = (*cl)->Allocate(TierKind::kHost, 64);
      if (!pages.ok()) return 22;
      for (PageId p : *pages) {
        auto* a = static_cast<uint8_t*>((*cl)->PageAddress(TierKind::kHost, p));
        std::memset(a, 0x0d, block);
        mine.push_back(a);
      }
      if (!(*cl)->Release(TierKind::kHost, *pages).ok()) return 23;
    }
    leased.Signal();
    if (!checked.Wait()) return 24;
    // Its old mapping: never the new tenant's bytes (0x4e); with the memory released, zeros.
    uint64_t zero = 0, other = 0;
    for (uint8_t* a : mine) {
      for (uint64_t i = 0; i < block; i += 4096) {
        zero += a[i] == 0;
        other += a[i] == 0x4e;
      }
    }
    const std::string line = std::to_string(zero) + " " + std::to_string(other);
    (void)!::write(report[1], line.data(), line.size());
    ::close(report[1]);
    done.Wait();
    return 0;
  });
  ::close(report[1]);
  ASSERT_TRUE(leased.Wait());

  // The new tenant fills the pool: the old tenant's empty segment is renewed for it.
  auto cl = Client::Connect(Engine(d.socket_path(), "new-tenant"));
  ASSERT_TRUE(cl.ok());
  const auto chain = HashChain(0x4e, 512);
  for (size_t from = 0; from < chain.size(); from += 64) {
    auto pages = (*cl)->Allocate(TierKind::kHost, 64);
    ASSERT_TRUE(pages.ok()) << pages.status().ToString() << d.Log();
    std::vector<CommitEntry> e;
    for (size_t i = 0; i < 64; ++i) {
      std::memset((*cl)->PageAddress(TierKind::kHost, (*pages)[i]), 0x4e, block);
      e.push_back({(*pages)[i], chain[from + i], from + i ? chain[from + i - 1] : BlockHash()});
    }
    ASSERT_TRUE((*cl)->Commit(TierKind::kHost, e).ok());
  }
  const std::string metrics = Sh("curl -fsS -m 5 " + MetricsUrl(d)).out;
  const uint64_t after = (*dcg)->UsageBytes();
  checked.Signal();
  std::string got;
  char buf[128];
  for (ssize_t n; (n = ::read(report[0], buf, sizeof(buf))) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(report[0]);
  done.Signal();
  EXPECT_EQ(old_tenant.Join(), 0);

  EXPECT_NE(metrics.find("kvtier_segment_renewals_total{tier=\"host\",outcome=\"ok\"} 1\n"), std::string::npos)
      << metrics;
  const uint64_t probes = 256 * (block / 4096);
  EXPECT_EQ(got, std::to_string(probes) + " 0") << "zero pages, pages with the new tenant's bytes";
  // The pool was charged at start; renewing a segment adds nothing while old mappings live
  // (16 MiB more before: the old segment's memory). Half a segment leaves room for heap.
  EXPECT_LT(after, before + 8 * kMiB) << "kvtierd's cgroup: " << before << " -> " << after;
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

}  // namespace
}  // namespace kvtier::testing
