#include "engine/tools/block_pattern.h"

#include <xxhash.h>

#include <cstring>
#include <vector>

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
