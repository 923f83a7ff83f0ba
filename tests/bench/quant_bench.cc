// kvtier-bench quant: what a quantized NVMe tier gives and costs, measured in one run on
// three daemons with the same host and NVMe bytes — full width, int8 and fp8 — and
// llama3.1-8b's blocks of 16 tokens in bf16 (2 MiB, KV-like values, head_dim 128):
//   capacity_gain         blocks the int8 tier holds once full ÷ the full-width tier's
//   max_error_over_bound  the worst element of every block read back from the int8 and the
//                         fp8 tiers, |x' - x| over the documented bound (QuantErrorBound
//                         plus half an ulp of bf16): <= 1 is within it
//   fetch_ratio           NVMe fetch throughput of quantized blocks (int8: read, verify,
//                         dequantize on the daemon's workers) ÷ full width, blocks per
//                         second, the median of interleaved rounds
// Each daemon's host tier holds 8 blocks, so the blocks of a round come from NVMe.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "engine/tools/block_pattern.h"
#include "protocol/base/model_presets.h"
#include "protocol/base/units.h"
#include "tests/bench/bench_main.h"
#include "tests/bench/bench_util.h"
#include "tests/integration/engine_process.h"

namespace kvtier::bench {
namespace {

using json = nlohmann::json;

struct Node {
  std::string name;
  std::optional<QuantKind> kind;
  std::unique_ptr<BenchDaemon> daemon;
  std::unique_ptr<Client> client;
  uint64_t nvme_blocks = 0;
  double worst = 0;
};

Result<uint64_t> NvmeBlocks(const std::string& socket) {
  KVTIER_ASSIGN_OR_RETURN(DaemonStats s, testing::StatsOf(socket));
  for (const auto& t : s.tiers) {
    if (t.tier == TierKind::kNvme) return t.blocks;
  }
  return NotFound("no NVMe tier");
}

// Stores `blocks` (KV pattern), a few at a time: the host tier is full after the first
// ones, so each commit spills one out to NVMe.
Status Store(Client& c, const ModelLayout& l, const std::vector<BlockHash>& blocks) {
  for (size_t from = 0; from < blocks.size(); from += 4) {
    const size_t n = std::min<size_t>(4, blocks.size() - from);
    KVTIER_ASSIGN_OR_RETURN(auto pages, c.Allocate(TierKind::kHost, static_cast<uint32_t>(n)));
    std::vector<CommitEntry> e;
    for (size_t i = 0; i < n; ++i) {
      FillKvPattern(blocks[from + i], FloatKind::kBf16, l.head_dim,
                    c.PageBytes(TierKind::kHost, pages[i]).first(l.block_bytes));
      e.push_back({pages[i], blocks[from + i], {}});
    }
    KVTIER_ASSIGN_OR_RETURN(auto r, c.Commit(TierKind::kHost, e));
    for (const auto& x : r) KVTIER_RETURN_IF_ERROR(x.status);
  }
  return Status::Ok();
}

// Acquires `blocks` (each read from NVMe) and releases them: blocks per second. Untimed
// (`timed` false), each is copied out before its release and checked against the pattern
// after: the worst error over the bound.
Result<std::pair<double, double>> Fetch(Client& c, const ModelLayout& l, std::optional<QuantKind> kind,
                                        const std::vector<BlockHash>& blocks, bool timed = true) {
  std::vector<std::vector<uint8_t>> copies(blocks.size());
  const double t0 = NowUs();
  // Four blocks an Acquire, as an engine loads a prefix: their reads (and dequantization)
  // overlap.
  constexpr size_t kBatch = 4;
  for (size_t from = 0; from < blocks.size(); from += kBatch) {
    const std::span<const BlockHash> part(blocks.data() + from, std::min(kBatch, blocks.size() - from));
    KVTIER_ASSIGN_OR_RETURN(auto r, c.Acquire(part));
    std::vector<BlockHash> held;
    for (size_t k = 0; k < part.size(); ++k) {
      if (r[k].status.code() == StatusCode::kNotFound && !timed) continue;  // dropped from a full tier
      KVTIER_RETURN_IF_ERROR(r[k].status);
      if (!timed) {
        const auto bytes = c.PageBytes(r[k].tier, r[k].page).first(l.block_bytes);
        copies[from + k].assign(bytes.begin(), bytes.end());
      }
      held.push_back(part[k]);
    }
    KVTIER_RETURN_IF_ERROR(c.Release(TierKind::kHost, {}, held).status());
  }
  const double secs = (NowUs() - t0) * 1e-6;
  double worst = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!copies[i].empty())
      worst = std::max(worst, KvPatternError(blocks[i], FloatKind::kBf16, l.head_dim, kind, copies[i]));
  }
  return std::make_pair(worst, static_cast<double>(blocks.size()) / secs);
}

}  // namespace

