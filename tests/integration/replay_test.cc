// kvtier-replay and kvtier-sim as a user runs them: a generated trace replayed by several
// engine processes against a real kvtierd with small host and NVMe tiers, every block read
// back verified.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/tools/block_pattern.h"
#include "engine/tools/trace.h"
#include "protocol/base/model_presets.h"
#include "tests/integration/engine_process.h"

namespace kvtier::testing {
namespace {

DaemonProcess::Options SmallTiers() {
  DaemonProcess::Options o;
  o.host_capacity = "4MiB";  // 256 pages of 16 KiB
  o.page_bytes = "16KiB";
  o.segment_bytes = "1MiB";
  o.nvme_capacity = "8MiB";  // 512 slots
  o.nvme_yaml = "    durability: relaxed\n";
  o.log_level = "notice";
  return o;
}

// Runs a tool; its stdout parsed as JSON (stderr is kept apart).
nlohmann::json RunJson(const std::string& cmd, const TempDir& dir, int* code) {
  CmdResult r = Sh("(" + cmd + " 2>" + dir.File("stderr") + ")");
  *code = r.code;
  auto j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << cmd << "\n" << r.out;
  return j;
}

std::string Replay(const DaemonProcess& d, const std::string& trace, const std::string& extra = "") {
  return BinaryPath("kvtier-replay") + " --trace " + trace + " -s " + d.socket_path() + " --block-bytes 16KiB --json " +
         extra;
}

TEST(Replay, SessionsReconnectWhenTheDaemonIsKilledAndRestartedMidRun) {
  // An engine does not stop because its cache daemon restarted: the replay's sessions miss
  // while it is gone, reconnect, and hit the warm NVMe index after.
  auto trace = GenerateTrace("conversation", 400, 9);
  ASSERT_TRUE(trace.ok());
  TempDir dir;
  ASSERT_TRUE(WriteTrace(*trace, dir.File("t.jsonl")).ok());
  DaemonProcess::Options o = SmallTiers();
  o.nvme_yaml += "    write_policy: write_through\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  // About 4 s of requests at the trace's pace scaled so the restart lands in the middle.
  const double span_s = trace->requests.back().timestamp_ms / 1000.0;
  const std::string speed = std::to_string(span_s / 4.0);
  int code = -1;
  nlohmann::json j;
  std::thread replay([&] { j = RunJson(Replay(d, dir.File("t.jsonl"), "--sessions 2 --speed " + speed), dir, &code); });
  EXPECT_TRUE(WaitForLookups(d, 100)) << d.Log();  // well into the trace
  d.Kill();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a gap with no daemon: requests in it fail
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  replay.join();
  EXPECT_EQ(code, 0) << j.dump(2);
  EXPECT_EQ(j["requests"], 400);
  EXPECT_EQ(j["corrupt"], 0);
  EXPECT_EQ(j["errors"], 0) << "a daemon that went away is a miss, not an error";
  EXPECT_GT(j["unavailable"].get<uint64_t>() + j["reconnects"].get<uint64_t>(), 0u) << j.dump(2);
  EXPECT_GT(j["hits"]["host"].get<uint64_t>() + j["hits"]["nvme"].get<uint64_t>(), 0u);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(Replay, AWholeTraceVerifiesAndHitsBothTiers) {
  auto trace = GenerateTrace("conversation-long", 600, 5);
  ASSERT_TRUE(trace.ok());
  TempDir dir;
  ASSERT_TRUE(WriteTrace(*trace, dir.File("t.jsonl")).ok());
  DaemonProcess d(SmallTiers());
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  int code = -1;
  auto j = RunJson(Replay(d, dir.File("t.jsonl"), "--sessions 3"), dir, &code);
  EXPECT_EQ(code, 0) << j.dump(2);
  EXPECT_EQ(j["requests"], 600);
  EXPECT_EQ(j["blocks"], trace->total_blocks);
  EXPECT_EQ(j["corrupt"], 0);
  EXPECT_EQ(j["errors"], 0);
  EXPECT_GT(j["hits"]["host"].get<uint64_t>(), 0u);
  EXPECT_GT(j["hits"]["nvme"].get<uint64_t>(), 0u);
  const uint64_t hits = j["hits"]["host"].get<uint64_t>() + j["hits"]["nvme"].get<uint64_t>();
  EXPECT_DOUBLE_EQ(j["hit_ratio"].get<double>(), static_cast<double>(hits) / trace->total_blocks);
  EXPECT_EQ(j["bytes_moved"]["nvme"].get<uint64_t>(), j["hits"]["nvme"].get<uint64_t>() * 16384);
  // The TTFT model: caching never makes the first token later than no cache, and kvtier
  // in front of nothing but a GPU cache of the same HBM caches at least as much.
  const auto& m = j["ttft_model"];
  EXPECT_LE(m["kvtier_mean_s"].get<double>(), m["no_cache_mean_s"].get<double>());
  EXPECT_GE(m["kvtier_hit_ratio"].get<double>(), m["gpu_only_hit_ratio"].get<double>());
  EXPECT_GT(m["no_cache_mean_s"].get<double>(), 0);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(Replay, BytesThatDoNotMatchTheirBlockAreReportedAsCorrupt) {
  // Another engine of the same model commits the trace's first blocks with the wrong
  // bytes; the replay's first request hits them and must call them corrupt.
  TempDir dir;
  auto trace = GenerateTrace("zipf", 20, 1);
  ASSERT_TRUE(trace.ok());
  ASSERT_TRUE(WriteTrace(*trace, dir.File("t.jsonl")).ok());
  DaemonProcess d(SmallTiers());
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  {
    ClientOptions o = EngineOptions(d.socket_path(), "liar");
    o.layout = FindModelPreset("llama3.1-8b")->Layout(DType::kBFloat16, 512);
    o.layout.block_bytes = 16384;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const TraceRequest& first = trace->requests[0];
    std::vector<BlockHash> chain;
    BlockHash parent;
    for (uint32_t id : first.blocks) {
      const uint32_t tokens[1] = {id};
      chain.push_back(parent = ChainHash(parent, tokens));
    }
    auto pages = (*c)->Allocate(TierKind::kHost, static_cast<uint32_t>(chain.size()));
    ASSERT_TRUE(pages.ok());
    std::vector<CommitEntry> e;
    for (size_t k = 0; k < chain.size(); ++k) {
      auto bytes = (*c)->PageBytes(TierKind::kHost, (*pages)[k]);
      FillBlockPattern(chain[(k + 1) % chain.size()], bytes.first(16384));  // someone else's bytes
      e.push_back({(*pages)[k], chain[k], k ? chain[k - 1] : BlockHash()});
    }
    ASSERT_TRUE((*c)->Commit(TierKind::kHost, e).ok());
  }
  int code = -1;
  auto j = RunJson(Replay(d, dir.File("t.jsonl"), "--sessions 1 --max-requests 1"), dir, &code);
  EXPECT_EQ(code, 1);
  EXPECT_EQ(j["corrupt"], trace->requests[0].blocks.size());
  EXPECT_EQ(j["hits"]["host"], 0);  // a corrupt block is never counted as a hit
}

TEST(Replay, RefusesAnUnknownModelOrAMissingTrace) {
  TempDir dir;
  CmdResult r = Sh(BinaryPath("kvtier-replay") + " --trace " + dir.File("none.jsonl") + " --model gpt-9");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("gpt-9"), std::string::npos) << r.out;
  r = Sh(BinaryPath("kvtier-replay") + " --trace " + dir.File("none.jsonl"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("none.jsonl"), std::string::npos) << r.out;
}

TEST(Sim, PrintsOneJsonObjectWithLruBeladyAndTheDefault) {
  TempDir dir;
  int code = -1;
  auto j = RunJson(
      BinaryPath("kvtier-sim") + " --synthetic conversation --requests 800 --json --write-trace " + dir.File("c.jsonl"),
      dir, &code);
  ASSERT_EQ(code, 0);
  EXPECT_EQ(j["default_policy"], "adaptive");
  EXPECT_GT(j["unique_blocks"].get<uint64_t>(), 0u);
  std::map<std::pair<std::string, int>, std::vector<double>> seen;
  for (const auto& r : j["results"]) seen[{r["policy"], r["tiers"]}].push_back(r["capacity_fraction"]);
  for (const char* p : {"lru", "belady", "adaptive", "prefix-lru", "arc", "prefix-arc"}) {
    EXPECT_EQ(seen[std::make_pair(std::string(p), 1)], (std::vector<double>{0.01, 0.05, 0.2})) << p;
  }
  EXPECT_EQ(seen[std::make_pair(std::string("lru"), 2)].size(), 3u);
  EXPECT_EQ(seen[std::make_pair(std::string("belady"), 2)].size(), 3u);
  // The trace it wrote reads back as the same trace.
  auto again = RunJson(BinaryPath("kvtier-sim") + " --trace " + dir.File("c.jsonl") + " --json", dir, &code);
  ASSERT_EQ(code, 0);
  EXPECT_EQ(again["unique_blocks"], j["unique_blocks"]);
  EXPECT_EQ(again["results"], j["results"]);
  CmdResult r = Sh(BinaryPath("kvtier-sim") + " --synthetic zipf --fractions 0.1,2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("'2'"), std::string::npos) << r.out;
  r = Sh(BinaryPath("kvtier-sim") + " --synthetic spiral");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("spiral"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kvtier::testing
