// kvtier-bench kv: StoreBlocks / LoadBlocks — an engine's paged KV (its device memory)
// gathered into the daemon's host pages and scattered back — against the device's own copy
// of the same bytes between device memory and pinned host memory, in one run.
//
// llama3.1-8b, 16 tokens, bf16 (2 MiB blocks, 32 layers, kv-first layout), 128 blocks a
// call (256 MiB). Each round stores 128 fresh blocks, loads them back into other engine
// blocks, and times a DeviceBackend::Copy D2H and H2D of 256 MiB between a device buffer
// and host memory pinned with RegisterHost (cudaMemcpyAsync on cuda, memcpy host-emulated).
// Prints the median GB/s of each and store_ratio / load_ratio = kvtier ÷ copy; the loaded
// bytes are compared with the stored ones (a mismatch fails the run).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "kernels/device_backend.h"
#include "protocol/base/model_presets.h"
#include "protocol/base/units.h"
#include "tests/bench/bench_main.h"
#include "tests/bench/bench_util.h"

namespace kvtier::bench {
namespace {

constexpr uint32_t kBlocks = 128;  // per call
constexpr uint32_t kEngineBlocks = 2 * kBlocks;

// An engine's KV tensors in device memory, one allocation per layer.
struct DeviceKv {
  DeviceBackend* dev = nullptr;
  std::vector<DeviceAllocation> layers;
  EngineKv kv;
  ~DeviceKv() {
    for (auto& a : layers) dev->Free(a);
  }
};

Status AllocateKv(DeviceBackend& dev, const KvGeometry& g, DeviceKv* out) {
  out->dev = &dev;
  out->kv = EngineKv{g.kind, g.num_blocks, {}, nullptr, 0};
  const uint64_t granule = 2u << 20;
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    KVTIER_ASSIGN_OR_RETURN(auto a, dev.AllocateShareable(0, (g.LayerTensorBytes() + granule - 1) / granule * granule));
    out->layers.push_back(a);
    out->kv.layers.push_back(a.ptr);
  }
  return Status::Ok();
}

double Gbs(uint64_t bytes, double us) { return us > 0 ? static_cast<double>(bytes) / (us * 1e3) : 0; }

}  // namespace

