#pragma once
// kvtier-bench modes. Each starts its own kvtierd on a temporary socket and directory
// unless --socket is given, measures its baseline in the same run, and prints the ratio.

#include <string>
#include <vector>

namespace kvtier::bench {

struct BenchArgs {
  std::string socket;  // measure this daemon instead of starting one
  bool json = false;   // one JSON object on stdout
  int iterations = 20000;
  int rounds = 10;
  uint64_t blocks = 1'000'000;                                    // restart: indexed blocks
  int sessions = 64;                                              // soak: engine sessions
  double seconds = 60;                                            // soak: duration
  std::string host_capacity = "64MiB", nvme_capacity = "384MiB";  // soak: its daemon's tiers
  bool check_rss = true;                                          // soak: fail when the daemon's RSS grows
  uint64_t block_bytes = 2ull << 20;                              // remote: value size
  int concurrency = 16;                                           // remote: sessions, redis-benchmark -c
  int remote_blocks = 96;                                         // remote: distinct blocks cycled through
  bool remote_unkeyed = false;                                    // remote: no fleet secret
  std::vector<std::string> ops;                                   // rpc: only these operations (all when empty)
  std::string device = "host-emulated";                           // kv, demotion: the GPU backend
};

int RunRpcBench(const BenchArgs& args);
int RunNvmeBench(const BenchArgs& args);
int RunRestartBench(const BenchArgs& args);
int RunColdIndexBench(const BenchArgs& args);
int RunSoakBench(const BenchArgs& args);
int RunEventsBench(const BenchArgs& args);
int RunRemoteBench(const BenchArgs& args);
int RunQuantBench(const BenchArgs& args);
int RunDemotionBench(const BenchArgs& args);
int RunPipelineBench(const BenchArgs& args);
int RunKvBench(const BenchArgs& args);

}  // namespace kvtier::bench
