#pragma once
// ModelLayout: the KV geometry an engine declares in Hello, and what the daemon digests
// into the model fingerprint half of a namespace. Also the arithmetic of KV sizing
// (kvctl plan, kvtier-replay). Value type; thread-compatible.

#include <cstdint>
#include <string>
#include <string_view>

#include "protocol/base/status.h"

namespace kvtier {

// Numeric values are frozen in protocol/kvtier.fbs (enum DType).
enum class DType : uint8_t {
  kUnknown = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat8E4M3 = 3,
  kFloat8E5M2 = 4,
  kInt8 = 5,
  kFloat32 = 6,
};

// Bytes per element; 0 for kUnknown.
size_t DTypeBytes(DType dtype);
// "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8", "fp32".
std::string_view DTypeName(DType dtype);
// Accepts the names above and the aliases "float16", "half", "bfloat16", "fp8", "float32".
bool ParseDType(std::string_view name, DType* dtype);

struct ModelLayout {
  std::string model_id;
  uint32_t num_layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kUnknown;
  uint32_t tokens_per_block = 0;
  // Bytes one block occupies in a page. Usually NaturalBlockBytes(); an engine that packs
  // differently may say otherwise, and the fingerprint then differs.
  uint64_t block_bytes = 0;

  // KV bytes per token = 2 (K and V) x layers x kv heads x head dim x dtype bytes.
  uint64_t KvBytesPerToken() const;
  // KvBytesPerToken() x tokens_per_block.
  uint64_t NaturalBlockBytes() const;
  // kInvalidArgument naming the first bad field.
  Status Validate() const;
  // 16 bytes: XXH3-128 of a canonical, length-prefixed encoding of every field above.
  std::string Fingerprint() const;
  // "llama3-8b/32L/8H/128D/bf16/512T/65536B" for logs and kvctl.
  std::string ToString() const;
};

}  // namespace kvtier
