// kvctl's operator commands against a real kvtierd: lookup and explain (why a block is
// not a hit), blocks, evict, drain before maintenance, top, plan — through the binary, as
// an operator runs them, reading its --json.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "engine/tools/block_pattern.h"
#include "tests/integration/device_pages.h"
#include "tests/integration/engine_process.h"

namespace kvtier::testing {
namespace {

using json = nlohmann::json;

const uint64_t kBlock = TestLayout().block_bytes;  // 64 KiB

Status StoreChain(Client& c, TierKind tier, const std::vector<BlockHash>& chain) {
  KVTIER_ASSIGN_OR_RETURN(auto pages, c.Allocate(tier, static_cast<uint32_t>(chain.size())));
  std::vector<CommitEntry> e;
  for (size_t i = 0; i < chain.size(); ++i) {
    KVTIER_RETURN_IF_ERROR(FillPage(c, tier, pages[i], chain[i], kBlock));
    e.push_back({pages[i], chain[i], i ? chain[i - 1] : BlockHash()});
  }
  KVTIER_ASSIGN_OR_RETURN(auto r, c.Commit(tier, e));
  for (const auto& x : r) KVTIER_RETURN_IF_ERROR(x.status);
  return Status::Ok();
}

json Kvctl(const DaemonProcess& d, const std::string& args, int want_code = 0) {
  CmdResult r = Sh(BinaryPath("kvctl") + " " + args + " --json --socket " + d.socket_path());
  EXPECT_EQ(r.code, want_code) << args << "\n" << r.out;
  if (r.code != 0) return json();
  return json::parse(r.out, nullptr, false);
}

std::string Hex(const BlockHash& h) { return h.Hex(); }

ClientOptions OtherModel(const std::string& socket) {
  ClientOptions o = EngineOptions(socket, "other-model");
  o.layout.model_id = "another-model";  // another layout fingerprint: another namespace
  return o;
}

TEST(KvctlExplain, SaysWhereABlockIsAndWhyItIsNotAHit) {
  DaemonProcess::Options opts;
  opts.host_capacity = "4MiB";  // 64 pages of 64 KiB, no NVMe: evicted blocks are gone
  opts.page_bytes = "64KiB";
  opts.segment_bytes = "1MiB";
  DaemonProcess d(opts);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto a = Client::Connect(EngineOptions(d.socket_path()));
  auto b = Client::Connect(OtherModel(d.socket_path()));
  ASSERT_TRUE(a.ok() && b.ok());
  const auto first = HashChain(1, 4), other = HashChain(2, 2), never = HashChain(3, 1);
  ASSERT_TRUE(StoreChain(**a, TierKind::kHost, first).ok());
  ASSERT_TRUE(StoreChain(**b, TierKind::kHost, other).ok());
  std::string ns_a;
  auto stats = StatsOf(d.socket_path(), true);
  ASSERT_TRUE(stats.ok());
  for (const auto& s : stats->sessions) {
    if (s.engine_name == "test-engine") ns_a = s.namespace_id;
  }
  ASSERT_FALSE(ns_a.empty());

  // lookup: cached blocks and where.
  json l = Kvctl(d, "lookup " + Hex(first[0]) + " " + Hex(never[0]));
  ASSERT_EQ(l["blocks"].size(), 2u);
  EXPECT_EQ(l["blocks"][0]["state"], "cached");
  EXPECT_EQ(l["blocks"][0]["tier"], "host");
  EXPECT_EQ(l["blocks"][0]["namespace"], ns_a);
  EXPECT_EQ(l["blocks"][1]["state"], "never-stored");

  // explain in engine A's namespace: B's block is there under another model.
  json e = Kvctl(d, "explain --namespace " + ns_a + " " + Hex(other[0]));
  EXPECT_EQ(e["blocks"][0]["state"], "other-namespace");
  EXPECT_EQ(e["blocks"][0]["model"], "another-model");
  EXPECT_NE(e["blocks"][0]["detail"].get<std::string>().find("layout"), std::string::npos);

  // Fill the host tier with newer blocks so that `first` is evicted (LRU, no NVMe).
  for (uint64_t seed = 100; seed < 140; ++seed) ASSERT_TRUE(StoreChain(**a, TierKind::kHost, HashChain(seed, 4)).ok());
  json ev = Kvctl(d, "explain --namespace " + ns_a + " " + Hex(first[0]));
  EXPECT_EQ(ev["blocks"][0]["state"], "evicted") << ev.dump();
  EXPECT_EQ(ev["blocks"][0]["tier"], "host");
  EXPECT_GE(ev["blocks"][0]["seconds_ago"].get<double>(), 0.0);
  EXPECT_NE(ev["blocks"][0]["detail"].get<std::string>().find("no NVMe tier"), std::string::npos);

  // Committed again after that eviction: the thrash counter moves, and it is a hit again.
  const uint64_t before = StatsOf(d.socket_path())->refetches_after_evict;
  ASSERT_TRUE(StoreChain(**a, TierKind::kHost, first).ok());
  EXPECT_EQ(StatsOf(d.socket_path())->refetches_after_evict, before + first.size());
  EXPECT_EQ(Kvctl(d, "lookup " + Hex(first[0]))["blocks"][0]["state"], "cached");

  // Bad input is a usage error, not a daemon error.
  CmdResult bad = Sh(BinaryPath("kvctl") + " explain nothex --socket " + d.socket_path());
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("not a block hash"), std::string::npos) << bad.out;
  EXPECT_EQ(d.Stop(), 0);
}

TEST(KvctlBlocks, ListsTheMostHitBlocksFirstAndFiltersByNamespaceAndTier) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto a = Client::Connect(EngineOptions(d.socket_path()));
  auto b = Client::Connect(OtherModel(d.socket_path()));
  ASSERT_TRUE(a.ok() && b.ok());
  const auto chain = HashChain(7, 3);
  ASSERT_TRUE(StoreChain(**a, TierKind::kHost, chain).ok());
  ASSERT_TRUE(StoreChain(**b, TierKind::kHost, HashChain(8, 2)).ok());
  // Block 0 is in every lookup's prefix; block 2 only in one.
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*a)->Lookup(std::vector<BlockHash>{chain[0]}).ok());
  ASSERT_TRUE((*a)->Lookup(chain).ok());
  json all = Kvctl(d, "blocks");
  ASSERT_EQ(all["blocks"].size(), 5u);
  EXPECT_EQ(all["blocks"][0]["hash"], Hex(chain[0]));
  EXPECT_EQ(all["blocks"][0]["hits"], 6);
  EXPECT_EQ(all["blocks"][0]["bytes"], kBlock);
  const std::string ns = all["blocks"][0]["namespace"];
  json mine = Kvctl(d, "blocks --namespace " + ns + " --limit 2");
  ASSERT_EQ(mine["blocks"].size(), 2u);
  for (const auto& x : mine["blocks"]) EXPECT_EQ(x["namespace"], ns);
  EXPECT_EQ(Kvctl(d, "blocks --tier gpu", 1), json()) << "no GPU tier configured";
  EXPECT_EQ(d.Stop(), 0);
}

