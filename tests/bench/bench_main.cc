// kvtier-bench: kvtier's benchmark programs. `kvtier-bench MODE --help` for each mode.
#include "tests/bench/bench_main.h"

#include <CLI/CLI.hpp>

#include "protocol/base/units.h"

int main(int argc, char** argv) {
  CLI::App app{
      "kvtier-bench: benchmarks of kvtier, each against a baseline measured in the same run.\n"
      "Every mode starts its own kvtierd on a temporary socket unless --socket is given."};
  app.require_subcommand(1);
  kvtier::bench::BenchArgs args;
  auto* rpc = app.add_subcommand(
      "rpc",
      "Request latency (p50/p99) and ops/s of Lookup 1, Lookup 64, Lookup and Acquire of 8192 (a 128K-token "
      "chain) and Allocate+Commit+Release "
      "16 vs a bare Unix-socket echo of the same sizes");
  auto* nvme = app.add_subcommand("nvme",
                                  "Spill and fetch throughput through kvtierd vs fio on the same file system, "
                                  "for 256 KiB, 2 MiB and 16 MiB pages");
  auto* restart = app.add_subcommand("restart",
                                     "Seconds from start to the first served hit with 1,000,000 indexed NVMe blocks, "
                                     "and RAM per NVMe block");
  restart->add_option("--blocks", args.blocks, "Indexed blocks")->check(CLI::Range(1000, 100'000'000));
  auto* cold = app.add_subcommand("cold-index",
                                  "Another session's Lookup p99 beside a session looking up cold 8,192-block chains "
                                  "(all in the NVMe index, none in memory) vs alone, interleaved rounds; 1,000,000 "
                                  "indexed blocks by default");
  cold->add_option("--blocks", args.blocks, "Indexed blocks")->check(CLI::Range(20'000, 100'000'000));
  cold->add_option("--rounds", args.rounds, "Interleaved rounds (1 s alone, 1 s beside)")->check(CLI::Range(1, 100));
  cold->add_flag("--json", args.json, "Print one JSON object");
  auto* soak = app.add_subcommand(
      "soak",
      "Engine sessions of mixed operations for a set time: fails unless 0 errors, RSS and fds "
      "bounded and every page returned; p99 per operation vs a bare echo under the same concurrency");
  soak->add_option("--sessions", args.sessions, "Engine sessions (threads, one connection each)")
      ->check(CLI::Range(1, 1000));
  soak->add_option("--seconds", args.seconds, "How long the sessions run")->check(CLI::Range(1.0, 86400.0));
  soak->add_option("--host-capacity", args.host_capacity, "Host tier of the daemon it starts (64 KiB pages)");
  soak->add_option("--nvme-capacity", args.nvme_capacity, "NVMe tier of the daemon it starts");
  soak->add_option("--check-rss", args.check_rss,
                   "Fail when the daemon's RSS grows (default true; sanitizer builds say false: their shadow "
                   "memory and freed-memory quarantine grow with the run)");
  auto* events = app.add_subcommand(
      "events",
      "Allocate+Commit p50/p99 (a BlockStored and a BlockRemoved each) against a daemon publishing KV events "
      "to a subscriber that never reads vs one without events, interleaved; RSS before and after");
  events->add_option("--iterations", args.iterations, "Operations per daemon")->check(CLI::Range(100, 10'000'000));
  events->add_option("--rounds", args.rounds, "Interleaved rounds")->check(CLI::Range(1, 1000));
  events->add_flag("--json", args.json, "Print one JSON object");
  auto* remote = app.add_subcommand(
      "remote",
      "Bytes/s kvtierd reads from the remote tier (a Redis Cluster it starts; each Acquire of one block by C "
      "sessions, verified) vs redis-benchmark GET of the same value size and concurrency, interleaved");
  remote->add_option("--concurrency", args.concurrency, "Sessions, and redis-benchmark -c")->check(CLI::Range(1, 256));
  remote->add_option("--rounds", args.rounds, "Interleaved rounds")->check(CLI::Range(1, 100));
  remote->add_option("--iterations", args.iterations, "Fetches per round (all sessions)")
      ->check(CLI::Range(16, 10'000'000));
  remote->add_option("--blocks", args.remote_blocks, "Distinct blocks (at least 4 per session)")
      ->check(CLI::Range(4, 100000));
  remote->add_option_function<std::string>(
      "--block-bytes",
      [&args](const std::string& s) {
        auto b = kvtier::ParseBytes(s);
        if (!b.ok() || *b < 4096) throw CLI::ValidationError("--block-bytes", "a size of at least 4KiB");
        args.block_bytes = *b;
      },
      "Block (value) size, e.g. 2MiB");
  remote->add_flag("--unkeyed", args.remote_unkeyed,
                   "Run the nodes without a fleet secret (values tagged by XXH3, not keyed Poly1305)");
  remote->add_flag("--json", args.json, "Print one JSON object");
  auto* quant = app.add_subcommand(
      "quant",
      "A quantized NVMe tier vs full width, same NVMe bytes (2 MiB bf16 blocks): blocks held (capacity_gain), the "
      "worst round-trip error over its bound (int8, fp8), NVMe fetch throughput ratio (interleaved rounds)");
  quant->add_option("--rounds", args.rounds, "Interleaved fetch rounds")->check(CLI::Range(1, 100));
  quant->add_flag("--json", args.json, "Print one JSON object");
  auto* demotion = app.add_subcommand(
      "demotion",
      "Lookup p50/p99 while a writer drives GPU->host demotions of 2 MiB blocks (--device GPU tier) vs with "
      "no demotions, interleaved phases; lookup_p99_ratio");
  demotion->add_option("--rounds", args.rounds, "Interleaved rounds of a quiet and a burst phase")
      ->check(CLI::Range(1, 1000));
  auto* kv = app.add_subcommand(
      "kv",
      "StoreBlocks/LoadBlocks of 2 MiB blocks between an engine's device KV and host pages vs the device's copy of "
      "the same bytes to/from pinned memory; store_ratio, load_ratio");
  kv->add_option("--rounds", args.rounds, "Rounds (the median is reported)")->check(CLI::Range(1, 100));
  for (auto* sub : {kv, demotion}) {
    sub->add_option("--device", args.device, "GPU backend: cuda or host-emulated")
        ->check(CLI::IsMember({"cuda", "host-emulated"}));
    sub->add_flag("--json", args.json, "Print one JSON object");
  }
  auto* pipeline = app.add_subcommand(
      "pipeline",
      "Lookups/s with 16 sessions x 16 one-block Lookups in flight vs redis-benchmark -c 16 -P 16 -t get on a "
      "redis-server over a Unix socket, same CPU placement, interleaved rounds");
  pipeline->add_option("--rounds", args.rounds, "Interleaved rounds")->check(CLI::Range(1, 100));
  for (auto* sub : {rpc, nvme, restart, soak, pipeline}) {
    sub->add_option("--socket", args.socket, "Measure the kvtierd at this socket");
    sub->add_flag("--json", args.json, "Print one JSON object");
  }
  rpc->add_option("--iterations", args.iterations, "Lookups per operation (Allocate+Commit+Release: a quarter)")
      ->check(CLI::Range(100, 10'000'000));
  rpc->add_option("--rounds", args.rounds, "Interleaved rounds of kvtier then echo")->check(CLI::Range(1, 1000));
  rpc->add_option("--ops", args.ops, "Measure only these operations (for profiling one)")
      ->check(CLI::IsMember({"lookup1", "lookup64", "lookup8192", "acquire8192", "acr16"}));
  CLI11_PARSE(app, argc, argv);
  if (rpc->parsed()) return kvtier::bench::RunRpcBench(args);
  if (nvme->parsed()) return kvtier::bench::RunNvmeBench(args);
  if (restart->parsed()) return kvtier::bench::RunRestartBench(args);
  if (cold->parsed()) return kvtier::bench::RunColdIndexBench(args);
  if (soak->parsed()) return kvtier::bench::RunSoakBench(args);
  if (pipeline->parsed()) {
    if (args.rounds == 10) args.rounds = 5;
    return kvtier::bench::RunPipelineBench(args);
  }
  if (events->parsed()) return kvtier::bench::RunEventsBench(args);
  if (demotion->parsed()) return kvtier::bench::RunDemotionBench(args);
  if (kv->parsed()) {
    if (args.rounds == 10) args.rounds = 5;
    return kvtier::bench::RunKvBench(args);
  }
  if (quant->parsed()) {
    if (args.rounds == 10) args.rounds = 7;
    return kvtier::bench::RunQuantBench(args);
  }
  if (remote->parsed()) {
    if (args.iterations == 20000) args.iterations = 4096;  // this mode's default
    if (args.rounds == 10) args.rounds = 5;
    return kvtier::bench::RunRemoteBench(args);
  }
  return 2;
}
