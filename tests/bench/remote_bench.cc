// kvtier-bench remote: how fast kvtierd reads blocks from the remote tier, against
// redis-benchmark GETs of the same value size and concurrency, in one run.
//
// A Redis Cluster of its own (3 masters on loopback ports). Node A (a kvtierd) stores
// --blocks blocks of --block-bytes (2 MiB: llama3.1-8b's 16 tokens in bf16) and writes
// them through to the cluster. Node B (another kvtierd, no NVMe, a host tier of two pages
// per session) serves --concurrency engine sessions, each acquiring one block at a time
// and releasing it, cycling through the blocks so that nearly every Acquire reads its
// block from the cluster (verified on the way: header, layout, checksum). The measure is
// bytes B read from the cluster per second (its own counters), so blocks served from
// host do not flatter it; the time includes the sessions' connects, as redis-benchmark's
// includes its clients'. The baseline: `redis-benchmark --cluster -c C -n FETCHES -d BYTES
// -t get` (after one SET pass), its requests per second times the value size. Both
// amortize their start over the round, so a round must be long: --iterations (default
// 4096) fetches. Rounds interleave the two; fetch_ratio is the median of per-round ratios.
// The nodes share a fleet secret (values tagged with Poly1305 under per-value keys, as production runs
// them) unless --unkeyed (XXH3-128 tags).
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "protocol/base/model_presets.h"
#include "protocol/base/units.h"
#include "tests/bench/bench_main.h"
#include "tests/bench/bench_util.h"
#include "tests/integration/engine_process.h"
#include "tests/support/redis_cluster_process.h"