TEST(KvctlEvict, FreesTheBytesAskedForAndDemotesToNvmeFirst) {
  DaemonProcess::Options opts;
  opts.nvme_capacity = "64MiB";
  DaemonProcess d(opts);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto a = Client::Connect(EngineOptions(d.socket_path()));
  ASSERT_TRUE(a.ok());
  const auto chain = HashChain(9, 8);
  ASSERT_TRUE(StoreChain(**a, TierKind::kHost, chain).ok());
  json r = Kvctl(d, "evict --tier host --bytes 4MiB");  // 4 pages of 1 MiB
  EXPECT_EQ(r["blocks"], 4);
  EXPECT_EQ(r["bytes"], 4u << 20);
  // Demoted, not lost: every block is still a hit, four of them on NVMe once written.
  WaitUntil(
      [&] {
        auto l = (*a)->Lookup(chain);
        EXPECT_TRUE(l.ok());
        EXPECT_EQ(l.ok() ? l->matched : 0, chain.size());
        return !l.ok() || std::count(l->tiers.begin(), l->tiers.end(), TierKind::kNvme) == 4;
      },
      std::chrono::seconds(2));
  auto l = (*a)->Lookup(chain);
  EXPECT_EQ(std::count(l->tiers.begin(), l->tiers.end(), TierKind::kNvme), 4);
  json n = Kvctl(d, "evict --tier nvme --bytes 1MiB");
  EXPECT_EQ(n["blocks"], 1);
  EXPECT_EQ(d.Stop(), 0);
}

