#include "kernels/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kvtier {
namespace {

template <bool kToPage>
void Move(const KvTransfer& t) {
  const KvGeometry& g = t.geometry;
  const uint64_t slab = g.SlabBytes();
  for (uint32_t i = 0; i < t.count; ++i) {
    for (uint32_t l = 0; l < g.num_layers; ++l) {
      for (uint32_t c = 0; c < 2; ++c) {
        uint8_t* engine = t.layers[l] + g.EngineSlabOffset(t.blocks[i], c);
        uint8_t* page = t.pages[i] + g.PageSlabOffset(l, c);
        if (kToPage)
          std::memcpy(page, engine, slab);
        else
          std::memcpy(engine, page, slab);
      }
    }
  }
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float Load(FloatKind k, const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return k == FloatKind::kFp16 ? HalfToFloat(v) : Bf16ToFloat(v);
}

}  // namespace

void GatherCpu(const KvTransfer& t) { Move<true>(t); }
void ScatterCpu(const KvTransfer& t) { Move<false>(t); }

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    if (mant == 0) return FromBits(sign);
    float v = std::ldexp(static_cast<float>(mant), -24);  // subnormal
    return sign ? -v : v;
  }
  if (exp == 31) return FromBits(sign | 0x7f800000u | (mant << 13));
  return FromBits(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t u = Bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to inf
  if (a < std::ldexp(1.0f, -25)) return sign;
  int e;
  std::frexp(a, &e);      // a = m * 2^e, m in [0.5, 1)
  const int exp = e - 1;  // a in [2^exp, 2^(exp+1))
  if (exp < -14) {
    const float q = std::nearbyint(a * std::ldexp(1.0f, 24));  // subnormal units of 2^-24
    return sign | static_cast<uint16_t>(q);
  }
  const float scaled = std::nearbyint(std::ldexp(a, 10 - exp));  // 1024 .. 2048
  uint32_t m = static_cast<uint32_t>(scaled);
  int ex = exp;
  if (m == 2048) {
    m = 1024;
    ++ex;
  }
  if (ex > 15) return sign | 0x7c00;
  return sign | static_cast<uint16_t>(((ex + 15) << 10) | (m - 1024));
}

float Bf16ToFloat(uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBf16(float f) {
  uint32_t u = Bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t round = 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + round) >> 16);
}

float Fp8E4M3ToFloat(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  if (exp == 0xf && mant == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);
  return sign * std::ldexp(1.0f + mant / 8.0f, exp - 7);
}

uint8_t FloatToFp8E4M3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return 0x7f;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate (no infinities in e4m3)
  if (a < std::ldexp(1.0f, -6)) {
    const int q = static_cast<int>(std::nearbyint(a * 512.0f));  // subnormal units of 2^-9
    return sign | static_cast<uint8_t>(q);                       // q == 8 is the smallest normal, 0x08
  }
  int e;
  std::frexp(a, &e);
  int exp = e - 1;
  int m = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - exp)));  // 8 .. 16
  if (m == 16) {
    m = 8;
    ++exp;
  }
  if (exp > 8) return sign | 0x7e;
  return sign | static_cast<uint8_t>(((exp + 7) << 3) | (m - 8));
}

void QuantizeCpu(const KvQuantize& q) {
  const KvGeometry& g = q.geometry;
  const uint64_t rows = QuantRows(g);
  const uint32_t d = g.head_dim;
  const float qmax = q.output == QuantKind::kInt8 ? 127.0f : 448.0f;
  std::vector<float> x(d);
  for (uint64_t r = 0; r < rows; ++r) {
    const uint8_t* src = q.src + r * d * 2;
    float m = 0;
    for (uint32_t i = 0; i < d; ++i) {
      x[i] = Load(q.input, src + 2 * i);
      m = std::max(m, std::fabs(x[i]));
    }
    const float scale = m > 0 ? m / qmax : 1.0f;
    q.scales[r] = scale;
    const float inv = 1.0f / scale;
    uint8_t* out = q.codes + r * d;
    if (q.output == QuantKind::kInt8) {
      // Round half to even as nearbyint does in the default mode: adding 1.5 x 2^23 leaves
      // the integer part in the mantissa (|x| <= 127 here).
      constexpr float kMagic = 12582912.0f;
      for (uint32_t i = 0; i < d; ++i) {
        const float c = std::clamp((x[i] * inv + kMagic) - kMagic, -127.0f, 127.0f);
        out[i] = static_cast<uint8_t>(static_cast<int8_t>(c));
      }
    } else {
      for (uint32_t i = 0; i < d; ++i) out[i] = FloatToFp8E4M3(x[i] * inv);
    }
  }
}

