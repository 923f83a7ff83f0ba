// The KV kernels' CPU references, and one DeviceBackend conformance suite run on every
// backend (CUDA skips without a device; host-emulated runs everywhere). Copies must match
// the reference byte for byte; quantization stays within QuantErrorBound.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu_kernels.h"
#include "kernels/device_backend.h"

namespace kvtier {
namespace {

KvGeometry Geometry(KvLayoutKind kind, uint32_t elem) {
  KvGeometry g;
  g.kind = kind;
  g.num_layers = 3;
  g.num_blocks = 10;
  g.block_tokens = 4;
  g.kv_heads = 2;
  g.head_dim = 16;
  g.elem_bytes = elem;
  return g;
}

// Gathers engine blocks `blocks` of the layer tensors `from` into pages with the CPU
// kernel, then scatters those pages into `to`; returns the pages.
std::vector<std::vector<uint8_t>> GatherThenScatterCpu(const KvGeometry& g, std::vector<std::vector<uint8_t>>& from,
                                                       std::vector<std::vector<uint8_t>>& to,
                                                       const std::vector<uint32_t>& blocks) {
  std::vector<std::vector<uint8_t>> pages(blocks.size(), std::vector<uint8_t>(g.BlockBytes()));
  std::vector<uint8_t*> page_ptrs;
  for (auto& p : pages) page_ptrs.push_back(p.data());
  KvTransfer t;
  t.geometry = g;
  for (uint32_t l = 0; l < g.num_layers; ++l) t.layers[l] = from[l].data();
  t.blocks = blocks.data();
  t.pages = page_ptrs.data();
  t.count = static_cast<uint32_t>(blocks.size());
  GatherCpu(t);
  for (uint32_t l = 0; l < g.num_layers; ++l) t.layers[l] = to[l].data();
  ScatterCpu(t);
  return pages;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(GpuKernels, SlabsAreContiguousInBothEngineLayouts) {
  for (KvLayoutKind kind : {KvLayoutKind::kKvFirst, KvLayoutKind::kBlockFirst}) {
    KvGeometry g = Geometry(kind, 2);
    // Every (block, kv) slab starts at a distinct multiple of the slab size and they tile
    // the layer tensor exactly.
    std::vector<bool> seen(2 * g.num_blocks, false);
    for (uint32_t b = 0; b < g.num_blocks; ++b) {
      for (uint32_t c = 0; c < 2; ++c) {
        const uint64_t off = g.EngineSlabOffset(b, c);
        ASSERT_EQ(off % g.SlabBytes(), 0u);
        const uint64_t idx = off / g.SlabBytes();
        ASSERT_LT(idx, seen.size());
        EXPECT_FALSE(seen[idx]);
        seen[idx] = true;
      }
    }
  }
  KvGeometry g = Geometry(KvLayoutKind::kKvFirst, 2);
  EXPECT_EQ(g.EngineSlabOffset(3, 1), (1 * 10 + 3) * g.SlabBytes());  // [2, num_blocks, ...]
  g.kind = KvLayoutKind::kBlockFirst;
  EXPECT_EQ(g.EngineSlabOffset(3, 1), (3 * 2 + 1) * g.SlabBytes());  // [num_blocks, 2, ...]
  EXPECT_EQ(g.BlockBytes(), 2u * 3 * 4 * 2 * 16 * 2);
}

TEST(GpuKernels, BlockFirstWithAStrideMovesEachBlocksRunAndNothingBetween) {
  // Layers interleaved per block (vLLM's block-outermost pages): block b of a layer is one
  // run of 2 x slab bytes at b x stride; the bytes between runs belong to other layers.
  KvGeometry g = Geometry(KvLayoutKind::kBlockFirst, 2);
  const uint64_t run = 2 * g.SlabBytes();
  g.block_stride_bytes = 3 * run;
  ASSERT_TRUE(g.Validate().ok());
  EXPECT_EQ(g.EngineSlabOffset(4, 1), 4 * 3 * run + g.SlabBytes());
  const uint64_t tensor = g.num_blocks * g.block_stride_bytes;
  std::vector<std::vector<uint8_t>> layers, back;
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    layers.push_back(RandomBytes(tensor, 300 + l));
    back.emplace_back(tensor, 0xee);
  }
  const std::vector<uint32_t> blocks = {5, 0, 8};
  GatherThenScatterCpu(g, layers, back, blocks);
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    for (uint64_t off = 0; off < tensor; ++off) {
      const uint64_t b = off / g.block_stride_bytes;
      const bool moved = (b == 5 || b == 0 || b == 8) && off % g.block_stride_bytes < run;
      ASSERT_EQ(back[l][off], moved ? layers[l][off] : 0xee) << "layer " << l << " byte " << off;
    }
  }
  KvGeometry bad = g;
  bad.block_stride_bytes = run - 1;  // runs would overlap
  EXPECT_EQ(bad.Validate().code(), StatusCode::kInvalidArgument);
  bad = g;
  bad.kind = KvLayoutKind::kKvFirst;  // a stride means block-first
  EXPECT_EQ(bad.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(GpuKernels, GatherThenScatterRoundTripsEveryLayoutAndElementSize) {
  for (KvLayoutKind kind : {KvLayoutKind::kKvFirst, KvLayoutKind::kBlockFirst}) {
    for (uint32_t elem : {1u, 2u}) {
      KvGeometry g = Geometry(kind, elem);
      std::vector<std::vector<uint8_t>> layers, back;
      for (uint32_t l = 0; l < g.num_layers; ++l) {
        layers.push_back(RandomBytes(g.LayerTensorBytes(), 100 + l));
        back.emplace_back(g.LayerTensorBytes(), 0);
      }
      const std::vector<uint32_t> blocks = {7, 2, 9};
      const auto pages = GatherThenScatterCpu(g, layers, back, blocks);
      // Page i, slab (l, c) equals engine block blocks[i]'s slab.
      for (size_t i = 0; i < 3; ++i) {
        for (uint32_t l = 0; l < g.num_layers; ++l) {
          for (uint32_t c = 0; c < 2; ++c) {
            ASSERT_EQ(std::memcmp(pages[i].data() + g.PageSlabOffset(l, c),
                                  layers[l].data() + g.EngineSlabOffset(blocks[i], c), g.SlabBytes()),
                      0);
          }
        }
      }
      for (uint32_t l = 0; l < g.num_layers; ++l) {
        for (uint32_t b = 0; b < g.num_blocks; ++b) {
          const bool moved = b == 7 || b == 2 || b == 9;
          for (uint32_t c = 0; c < 2; ++c) {
            const uint8_t* got = back[l].data() + g.EngineSlabOffset(b, c);
            const uint8_t* want = layers[l].data() + g.EngineSlabOffset(b, c);
            if (moved) {
              EXPECT_EQ(std::memcmp(got, want, g.SlabBytes()), 0);
            } else {
              EXPECT_TRUE(std::all_of(got, got + g.SlabBytes(), [](uint8_t v) { return v == 0; }))
                  << "scatter wrote a block it was not given";
            }
          }
        }
      }
    }
  }
}

TEST(GpuKernels, FloatConversionsRoundToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.5f), 0xc100);
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);
  EXPECT_EQ(HalfToFloat(FloatToHalf(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  // e4m3: max 448, min normal 2^-6, smallest subnormal 2^-9.
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(448.0f)), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(1000.0f)), 448.0f) << "saturates";
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(std::ldexp(1.0f, -9))), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(1.125f)), 1.125f);
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(-3.0f)), -3.0f);
  for (int i = 0; i < 256; ++i) {
    const float v = Fp8E4M3ToFloat(static_cast<uint8_t>(i));
    if (std::isnan(v)) continue;
    EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(v)), v) << "code " << i << " does not round trip";
  }
}