int RunQuantBench(const BenchArgs& args) {
  const ModelLayout layout = FindModelPreset("llama3.1-8b")->Layout(DType::kBFloat16, 16);  // 2 MiB
  const uint64_t block = layout.block_bytes;
  const uint64_t nvme_bytes = 64 * block;
  std::vector<Node> nodes;
  nodes.push_back({"full", std::nullopt});
  nodes.push_back({"int8", QuantKind::kInt8});
  nodes.push_back({"fp8", QuantKind::kFp8E4M3});
  const int n_blocks = 160;  // more than any of the tiers holds
  std::vector<BlockHash> blocks;
  for (int i = 0; i < n_blocks; ++i) blocks.push_back(IndexHash(99, static_cast<uint64_t>(i)));
  for (Node& n : nodes) {
    testing::DaemonProcess::Options o;
    o.page_bytes = FormatBytes(block);
    o.segment_bytes = FormatBytes(4 * block);
    o.host_capacity = FormatBytes(8 * block);
    o.nvme_capacity = FormatBytes(nvme_bytes);
    o.nvme_yaml = "    durability: relaxed\n    high_watermark: 1.0\n    low_watermark: 0.98\n    quantization: " +
                  std::string(n.kind ? (*n.kind == QuantKind::kInt8 ? "int8" : "fp8") : "none") + "\n";
    o.extra_yaml = "security: {unknown_kv_quantization: true}\n";
    auto d = BenchDaemon::Start("", o);
    if (!d.ok()) {
      std::fprintf(stderr, "kvtier-bench quant: %s\n", d.status().ToString().c_str());
      return 1;
    }
    n.daemon = std::move(d).value();
    ClientOptions co;
    co.socket_path = n.daemon->socket();
    co.engine_name = "kvtier-bench";
    co.layout = layout;
    auto c = Client::Connect(co);
    if (!c.ok()) {
      std::fprintf(stderr, "kvtier-bench quant: %s\n", c.status().ToString().c_str());
      return 1;
    }
    n.client = std::move(c).value();
    if (Status st = Store(*n.client, layout, blocks); !st.ok()) {
      std::fprintf(stderr, "kvtier-bench quant: %s: store: %s\n", n.name.c_str(), st.ToString().c_str());
      return 1;
    }
  }
  // Let the last spills land, then count what each NVMe tier holds.
  for (Node& n : nodes) {
    uint64_t last = 0;
    (void)testing::WaitUntil(
        [&] {
          auto b = NvmeBlocks(n.daemon->socket());
          if (!b.ok() || *b != last) {
            last = b.ok() ? *b : 0;
            return false;
          }
          return true;
        },
        std::chrono::seconds(20), std::chrono::milliseconds(200));
    n.nvme_blocks = last;
  }
  // The newest blocks are on every tier's NVMe; the host holds the last 8.
  const size_t common = std::min<size_t>(24, nodes[0].nvme_blocks > 8 ? nodes[0].nvme_blocks - 8 : 0);
  std::vector<BlockHash> probe(blocks.end() - 8 - static_cast<long>(common), blocks.end() - 8);
  std::vector<double> ratios, full_rate, int8_rate;
  const int rounds = std::max(3, args.rounds);
  for (int r = 0; r < rounds; ++r) {
    double rate[3] = {0, 0, 0};
    for (size_t i = 0; i < nodes.size(); ++i) {
      auto f = Fetch(*nodes[i].client, layout, nodes[i].kind, probe);
      if (!f.ok()) {
        std::fprintf(stderr, "kvtier-bench quant: %s: fetch: %s\n", nodes[i].name.c_str(),
                     f.status().ToString().c_str());
        return 1;
      }
      nodes[i].worst = std::max(nodes[i].worst, f->first);
      rate[i] = f->second;
    }
    full_rate.push_back(rate[0]);
    int8_rate.push_back(rate[1]);
    ratios.push_back(rate[1] / rate[0]);
  }
  // Every block each tier holds, read back once more and checked (the full-width tier's
  // must be exact).
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::vector<BlockHash> held(blocks.end() - static_cast<long>(std::min<uint64_t>(nodes[i].nvme_blocks, n_blocks)),
                                blocks.end());
    auto f = Fetch(*nodes[i].client, layout, nodes[i].kind, held, /*timed=*/false);
    if (!f.ok()) {
      std::fprintf(stderr, "kvtier-bench quant: %s: %s\n", nodes[i].name.c_str(), f.status().ToString().c_str());
      return 1;
    }
    nodes[i].worst = std::max(nodes[i].worst, f->first);
  }
  const double gain = nodes[0].nvme_blocks ? static_cast<double>(nodes[1].nvme_blocks) / nodes[0].nvme_blocks : 0;
  const double worst = std::max(nodes[1].worst, nodes[2].worst);
  const json j{
      {"model", layout.ToString()},
      {"block_bytes", block},
      {"nvme_bytes", nvme_bytes},
      {"nvme_blocks", {{"full", nodes[0].nvme_blocks}, {"int8", nodes[1].nvme_blocks}, {"fp8", nodes[2].nvme_blocks}}},
      {"capacity_gain", gain},
      {"max_error_over_bound", worst},
      {"max_error_over_bound_by_kind", {{"int8", nodes[1].worst}, {"fp8", nodes[2].worst}}},
      {"full_width_error", nodes[0].worst},
      {"fetch_blocks_per_s", {{"full", Median(full_rate)}, {"int8", Median(int8_rate)}}},
      {"fetch_ratio", Median(ratios)},
      {"fetch_ratios", ratios},
      {"rounds", rounds},
      {"blocks_per_round", probe.size()}};
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("quantized NVMe tier, %s blocks of %s, %s of NVMe each\n", layout.ToString().c_str(),
                FormatBytes(block).c_str(), FormatBytes(nvme_bytes).c_str());
    std::printf("  blocks held        full %llu, int8 %llu, fp8 %llu: capacity_gain %.2f\n",
                static_cast<unsigned long long>(nodes[0].nvme_blocks),
                static_cast<unsigned long long>(nodes[1].nvme_blocks),
                static_cast<unsigned long long>(nodes[2].nvme_blocks), gain);
    std::printf("  worst error/bound  int8 %.6f, fp8 %.6f (full width %.6f: exact)\n", nodes[1].worst, nodes[2].worst,
                nodes[0].worst);
    std::printf("  NVMe fetch         full %.0f blocks/s, int8 %.0f blocks/s: fetch_ratio %.2f (median of %d)\n",
                Median(full_rate), Median(int8_rate), Median(ratios), rounds);
  }
  return nodes[0].worst == 0 ? 0 : 1;
}

}  // namespace kvtier::bench
