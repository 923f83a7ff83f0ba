// kvtier-bench pipeline: block lookups per second with requests pipelined, against Redis
// GETs pipelined the same way, in one run.
//
// kvtier: 16 engine sessions (one client thread driving all of them, as redis-benchmark
// drives its clients from one event loop), each sending 16 one-block Lookups in one write
// (Client::StartLookups) and then taking their 16 replies, round after round: 256 lookups
// outstanding. Every reply is checked (the block is found). The baseline: a redis-server
// this bench starts on a Unix socket, and `redis-benchmark -s SOCKET -c 16 -P 16 -t get`.
// Same placement: the client side (this thread, redis-benchmark) on one CPU, the server
// side (kvtierd, redis-server) on another. Rounds alternate so drift hits both alike.
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/bench/bench_main.h"
#include "tests/bench/bench_util.h"
#include "tests/integration/engine_process.h"
#include "tests/support/redis_cluster_process.h"

namespace kvtier::bench {
namespace {

using json = nlohmann::json;

constexpr int kSessions = 16, kDepth = 16;
constexpr double kRoundSeconds = 1.5;

// GETs per second of `redis-benchmark -c 16 -P 16 -t get` over the socket, on `cpu`; -1
// when it did not run.
double RedisGets(const std::string& socket, int cpu, uint64_t requests) {
  const std::string pin = cpu >= 0 ? "taskset -c " + std::to_string(cpu) + " " : "";
  const testing::CmdResult out =
      testing::Sh(pin + "redis-benchmark -s " + socket + " -c " + std::to_string(kSessions) + " -P " +
                  std::to_string(kDepth) + " -n " + std::to_string(requests) + " -t get --csv 2>/dev/null");
  const size_t at = out.out.find("\"GET\",\"");
  return at == std::string::npos ? -1 : std::stod(out.out.substr(at + 7));
}

// Lookups per second over `seconds`: every session sends kDepth one-block Lookups in one
// write, then the replies of all sessions are taken, and again.
Result<double> KvtierLookups(std::vector<std::unique_ptr<Client>>& sessions,
                             const std::vector<std::vector<std::vector<BlockHash>>>& batches, double seconds) {
  uint64_t done = 0;
  const double t0 = NowUs();
  double elapsed = 0;
  std::vector<std::vector<Ticket>> tickets(sessions.size());
  while (elapsed < seconds) {
    for (size_t s = 0; s < sessions.size(); ++s) {
      KVTIER_ASSIGN_OR_RETURN(tickets[s], sessions[s]->StartLookups(batches[s]));
    }
    for (size_t s = 0; s < sessions.size(); ++s) {
      for (Ticket t : tickets[s]) {
        KVTIER_ASSIGN_OR_RETURN(LookupResult r, sessions[s]->WaitLookup(t));
        if (r.matched != 1) return Internal("a pipelined lookup missed");
      }
      done += tickets[s].size();
    }
    elapsed = (NowUs() - t0) * 1e-6;
  }
  return static_cast<double>(done) / elapsed;
}

}  // namespace

int RunPipelineBench(const BenchArgs& args) {
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "kvtier-bench pipeline: %s\n", what.c_str());
    return 1;
  };
  const int server_cpu = PinClientAndPickServerCpu();
  const int client_cpu = server_cpu >= 0 ? sched_getcpu() : -1;
  testing::DaemonProcess::Options opts;
  opts.host_capacity = "64MiB";
  opts.page_bytes = "16KiB";
  opts.segment_bytes = "16MiB";
  auto daemon = BenchDaemon::Start(args.socket, opts, server_cpu);
  if (!daemon.ok()) return fail(daemon.status().ToString());
  testing::RedisClusterProcess redis_server(
      {.masters = 1, .replicas_per_master = 0, .cluster = false, .unix_socket = true, .cpu = server_cpu});
  if (Status s = redis_server.Start(); !s.ok()) return fail(s.ToString());
  const std::string redis = redis_server.unix_socket_path(0);

  // Sessions, and one block per (session, slot) committed for them to look up.
  std::vector<std::unique_ptr<Client>> sessions;
  std::vector<std::vector<std::vector<BlockHash>>> batches(kSessions);
  for (int s = 0; s < kSessions; ++s) {
    ClientOptions co;
    co.socket_path = (*daemon)->socket();
    co.engine_name = "kvtier-bench-pipeline";
    co.layout = testing::TestLayout("bench-model");
    auto c = Client::Connect(co);
    if (!c.ok()) return fail(c.status().ToString());
    auto pages = (*c)->Allocate(TierKind::kHost, kDepth);
    if (!pages.ok()) return fail("allocate: " + pages.status().ToString());
    std::vector<CommitEntry> e;
    for (int i = 0; i < kDepth; ++i) {
      const BlockHash h = IndexHash(31, static_cast<uint64_t>(s * kDepth + i));
      e.push_back({(*pages)[i], h, {}});
      batches[s].push_back({h});
    }
    if (auto r = (*c)->Commit(TierKind::kHost, e, /*retain=*/true); !r.ok()) return fail(r.status().ToString());
    sessions.push_back(std::move(*c));
  }

  // Warm both, and size redis-benchmark's runs to about a round's time.
  if (auto w = KvtierLookups(sessions, batches, 0.3); !w.ok()) return fail(w.status().ToString());
  const double warm = RedisGets(redis, client_cpu, 200'000);
  if (warm <= 0) return fail("redis-benchmark did not run (redis-tools, scripts/deps.sh)");
  const uint64_t requests = static_cast<uint64_t>(warm * kRoundSeconds);

  std::vector<double> kv, rd, ratio;
  for (int round = 0; round < args.rounds; ++round) {
    auto k = KvtierLookups(sessions, batches, kRoundSeconds);
    if (!k.ok()) return fail(k.status().ToString());
    const double g = RedisGets(redis, client_cpu, requests);
    if (g <= 0) return fail("redis-benchmark failed");
    kv.push_back(*k);
    rd.push_back(g);
    ratio.push_back(*k / g);
  }
  json j{{"lookups_per_s", Median(kv)},
         {"redis_gets_per_s", Median(rd)},
         {"lookups_per_s_ratio_vs_redis", Median(ratio)},
         {"rounds_ratio", ratio},
         {"sessions", kSessions},
         {"depth", kDepth},
         {"server_cpu", server_cpu},
         {"baseline", "redis-benchmark -s SOCKET -c 16 -P 16 -t get, redis-server on the daemon's CPU"}};
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("kvtier-bench pipeline: %d sessions x %d one-block Lookups in flight, %d interleaved rounds\n", kSessions,
              kDepth, args.rounds);
  std::printf("  kvtierd lookups/s        %12.0f (median)\n", Median(kv));
  std::printf("  redis-server GETs/s      %12.0f (redis-benchmark -c %d -P %d, median)\n", Median(rd), kSessions,
              kDepth);
  std::printf("  ratio                    %12.2f (median of rounds)\n", Median(ratio));
  return 0;
}

}  // namespace kvtier::bench