namespace kvtier::bench {
namespace {

using json = nlohmann::json;

// Requests per second of redis-benchmark's `test` (set or get; --csv), or -1. In cluster
// mode its keys are one per master ("key:{tag}:__rand_int__"), so a SET run first gives
// every GET a value of `bytes`.
double RedisBenchmark(const testing::RedisClusterProcess& rc, const std::string& test, int clients, int requests,
                      uint64_t bytes) {
  const testing::CmdResult r = testing::Sh("redis-benchmark --cluster -h 127.0.0.1 -p " + std::to_string(rc.port(0)) +
                                           " -c " + std::to_string(clients) + " -n " + std::to_string(requests) +
                                           " -d " + std::to_string(bytes) + " -t " + test + " --csv 2>/dev/null");
  std::string name = test;
  for (char& ch : name) ch = static_cast<char>(std::toupper(ch));
  const size_t at = r.out.find("\"" + name + "\",\"");
  return at == std::string::npos ? -1 : std::stod(r.out.substr(at + name.size() + 4));
}

ModelLayout Layout(uint64_t block_bytes) {
  ModelLayout l = FindModelPreset("llama3.1-8b")->Layout(DType::kBFloat16, 16);
  l.block_bytes = block_bytes;
  return l;
}

}  // namespace

int RunRemoteBench(const BenchArgs& args) {
  if (!testing::RedisClusterProcess::Available()) {
    std::fprintf(stderr, "kvtier-bench remote: redis-server and redis-cli are needed (scripts/deps.sh)\n");
    return 2;
  }
  const uint64_t block_bytes = args.block_bytes;
  const int c = args.concurrency;
  const int n_blocks = std::max(args.remote_blocks, 4 * c);
  testing::RedisClusterProcess rc({.masters = 3, .replicas_per_master = 0, .maxmemory = "2gb"});
  if (Status st = rc.Start(); !st.ok()) {
    std::fprintf(stderr, "kvtier-bench remote: %s\n", st.ToString().c_str());
    return 1;
  }
  const std::string page = FormatBytes(block_bytes);
  testing::DaemonProcess::Options oa;
  oa.page_bytes = page;
  oa.segment_bytes = FormatBytes(block_bytes * 16);
  oa.host_capacity = FormatBytes(block_bytes * 16 * ((n_blocks + 31) / 16));
  oa.remote_nodes = rc.Seeds();
  testing::TempDir secret_dir;
  if (!args.remote_unkeyed) {
    const std::string path = secret_dir.File("secret");
    std::ofstream(path) << "kvtier-bench-fleet-secret-0123456789abcdef\n";
    ::chmod(path.c_str(), 0600);
    oa.remote_yaml = "    secret_file: " + path + "\n";
  }
  testing::DaemonProcess::Options ob = oa;
  ob.host_capacity = FormatBytes(block_bytes * 2 * c);
  ob.segment_bytes = FormatBytes(block_bytes * 2);
  auto a = BenchDaemon::Start("", oa);
  auto b = BenchDaemon::Start("", ob);
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "kvtier-bench remote: %s\n", (!a.ok() ? a.status() : b.status()).ToString().c_str());
    return 1;
  }
  ClientOptions co;
  co.engine_name = "kvtier-bench";
  co.layout = Layout(block_bytes);
  std::vector<BlockHash> blocks;
  for (int i = 0; i < n_blocks; ++i) blocks.push_back(IndexHash(88, static_cast<uint64_t>(i)));
  {
    co.socket_path = (*a)->socket();
    auto writer = Client::Connect(co);
    if (!writer.ok()) {
      std::fprintf(stderr, "kvtier-bench remote: %s\n", writer.status().ToString().c_str());
      return 1;
    }
    std::mt19937_64 rng(7);
    for (int from = 0; from < n_blocks; from += 8) {
      const int n = std::min(8, n_blocks - from);
      auto pages = (*writer)->Allocate(TierKind::kHost, static_cast<uint32_t>(n));
      if (!pages.ok()) {
        std::fprintf(stderr, "kvtier-bench remote: %s\n", pages.status().ToString().c_str());
        return 1;
      }
      std::vector<CommitEntry> e;
      for (int i = 0; i < n; ++i) {
        auto bytes = (*writer)->PageBytes(TierKind::kHost, (*pages)[i]);
        for (size_t k = 0; k + 8 <= block_bytes; k += 8) {
          const uint64_t v = rng();
          std::memcpy(bytes.data() + k, &v, 8);
        }
        e.push_back({(*pages)[i], blocks[from + i], {}});
      }
      if (auto r = (*writer)->Commit(TierKind::kHost, e); !r.ok()) return 1;
    }
  }
  if (!testing::WaitUntil(
          [&] {
            auto s = testing::StatsOf((*a)->socket());
            return s.ok() && s->remote && s->remote->puts >= static_cast<uint64_t>(n_blocks);
          },
          std::chrono::seconds(60))) {
    std::fprintf(stderr, "kvtier-bench remote: node A did not put its blocks into the cluster\n");
    return 1;
  }
  auto remote_bytes = [&] {
    auto s = testing::StatsOf((*b)->socket());
    return s.ok() && s->remote ? s->remote->fetch_bytes : 0;
  };
  if (RedisBenchmark(rc, "set", c, 4 * c, block_bytes) <= 0) {
    std::fprintf(stderr, "kvtier-bench remote: redis-benchmark did not run\n");
    return 1;
  }
  std::vector<double> kv_gbs, redis_gbs, ratios;
  uint64_t errors = 0;
  const int per_session = std::max(1, args.iterations / c);
  for (int round = 0; round < args.rounds; ++round) {
    // kvtier: C sessions, one Acquire of one block outstanding each.
    std::atomic<uint64_t> failed{0};
    const uint64_t before = remote_bytes();
    const double t0 = NowUs();
    std::vector<std::thread> threads;
    for (int t = 0; t < c; ++t) {
      threads.emplace_back([&, t] {
        ClientOptions o = co;
        o.socket_path = (*b)->socket();
        auto cl = Client::Connect(o);
        if (!cl.ok()) {
          failed += per_session;
          return;
        }
        for (int k = 0; k < per_session; ++k) {
          const BlockHash& h = blocks[static_cast<size_t>((t + k * c + round) % n_blocks)];
          auto r = (*cl)->Acquire(std::span<const BlockHash>(&h, 1));
          if (!r.ok() || !(*r)[0].status.ok()) {
            ++failed;
            continue;
          }
          (void)(*cl)->Release(TierKind::kHost, {}, std::span<const BlockHash>(&h, 1));
        }
      });
    }
    for (auto& th : threads) th.join();
    const double secs = (NowUs() - t0) * 1e-6;
    const double kv = static_cast<double>(remote_bytes() - before) / secs / 1e9;
    errors += failed;
    // redis-benchmark: the same value size, concurrency and number of requests.
    const double gets = RedisBenchmark(rc, "get", c, per_session * c, block_bytes);
    const double rb = gets * static_cast<double>(block_bytes) / 1e9;
    kv_gbs.push_back(kv);
    redis_gbs.push_back(rb);
    ratios.push_back(rb > 0 ? kv / rb : 0);
  }
  const json j{{"block_bytes", block_bytes},
               {"concurrency", c},
               {"blocks", n_blocks},
               {"rounds", args.rounds},
               {"fetches_per_round", per_session * c},
               {"kvtier_fetch_gbs", Median(kv_gbs)},
               {"redis_get_gbs", Median(redis_gbs)},
               {"fetch_ratio", Median(ratios)},
               {"fetch_ratios", ratios},
               {"failed_acquires", errors},
               {"values", args.remote_unkeyed ? "unkeyed (XXH3-128)" : "keyed (Poly1305)"},
               {"baseline", "redis-benchmark --cluster -c C -n FETCHES -d BYTES -t get (rps x BYTES)"}};
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("remote fetch of %s blocks, %d sessions, %d rounds of %d fetches, values %s\n",
                FormatBytes(block_bytes).c_str(), c, args.rounds, per_session * c,
                args.remote_unkeyed ? "unkeyed (XXH3-128)" : "keyed (Poly1305)");
    std::printf("  kvtierd from the cluster  %.2f GB/s (median)\n", Median(kv_gbs));
    std::printf("  redis-benchmark GET       %.2f GB/s (median)\n", Median(redis_gbs));
    std::printf("  fetch_ratio               %.2f (median of per-round ratios)\n", Median(ratios));
    if (errors) std::printf("  %llu acquires failed\n", static_cast<unsigned long long>(errors));
  }
  return errors == 0 ? 0 : 1;
}

}  // namespace kvtier::bench
