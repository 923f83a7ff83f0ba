#pragma once
// CPU reference kernels: the definition of what the CUDA kernels must compute (copies
// bit-exactly; quantization within QuantErrorBound), and what the host-emulated
// DeviceBackend runs. Pure functions over caller memory; thread-safe.

#include <cstdint>

#include "kernels/kv_layout.h"

namespace kvtier {

// Engine blocks -> pages, every layer.
void GatherCpu(const KvTransfer& t);
// Pages -> engine blocks, every layer.
void ScatterCpu(const KvTransfer& t);

// Quantize one page (fp16/bf16) to codes + per-row scales.
void QuantizeCpu(const KvQuantize& q);
// The inverse: codes + scales -> one page of `q.input` kind floats written to `dst`.
void DequantizeCpu(const KvQuantize& q, uint8_t* dst);

// One page (`src`: g.BlockBytes() of `in` floats) to its stored quantized form in `dst`
// (QuantizedBlockBytes(g): codes, then scales). REQUIRES: g.elem_bytes == 2.
void QuantizeBlockCpu(const KvGeometry& g, FloatKind in, QuantKind out, const uint8_t* src, uint8_t* dst);
// The inverse: the stored form at `src` to one page of `in` floats at `dst`. `src` may lie
// inside [dst, dst + g.BlockBytes()) (a page fetched into itself): it is copied aside first.
void DequantizeBlockCpu(const KvGeometry& g, FloatKind in, QuantKind out, const uint8_t* src, uint8_t* dst);

// Scalar conversions (exposed for tests).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);  // round to nearest even
float Bf16ToFloat(uint16_t b);
uint16_t FloatToBf16(float f);  // round to nearest even
float Fp8E4M3ToFloat(uint8_t v);
uint8_t FloatToFp8E4M3(float f);  // round to nearest even, saturating at 448

}  // namespace kvtier
