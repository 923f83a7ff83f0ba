#include "engine/tools/block_pattern.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu_kernels.h"

namespace kvtier {
namespace {

// splitmix64: fast, and every 8-byte word depends on the hash and its offset.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

void FillBlockPattern(const BlockHash& hash, std::span<uint8_t> out) {
  const uint64_t seed = XXH3_64bits(hash.bytes().data(), hash.size());
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    const uint64_t v = Mix(seed ^ i);
    std::memcpy(out.data() + i, &v, 8);
  }
  const uint64_t tail = Mix(seed ^ i);
  for (size_t k = 0; i < out.size(); ++i, ++k) out[i] = static_cast<uint8_t>(tail >> (8 * k));
}

bool CheckBlockPattern(const BlockHash& hash, std::span<const uint8_t> bytes) {
  const uint64_t seed = XXH3_64bits(hash.bytes().data(), hash.size());
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t got;
    std::memcpy(&got, bytes.data() + i, 8);
    if (got != Mix(seed ^ i)) return false;
  }
  const uint64_t tail = Mix(seed ^ i);
  for (size_t k = 0; i < bytes.size(); ++i, ++k) {
    if (bytes[i] != static_cast<uint8_t>(tail >> (8 * k))) return false;
  }
  return true;
}

namespace {

// Element i of the KV pattern, before rounding to the 2-byte float.
float KvValue(uint64_t seed, uint64_t i, uint32_t row) {
  const uint64_t r = Mix(seed ^ (0x5eed0000ull + i / row));                                       // the row's magnitude
  const float magnitude = std::ldexp(1.0f, static_cast<int>(r % 9) - 4);                          // 2^-4 .. 2^4
  const uint64_t u = Mix(seed ^ (i * 0x2545f4914f6cdd1dull));                                     // the element
  const float unit = static_cast<float>(u >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f;  // [-1, 1)
  return magnitude * unit;
}

uint16_t ToHalf(FloatKind kind, float f) { return kind == FloatKind::kFp16 ? FloatToHalf(f) : FloatToBf16(f); }
float FromHalf(FloatKind kind, uint16_t h) { return kind == FloatKind::kFp16 ? HalfToFloat(h) : Bf16ToFloat(h); }

}  // namespace

void FillKvPattern(const BlockHash& hash, FloatKind kind, uint32_t row, std::span<uint8_t> out) {
  const uint64_t seed = XXH3_64bits(hash.bytes().data(), hash.size());
  const uint64_t n = out.size() / 2;
  for (uint64_t i = 0; i < n; ++i) {
    const uint16_t h = ToHalf(kind, KvValue(seed, i, row));
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  if (out.size() % 2) out.back() = 0;
}

double KvPatternError(const BlockHash& hash, FloatKind kind, uint32_t row, std::optional<QuantKind> lossy,
                      std::span<const uint8_t> bytes) {
  const uint64_t seed = XXH3_64bits(hash.bytes().data(), hash.size());
  const uint64_t n = bytes.size() / 2;
  const double half_ulp = kind == FloatKind::kFp16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  double worst = 0;
  std::vector<float> expect(row);
  for (uint64_t start = 0; start < n; start += row) {
    const uint64_t len = std::min<uint64_t>(row, n - start);
    double row_max = 0;
    for (uint64_t k = 0; k < len; ++k) {
      expect[k] = FromHalf(kind, ToHalf(kind, KvValue(seed, start + k, row)));
      row_max = std::max(row_max, std::fabs(static_cast<double>(expect[k])));
    }
    for (uint64_t k = 0; k < len; ++k) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * (start + k), 2);
      const double got = FromHalf(kind, h), want = expect[k];
      if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
      const double err = std::fabs(got - want);
      if (!lossy) {
        if (h != ToHalf(kind, static_cast<float>(want))) return std::numeric_limits<double>::infinity();
        continue;
      }
      const double bound = QuantErrorBound(*lossy, want, row_max) + std::fabs(got) * half_ulp;
      worst = std::max(worst, err / bound);
    }
  }
  return worst;
}

BlockHash ChainHash(const BlockHash& parent, std::span<const uint32_t> tokens) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  const uint8_t tag = parent.empty() ? 0 : 1;
  XXH3_128bits_update(st, &tag, 1);
  XXH3_128bits_update(st, parent.bytes().data(), parent.size());
  XXH3_128bits_update(st, tokens.data(), tokens.size_bytes());
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
  XXH3_freeState(st);
  return BlockHash(std::span<const uint8_t>(c.digest, sizeof(c.digest)));
}

}  // namespace kvtier
