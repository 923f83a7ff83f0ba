// The memory tier (tiers.memory) end to end, through a real kvtierd: blocks that leave the
// host tier go there (write-back) and come back with their bytes through Lookup and
// Acquire; its figures are in the Stats reply, `kvctl tiers` and /metrics; a tenant's
// quota on it (security.tenants[].quota.memory) holds; a restart starts it empty while
// NVMe keeps what it had.
#include <gtest/gtest.h>
#include <unistd.h>

#include "engine/tools/block_pattern.h"
#include "tests/integration/engine_process.h"

namespace kvtier::testing {
namespace {

constexpr size_t kBlock = 16 * 1024;

// 1 MiB of host (64 pages of 16 KiB) over `memory` of memory tier, write-back.
DaemonProcess::Options Node(const std::string& memory, const std::string& extra = "") {
  DaemonProcess::Options o;
  o.host_capacity = "1MiB";
  o.page_bytes = "16KiB";
  o.segment_bytes = "1MiB";
  o.tiers_yaml = "  memory:\n    capacity: " + memory + "\n";
  o.extra_yaml = extra;
  o.log_level = "notice";
  return o;
}

Result<std::unique_ptr<Client>> Engine(const DaemonProcess& d) {
  ClientOptions o = EngineOptions(d.socket_path());
  o.layout = TestLayout("m", 16);  // 16 KiB blocks
  return Client::Connect(o);
}

Status Store(Client& c, const std::vector<BlockHash>& chain) {
  KVTIER_ASSIGN_OR_RETURN(auto pages, c.Allocate(TierKind::kHost, static_cast<uint32_t>(chain.size())));
  std::vector<CommitEntry> e;
  for (size_t i = 0; i < chain.size(); ++i) {
    FillBlockPattern(chain[i], {static_cast<uint8_t*>(c.PageAddress(TierKind::kHost, pages[i])), kBlock});
    e.push_back({pages[i], chain[i], i ? chain[i - 1] : BlockHash()});
  }
  KVTIER_ASSIGN_OR_RETURN(auto r, c.Commit(TierKind::kHost, e));
  for (const auto& x : r) KVTIER_RETURN_IF_ERROR(x.status);
  return Status::Ok();
}

// Chains of 16 blocks, `n` of them: 4x the host tier for n = 16.
std::vector<std::vector<BlockHash>> StoreChains(Client& c, uint64_t first_seed, int n) {
  std::vector<std::vector<BlockHash>> chains;
  for (int i = 0; i < n; ++i) {
    chains.push_back(HashChain(first_seed + static_cast<uint64_t>(i), 16));
    EXPECT_TRUE(Store(c, chains.back()).ok());
  }
  return chains;
}

const LowerTierStatsInfo* MemoryEntry(const DaemonStats& s) {
  for (const auto& l : s.lower) {
    if (l.tier == TierKind::kMemory) return &l;
  }
  return nullptr;
}

// Waits until the memory tier has nothing in flight or queued.
bool Drained(const DaemonProcess& d) {
  return WaitUntil([&] {
    auto s = StatsOf(d.socket_path());
    const LowerTierStatsInfo* m = s.ok() ? MemoryEntry(*s) : nullptr;
    return m && m->puts_in_flight == 0 && m->puts_queued == 0;
  });
}

double Figure(const LowerTierStatsInfo& l, const std::string& key) {
  for (const auto& f : l.figures) {
    if (f.key == key) return f.value;
  }
  return -1;
}

TEST(MemoryTier, BlocksLeavingHostAreServedFromItWithTheirBytesAndShowInStatsKvctlAndMetrics) {
  DaemonProcess d(Node("8MiB"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Engine(d);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const auto chains = StoreChains(**c, 100, 16);
  ASSERT_TRUE(Drained(d));

  // The first chains left host long ago: found in the memory tier, served with their bytes.
  auto l = (*c)->Lookup(chains[0]);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->matched, 16u);
  EXPECT_EQ(std::count(l->tiers.begin(), l->tiers.end(), TierKind::kMemory), 16);
  auto a = (*c)->Acquire(chains[0]);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  for (size_t i = 0; i < chains[0].size(); ++i) {
    ASSERT_TRUE((*a)[i].status.ok()) << i << ": " << (*a)[i].status.ToString();
    EXPECT_EQ((*a)[i].tier, TierKind::kHost);
    EXPECT_TRUE(CheckBlockPattern(
        chains[0][i], {static_cast<const uint8_t*>((*c)->PageAddress(TierKind::kHost, (*a)[i].page)), kBlock}))
        << "block " << i << " came back with other bytes";
  }
  std::vector<PageId> none;
  ASSERT_TRUE((*c)->Release(TierKind::kHost, none, chains[0]).ok());

  auto s = StatsOf(d.socket_path());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const LowerTierStatsInfo* m = MemoryEntry(*s);
  ASSERT_NE(m, nullptr) << "no memory entry in StatsReply.lower";
  EXPECT_EQ(m->name, "memory");
  EXPECT_EQ(m->write_policy, "write_back");
  EXPECT_GE(m->hits, 16u);
  EXPECT_GE(m->promotions, 16u);
  EXPECT_GT(m->puts, 0u);
  EXPECT_GT(Figure(*m, "blocks"), 0);
  EXPECT_LE(Figure(*m, "bytes"), 8.0 * 1024 * 1024);
  EXPECT_FALSE(s->remote.has_value()) << "the old remote entry is the remote tier's only";

  CmdResult tiers = Sh(BinaryPath("kvctl") + " tiers -s " + d.socket_path());
  ASSERT_EQ(tiers.code, 0) << tiers.out;
  EXPECT_NE(tiers.out.find("memory: kvtierd's memory, "), std::string::npos) << tiers.out;
  EXPECT_NE(tiers.out.find("write_back: "), std::string::npos) << tiers.out;

  const std::string url = MetricsUrl(d);
  ASSERT_FALSE(url.empty()) << d.Log();
  EXPECT_GT(Metric(url, "kvtier_memory_blocks"), 0);
  EXPECT_GE(Metric(url, "kvtier_memory_promotions_total"), 16);
  EXPECT_GT(Metric(url, "kvtier_memory_puts_total"), 0);
  EXPECT_GE(Metric(url, "kvtier_memory_fetches_total{result=\"hit\"}"), 16);
  EXPECT_GE(Metric(url, "kvtier_block_hits_total{tier=\"memory\"}"), 16);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// Full: the least recently used values leave; what is still there is served, what left is
// a miss, never other bytes.
TEST(MemoryTier, WhenFullItDropsTheLeastRecentlyUsedAndMissesThem) {
  DaemonProcess d(Node("1MiB"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Engine(d);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const auto chains = StoreChains(**c, 200, 16);
  ASSERT_TRUE(Drained(d));
  auto s = StatsOf(d.socket_path());
  ASSERT_TRUE(s.ok());
  const LowerTierStatsInfo* m = MemoryEntry(*s);
  ASSERT_NE(m, nullptr);
  EXPECT_GT(Figure(*m, "evictions"), 0);
  EXPECT_LE(Figure(*m, "bytes"), 1024.0 * 1024);
  auto first = (*c)->Lookup(chains[0]);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->matched, 0u) << "the oldest chain should have left a 1 MiB memory tier";
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// security.tenants[].quota.memory: past it, this kvtierd deletes the tenant's oldest values.
TEST(MemoryTier, ATenantsQuotaOnItHolds) {
  const std::string tenants = "security:\n  tenants:\n    - name: a\n      uids: [" + std::to_string(::getuid()) +
                              "]\n      quota: {memory: 256KiB}\n";
  DaemonProcess d(Node("8MiB", tenants));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Engine(d);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  StoreChains(**c, 300, 12);
  ASSERT_TRUE(Drained(d));
  auto s = StatsOf(d.socket_path());
  ASSERT_TRUE(s.ok());
  const LowerTierStatsInfo* m = MemoryEntry(*s);
  ASSERT_NE(m, nullptr);
  EXPECT_GT(m->quota_deletes, 0u);
  EXPECT_LE(Figure(*m, "bytes"), 256.0 * 1024);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// A restart starts the memory tier empty; NVMe (below host, above it) still serves.
TEST(MemoryTier, ARestartStartsItEmptyWhileNvmeKeepsWhatItHad) {
  DaemonProcess::Options o = Node("8MiB");
  o.nvme_capacity = "2MiB";
  o.nvme_yaml = "    durability: strict\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  std::vector<std::vector<BlockHash>> chains;
  {
    auto c = Engine(d);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    chains = StoreChains(**c, 400, 16);
    ASSERT_TRUE(Drained(d));
  }
  ASSERT_EQ(d.Stop(), 0) << d.Log();
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto s = StatsOf(d.socket_path());
  ASSERT_TRUE(s.ok());
  const LowerTierStatsInfo* m = MemoryEntry(*s);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(Figure(*m, "blocks"), 0);
  auto c = Engine(d);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  size_t on_nvme = 0;
  for (const auto& chain : chains) {
    auto l = (*c)->Lookup(chain);
    ASSERT_TRUE(l.ok());
    for (TierKind t : l->tiers) {
      EXPECT_NE(t, TierKind::kMemory) << "a restarted kvtierd's memory tier holds nothing";
      on_nvme += t == TierKind::kNvme;
    }
    auto a = (*c)->Acquire(std::span(chain).first(l->matched));
    ASSERT_TRUE(a.ok());
    for (size_t i = 0; i < l->matched; ++i) {
      ASSERT_TRUE((*a)[i].status.ok()) << (*a)[i].status.ToString();
      EXPECT_TRUE(CheckBlockPattern(
          chain[i], {static_cast<const uint8_t*>((*c)->PageAddress(TierKind::kHost, (*a)[i].page)), kBlock}));
    }
    std::vector<PageId> none;
    ASSERT_TRUE((*c)->Release(TierKind::kHost, none, std::span(chain).first(l->matched)).ok());
  }
  EXPECT_GT(on_nvme, 0u) << "NVMe kept nothing across the restart";
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

}  // namespace
}  // namespace kvtier::testing
