#pragma once
// Deterministic block contents for load generators, replay and tests: the bytes of a
// block are a pure function of its hash, so whoever reads a block can tell whether it got
// the right bytes without having written them. Thread-safe (pure functions).

#include <cstdint>
#include <optional>
#include <span>

#include "kernels/kv_layout.h"
#include "protocol/base/block_key.h"

namespace kvtier {

// Fills `out` with the pattern of `hash`.
void FillBlockPattern(const BlockHash& hash, std::span<uint8_t> out);
// True when `bytes` hold exactly the pattern of `hash`.
bool CheckBlockPattern(const BlockHash& hash, std::span<const uint8_t> bytes);

// KV-like contents for blocks that may be stored quantized: 2-byte floats (bf16 or fp16),
// a pure function of the hash and the position, in rows of `row` elements (a token-head's
// K or V) whose magnitudes differ from row to row by up to 2^8; never NaN or infinite.
void FillKvPattern(const BlockHash& hash, FloatKind kind, uint32_t row, std::span<uint8_t> out);
// How far `bytes` are from the KV pattern of `hash`, as the largest |x' - x| over what a
// round trip through `lossy` may cost (QuantErrorBound for the row's largest magnitude,
// plus half an ulp of the 2-byte float x' is stored in): <= 1 means within the bound. With
// no `lossy`: 0 when every byte is exact, else infinity.
double KvPatternError(const BlockHash& hash, FloatKind kind, uint32_t row, std::optional<QuantKind> lossy,
                      std::span<const uint8_t> bytes);

// An engine-style chained block hash: H(parent ‖ tokens), 16 bytes (XXH3-128), as vLLM's
// prefix cache chains them. An empty parent starts a sequence.
BlockHash ChainHash(const BlockHash& parent, std::span<const uint32_t> tokens);

}  // namespace kvtier
