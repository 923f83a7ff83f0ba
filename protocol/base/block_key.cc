#include "protocol/base/block_key.h"

#include <xxhash.h>

#include <random>

namespace kvtier {
namespace {

uint64_t ProcessSeed() {
  static const uint64_t seed = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  return seed;
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

}  // namespace

bool BlockHash::IsZero() const {
  for (size_t i = 0; i < size_; ++i) {
    if (bytes_[i] != 0) return false;
  }
  return true;
}

std::string BlockHash::Hex() const { return HexEncode(bytes()); }

uint64_t HashBytes(std::span<const uint8_t> bytes, uint64_t salt) {
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), ProcessSeed() ^ salt);
}

std::string EncodeNamespace(std::string_view tenant, std::string_view model_fingerprint) {
  std::string out;
  out.reserve(tenant.size() + model_fingerprint.size() + 4);
  PutVarint(&out, tenant.size());
  out.append(tenant);
  PutVarint(&out, model_fingerprint.size());
  out.append(model_fingerprint);
  return out;
}

namespace {
bool GetVarint(std::string_view* in, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && !in->empty(); shift += 7) {
    const auto byte = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    *v |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}
bool GetField(std::string_view* in, std::string_view* field) {
  uint64_t n = 0;
  if (!GetVarint(in, &n) || n > in->size()) return false;
  *field = in->substr(0, n);
  in->remove_prefix(n);
  return true;
}
}  // namespace

bool DecodeBlockKey(std::string_view key, std::string* tenant, std::string* model_fingerprint,
                    std::string* encoded_namespace, BlockHash* hash) {
  std::string_view rest = key, t, m;
  if (!GetField(&rest, &t) || !GetField(&rest, &m) || !BlockHash::ValidSize(rest.size())) return false;
  if (tenant) *tenant = std::string(t);
  if (model_fingerprint) *model_fingerprint = std::string(m);
  if (encoded_namespace) *encoded_namespace = std::string(key.substr(0, key.size() - rest.size()));
  if (hash) *hash = BlockHash(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(rest.data()), rest.size()));
  return true;
}

std::string EncodeBlockKey(std::string_view encoded_namespace, const BlockHash& hash) {
  std::string out(encoded_namespace);
  auto b = hash.bytes();
  out.append(reinterpret_cast<const char*>(b.data()), b.size());
  return out;
}

std::string HexEncode(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.resize(bytes.size() * 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0xf];
  }
  return out;
}

std::string HexEncode(std::string_view bytes) {
  return HexEncode(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

bool HexDecode(std::string_view hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string r;
  r.resize(hex.size() / 2);
  for (size_t i = 0; i < r.size(); ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    r[i] = static_cast<char>((hi << 4) | lo);
  }
  *out = std::move(r);
  return true;
}

}  // namespace kvtier
