// kvtierd as it is deployed beside engines: in memory cgroups of its own (a pod, a systemd
// slice). The host pool is kvtierd's memory: its pages are charged to kvtierd's cgroup
// when a segment is made, not to the engine that writes a page first, so an engine pod
// needs no room for the pool and is not charged for it after it exits.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvtier::testing
