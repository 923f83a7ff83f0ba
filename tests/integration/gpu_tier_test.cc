// The GPU tier through a real kvtierd on TestGpuBackend() — host-emulated in `make test`,
// cuda on a machine with a GPU (tests/gpu/device.sh): engines lease GPU pages, share
// committed GPU blocks zero-copy, GPU blocks are demoted to host pages with their bytes,
// the store/load helpers move KV between an engine's paged layout and kvtier pages, and a
// killed engine's GPU leases come back.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <span>
#include <sstream>
#include <thread>

#include "engine/tools/block_pattern.h"
#include "kernels/device_backend.h"
#include "tests/integration/device_pages.h"
#include "tests/integration/engine_process.h"

namespace kvtier::testing {
namespace {

const uint64_t kBlock = TestLayout().block_bytes;

DaemonProcess::Options GpuDaemon(const std::string& gpu_capacity = "8MiB") {
  DaemonProcess::Options o;
  o.host_capacity = "16MiB";
  o.page_bytes = "1MiB";
  o.segment_bytes = "4MiB";
  o.gpu_capacity = gpu_capacity;
  o.gpu_segment_bytes = "4MiB";
  return o;
}

ClientOptions GpuEngine(const DaemonProcess& d, const std::string& name) {
  ClientOptions o = EngineOptions(d.socket_path(), name);
  o.device = TestGpuBackend();
  return o;
}

Status StoreOnGpu(Client& c, const std::vector<BlockHash>& chain) {
  KVTIER_ASSIGN_OR_RETURN(auto pages, c.Allocate(TierKind::kGpu, static_cast<uint32_t>(chain.size())));
  std::vector<CommitEntry> e;
  for (size_t i = 0; i < chain.size(); ++i) {
    KVTIER_RETURN_IF_ERROR(FillPage(c, TierKind::kGpu, pages[i], chain[i], kBlock));
    e.push_back({pages[i], chain[i], i ? chain[i - 1] : BlockHash()});
  }
  KVTIER_ASSIGN_OR_RETURN(auto r, c.Commit(TierKind::kGpu, e));
  for (const auto& x : r) KVTIER_RETURN_IF_ERROR(x.status);
  return Status::Ok();
}

TEST(GpuTier, TwoEnginesShareAGpuBlockThroughTheDaemon) {
  DaemonProcess d(GpuDaemon());
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const auto chain = HashChain(5, 3);
  Pipe stored, done;
  EngineProcess writer([&]() -> int {
    auto c = Client::Connect(GpuEngine(d, "gpu-writer"));
    if (!c.ok()) return 10;
    if (!StoreOnGpu(**c, chain).ok()) return 11;
    stored.Signal();
    return done.Wait() ? 0 : 12;
  });
  ASSERT_TRUE(stored.Wait()) << d.Log();
  EngineProcess reader([&]() -> int {
    auto c = Client::Connect(GpuEngine(d, "gpu-reader"));
    if (!c.ok()) return 20;
    auto l = (*c)->Lookup(chain);
    if (!l.ok() || l->matched != 3) return 21;
    for (TierKind t : l->tiers) {
      if (t != TierKind::kGpu) return 22;
    }
    auto a = (*c)->Acquire(chain);
    if (!a.ok()) return 23;
    for (size_t i = 0; i < 3; ++i) {
      if (!(*a)[i].status.ok() || (*a)[i].tier != TierKind::kGpu) return 24;
      if (!CheckPage(**c, TierKind::kGpu, (*a)[i].page, chain[i], kBlock)) return 25;
    }
    return 0;
  });
  EXPECT_EQ(reader.Join(), 0) << d.Log();
  done.Signal();
  EXPECT_EQ(writer.Join(), 0) << d.Log();
  // The blocks outlive both engines: a restarted engine finds them on the GPU.
  auto c = Client::Connect(GpuEngine(d, "gpu-late"));
  ASSERT_TRUE(c.ok());
  auto l = (*c)->Lookup(chain);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->matched, 3u);
  c->reset();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(GpuTier, DemotionFromGpuToHostKeepsTheBytes) {
  DaemonProcess d(GpuDaemon("8MiB"));  // 8 GPU pages, demoted above 90%
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Connect(GpuEngine(d, "gpu-filler"));
  ASSERT_TRUE(c.ok());
  std::vector<BlockHash> all;
  for (int seq = 0; seq < 6; ++seq) {
    auto chain = HashChain(100 + seq, 3);
    ASSERT_TRUE(StoreOnGpu(**c, chain).ok());
    all.insert(all.end(), chain.begin(), chain.end());
  }
  size_t on_host = 0, on_gpu = 0;
  for (const BlockHash& h : all) {
    std::vector<BlockHash> one = {h};
    auto l = (*c)->Lookup(one);
    ASSERT_TRUE(l.ok());
    ASSERT_EQ(l->matched, 1u) << "a demoted block was lost";
    ++(l->tiers[0] == TierKind::kHost ? on_host : on_gpu);
    auto a = (*c)->Acquire(one);
    ASSERT_TRUE(a.ok() && (*a)[0].status.ok());
    EXPECT_TRUE(CheckPage(**c, (*a)[0].tier, (*a)[0].page, h, kBlock)) << "bytes changed on the way down";
    ASSERT_TRUE((*c)->Release(TierKind::kGpu, {}, one).ok());
  }
  EXPECT_GT(on_host, 0u);
  EXPECT_GT(on_gpu, 0u);
  auto stats = StatsOf(d.socket_path());
  ASSERT_TRUE(stats.ok());
  for (const auto& t : stats->tiers) {
    EXPECT_EQ(t.free_pages + t.leased_pages + t.inflight_pages + t.cached_pages + t.referenced_pages, t.capacity_pages)
        << t.name;
  }
  c->reset();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// An engine's KV in its device memory, one tensor per layer: random in `src` (A's), zeros
// in B's.
struct TwoEngines {
  TwoEngines(const ModelLayout& layout, KvLayoutKind kind, uint32_t num_blocks, uint32_t seed)
      : g{kind, layout.num_layers, num_blocks, layout.tokens_per_block, layout.kv_heads, layout.head_dim, 2},
        a_kv{kind, num_blocks, {}, nullptr},
        b_kv{kind, num_blocks, {}, nullptr} {
    std::mt19937 rng(seed);
    src.assign(layout.num_layers, std::vector<uint8_t>(g.LayerTensorBytes()));
    for (auto& t : src) {
      for (auto& b : t) b = static_cast<uint8_t>(rng());
      a_mem.push_back(std::make_unique<DeviceBuffer>(g.LayerTensorBytes()));
      b_mem.push_back(std::make_unique<DeviceBuffer>(g.LayerTensorBytes()));
      ok = ok && a_mem.back()->Upload(t).ok() && b_mem.back()->Upload(std::vector<uint8_t>(t.size(), 0)).ok();
      a_kv.layers.push_back(a_mem.back()->data());
      b_kv.layers.push_back(b_mem.back()->data());
    }
  }
  // B's tensors as they are now.
  std::vector<std::vector<uint8_t>> Downloaded() const {
    std::vector<std::vector<uint8_t>> out;
    for (const auto& m : b_mem) {
      auto bytes = m->Download();
      out.push_back(bytes.ok() ? std::move(*bytes) : std::vector<uint8_t>());
    }
    return out;
  }
  // Whether slab (to[i], c) of B's layer l holds slab (from[i], c) of A's, for every block i
  // and kv c; whether it is still zeros when !moved.
  bool Moved(const std::vector<std::vector<uint8_t>>& dst, uint32_t l, std::span<const uint32_t> from,
             std::span<const uint32_t> to, bool moved = true) const {
    const std::vector<uint8_t> zeros(g.SlabBytes(), 0);
    for (size_t i = 0; i < to.size(); ++i) {
      for (uint32_t c = 0; c < 2; ++c) {
        const uint8_t* want = moved ? src[l].data() + g.EngineSlabOffset(from[i], c) : zeros.data();
        if (std::memcmp(dst[l].data() + g.EngineSlabOffset(to[i], c), want, g.SlabBytes()) != 0) return false;
      }
    }
    return true;
  }
  KvGeometry g;
  std::vector<std::vector<uint8_t>> src;
  std::vector<std::unique_ptr<DeviceBuffer>> a_mem, b_mem;
  EngineKv a_kv, b_kv;
  bool ok = true;
};

TEST(GpuTier, StoreAndLoadHelpersMoveKvBetweenEngineLayoutsAndPages) {
  DaemonProcess d(GpuDaemon());
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const ModelLayout layout = TestLayout();  // 2 layers, 2 heads, dim 64, bf16, 16 tokens
  for (KvLayoutKind kind : {KvLayoutKind::kKvFirst, KvLayoutKind::kBlockFirst}) {
    TwoEngines e(layout, kind, 8, static_cast<uint32_t>(kind) + 3);
    ASSERT_TRUE(e.ok);
    const auto chain = HashChain(40 + static_cast<int>(kind), 3);
    auto a = Client::Connect(GpuEngine(d, "store"));
    ASSERT_TRUE(a.ok());
    const std::vector<uint32_t> from = {6, 1, 4};
    auto stored = (*a)->StoreBlocks(e.a_kv, from, chain);
    ASSERT_TRUE(stored.ok()) << stored.status().ToString();
    for (const auto& r : *stored) EXPECT_TRUE(r.status.ok());
    auto b = Client::Connect(GpuEngine(d, "load"));
    ASSERT_TRUE(b.ok());
    const std::vector<uint32_t> to = {0, 7, 3};
    auto before = StatsOf(d.socket_path());
    ASSERT_TRUE(before.ok());
    auto ops = [&](const char* op) {
      return Metric(before->metrics_url, std::string("kvtier_rpc_duration_seconds_count{op=\"") + op + "\"}");
    };
    const double lookups = ops("lookup"), acquires = ops("acquire"), releases = ops("release");
    auto loaded = (*b)->LoadBlocks(e.b_kv, chain, to);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_EQ(*loaded, 3u);
    // The Release is not waited for: a later request on the session comes after it.
    ASSERT_TRUE((*b)->Ping().ok());
    // One Acquire of the chain's present prefix (no Lookup first), one Release.
    EXPECT_EQ(ops("lookup"), lookups);
    EXPECT_EQ(ops("acquire"), acquires + 1);
    EXPECT_EQ(ops("release"), releases + 1);
    const auto dst = e.Downloaded();
    for (uint32_t l = 0; l < layout.num_layers; ++l) EXPECT_TRUE(e.Moved(dst, l, from, to)) << "layer " << l;
    // Blocks not named stay untouched.
    EXPECT_TRUE(std::all_of(dst[0].begin() + e.g.EngineSlabOffset(5, 0),
                            dst[0].begin() + e.g.EngineSlabOffset(5, 0) + e.g.SlabBytes(),
                            [](uint8_t v) { return v == 0; }));
    // Nothing stays referenced after the helpers.
    auto s = StatsOf(d.socket_path());
    ASSERT_TRUE(s.ok());
    for (const auto& t : s->tiers) EXPECT_EQ(t.referenced_pages, 0u) << t.name;
  }
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// A load in layers, as an engine that waits for each layer does: StartLoad holds the
// chain's present prefix (one Acquire), each ScatterLayers moves only its layers, in any
// order, and FinishLoad gives the blocks back.
TEST(GpuTier, ALoadInLayersMovesOnlyTheLayersAskedAndHoldsItsBlocksUntilFinished) {
  DaemonProcess d(GpuDaemon());
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ModelLayout layout = TestLayout();
  layout.num_layers = 4;
  layout.block_bytes = layout.NaturalBlockBytes();
  for (KvLayoutKind kind : {KvLayoutKind::kKvFirst, KvLayoutKind::kBlockFirst}) {
    TwoEngines e(layout, kind, 8, static_cast<uint32_t>(kind) + 11);
    ASSERT_TRUE(e.ok);
    ClientOptions so = GpuEngine(d, "store"), lo = GpuEngine(d, "load");
    so.layout = lo.layout = layout;
    auto a = Client::Connect(so);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    const auto chain = HashChain(60 + static_cast<int>(kind), 4);
    const std::vector<uint32_t> from = {2, 5, 0};
    // Three of the chain's four blocks are cached: the load is their prefix.
    ASSERT_TRUE((*a)->StoreBlocks(e.a_kv, from, std::span(chain).first(3)).ok());
    auto b = Client::Connect(lo);
    ASSERT_TRUE(b.ok());
    const std::vector<uint32_t> to = {1, 6, 3, 4};
    auto load = (*b)->StartLoad(e.b_kv, chain, to);
    ASSERT_TRUE(load.ok()) << load.status().ToString();
    ASSERT_EQ(load->loaded(), 3u);
    auto referenced = [&] {
      auto s = StatsOf(d.socket_path());
      uint64_t n = 0;
      for (const auto& t : s->tiers) n += t.referenced_pages;
      return n;
    };
    EXPECT_EQ(referenced(), 3u);
    const std::span<const uint32_t> moved_to = std::span(to).first(3);
    // Layer 2, then layers 0 and 1 together: layer 3 is untouched until it is asked.
    ASSERT_TRUE((*b)->ScatterLayers(*load, 2, 3, e.b_kv.stream, true).ok());
    auto dst = e.Downloaded();
    EXPECT_TRUE(e.Moved(dst, 2, from, moved_to));
    for (uint32_t l : {0u, 1u, 3u}) EXPECT_TRUE(e.Moved(dst, l, from, moved_to, false)) << "layer " << l;
    ASSERT_TRUE((*b)->ScatterLayers(*load, 0, 2, e.b_kv.stream, true).ok());
    dst = e.Downloaded();
    for (uint32_t l : {0u, 1u, 2u}) EXPECT_TRUE(e.Moved(dst, l, from, moved_to)) << "layer " << l;
    EXPECT_TRUE(e.Moved(dst, 3, from, moved_to, false));
    EXPECT_EQ((*b)->ScatterLayers(*load, 3, 5, e.b_kv.stream, true).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE((*b)->ScatterLayers(*load, 3, 4, e.b_kv.stream, true).ok());
    dst = e.Downloaded();
    for (uint32_t l = 0; l < 4; ++l) EXPECT_TRUE(e.Moved(dst, l, from, moved_to)) << "layer " << l;
    // The engine block past the prefix is never written.
    EXPECT_TRUE(e.Moved(dst, 0, {}, std::span(to).subspan(3), false));
    ASSERT_TRUE((*b)->FinishLoad(*load).ok());
    ASSERT_TRUE((*b)->Ping().ok());  // after the unwaited Release
    EXPECT_EQ(referenced(), 0u);
    EXPECT_EQ((*b)->ScatterLayers(*load, 0, 1, e.b_kv.stream, true).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ((*b)->FinishLoad(*load).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(GpuTier, AnEngineKilledWithGpuPagesLeasedGivesThemBack) {
  DaemonProcess d(GpuDaemon("8MiB"));  // 8 GPU pages
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  Pipe leased;
  EngineProcess engine([&]() -> int {
    const int rc = [&] {
      auto c = Client::Connect(GpuEngine(d, "gpu-killed"));
      if (!c.ok()) return 10;
      auto pages = (*c)->Allocate(TierKind::kGpu, 4);  // security.max_leased_share: half the tier
      if (!pages.ok()) return 11;
      const auto hashes = HashChain(7, pages->size());
      for (size_t i = 0; i < pages->size(); ++i) {
        if (!FillPage(**c, TierKind::kGpu, (*pages)[i], hashes[i], kBlock).ok()) return 12;
      }
      c->release();  // never closed: the process dies holding the lease
      return 0;
    }();
    leased.Signal();
    if (rc != 0) return rc;
    std::this_thread::sleep_for(std::chrono::seconds(60));  // killed before this ends
    return 13;
  });
  ASSERT_TRUE(leased.Wait()) << d.Log();
  auto held = StatsOf(d.socket_path());
  ASSERT_TRUE(held.ok());
  ASSERT_NE(TierOf(*held, TierKind::kGpu), nullptr);
  ASSERT_EQ(TierOf(*held, TierKind::kGpu)->leased_pages, 4u) << "engine exited " << engine.Join();
  engine.Kill9();
  EXPECT_EQ(engine.Join(), 128 + SIGKILL);
  // The daemon sees the session's socket close and takes the pages back.
  uint32_t free_pages = 0, leased_pages = 1;
  EXPECT_TRUE(WaitUntil([&] {
    auto s = StatsOf(d.socket_path());
    if (!s.ok()) return false;
    const TierStatsInfo* gpu = TierOf(*s, TierKind::kGpu);
    free_pages = gpu->free_pages, leased_pages = gpu->leased_pages;
    return leased_pages == 0 && free_pages == gpu->capacity_pages;
  })) << d.Log();
  EXPECT_EQ(leased_pages, 0u);
  EXPECT_EQ(free_pages, 8u);
  // Another engine leases its share and writes it.
  auto c = Client::Connect(GpuEngine(d, "gpu-next"));
  ASSERT_TRUE(c.ok());
  auto all = (*c)->Allocate(TierKind::kGpu, 4);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  const auto hashes = HashChain(8, all->size());
  for (size_t i = 0; i < all->size(); ++i) {
    ASSERT_TRUE(FillPage(**c, TierKind::kGpu, (*all)[i], hashes[i], kBlock).ok());
    EXPECT_TRUE(CheckPage(**c, TierKind::kGpu, (*all)[i], hashes[i], kBlock));
  }
  c->reset();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(GpuTier, AGpuTierNeedsABackendAndSaysSo) {
  if (OpenDeviceBackend("cuda").ok()) GTEST_SKIP() << "a GPU is visible";
  DaemonProcess::Options o = GpuDaemon();
  o.extra_yaml = "";
  DaemonProcess d(o);
  // A cuda backend asked for explicitly, where there is none, is refused at start.
  std::string cfg = d.config_path();
  {
    std::ifstream in(cfg);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    const std::string configured = "backend: " + TestGpuBackend();
    const size_t at = text.find(configured);
    ASSERT_NE(at, std::string::npos);
    text.replace(at, configured.size(), "backend: cuda");
    std::ofstream(cfg) << text;
  }
  Status st = d.Start();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(d.Log().find("tiers.gpu.backend cuda"), std::string::npos) << d.Log();
}

}  // namespace
}  // namespace kvtier::testing
