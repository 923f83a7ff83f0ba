#include "protocol/base/layout.h"

#include <xxhash.h>

#include <cstring>

#include "protocol/base/text.h"

namespace kvtier {

size_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
    case DType::kInt8:
      return 1;
    case DType::kFloat32:
      return 4;
    case DType::kUnknown:
      return 0;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat8E4M3:
      return "fp8_e4m3";
    case DType::kFloat8E5M2:
      return "fp8_e5m2";
    case DType::kInt8:
      return "int8";
    case DType::kFloat32:
      return "fp32";
    case DType::kUnknown:
      return "unknown";
  }
  return "unknown";
}

bool ParseDType(std::string_view name, DType* dtype) {
  static constexpr std::pair<std::string_view, DType> kNames[] = {
      {"fp16", DType::kFloat16},   {"float16", DType::kFloat16},     {"half", DType::kFloat16},
      {"bf16", DType::kBFloat16},  {"bfloat16", DType::kBFloat16},   {"fp8_e4m3", DType::kFloat8E4M3},
      {"fp8", DType::kFloat8E4M3}, {"fp8_e5m2", DType::kFloat8E5M2}, {"int8", DType::kInt8},
      {"fp32", DType::kFloat32},   {"float32", DType::kFloat32},
  };
  for (const auto& [n, d] : kNames) {
    if (n == name) {
      *dtype = d;
      return true;
    }
  }
  return false;
}

uint64_t ModelLayout::KvBytesPerToken() const { return 2ull * num_layers * kv_heads * head_dim * DTypeBytes(dtype); }

uint64_t ModelLayout::NaturalBlockBytes() const { return KvBytesPerToken() * tokens_per_block; }

Status ModelLayout::Validate() const {
  if (model_id.empty() || model_id.size() > 256) {
    return InvalidArgument("layout.model_id must be 1..256 bytes");
  }
  // It names the model in logs, kvctl and event topics ("...@model" is split there).
  if (HasControlCharacters(model_id) || model_id.find('@') != std::string::npos) {
    return InvalidArgument("layout.model_id '" + EscapeControlCharacters(model_id) +
                           "' holds a control character or '@'");
  }
  if (num_layers == 0 || num_layers > 4096) return InvalidArgument("layout.num_layers must be 1..4096");
  if (kv_heads == 0 || kv_heads > 4096) return InvalidArgument("layout.kv_heads must be 1..4096");
  if (head_dim == 0 || head_dim > 16384) return InvalidArgument("layout.head_dim must be 1..16384");
  if (DTypeBytes(dtype) == 0) return InvalidArgument("layout.dtype is unknown");
  if (tokens_per_block == 0 || tokens_per_block > (1u << 20)) {
    return InvalidArgument("layout.tokens_per_block must be 1..1048576");
  }
  if (block_bytes == 0) return InvalidArgument("layout.block_bytes must be > 0");
  return Status::Ok();
}

std::string ModelLayout::Fingerprint() const {
  // Length-prefixed fields, fixed-width little-endian integers: unambiguous by construction.
  std::string enc;
  auto put_u64 = [&enc](uint64_t v) {
    char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
    enc.append(b, 8);
  };
  enc.append("kvtier-layout-v1");
  put_u64(model_id.size());
  enc.append(model_id);
  put_u64(num_layers);
  put_u64(kv_heads);
  put_u64(head_dim);
  put_u64(static_cast<uint8_t>(dtype));
  put_u64(tokens_per_block);
  put_u64(block_bytes);
  XXH128_hash_t h = XXH3_128bits(enc.data(), enc.size());
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  return std::string(reinterpret_cast<const char*>(c.digest), sizeof(c.digest));
}

std::string ModelLayout::ToString() const {
  return model_id + "/" + std::to_string(num_layers) + "L/" + std::to_string(kv_heads) + "H/" +
         std::to_string(head_dim) + "D/" + std::string(DTypeName(dtype)) + "/" + std::to_string(tokens_per_block) +
         "T/" + std::to_string(block_bytes) + "B";
}

}  // namespace kvtier
