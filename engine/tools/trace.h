#pragma once
// Request traces in the Mooncake (FAST'25) format: one JSON object per line with
// `timestamp` (ms), `input_length`, `output_length` and `hash_ids`, the ids of the
// request's consecutive 512-token blocks (equal ids at equal positions: a shared prefix).
// Blocks are interned as chains — block i's identity is (identity of block i-1, hash id i)
// — so equal identities always mean equal prefixes, whatever the trace's id scheme.
// Value type; thread-compatible.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/base/status.h"

namespace kvtier {

struct TraceRequest {
  int64_t timestamp_ms = 0;
  uint32_t input_length = 0;
  uint32_t output_length = 0;
  std::vector<uint32_t> blocks;    // chained block identities, dense from 0
  std::vector<uint64_t> hash_ids;  // as in the trace
};

struct Trace {
  std::string name;
  std::vector<TraceRequest> requests;
  uint32_t unique_blocks = 0;
  uint64_t total_blocks = 0;
};

// kInvalidArgument naming the line of the first record that is not a trace request.
Result<Trace> LoadTrace(const std::string& path);
// A trace of these requests (their hash_ids; blocks are filled in by interning chains).
Trace MakeTrace(std::string name, std::vector<TraceRequest> requests);
// Writes the trace in the Mooncake format (its hash_ids), one request per line.
Status WriteTrace(const Trace& trace, const std::string& path);

// Synthetic traces of named shapes, deterministic in `seed`, for policy work and tests:
//   conversation       multi-turn chats under one shared system prompt; a turn extends its
//                      chat, mostly a recent one (short reuse distance)
//   conversation-long  the same with chats revisited long after (long reuse distance)
//   recency            the same few chains round robin, slowly replaced (LRU's best case)
//   zipf               Zipf-popular system prompts with unique tails (agents, tools)
//   scan               nothing repeats
// kInvalidArgument for another shape.
Result<Trace> GenerateTrace(std::string_view shape, uint32_t requests, uint64_t seed);
std::vector<std::string_view> TraceShapes();

}  // namespace kvtier
