#pragma once
// Deterministic block contents for load generators, replay and tests: the bytes of a
// block are a pure function of its hash, so whoever reads a block can tell whether it got
// the right bytes without having written them. Thread-safe (pure functions).

#include <cstdint>
#include <span>

#include "protocol/base/block_key.h"

namespace kvtier {

// Fills `out` with the pattern of `hash`.
void FillBlockPattern(const BlockHash& hash, std::span<uint8_t> out);
// True when `bytes` hold exactly the pattern of `hash`.
bool CheckBlockPattern(const BlockHash& hash, std::span<const uint8_t> bytes);

// An engine-style chained block hash: H(parent ‖ tokens), 16 bytes (XXH3-128), as vLLM's
// prefix cache chains them. An empty parent starts a sequence.
BlockHash ChainHash(const BlockHash& parent, std::span<const uint32_t> tokens);

}  // namespace kvtier
