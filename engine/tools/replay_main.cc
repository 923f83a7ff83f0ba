// kvtier-replay: replays a request trace (Mooncake format) against a running kvtierd with
// N engine sessions (separate processes), verifying every byte it reads back.
//
// Each trace block becomes a chained block hash (ChainHash over the trace's block
// identities). Per request, a session looks the chain up, acquires the cached prefix and
// checks its bytes (the pattern of each block's hash: a mismatch is corruption), and
// "prefills" the rest: writes the pattern and commits. Requests are spread over sessions
// round robin and issued at their timestamps / --speed (0: as fast as possible).
//
// Modeled TTFT (documented in docs/benchmarks.md):
//   FLOPs(T) = 2 P T + 2 L H T^2        P: active parameters, L: layers, H: hidden size
//   prefill(T, c) = (FLOPs(T) - FLOPs(c)) / (gpu_tflops x mfu)   with c tokens cached
//   load = cached bytes / bandwidth of the tier each block came from (GPU: HBM; host:
//          PCIe; NVMe: disk, then PCIe; remote: network, then PCIe)
//   TTFT = prefill + load, for no cache (c = 0); a GPU-only prefix cache: the engine's own
//   LRU over --gpu-cache bytes of HBM (simulated over the same trace with the daemon's LRU
//   class); and kvtier: that same GPU cache in front of the daemon, so a request's
//   cached prefix is the longer of the two, its first blocks loaded from HBM and the
//   rest from the daemon tier that served them in this replay.
// Bytes in the model are the model's own (KV bytes per token x 512 per trace block),
// whatever --block-bytes the replay moves, so a small replay models a full-size host.
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <list>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "engine/client.h"
#include "engine/tools/backoff.h"
#include "engine/tools/block_pattern.h"
#include "engine/tools/cache_sim.h"
#include "engine/tools/trace.h"
#include "protocol/base/model_presets.h"
#include "protocol/base/units.h"

