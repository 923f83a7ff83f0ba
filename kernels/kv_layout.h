#pragma once
// KV layouts: how an engine's paged KV cache is laid out in its (device) memory, and the
// canonical contiguous block format of a kvtier page.
//
// An engine keeps, per layer, one tensor of K and V for all its blocks, in one of two
// common layouts (vLLM flash-attn and FlashInfer-style):
//   kKvFirst    [2, num_blocks, block_tokens, kv_heads, head_dim]
//   kBlockFirst [num_blocks, 2, block_tokens, kv_heads, head_dim]
// In both, the (K or V) slab of one block of one layer — block_tokens x kv_heads x
// head_dim elements — is contiguous; only the strides between slabs differ. kBlockFirst
// also covers any layout whose block of one layer is one dense run of 2 x slab bytes
// (vLLM's [blocks, heads, tokens, 2 x head_dim] pages, in either token/head order), with
// a block stride larger than the run when a layer's blocks are interleaved with other
// layers' (block_stride_bytes; 0 means 2 x slab). Which order the bytes inside a run
// have is the engine's business: kvtier moves runs bit-exact.
//
// A kvtier page holds one block, all layers, as [layer][k, v][token][head][dim]: slab
// (layer l, kv c) at offset (2 l + c) x slab_bytes. Value types; thread-compatible.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "protocol/base/status.h"

namespace kvtier {

enum class KvLayoutKind : uint8_t { kKvFirst = 0, kBlockFirst = 1 };

inline constexpr int kMaxKvLayers = 256;

struct KvGeometry {
  KvLayoutKind kind = KvLayoutKind::kKvFirst;
  uint32_t num_layers = 0;
  uint32_t num_blocks = 0;  // blocks in each engine tensor
  uint32_t block_tokens = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t elem_bytes = 2;          // 4: fp32, 2: fp16/bf16, 1: fp8/int8 (gather/scatter copy bytes)
  uint64_t block_stride_bytes = 0;  // kBlockFirst: bytes from one block to the next; 0: 2 x slab

  // constexpr so CUDA kernels may call them (nvcc --expt-relaxed-constexpr).
  constexpr uint64_t SlabBytes() const { return uint64_t{block_tokens} * kv_heads * head_dim * elem_bytes; }
  // Bytes of one block in a page: 2 x layers x slab.
  constexpr uint64_t BlockBytes() const { return 2 * num_layers * SlabBytes(); }
  // Byte offset of slab (block b, kv c) inside one layer's tensor.
  constexpr uint64_t EngineSlabOffset(uint32_t b, uint32_t c) const {
    return kind == KvLayoutKind::kKvFirst ? (uint64_t{c} * num_blocks + b) * SlabBytes()
                                          : uint64_t{b} * BlockStride() + uint64_t{c} * SlabBytes();
  }
  constexpr uint64_t BlockStride() const { return block_stride_bytes ? block_stride_bytes : 2 * SlabBytes(); }
  // Byte offset of slab (layer l, kv c) inside a page.
  constexpr uint64_t PageSlabOffset(uint32_t l, uint32_t c) const { return (uint64_t{l} * 2 + c) * SlabBytes(); }
  // Bytes of one layer's engine tensor (dense layouts: block_stride_bytes 0).
  constexpr uint64_t LayerTensorBytes() const { return 2ull * num_blocks * SlabBytes(); }
  // kInvalidArgument naming the bad field.
  Status Validate() const;
};

// One gather (engine blocks -> pages) or scatter (pages -> engine blocks) over every layer:
// block i moves between engine block blocks[i] and page pages[i].
struct KvTransfer {
  KvGeometry geometry;
  std::array<uint8_t*, kMaxKvLayers> layers{};  // each layer's tensor (engine memory)
  const uint32_t* blocks = nullptr;             // engine block ids, `count` of them
  uint8_t* const* pages = nullptr;              // page addresses, `count` of them
  uint32_t count = 0;
};

// Quantization of a page of fp16/bf16 KV into 1-byte codes with one float scale per
// (layer, kv, token, head) row of head_dim elements.
enum class QuantKind : uint8_t { kInt8 = 0, kFp8E4M3 = 1 };
// The config's words for them (tiers.nvme.quantization).
inline constexpr std::pair<std::string_view, QuantKind> kQuantKindNames[] = {{"int8", QuantKind::kInt8},
                                                                             {"fp8", QuantKind::kFp8E4M3}};
enum class FloatKind : uint8_t { kFp16 = 0, kBf16 = 1 };

struct KvQuantize {
  KvGeometry geometry;  // elem_bytes must be 2
  FloatKind input = FloatKind::kBf16;
  QuantKind output = QuantKind::kInt8;
  const uint8_t* src = nullptr;  // one page: BlockBytes() bytes
  uint8_t* codes = nullptr;      // BlockBytes() / 2 bytes
  float* scales = nullptr;       // 2 x layers x tokens x heads floats
};

constexpr uint64_t QuantRows(const KvGeometry& g) { return 2ull * g.num_layers * g.block_tokens * g.kv_heads; }

// A quantized block as the cold tiers store it: the codes (one byte per element, in page
// order), then one little-endian float scale per row. REQUIRES: elem_bytes == 2.
constexpr uint64_t QuantizedBlockBytes(const KvGeometry& g) { return g.BlockBytes() / 2 + QuantRows(g) * 4; }

// The documented error bound of a round trip (quantize then dequantize), per element x of
// a row whose largest magnitude is m:
//   int8:     |x - x'| <= m / 254 (half a step of m / 127)
//   fp8_e4m3: |x - x'| <= |x| / 16 + m / 2^9 (half an ulp of 3 mantissa bits, and the
//             subnormal step of the row's scale)
// each plus m x 2^-20 + 1e-7 for float32 arithmetic; x' as computed in float, before it is
// rounded to the page's 2-byte float (which adds half an ulp of x').
double QuantErrorBound(QuantKind kind, double x, double row_max);

}  // namespace kvtier