namespace {

// Code -> float before the row's scale.
void CodeValues(QuantKind kind, float* value) {
  for (int c = 0; c < 256; ++c) {
    value[c] =
        kind == QuantKind::kInt8 ? static_cast<float>(static_cast<int8_t>(c)) : Fp8E4M3ToFloat(static_cast<uint8_t>(c));
  }
}

// One row of `d` codes to 2-byte floats in `out` (which may not overlap `in`). The
// conversion is FloatToBf16 / FloatToHalf written branch-free for the values codes can
// give (finite, or the quiet NaN of fp8's NaN code), so the compiler vectorizes it.
void DequantizeRow(FloatKind kind, QuantKind qk, const float* value, const uint8_t* in, float scale, uint32_t d,
                   uint16_t* out) {
  if (kind == FloatKind::kBf16) {
    if (qk == QuantKind::kInt8) {
      for (uint32_t i = 0; i < d; ++i) {
        const uint32_t u = Bits(static_cast<float>(static_cast<int8_t>(in[i])) * scale);
        out[i] = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
      }
    } else {
      for (uint32_t i = 0; i < d; ++i) {
        const uint32_t u = Bits(value[in[i]] * scale);
        out[i] = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
      }
    }
    return;
  }
  for (uint32_t i = 0; i < d; ++i) out[i] = FloatToHalf(value[in[i]] * scale);
}

}  // namespace

void DequantizeCpu(const KvQuantize& q, uint8_t* dst) {
  const KvGeometry& g = q.geometry;
  const uint64_t rows = QuantRows(g);
  const uint32_t d = g.head_dim;
  float value[256];
  CodeValues(q.output, value);
  std::vector<uint16_t> row(d);
  for (uint64_t r = 0; r < rows; ++r) {
    DequantizeRow(q.input, q.output, value, q.codes + r * d, q.scales[r], d, row.data());
    std::memcpy(dst + r * d * 2, row.data(), d * 2);
  }
}

void QuantizeBlockCpu(const KvGeometry& g, FloatKind in, QuantKind out, const uint8_t* src, uint8_t* dst) {
  const uint64_t codes = g.BlockBytes() / 2;
  // Scales are written through a float buffer and copied, so `dst` needs no alignment.
  thread_local std::vector<float> scales;
  scales.resize(QuantRows(g));
  KvQuantize q;
  q.geometry = g;
  q.input = in;
  q.output = out;
  q.src = src;
  q.codes = dst;
  q.scales = scales.data();
  QuantizeCpu(q);
  std::memcpy(dst + codes, scales.data(), scales.size() * sizeof(float));
}

void DequantizeBlockCpu(const KvGeometry& g, FloatKind in, QuantKind out, const uint8_t* src, uint8_t* dst) {
  const uint64_t rows = QuantRows(g);
  const uint32_t d = g.head_dim;
  const uint64_t codes = g.BlockBytes() / 2;
  // Only the scales are set aside: the rows are done last to first, and row r's floats
  // cover the codes of rows 2r and 2r + 1 — done already — and, for row 0, its own codes,
  // read into the row buffer before it is written. So the stored form may be the page's
  // own first bytes (a block fetched into its page).
  thread_local std::vector<float> scales;
  thread_local std::vector<uint16_t> row;
  scales.resize(rows);
  row.resize(d);
  std::memcpy(scales.data(), src + codes, rows * sizeof(float));
  const bool in_place = src >= dst && src < dst + g.BlockBytes();
  thread_local std::vector<uint8_t> stored;
  if (in_place && src != dst) {
    // Elsewhere inside the page: the backward order's argument needs the codes at its
    // start; copy them aside instead.
    stored.assign(src, src + codes);
    src = stored.data();
  }
  float value[256];
  CodeValues(out, value);
  for (uint64_t r = rows; r-- > 0;) {
    DequantizeRow(in, out, value, src + r * d, scales[r], d, row.data());
    std::memcpy(dst + r * d * 2, row.data(), d * 2);
  }
}

}  // namespace kvtier