struct QuantCase {
  QuantKind quant;
  FloatKind input;
};

class GpuQuantTest : public ::testing::TestWithParam<QuantCase> {};

TEST_P(GpuQuantTest, RoundTripErrorIsWithinTheDocumentedBound) {
  KvGeometry g = Geometry(KvLayoutKind::kKvFirst, 2);
  g.head_dim = 64;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<uint8_t> src(g.BlockBytes()), out(g.BlockBytes());
  std::vector<float> exact(g.BlockBytes() / 2);
  for (size_t i = 0; i < exact.size(); ++i) {
    float x = dist(rng) * (i % 97 == 0 ? 40.0f : 1.0f);  // outliers stretch some rows' scale
    const uint16_t h = GetParam().input == FloatKind::kFp16 ? FloatToHalf(x) : FloatToBf16(x);
    std::memcpy(src.data() + 2 * i, &h, 2);
    exact[i] = GetParam().input == FloatKind::kFp16 ? HalfToFloat(h) : Bf16ToFloat(h);
  }
  std::vector<uint8_t> codes(g.BlockBytes() / 2);
  std::vector<float> scales(QuantRows(g));
  KvQuantize q{g, GetParam().input, GetParam().quant, src.data(), codes.data(), scales.data()};
  QuantizeCpu(q);
  DequantizeCpu(q, out.data());
  const uint32_t d = g.head_dim;
  double worst = 0;
  for (uint64_t r = 0; r < QuantRows(g); ++r) {
    double m = 0;
    for (uint32_t i = 0; i < d; ++i) m = std::max(m, std::fabs(double{exact[r * d + i]}));
    for (uint32_t i = 0; i < d; ++i) {
      uint16_t h;
      std::memcpy(&h, out.data() + 2 * (r * d + i), 2);
      const double got = GetParam().input == FloatKind::kFp16 ? HalfToFloat(h) : Bf16ToFloat(h);
      const double x = exact[r * d + i];
      // The dequantized value is stored in the input's format: allow its rounding too.
      const double storage = std::fabs(x) * (GetParam().input == FloatKind::kFp16 ? 1.0 / 2048 : 1.0 / 256);
      const double bound = QuantErrorBound(GetParam().quant, x, m) + storage;
      ASSERT_LE(std::fabs(got - x), bound) << "row " << r << " elem " << i << " x " << x << " got " << got;
      worst = std::max(worst, std::fabs(got - x) / (m > 0 ? m : 1));
    }
  }
  EXPECT_GT(worst, 0.0) << "a lossy round trip lost nothing: the test is not testing";
}

