// kvtier-bench demotion: Lookup latency while GPU blocks are demoted to host, against the
// same Lookups with no demotions, interleaved in one run.
//
// One daemon with a GPU tier (64 MiB; --device: host-emulated or cuda) in front of its host tier, 2 MiB
// pages (llama3.1-8b, 16 tokens, bf16). A reader session looks up one host block over and
// over, timing each, for 0.3 s a phase. In "burst" phases a writer session commits GPU blocks as fast as it
// can: past the GPU tier's high watermark every commit makes the daemon demote a GPU block
// into a host page — a 2 MiB copy, done on its GPU copy thread, never on the control
// thread that answers the Lookups. "Quiet" phases have no writer. Prints p50/p99 of each
// and lookup_p99_ratio = p99 burst ÷ p99 quiet, with the demotions made; and the
// demotion throughput during the bursts (2 MiB x demotions ÷ burst time) against the
// device's D2H copy of 2 MiB pages into pinned memory (demotion_ratio).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "kernels/device_backend.h"
#include "protocol/base/model_presets.h"
#include "protocol/base/units.h"
#include "tests/bench/bench_main.h"
#include "tests/bench/bench_util.h"
#include "tests/integration/engine_process.h"

namespace kvtier::bench {

namespace {

// The device's own D2H copy of `page` bytes at a time, 64 MiB in all, into pinned memory.
double D2hCopyGbs(const std::string& device, uint64_t page) {
  auto dev = OpenDeviceBackend(device);
  if (!dev.ok()) return 0;
  const uint64_t total = 64ull << 20;
  auto src = (*dev)->AllocateShareable(0, total);
  if (!src.ok()) return 0;
  std::vector<uint8_t> host(total, 1);
  double gbs = 0;
  if ((*dev)->RegisterHost(host.data(), total).ok()) {
    for (int rep = 0; rep < 3; ++rep) {  // the best of 3
      const double t0 = NowUs();
      bool ok = true;
      for (uint64_t at = 0; at < total; at += page)
        ok = ok && (*dev)->Copy(host.data() + at, src->ptr + at, page, CopyKind::kDeviceToHost, nullptr).ok();
      ok = ok && (*dev)->Synchronize(nullptr).ok();
      if (ok) gbs = std::max(gbs, static_cast<double>(total) / ((NowUs() - t0) * 1e3));
    }
    (*dev)->UnregisterHost(host.data());
  }
  (*dev)->Free(*src);
  return gbs;
}

}  // namespace

int RunDemotionBench(const BenchArgs& args) {
  const ModelLayout layout = FindModelPreset("llama3.1-8b")->Layout(DType::kBFloat16, 16);  // 2 MiB
  testing::DaemonProcess::Options o;
  o.page_bytes = FormatBytes(layout.block_bytes);
  o.segment_bytes = "32MiB";
  o.host_capacity = "512MiB";
  o.gpu_capacity = "64MiB";
  o.gpu_segment_bytes = "16MiB";
  o.host_yaml = "    overcommit: true\n";
  o.gpu_backend = args.device;
  auto d = BenchDaemon::Start(args.socket, o);
  if (!d.ok()) {
    std::fprintf(stderr, "kvtier-bench demotion: %s\n", d.status().ToString().c_str());
    return 1;
  }
  ClientOptions co;
  co.socket_path = (*d)->socket();
  co.layout = layout;
  co.device = args.device;
  co.engine_name = "kvtier-bench-reader";
  auto reader = Client::Connect(co);
  co.engine_name = "kvtier-bench-writer";
  auto writer = Client::Connect(co);
  if (!reader.ok() || !writer.ok()) {
    std::fprintf(stderr, "kvtier-bench demotion: %s\n",
                 (!reader.ok() ? reader.status() : writer.status()).ToString().c_str());
    return 1;
  }
  const std::vector<BlockHash> one = {IndexHash(31, 0)};
  {
    auto p = (*reader)->Allocate(TierKind::kHost, 1);
    const std::vector<CommitEntry> e = {{(*p)[0], one[0], {}}};
    if (!p.ok() || !(*reader)->Commit(TierKind::kHost, e).ok()) return 1;
    // Held (referenced) for the run: a burst churns the whole host tier in tens of
    // milliseconds, and the reader does not look between phases, so a block it only
    // looked up would rightly be evicted as the least recently used.
    auto held = (*reader)->Acquire(one);
    if (!held.ok() || !(*held)[0].status.ok()) return 1;
  }
  std::atomic<bool> burst{false}, stop{false};
  std::atomic<uint64_t> gpu_commits{0}, failures{0};
  std::thread writing([&] {
    uint64_t seq = 0;
    while (!stop.load()) {
      if (!burst.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      auto p = (*writer)->Allocate(TierKind::kGpu, 8);  // 16 MiB at a time
      if (!p.ok()) {
        ++failures;
        continue;
      }
      std::vector<CommitEntry> e;
      for (PageId page : *p) e.push_back({page, IndexHash(32, seq++), {}});
      if ((*writer)->Commit(TierKind::kGpu, e).ok()) gpu_commits += e.size();
    }
  });
  auto demotions = [&] {
    auto s = testing::StatsOf((*d)->socket());
    return s.ok() ? s->gpu_demotions : 0;
  };
  Latencies quiet, loaded;
  double burst_us = 0;
  const double phase_us = 300'000;  // each phase: 0.3 s of back-to-back Lookups
  const uint64_t demoted_before = demotions();
  for (int r = 0; r < args.rounds; ++r) {
    for (bool b : {false, true}) {
      burst = b;
      std::this_thread::sleep_for(std::chrono::milliseconds(b ? 50 : 20));  // the burst under way
      Latencies& into = b ? loaded : quiet;
      if (b) burst_us += phase_us;
      for (const double end = NowUs() + phase_us; NowUs() < end;) {
        const double t0 = NowUs();
        auto l = (*reader)->Lookup(one);
        if (!l.ok() || l->matched != 1) ++failures;
        into.Add(NowUs() - t0);
      }
    }
  }
  const int per_phase = static_cast<int>(quiet.count() / std::max(1, args.rounds));
  burst = false;
  stop = true;
  writing.join();
  const uint64_t demoted = demotions() - demoted_before;
  const double ratio = quiet.Percentile(99) > 0 ? loaded.Percentile(99) / quiet.Percentile(99) : 0;
  const double demotion_gbs = static_cast<double>(demoted * layout.block_bytes) / (burst_us * 1e3);
  const double copy_gbs = D2hCopyGbs(args.device, layout.block_bytes);
  const nlohmann::json j{{"model", layout.ToString()},
                         {"gpu_tier", o.gpu_capacity},
                         {"rounds", args.rounds},
                         {"lookups_per_phase", per_phase},
                         {"quiet_p50_us", quiet.Percentile(50)},
                         {"quiet_p99_us", quiet.Percentile(99)},
                         {"burst_p50_us", loaded.Percentile(50)},
                         {"burst_p99_us", loaded.Percentile(99)},
                         {"lookup_p99_ratio", ratio},
                         {"gpu_commits", gpu_commits.load()},
                         {"gpu_demotions", demoted},
                         {"device", args.device},
                         {"demotion_gbs", demotion_gbs},
                         {"copy_d2h_gbs", copy_gbs},
                         {"demotion_ratio", copy_gbs > 0 ? demotion_gbs / copy_gbs : 0},
                         {"failures", failures.load()}};
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("Lookup of one host block, %d rounds of %d per phase; GPU tier %s of 2 MiB blocks\n", args.rounds,
                per_phase, o.gpu_capacity.c_str());
    std::printf("                        p50 us     p99 us\n");
    std::printf("quiet                %8.1f   %8.1f\n", quiet.Percentile(50), quiet.Percentile(99));
    std::printf("demotion burst       %8.1f   %8.1f\n", loaded.Percentile(50), loaded.Percentile(99));
    std::printf("lookup_p99_ratio %.2f; %llu GPU commits, %llu GPU->host demotions during the bursts\n", ratio,
                static_cast<unsigned long long>(gpu_commits.load()), static_cast<unsigned long long>(demoted));
    std::printf("demotion %.2f GB/s during the bursts vs D2H copy of 2 MiB pages %.2f GB/s (%s)\n", demotion_gbs,
                copy_gbs, args.device.c_str());
  }
  return failures.load() == 0 && demoted > 0 ? 0 : 1;
}

}  // namespace kvtier::bench
