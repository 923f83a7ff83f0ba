// kvtier-bench events: what KV events cost the request path, measured in one run.
//
// Two daemons with the same tiers, pinned to the same CPU: one without events (the
// baseline), one publishing them on an ipc:// PUB socket to a subscriber that connected
// and never reads (the worst subscriber: its buffers fill, ZMQ drops for it). The load is
// Allocate + Commit of one block through a full host tier, so every commit stores one
// block and evicts another: a BlockStored and a BlockRemoved per operation, the most
// events a request makes. Rounds interleave the two daemons. Prints p50/p99 of each, their
// ratios, the events published and the publishing daemon's RSS before and after.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "tests/bench/bench_main.h"
#include "tests/bench/bench_util.h"
#include "tests/integration/engine_process.h"

namespace kvtier::bench {
namespace {

using json = nlohmann::json;

// Allocate + Commit of `n` one-block operations, each timed.
Status StoreBlocks(Client& c, uint64_t* seq, int n, Latencies* out) {
  for (int i = 0; i < n; ++i) {
    const double t0 = NowUs();
    KVTIER_ASSIGN_OR_RETURN(auto pages, c.Allocate(TierKind::kHost, 1));
    const std::vector<CommitEntry> e = {{pages[0], IndexHash(77, (*seq)++), {}}};
    KVTIER_ASSIGN_OR_RETURN(auto r, c.Commit(TierKind::kHost, e));
    if (!r[0].status.ok()) return r[0].status;
    out->Add(NowUs() - t0);
  }
  return Status::Ok();
}

double Scrape(const std::string& url, const std::string& name) {
  testing::CmdResult r = testing::Sh("curl -fsS -m 5 " + url);
  const size_t at = r.out.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(r.out.substr(at + name.size() + 2));
}

}  // namespace

int RunEventsBench(const BenchArgs& args) {
  testing::TempDir dir;
  const std::string endpoint = "ipc://" + dir.File("events");
  testing::DaemonProcess::Options opts;
  opts.host_capacity = "16MiB";  // 256 pages of 64 KiB: full after the warm-up
  opts.page_bytes = "64KiB";
  opts.segment_bytes = "1MiB";
  const int server_cpu = PinClientAndPickServerCpu();
  auto plain = BenchDaemon::Start("", opts, server_cpu);
  opts.extra_yaml = "events: {publish: '" + endpoint + "', send_hwm: 1000}\n";
  auto publishing = BenchDaemon::Start("", opts, server_cpu);
  if (!plain.ok() || !publishing.ok()) {
    std::fprintf(stderr, "kvtier-bench events: %s\n",
                 (!plain.ok() ? plain.status() : publishing.status()).ToString().c_str());
    return 1;
  }
  // The subscriber that never reads: subscribed, smallest buffers, then left alone.
  zmq::context_t ctx;
  zmq::socket_t stuck(ctx, zmq::socket_type::sub);
  stuck.set(zmq::sockopt::rcvbuf, 4096);
  stuck.set(zmq::sockopt::rcvhwm, 1);
  stuck.set(zmq::sockopt::subscribe, "");
  stuck.connect(endpoint);

  auto connect = [](const std::string& socket) {
    ClientOptions co;
    co.socket_path = socket;
    co.engine_name = "kvtier-bench";
    co.layout = testing::TestLayout("bench-model");
    return Client::Connect(co);
  };
  auto a = connect((*plain)->socket());
  auto b = connect((*publishing)->socket());
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "kvtier-bench events: %s\n", (!a.ok() ? a.status() : b.status()).ToString().c_str());
    return 1;
  }
  auto stats = ControlClient::Connect(testing::ControlOptions((*publishing)->socket()));
  std::string url;
  if (stats.ok()) {
    auto s = (*stats)->Stats(false);
    if (s.ok()) url = s->metrics_url;
  }
  uint64_t seq_a = 0, seq_b = 1ull << 40;
  Latencies warm, lat_a, lat_b;
  // Warm-up: both tiers full, so every measured commit evicts.
  if (Status s = StoreBlocks(**a, &seq_a, 600, &warm); !s.ok()) return 1;
  if (Status s = StoreBlocks(**b, &seq_b, 600, &warm); !s.ok()) return 1;
  const uint64_t rss_before = ProcStatusKb((*publishing)->pid(), "VmRSS");
  const int rounds = args.rounds;
  const int per_round = std::max(1, args.iterations / rounds);
  for (int round = 0; round < rounds; ++round) {
    for (Status s : {StoreBlocks(**a, &seq_a, per_round, &lat_a), StoreBlocks(**b, &seq_b, per_round, &lat_b)}) {
      if (!s.ok()) {
        std::fprintf(stderr, "kvtier-bench events: %s\n", s.ToString().c_str());
        return 1;
      }
    }
  }
  const uint64_t rss_after = ProcStatusKb((*publishing)->pid(), "VmRSS");
  const double published = url.empty() ? -1 : Scrape(url, "kvtier_events_published_total");
  const double dropped = url.empty() ? -1 : Scrape(url, "kvtier_events_dropped_total");

  json j;
  j["ops"] = lat_b.count();
  j["no_events_p50_us"] = lat_a.Percentile(50);
  j["no_events_p99_us"] = lat_a.Percentile(99);
  j["events_p50_us"] = lat_b.Percentile(50);
  j["events_p99_us"] = lat_b.Percentile(99);
  j["p50_ratio"] = lat_a.Percentile(50) > 0 ? lat_b.Percentile(50) / lat_a.Percentile(50) : 0;
  j["p99_ratio"] = lat_a.Percentile(99) > 0 ? lat_b.Percentile(99) / lat_a.Percentile(99) : 0;
  j["events_published"] = published;
  j["events_dropped"] = dropped;
  j["rss_before_kib"] = rss_before;
  j["rss_after_kib"] = rss_after;
  j["server_cpu"] = server_cpu;
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "kvtier-bench events: Allocate+Commit of one block through a full host tier (a BlockStored and a\n"
      "BlockRemoved each), %d rounds interleaved, with a subscriber that never reads\n\n",
      rounds);
  std::printf("%-22s %10s %10s\n", "", "p50 us", "p99 us");
  std::printf("%-22s %10.1f %10.1f\n", "no events", lat_a.Percentile(50), lat_a.Percentile(99));
  std::printf("%-22s %10.1f %10.1f\n", "events, stuck reader", lat_b.Percentile(50), lat_b.Percentile(99));
  std::printf("%-22s %10.2f %10.2f\n", "ratio", j["p50_ratio"].get<double>(), j["p99_ratio"].get<double>());
  std::printf("\nevents published %.0f, dropped by the daemon %.0f; RSS %llu -> %llu KiB\n", published, dropped,
              static_cast<unsigned long long>(rss_before), static_cast<unsigned long long>(rss_after));
  return 0;
}

}  // namespace kvtier::bench