TEST_P(GpuQuantTest, TheStoredBlockFormDequantizesInPlaceAsTheReferenceDoes) {
  // The cold tiers' form: codes then scales, QuantizedBlockBytes long; read back into the
  // start of the page it becomes (in place) it gives the reference's bytes exactly.
  KvGeometry g = Geometry(KvLayoutKind::kKvFirst, 2);
  g.head_dim = 128;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<uint8_t> src(g.BlockBytes());
  for (size_t i = 0; i < src.size() / 2; ++i) {
    const float x = dist(rng);
    const uint16_t h = GetParam().input == FloatKind::kFp16 ? FloatToHalf(x) : FloatToBf16(x);
    std::memcpy(src.data() + 2 * i, &h, 2);
  }
  std::vector<uint8_t> stored(QuantizedBlockBytes(g));
  EXPECT_EQ(stored.size(), g.BlockBytes() / 2 + QuantRows(g) * 4);
  QuantizeBlockCpu(g, GetParam().input, GetParam().quant, src.data(), stored.data());
  // The reference, with separate buffers.
  std::vector<uint8_t> codes(g.BlockBytes() / 2), expect(g.BlockBytes());
  std::vector<float> scales(QuantRows(g));
  KvQuantize q{g, GetParam().input, GetParam().quant, src.data(), codes.data(), scales.data()};
  QuantizeCpu(q);
  ASSERT_EQ(std::memcmp(codes.data(), stored.data(), codes.size()), 0);
  ASSERT_EQ(std::memcmp(scales.data(), stored.data() + codes.size(), scales.size() * 4), 0);
  DequantizeCpu(q, expect.data());
  // In place: the page starts with the stored form, the rest is stale bytes.
  std::vector<uint8_t> page(g.BlockBytes(), 0xa5);
  std::memcpy(page.data(), stored.data(), stored.size());
  DequantizeBlockCpu(g, GetParam().input, GetParam().quant, page.data(), page.data());
  EXPECT_EQ(page, expect);
  // And from another buffer.
  std::vector<uint8_t> out(g.BlockBytes(), 0);
  DequantizeBlockCpu(g, GetParam().input, GetParam().quant, stored.data(), out.data());
  EXPECT_EQ(out, expect);
}

INSTANTIATE_TEST_SUITE_P(Kinds, GpuQuantTest,
                         ::testing::Values(QuantCase{QuantKind::kInt8, FloatKind::kBf16},
                                           QuantCase{QuantKind::kInt8, FloatKind::kFp16},
                                           QuantCase{QuantKind::kFp8E4M3, FloatKind::kBf16},
                                           QuantCase{QuantKind::kFp8E4M3, FloatKind::kFp16}),
                         [](const auto& info) {
                           return std::string(info.param.quant == QuantKind::kInt8 ? "int8" : "fp8") + "_" +
                                  (info.param.input == FloatKind::kFp16 ? "fp16" : "bf16");
                         });

class DeviceBackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto b = OpenDeviceBackend(GetParam());
    if (!b.ok()) GTEST_SKIP() << GetParam() << ": " << b.status().ToString();
    backend_ = std::move(b).value();
    auto s = backend_->CreateStream(0);
    ASSERT_TRUE(s.ok());
    stream_ = *s;
  }
  void TearDown() override {
    if (backend_) backend_->DestroyStream(stream_);
  }
  std::unique_ptr<DeviceBackend> backend_;
  DeviceStream stream_ = nullptr;
};

TEST_P(DeviceBackendTest, AnImportedAllocationSeesTheExportersBytes) {
  auto a = backend_->AllocateShareable(0, 2 << 20);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::vector<uint8_t> data = RandomBytes(4096, 1), back(4096);
  ASSERT_TRUE(backend_->Copy(a->ptr, data.data(), 4096, CopyKind::kHostToDevice, stream_).ok());
  ASSERT_TRUE(backend_->Synchronize(stream_).ok());
  auto imported = backend_->Import(0, a->fd, a->ipc_handle.data(), a->bytes);
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  ASSERT_TRUE(backend_->Copy(back.data(), *imported, 4096, CopyKind::kDeviceToHost, stream_).ok());
  ASSERT_TRUE(backend_->Synchronize(stream_).ok());
  EXPECT_EQ(back, data);
  backend_->Unimport(*imported, a->bytes);
  backend_->Free(*a);
}

TEST_P(DeviceBackendTest, GatherAndScatterMatchTheCpuReferenceByteForByte) {
  for (KvLayoutKind kind : {KvLayoutKind::kKvFirst, KvLayoutKind::kBlockFirst}) {
    KvGeometry g = Geometry(kind, 2);
    std::vector<DeviceAllocation> layers;
    std::vector<std::vector<uint8_t>> host_layers;
    KvTransfer dev, ref;
    dev.geometry = ref.geometry = g;
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      host_layers.push_back(RandomBytes(g.LayerTensorBytes(), 50 + l));
      auto a = backend_->AllocateShareable(0, 2 << 20);
      ASSERT_TRUE(a.ok());
      ASSERT_TRUE(
          backend_->Copy(a->ptr, host_layers[l].data(), g.LayerTensorBytes(), CopyKind::kHostToDevice, stream_).ok());
      layers.push_back(*a);
      dev.layers[l] = a->ptr;
      ref.layers[l] = host_layers[l].data();
    }
    auto pages_mem = backend_->AllocateShareable(0, 2 << 20);
    ASSERT_TRUE(pages_mem.ok());
    const std::vector<uint32_t> blocks = {0, 5, 9, 3};
    std::vector<uint8_t*> dev_pages, ref_pages;
    std::vector<std::vector<uint8_t>> ref_bufs(4, std::vector<uint8_t>(g.BlockBytes()));
    for (int i = 0; i < 4; ++i) {
      dev_pages.push_back(pages_mem->ptr + i * g.BlockBytes());
      ref_pages.push_back(ref_bufs[i].data());
    }
    dev.blocks = ref.blocks = blocks.data();
    dev.pages = dev_pages.data();
    ref.pages = ref_pages.data();
    dev.count = ref.count = 4;
    ASSERT_TRUE(backend_->Gather(dev, stream_).ok());
    ASSERT_TRUE(backend_->Synchronize(stream_).ok());
    GatherCpu(ref);
    std::vector<uint8_t> got(4 * g.BlockBytes());
    ASSERT_TRUE(backend_->Copy(got.data(), pages_mem->ptr, got.size(), CopyKind::kDeviceToHost, stream_).ok());
    ASSERT_TRUE(backend_->Synchronize(stream_).ok());
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(std::memcmp(got.data() + i * g.BlockBytes(), ref_bufs[i].data(), g.BlockBytes()), 0) << i;
    }
    for (auto& a : layers) backend_->Free(a);
    backend_->Free(*pages_mem);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceBackendTest, ::testing::Values("host-emulated", "cuda"), [](const auto& info) {
  return info.param == "cuda" ? std::string("cuda") : std::string("host_emulated");
});

TEST(DeviceBackend, CudaWithoutADeviceIsUnavailableNotACrash) {
  auto b = OpenDeviceBackend("cuda");
  if (b.ok()) GTEST_SKIP() << "a CUDA device is visible here";
  EXPECT_TRUE(b.status().code() == StatusCode::kUnavailable || b.status().code() == StatusCode::kUnimplemented)
      << b.status().ToString();
  EXPECT_EQ(OpenDeviceBackend("opencl").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