TEST(KvctlDrain, MovesGpuBlocksDownToNvmeRefusesGpuLeasesAndARestartKeepsThem) {
  DaemonProcess::Options opts;
  opts.host_capacity = "8MiB";
  opts.page_bytes = "64KiB";
  opts.segment_bytes = "1MiB";
  opts.gpu_capacity = "4MiB";
  opts.gpu_segment_bytes = "2MiB";  // a VMM granule
  opts.nvme_capacity = "32MiB";
  DaemonProcess d(opts);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const auto gpu_chain = HashChain(11, 6), host_chain = HashChain(12, 6);
  {
    auto a = Client::Connect(EngineOptions(d.socket_path()));
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(StoreChain(**a, TierKind::kGpu, gpu_chain).ok());
    ASSERT_TRUE(StoreChain(**a, TierKind::kHost, host_chain).ok());
  }
  json r = Kvctl(d, "drain --timeout 30");
  EXPECT_EQ(r["complete"], true) << r.dump();
  EXPECT_EQ(r["draining"], true);
  EXPECT_EQ(r["gpu_blocks_left"], 0);
  EXPECT_EQ(r["host_blocks_unspilled"], 0);
  auto a = Client::Connect(EngineOptions(d.socket_path()));
  ASSERT_TRUE(a.ok());
  auto gpu = (*a)->Allocate(TierKind::kGpu, 1);
  EXPECT_EQ(gpu.status().code(), StatusCode::kUnavailable) << "a GPU lease during the drain";
  EXPECT_TRUE((*a)->Allocate(TierKind::kHost, 1).ok()) << "host leases go on";
  a->reset();
  // Maintenance: a restart keeps every block, now served from NVMe.
  ASSERT_EQ(d.Stop(), 0);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Connect(EngineOptions(d.socket_path()));
  ASSERT_TRUE(c.ok());
  for (const auto* chain : {&gpu_chain, &host_chain}) {
    auto l = (*c)->Lookup(*chain);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(l->matched, chain->size());
    auto acq = (*c)->Acquire(*chain);
    ASSERT_TRUE(acq.ok());
    for (size_t i = 0; i < chain->size(); ++i) {
      ASSERT_TRUE((*acq)[i].status.ok()) << i;
      EXPECT_TRUE(CheckBlockPattern((*chain)[i], (*c)->PageBytes((*acq)[i].tier, (*acq)[i].page).first(kBlock)));
    }
  }
  // A new run starts undrained; --resume on a drained daemon ends it.
  EXPECT_TRUE((*c)->Allocate(TierKind::kGpu, 1).ok());
  EXPECT_EQ(Kvctl(d, "drain --no-wait")["draining"], true);
  EXPECT_EQ(Kvctl(d, "drain --resume")["draining"], false);
  EXPECT_EQ(d.Stop(), 0);
}

// One screen of top fits a terminal of 80 x 24.
TEST(KvctlTop, EachScreenFits80By24AndShowsTiersHitRatioPathsAndSessions) {
  DaemonProcess::Options opts;
  opts.nvme_capacity = "64MiB";
  DaemonProcess d(opts);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  std::vector<std::unique_ptr<Client>> engines;
  for (int i = 0; i < 30; ++i) {  // more sessions than the screen has rows for
    auto c = Client::Connect(EngineOptions(d.socket_path(), "engine-" + std::to_string(i)));
    ASSERT_TRUE(c.ok());
    engines.push_back(std::move(*c));
  }
  ASSERT_TRUE(StoreChain(*engines[0], TierKind::kHost, HashChain(21, 4)).ok());
  ASSERT_TRUE(engines[1]->Lookup(HashChain(21, 4)).ok());
  CmdResult r = Sh(BinaryPath("kvctl") + " top --iterations 2 --interval 0.2 --socket " + d.socket_path());
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string clear = "\x1b[H\x1b[2J";
  size_t screens = 0;
  for (size_t at = r.out.find(clear); at != std::string::npos; at = r.out.find(clear, at + 1)) {
    const size_t end = r.out.find(clear, at + 1);
    std::string screen =
        r.out.substr(at + clear.size(), end == std::string::npos ? std::string::npos : end - at - clear.size());
    std::istringstream in(screen);
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
      ++lines;
      EXPECT_LE(line.size(), 80u) << line;
    }
    EXPECT_LE(lines, 24) << screen;
    EXPECT_NE(screen.find("hit ratio 100.0%"), std::string::npos) << screen;
    for (const char* s : {"host ", "nvme ", "host -> nvme", "nvme -> host", "fetch queue", "engine-"}) {
      EXPECT_NE(screen.find(s), std::string::npos) << s << "\n" << screen;
    }
    EXPECT_NE(screen.find("sessions in all"), std::string::npos) << "31 sessions do not fit: say how many";
    ++screens;
  }
  EXPECT_EQ(screens, 2u);
  EXPECT_EQ(d.Stop(), 0);
}

TEST(KvctlPlan, Llama8bOnAnH200AgreesWithTheHandComputation) {
  CmdResult r =
      Sh(BinaryPath("kvctl") + " plan --model llama3.1-8b --context 131072 --concurrency 32 --gpu-mem 141GiB --json");
  ASSERT_EQ(r.code, 0) << r.out;
  json j = json::parse(r.out);
  EXPECT_EQ(j["kv_bytes_per_token"], 131072);  // 2 x 32 x 8 x 128 x 2 bytes
  EXPECT_EQ(j["kv_bytes_total"], uint64_t{131072} * 131072 * 32);
  EXPECT_GT(j["gpu_kv_budget_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["offload_bytes"].get<uint64_t>(),
            j["kv_bytes_total"].get<uint64_t>() - j["gpu_kv_budget_bytes"].get<uint64_t>());
  CmdResult text =
      Sh(BinaryPath("kvctl") + " plan --model llama3.1-8b --context 131072 --concurrency 32 --gpu-mem 141GiB");
  EXPECT_NE(text.out.find("must live in host RAM or on NVMe"), std::string::npos) << text.out;
  EXPECT_EQ(Sh(BinaryPath("kvctl") + " plan --model nope --context 1 --gpu-mem 1GiB").code, 2);
}

}  // namespace
}  // namespace kvtier::testing