int RunKvBench(const BenchArgs& args) {
  const ModelLayout layout = FindModelPreset("llama3.1-8b")->Layout(DType::kBFloat16, 16);  // 2 MiB
  auto fail = [](const std::string& what, const Status& s) {
    std::fprintf(stderr, "kvtier-bench kv: %s: %s\n", what.c_str(), s.ToString().c_str());
    return 1;
  };
  auto dev = OpenDeviceBackend(args.device);
  if (!dev.ok()) return fail("device " + args.device, dev.status());
  testing::DaemonProcess::Options o;
  o.page_bytes = FormatBytes(layout.block_bytes);
  o.segment_bytes = "64MiB";
  o.host_capacity = "1GiB";
  o.host_yaml = "    overcommit: true\n";
  auto d = BenchDaemon::Start(args.socket, o);
  if (!d.ok()) return fail("daemon", d.status());
  ClientOptions co;
  co.socket_path = (*d)->socket();
  co.layout = layout;
  co.device = args.device;
  co.engine_name = "kvtier-bench-kv";
  auto c = Client::Connect(co);
  if (!c.ok()) return fail("connect", c.status());

  const KvGeometry g{KvLayoutKind::kKvFirst,
                     layout.num_layers,
                     kEngineBlocks,
                     layout.tokens_per_block,
                     layout.kv_heads,
                     layout.head_dim,
                     2};
  DeviceKv kv;
  if (Status s = AllocateKv(**dev, g, &kv); !s.ok()) return fail("engine KV", s);
  // Random KV in the engine blocks stored from; zeros where they are loaded to.
  std::mt19937_64 rng(7);
  std::vector<uint8_t> host(g.LayerTensorBytes());
  for (auto& b : host) b = static_cast<uint8_t>(rng());
  std::fill(host.begin() + static_cast<ptrdiff_t>(g.EngineSlabOffset(kBlocks, 0)),
            host.begin() + static_cast<ptrdiff_t>(g.EngineSlabOffset(0, 1)), 0);
  std::fill(host.begin() + static_cast<ptrdiff_t>(g.EngineSlabOffset(kBlocks, 1)), host.end(), 0);
  for (void* layer : kv.kv.layers) {
    if (Status s = (*dev)->Copy(layer, host.data(), host.size(), CopyKind::kHostToDevice, nullptr); !s.ok())
      return fail("upload", s);
  }
  if (Status s = (*dev)->Synchronize(nullptr); !s.ok()) return fail("upload", s);

  // The baseline: the same bytes between one device buffer and pinned host memory.
  const uint64_t bytes = uint64_t{kBlocks} * layout.block_bytes;
  auto dbuf = (*dev)->AllocateShareable(0, bytes);
  if (!dbuf.ok()) return fail("baseline buffer", dbuf.status());
  std::vector<uint8_t> pinned(bytes, 1);
  if (Status s = (*dev)->RegisterHost(pinned.data(), bytes); !s.ok()) return fail("RegisterHost", s);

  std::vector<uint32_t> from(kBlocks), to(kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) from[i] = i, to[i] = kBlocks + i;
  std::vector<double> store, load, d2h, h2d;
  int failures = 0;
  for (int r = 0; r < args.rounds; ++r) {
    std::vector<BlockHash> chain(kBlocks);
    for (uint32_t i = 0; i < kBlocks; ++i) chain[i] = IndexHash(900 + r, i);
    double t0 = NowUs();
    auto stored = (*c)->StoreBlocks(kv.kv, from, chain);
    store.push_back(NowUs() - t0);
    if (!stored.ok()) return fail("StoreBlocks", stored.status());
    for (const auto& x : *stored) failures += x.status.ok() ? 0 : 1;
    t0 = NowUs();
    auto loaded = (*c)->LoadBlocks(kv.kv, chain, to);
    load.push_back(NowUs() - t0);
    if (!loaded.ok()) return fail("LoadBlocks", loaded.status());
    if (*loaded != kBlocks) ++failures;
    (void)(*c)->Ping();  // LoadBlocks' Release, before the next round allocates
    t0 = NowUs();
    Status s = (*dev)->Copy(pinned.data(), dbuf->ptr, bytes, CopyKind::kDeviceToHost, nullptr);
    if (s.ok()) s = (*dev)->Synchronize(nullptr);
    d2h.push_back(NowUs() - t0);
    t0 = NowUs();
    if (s.ok()) s = (*dev)->Copy(dbuf->ptr, pinned.data(), bytes, CopyKind::kHostToDevice, nullptr);
    if (s.ok()) s = (*dev)->Synchronize(nullptr);
    h2d.push_back(NowUs() - t0);
    if (!s.ok()) return fail("baseline copy", s);
  }
  // The loaded engine blocks hold the stored ones' bytes (both slabs of every layer).
  for (void* layer : kv.kv.layers) {
    std::vector<uint8_t> back(g.LayerTensorBytes());
    if (!(*dev)->Copy(back.data(), layer, back.size(), CopyKind::kDeviceToHost, nullptr).ok() ||
        !(*dev)->Synchronize(nullptr).ok())
      return fail("download", Internal("copy"));
    for (uint32_t c2 = 0; c2 < 2; ++c2) {
      if (std::memcmp(back.data() + g.EngineSlabOffset(kBlocks, c2), back.data() + g.EngineSlabOffset(0, c2),
                      uint64_t{kBlocks} * g.SlabBytes()) != 0)
        ++failures;
    }
  }
  (*dev)->UnregisterHost(pinned.data());
  (*dev)->Free(*dbuf);
  const double store_gbs = Gbs(bytes, Median(store)), load_gbs = Gbs(bytes, Median(load));
  const double d2h_gbs = Gbs(bytes, Median(d2h)), h2d_gbs = Gbs(bytes, Median(h2d));
  const nlohmann::json j{{"device", (*dev)->name()},
                         {"model", layout.ToString()},
                         {"blocks_per_call", kBlocks},
                         {"rounds", args.rounds},
                         {"store_gbs", store_gbs},
                         {"copy_d2h_gbs", d2h_gbs},
                         {"store_ratio", d2h_gbs > 0 ? store_gbs / d2h_gbs : 0},
                         {"load_gbs", load_gbs},
                         {"copy_h2d_gbs", h2d_gbs},
                         {"load_ratio", h2d_gbs > 0 ? load_gbs / h2d_gbs : 0},
                         {"failures", failures}};
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("StoreBlocks/LoadBlocks of %u x 2 MiB blocks (%s device), median of %d rounds\n", kBlocks,
                std::string((*dev)->name()).c_str(), args.rounds);
    std::printf("  store (gather to host pages + commit)  %6.1f GB/s   copy D2H %6.1f GB/s   ratio %.2f\n", store_gbs,
                d2h_gbs, j["store_ratio"].get<double>());
    std::printf("  load  (acquire + scatter from pages)   %6.1f GB/s   copy H2D %6.1f GB/s   ratio %.2f\n", load_gbs,
                h2d_gbs, j["load_ratio"].get<double>());
    std::printf("  failures %d\n", failures);
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace kvtier::bench
