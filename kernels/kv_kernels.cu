// CUDA KV kernels: gather (engine paged layout -> contiguous pages) and scatter (the
// reverse) over every layer of every block in one launch, and int8 / fp8-e4m3
// quantization with one scale per (layer, kv, token, head) row. The CPU references in
// cpu_kernels.cc define the results: copies must match them bit for bit, quantization
// within QuantErrorBound.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/kv_kernels.h"

namespace kvtier::cuda {
namespace {

struct Params {
  KvGeometry g;
  uint8_t* layers[kMaxKvLayers];
  const uint32_t* blocks;
  uint8_t* const* pages;
};

// One CTA per (block, layer, kv) slab: the slab is contiguous on both sides, so this is a
// strided memcpy with 16-byte accesses where both ends allow them.
template <bool kToPage>
__global__ void MoveSlabs(const Params p) {
  const uint32_t slab_id = blockIdx.x;
  const uint32_t c = slab_id % 2;
  const uint32_t l = (slab_id / 2) % p.g.num_layers;
  const uint32_t i = slab_id / (2 * p.g.num_layers);
  const uint64_t slab = p.g.SlabBytes();
  uint8_t* engine = p.layers[l] + p.g.EngineSlabOffset(p.blocks[i], c);
  uint8_t* page = p.pages[i] + p.g.PageSlabOffset(l, c);
  uint8_t* dst = kToPage ? page : engine;
  const uint8_t* src = kToPage ? engine : page;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | slab) & 15) == 0) {
    const uint64_t n = slab / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (uint64_t k = threadIdx.x; k < n; k += blockDim.x) d[k] = s[k];
  } else {
    for (uint64_t k = threadIdx.x; k < slab; k += blockDim.x) dst[k] = src[k];
  }
}

__device__ float LoadF(FloatKind k, const uint8_t* p) {
  if (k == FloatKind::kFp16) return __half2float(*reinterpret_cast<const __half*>(p));
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
}

__device__ void StoreF(FloatKind k, uint8_t* p, float v) {
  if (k == FloatKind::kFp16)
    *reinterpret_cast<__half*>(p) = __float2half_rn(v);
  else
    *reinterpret_cast<__nv_bfloat16*>(p) = __float2bfloat16_rn(v);
}

// One warp per row of head_dim elements.
__global__ void QuantizeRows(const KvQuantize q, uint64_t rows) {
  const uint64_t row = (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const uint32_t lane = threadIdx.x % 32;
  if (row >= rows) return;
  const uint32_t d = q.geometry.head_dim;
  const uint8_t* src = q.src + row * d * 2;
  float m = 0.f;
  for (uint32_t i = lane; i < d; i += 32) m = fmaxf(m, fabsf(LoadF(q.input, src + 2 * i)));
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const float qmax = q.output == QuantKind::kInt8 ? 127.f : 448.f;
  const float scale = m > 0.f ? m / qmax : 1.f;
  if (lane == 0) q.scales[row] = scale;
  const float inv = 1.f / scale;
  for (uint32_t i = lane; i < d; i += 32) {
    const float x = LoadF(q.input, src + 2 * i) * inv;
    uint8_t code;
    if (q.output == QuantKind::kInt8) {
      code = static_cast<uint8_t>(static_cast<int8_t>(max(-127, min(127, __float2int_rn(x)))));
    } else {
      code = static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
    }
    q.codes[row * d + i] = code;
  }
}

__global__ void DequantizeRows(const KvQuantize q, uint8_t* dst, uint64_t rows) {
  const uint64_t row = (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const uint32_t lane = threadIdx.x % 32;
  if (row >= rows) return;
  const uint32_t d = q.geometry.head_dim;
  const float scale = q.scales[row];
  for (uint32_t i = lane; i < d; i += 32) {
    const uint8_t code = q.codes[row * d + i];
    float v;
    if (q.output == QuantKind::kInt8) {
      v = static_cast<float>(static_cast<int8_t>(code));
    } else {
      __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
      v = __half2float(__half(h));
    }
    StoreF(q.input, dst + (row * d + i) * 2, v * scale);
  }
}

template <bool kToPage>
int LaunchMove(const KvTransfer& t, const uint32_t* blocks, uint8_t* const* pages, void* stream) {
  if (t.count == 0) return 0;
  Params p;
  p.g = t.geometry;
  for (uint32_t l = 0; l < t.geometry.num_layers; ++l) p.layers[l] = t.layers[l];
  p.blocks = blocks;
  p.pages = pages;
  const uint32_t ctas = t.count * t.geometry.num_layers * 2;
  MoveSlabs<kToPage><<<ctas, 256, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchGather(const KvTransfer& t, const uint32_t* blocks, uint8_t* const* pages, void* stream) {
  return LaunchMove<true>(t, blocks, pages, stream);
}

int LaunchScatter(const KvTransfer& t, const uint32_t* blocks, uint8_t* const* pages, void* stream) {
  return LaunchMove<false>(t, blocks, pages, stream);
}

int LaunchQuantize(const KvQuantize& q, void* stream) {
  const uint64_t rows = QuantRows(q.geometry);
  const uint64_t threads = rows * 32;
  QuantizeRows<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(q, rows);
  return static_cast<int>(cudaGetLastError());
}

int LaunchDequantize(const KvQuantize& q, uint8_t* dst, void* stream) {
  const uint64_t rows = QuantRows(q.geometry);
  const uint64_t threads = rows * 32;
  DequantizeRows<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(q, dst,
                                                                                                              rows);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace kvtier::cuda