namespace {

using namespace kvtier;

struct Args {
  std::string socket, trace, model = "llama3.1-8b", dtype = "bf16", block_bytes_arg, gpu_cache = "40GiB";
  uint32_t tokens_per_block = 512, layers = 0, kv_heads = 0, head_dim = 0;
  int sessions = 4;
  uint32_t chunk_blocks = 32;
  double speed = 0;
  uint32_t max_requests = 0;
  double params_billion = 0, hidden = 0;
  double gpu_tflops = 989, mfu = 0.5, hbm_gbs = 4800, pcie_gbs = 50, nvme_gbs = 6, remote_gbs = 12.5;
  bool json = false;
  std::string quantization = "none";  // none | int8 | fp8: hits are checked within that bound
};

// What a session reports per request, through a pipe.
struct Record {
  uint32_t request;
  uint32_t blocks;
  uint32_t hit[kTierCount];
  uint32_t beyond_gpu[kTierCount];  // hits past the GPU-only cache's prefix
  uint32_t corrupt;
  uint32_t errors;
  double latency_us;     // lookup + acquire
  uint32_t unavailable;  // the daemon was gone (a restart, an upgrade): a miss, the session reconnects
  uint32_t reconnects;
  float worst_error;  // --quantization: the largest error of a hit over its bound
};

std::vector<BlockHash> ChainOf(const TraceRequest& r) {
  std::vector<BlockHash> out;
  BlockHash parent;
  for (uint32_t id : r.blocks) {
    const uint32_t tokens[1] = {id};
    parent = ChainHash(parent, tokens);
    out.push_back(parent);
  }
  return out;
}

// The first few errors of a session go to stderr; the count goes into the report.
void Report(int session, const char* what, const Status& s) {
  static int reported = 0;
  if (reported++ < 3) std::fprintf(stderr, "kvtier-replay: session %d: %s: %s\n", session, what, s.ToString().c_str());
}

// A failure that means the daemon went away (or restarted: handles of another epoch).
int RunSession(const Args& a, const Trace& trace, const ModelLayout& layout, const std::vector<uint32_t>& gpu_hit,
               int index, int fd) {
  std::optional<QuantKind> lossy;
  if (a.quantization == "int8") lossy = QuantKind::kInt8;
  if (a.quantization == "fp8") lossy = QuantKind::kFp8E4M3;
  const FloatKind float_kind = layout.dtype == DType::kFloat16 ? FloatKind::kFp16 : FloatKind::kBf16;
  ClientOptions o;
  o.socket_path = a.socket;
  o.engine_name = "kvtier-replay-" + std::to_string(index);
  o.layout = layout;
  std::unique_ptr<Client> client;
  uint32_t reconnects = 0;
  // Connects, or reconnects after the daemon went away: with back-off (10 ms doubling to
  // 1 s, jittered) for up to 30 s, as an engine would, rather than stopping the session.
  auto connect = [&]() -> bool {
    Backoff backoff(std::chrono::milliseconds(10), std::chrono::seconds(1), index * 7919 + reconnects);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      auto c = Client::Connect(o);
      if (c.ok()) {
        client = std::move(c).value();
        return true;
      }
      if (!backoff.Wait(deadline)) {
        std::fprintf(stderr, "kvtier-replay: session %d: %s\n", index, c.status().ToString().c_str());
        return false;
      }
    }
  };
  if (!connect()) return 1;
  // After a refusal or an error, the next request waits (jittered, growing while they
  // keep failing): a session never spins on a daemon that says no.
  Backoff retry(std::chrono::milliseconds(1), std::chrono::milliseconds(500), index * 104729 + 1);
  const auto start = std::chrono::steady_clock::now();
  const size_t n = a.max_requests ? std::min<size_t>(a.max_requests, trace.requests.size()) : trace.requests.size();
  for (size_t i = static_cast<size_t>(index); i < n; i += static_cast<size_t>(a.sessions)) {
    const TraceRequest& q = trace.requests[i];
    if (a.speed > 0) {
      std::this_thread::sleep_until(start +
                                    std::chrono::microseconds(static_cast<int64_t>(q.timestamp_ms * 1000 / a.speed)));
    }
    Record rec{static_cast<uint32_t>(i), static_cast<uint32_t>(q.blocks.size()), {}, {}, 0, 0, 0, 0, 0, 0};
    if (!client) {
      if (!connect()) return 1;
      rec.reconnects = 1;
      ++reconnects;
    }
    // An error counts against the daemon unless the daemon was gone: then the request is
    // a miss and the session reconnects before the next one.
    auto failed = [&](const char* what, const Status& st) {
      if (DaemonGone(st)) {
        ++rec.unavailable;
        client.reset();
      } else {
        Report(index, what, st);
        ++rec.errors;
        (void)retry.Wait(std::chrono::steady_clock::now() + std::chrono::seconds(1));
      }
    };
    const auto chain = ChainOf(q);
    const auto t0 = std::chrono::steady_clock::now();
    size_t hit = 0;
    auto l = client->Lookup(chain);
    if (!l.ok()) {
      failed("lookup", l.status());
    } else if (l->matched > 0) {
      std::span<const BlockHash> prefix(chain.data(), l->matched);
      auto acq = client->Acquire(prefix);
      if (!acq.ok()) {
        failed("acquire", acq.status());
      } else {
        std::vector<BlockHash> held;
        bool in_prefix = true;
        for (size_t k = 0; k < acq->size(); ++k) {
          const BlockResult& r = (*acq)[k];
          if (!r.status.ok()) {
            in_prefix = false;
            continue;
          }
          held.push_back(chain[k]);
          auto bytes = client->PageBytes(r.tier, r.page);
          bool good = bytes.size() >= layout.block_bytes;
          if (good && lossy) {
            // Possibly read back from a quantized tier: within the bound, not exact.
            const double e =
                KvPatternError(chain[k], float_kind, layout.head_dim, *lossy, bytes.first(layout.block_bytes));
            rec.worst_error = std::max(rec.worst_error, static_cast<float>(std::min(e, 1e9)));
            good = e <= 1.0;
          } else if (good) {
            good = CheckBlockPattern(chain[k], bytes.first(layout.block_bytes));
          }
          if (!good) {
            ++rec.corrupt;
            in_prefix = false;
            continue;
          }
          if (in_prefix) {
            // The tier it came from: Lookup's view (NVMe hits are promoted by Acquire).
            ++rec.hit[TierIndex(l->tiers[k])];
            if (k >= gpu_hit[i]) ++rec.beyond_gpu[TierIndex(l->tiers[k])];
            ++hit;
          }
        }
        if (!held.empty()) (void)client->Release(TierKind::kHost, {}, held);
      }
    }
    rec.latency_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    // Prefill what missed, a chunk at a time as an engine's chunked prefill does: write
    // the pattern of each block and commit it.
    for (size_t from = hit; client && from < chain.size();) {
      const size_t n_chunk = std::min<size_t>(a.chunk_blocks, chain.size() - from);
      auto pages = client->Allocate(TierKind::kHost, static_cast<uint32_t>(n_chunk));
      if (!pages.ok()) {
        failed("allocate", pages.status());
        break;
      }
      std::vector<CommitEntry> e;
      for (size_t k = from; k < from + n_chunk; ++k) {
        auto bytes = client->PageBytes(TierKind::kHost, (*pages)[k - from]);
        if (lossy) {
          FillKvPattern(chain[k], float_kind, layout.head_dim, bytes.first(layout.block_bytes));
        } else {
          FillBlockPattern(chain[k], bytes.first(layout.block_bytes));
        }
        e.push_back({(*pages)[k - from], chain[k], k ? chain[k - 1] : BlockHash()});
      }
      if (auto c = client->Commit(TierKind::kHost, e); !c.ok()) {
        failed("commit", c.status());
        break;
      }
      from += n_chunk;
    }
    if (rec.errors == 0 && rec.unavailable == 0) retry.Reset();
    if (::write(fd, &rec, sizeof(rec)) != sizeof(rec)) return 1;
  }
  return 0;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * v.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"kvtier-replay: replay a KV request trace against kvtierd, verifying every block read"};
  app.add_option("--trace", a.trace, "Trace (Mooncake JSON lines)")->required();
  app.add_option("-s,--socket", a.socket, "kvtierd socket (default: $KVTIER_SOCKET or ./var/kvtierd.sock)");
  app.add_option("--sessions", a.sessions, "Engine processes")->check(CLI::Range(1, 256));
  app.add_option("--speed", a.speed, "Time scaling: 1 = the trace's pace, 10 = ten times faster, 0 = no waiting");
  app.add_option("--model", a.model,
                 "Model preset (llama3.1-8b, llama3.1-70b, qwen2.5-7b, qwen2.5-72b, mistral-7b, mixtral-8x7b)");
  app.add_option("--layers", a.layers, "Explicit geometry instead of a preset: layers");
  app.add_option("--kv-heads", a.kv_heads, "Explicit geometry: KV heads");
  app.add_option("--head-dim", a.head_dim, "Explicit geometry: head dim");
  app.add_option("--dtype", a.dtype, "KV dtype: bf16, fp16, fp8");
  app.add_option("--tokens-per-block", a.tokens_per_block, "Tokens per block (the trace's blocks are 512)");
  app.add_option("--block-bytes", a.block_bytes_arg, "Bytes per block, overriding the layout's (e.g. 64KiB)");
  app.add_option("--chunk-blocks", a.chunk_blocks, "Blocks a session prefills (leases and commits) at a time")
      ->check(CLI::Range(1u, 65536u));
  app.add_option("--max-requests", a.max_requests, "Replay only the first N requests");
  app.add_option("--gpu-cache", a.gpu_cache, "HBM for the GPU-only cache baseline (e.g. 40GiB)");
  app.add_option("--params-billion", a.params_billion, "Active parameters for the FLOP model (default: the preset's)");
  app.add_option("--hidden", a.hidden, "Hidden size for the FLOP model (default: the preset's)");
  app.add_option("--gpu-tflops", a.gpu_tflops, "Dense bf16 TFLOP/s of the GPU (H200: 989)");
  app.add_option("--mfu", a.mfu, "Fraction of peak a prefill reaches");
  app.add_option("--hbm-gbs", a.hbm_gbs, "HBM GB/s (H200: 4800; a GPU cache hit is read at this rate)");
  app.add_option("--pcie-gbs", a.pcie_gbs, "Host-to-GPU GB/s");
  app.add_option("--nvme-gbs", a.nvme_gbs, "NVMe read GB/s");
  app.add_option("--remote-gbs", a.remote_gbs, "Remote tier (network) read GB/s (100 Gbit/s: 12.5)");
  app.add_option("--quantization", a.quantization,
                 "none, int8 or fp8: blocks hold KV-like floats and each hit is checked within the error bound of "
                 "that quantization (QuantErrorBound) instead of exactly; the layout must be 2-byte floats at "
                 "its natural block size")
      ->check(CLI::IsMember({"none", "int8", "fp8"}));
  app.add_flag("--json", a.json, "Print one JSON object");
  CLI11_PARSE(app, argc, argv);

  const ModelPreset* preset = FindModelPreset(a.model);
  DType dtype;
  if (!ParseDType(a.dtype, &dtype) || (!preset && a.layers == 0)) {
    std::fprintf(stderr,
                 "kvtier-replay: unknown model '%s' (or dtype '%s'); give a preset or --layers/--kv-heads/--head-dim\n",
                 a.model.c_str(), a.dtype.c_str());
    return 2;
  }
  ModelLayout layout;
  if (a.layers) preset = nullptr;  // explicit geometry: the FLOP model takes the flags
  if (a.layers) {
    layout.model_id = "custom";
    layout.num_layers = a.layers;
    layout.kv_heads = a.kv_heads;
    layout.head_dim = a.head_dim;
    layout.dtype = dtype;
    layout.tokens_per_block = a.tokens_per_block;
    layout.block_bytes = layout.NaturalBlockBytes();
  } else {
    layout = preset->Layout(dtype, a.tokens_per_block);
  }
  if (!a.block_bytes_arg.empty()) {
    auto b = ParseBytes(a.block_bytes_arg);
    if (!b.ok()) {
      std::fprintf(stderr, "kvtier-replay: --block-bytes: %s\n", b.status().message().c_str());
      return 2;
    }
    layout.block_bytes = *b;
  }
  if (a.quantization != "none" && ((layout.dtype != DType::kBFloat16 && layout.dtype != DType::kFloat16) ||
                                   layout.block_bytes != layout.NaturalBlockBytes())) {
    std::fprintf(stderr,
                 "kvtier-replay: --quantization needs blocks of 2-byte floats at their natural size (%s has %llu "
                 "bytes per block); give a geometry instead of --block-bytes, e.g. --layers 2 --kv-heads 2 "
                 "--head-dim 128 --tokens-per-block 16\n",
                 layout.ToString().c_str(), static_cast<unsigned long long>(layout.block_bytes));
    return 2;
  }
  auto trace = LoadTrace(a.trace);
  if (!trace.ok()) {
    std::fprintf(stderr, "kvtier-replay: %s\n", trace.status().ToString().c_str());
    return 1;
  }
  const size_t n = a.max_requests ? std::min<size_t>(a.max_requests, trace->requests.size()) : trace->requests.size();
  auto gpu_bytes = ParseBytes(a.gpu_cache);
  if (!gpu_bytes.ok()) {
    std::fprintf(stderr, "kvtier-replay: --gpu-cache: %s\n", gpu_bytes.status().message().c_str());
    return 2;
  }
  // The GPU-only baseline: an LRU prefix cache of the same HBM, in the model's block bytes.
  constexpr double kTraceBlockTokens = 512;
  const double model_block_bytes = static_cast<double>(layout.KvBytesPerToken()) * kTraceBlockTokens;
  Trace replayed = *trace;
  replayed.requests.resize(n);
  SimConfig gpu_cfg;
  gpu_cfg.host_capacity = std::max<uint64_t>(1, static_cast<uint64_t>(*gpu_bytes / model_block_bytes));
  gpu_cfg.per_request = true;
  auto gpu_sim = Simulate(replayed, gpu_cfg);
  if (!gpu_sim.ok()) {
    std::fprintf(stderr, "kvtier-replay: %s\n", gpu_sim.status().ToString().c_str());
    return 1;
  }
  const std::vector<uint32_t>& gpu_hit = gpu_sim->request_hits;

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::pair<pid_t, int>> kids;
  for (int s = 0; s < a.sessions; ++s) {
    int p[2];
    if (::pipe(p) != 0) return 1;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      ::_exit(RunSession(a, *trace, layout, gpu_hit, s, p[1]));
    }
    ::close(p[1]);
    kids.emplace_back(pid, p[0]);
  }
  std::vector<Record> recs(n);
  std::vector<bool> have(n, false);
  int failed = 0;
  for (auto [pid, fd] : kids) {
    Record r;
    while (::read(fd, &r, sizeof(r)) == sizeof(r)) {
      if (r.request < n) {
        recs[r.request] = r;
        have[r.request] = true;
      }
    }
    ::close(fd);
    int st = 0;
    ::waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failed;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Aggregates.
  uint64_t requests = 0, blocks = 0, hits[kTierCount] = {}, corrupt = 0, errors = 0, unavailable = 0, reconnects = 0;
  std::vector<double> lat;
  for (size_t i = 0; i < n; ++i) {
    if (!have[i]) continue;
    ++requests;
    blocks += recs[i].blocks;
    for (int t = 0; t < kTierCount; ++t) hits[t] += recs[i].hit[t];
    corrupt += recs[i].corrupt;
    errors += recs[i].errors;
    unavailable += recs[i].unavailable;
    reconnects += recs[i].reconnects;
    lat.push_back(recs[i].latency_us);
  }
  double worst_error = 0;
  for (size_t i = 0; i < n; ++i) {
    if (have[i]) worst_error = std::max(worst_error, static_cast<double>(recs[i].worst_error));
  }
  uint64_t total_hits = 0;
  for (uint64_t h : hits) total_hits += h;

  // Modeled TTFT.
  // Without a preset or flags: 8B parameters and a hidden size of 4 query heads per KV head.
  const double P = (a.params_billion > 0 ? a.params_billion : preset ? preset->active_params_billion : 8.0) * 1e9;
  const double L = layout.num_layers;
  const double H = a.hidden > 0 ? a.hidden
                   : preset     ? preset->hidden_size
                                : static_cast<double>(layout.kv_heads) * layout.head_dim * 4;
  const double rate = a.gpu_tflops * 1e12 * a.mfu;
  auto flops = [&](double t) { return 2 * P * t + 2 * L * H * t * t; };
  const double hbm_s = model_block_bytes / (a.hbm_gbs * 1e9);
  const double host_s = model_block_bytes / (a.pcie_gbs * 1e9);
  const double nvme_s = model_block_bytes / (a.nvme_gbs * 1e9) + host_s;
  const double remote_s = model_block_bytes / (a.remote_gbs * 1e9) + host_s;
  uint64_t gpu_only_hits = 0;
  std::vector<double> ttft_none, ttft_gpu, ttft_kvtier;
  uint64_t kvtier_cached_blocks = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!have[i]) continue;
    const Record& r = recs[i];
    const double T =
        replayed.requests[i].input_length ? replayed.requests[i].input_length : r.blocks * kTraceBlockTokens;
    auto prefill = [&](double cached_blocks) {
      return (flops(T) - flops(std::min(T, cached_blocks * kTraceBlockTokens))) / rate;
    };
    const uint32_t g = gpu_hit[i];
    gpu_only_hits += g;
    ttft_none.push_back(prefill(0));
    ttft_gpu.push_back(prefill(g) + g * hbm_s);
    // kvtier: the GPU cache's prefix, then what the daemon served beyond it.
    uint32_t beyond = 0;
    for (uint32_t b : r.beyond_gpu) beyond += b;
    kvtier_cached_blocks += g + beyond;
    ttft_kvtier.push_back(prefill(g + beyond) + (g + r.beyond_gpu[0]) * hbm_s + r.beyond_gpu[1] * host_s +
                          r.beyond_gpu[2] * nvme_s + r.beyond_gpu[3] * remote_s);
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / v.size();
  };
  const double ratio = blocks ? static_cast<double>(total_hits) / blocks : 0;
  nlohmann::json j{{"trace", trace->name},
                   {"requests", requests},
                   {"blocks", blocks},
                   {"sessions", a.sessions},
                   {"seconds", secs},
                   {"model", layout.ToString()},
                   {"hits", {{"gpu", hits[0]}, {"host", hits[1]}, {"nvme", hits[2]}, {"remote", hits[3]}}},
                   {"hit_ratio", ratio},
                   {"bytes_moved",
                    {{"gpu", hits[0] * layout.block_bytes},
                     {"host", hits[1] * layout.block_bytes},
                     {"nvme", hits[2] * layout.block_bytes},
                     {"remote", hits[3] * layout.block_bytes},
                     {"committed", (blocks - total_hits) * layout.block_bytes}}},
                   {"corrupt", corrupt},
                   {"quantization", a.quantization},
                   {"max_error_over_bound", worst_error},
                   {"errors", errors},
                   {"unavailable", unavailable},
                   {"reconnects", reconnects},
                   {"lookup_acquire_p50_us", Percentile(lat, 50)},
                   {"lookup_acquire_p99_us", Percentile(lat, 99)},
                   {"ttft_model",
                    {{"formula", "prefill=(2PT+2LHT^2 - same at cached c)/(tflops*mfu); load=bytes/tier bandwidth"},
                     {"gpu_tflops", a.gpu_tflops},
                     {"mfu", a.mfu},
                     {"gpu_cache_bytes", *gpu_bytes},
                     {"model_block_bytes", model_block_bytes},
                     {"hbm_gbs", a.hbm_gbs},
                     {"pcie_gbs", a.pcie_gbs},
                     {"nvme_gbs", a.nvme_gbs},
                     {"remote_gbs", a.remote_gbs},
                     {"gpu_only_hit_ratio", blocks ? static_cast<double>(gpu_only_hits) / blocks : 0},
                     {"kvtier_hit_ratio", blocks ? static_cast<double>(kvtier_cached_blocks) / blocks : 0},
                     {"no_cache_mean_s", mean(ttft_none)},
                     {"gpu_only_mean_s", mean(ttft_gpu)},
                     {"kvtier_mean_s", mean(ttft_kvtier)},
                     {"no_cache_p50_s", Percentile(ttft_none, 50)},
                     {"gpu_only_p50_s", Percentile(ttft_gpu, 50)},
                     {"kvtier_p50_s", Percentile(ttft_kvtier, 50)},
                     {"no_cache_p99_s", Percentile(ttft_none, 99)},
                     {"gpu_only_p99_s", Percentile(ttft_gpu, 99)},
                     {"kvtier_p99_s", Percentile(ttft_kvtier, 99)}}}};
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("kvtier-replay %s: %llu requests, %llu blocks over %d sessions in %.1f s (%s)\n", trace->name.c_str(),
                static_cast<unsigned long long>(requests), static_cast<unsigned long long>(blocks), a.sessions, secs,
                layout.ToString().c_str());
    std::printf("  hits: %.1f%% (gpu %llu, host %llu, nvme %llu, remote %llu); corrupt %llu, errors %llu\n",
                100 * ratio, static_cast<unsigned long long>(hits[0]), static_cast<unsigned long long>(hits[1]),
                static_cast<unsigned long long>(hits[2]), static_cast<unsigned long long>(hits[3]),
                static_cast<unsigned long long>(corrupt), static_cast<unsigned long long>(errors));
    if (unavailable > 0) {
      std::printf("  daemon unavailable during %llu requests (misses); %llu reconnects\n",
                  static_cast<unsigned long long>(unavailable), static_cast<unsigned long long>(reconnects));
    }
    std::printf("  lookup+acquire p50 %.0f us, p99 %.0f us\n", Percentile(lat, 50), Percentile(lat, 99));
    std::printf("  modeled prefix hits: GPU-only %s cache %.1f%%, that cache + kvtier %.1f%%\n",
                FormatBytes(*gpu_bytes).c_str(), blocks ? 100.0 * gpu_only_hits / blocks : 0.0,
                blocks ? 100.0 * kvtier_cached_blocks / blocks : 0.0);
    std::printf(
        "  modeled TTFT mean (p99): no cache %.3f s (%.3f), GPU-only %s cache %.3f s (%.3f), kvtier %.3f s (%.3f)\n",
        mean(ttft_none), Percentile(ttft_none, 99), FormatBytes(*gpu_bytes).c_str(), mean(ttft_gpu),
        Percentile(ttft_gpu, 99), mean(ttft_kvtier), Percentile(ttft_kvtier, 99));
  }
  return (corrupt || failed) ? 1 : 0;
}
