#pragma once
// Request traces in the Mooncake (FAST'25) format: one JSON object per line with
// `timestamp` (ms), `input_length`, `output_length` and `hash_ids`, the ids of the
// request's consecutive 512-token blocks (equal ids at equal positions: a shared prefix),
// and, optionally, an agentic session's hints: `session_id` (a string or a number),
// `cache_ttl_s` (how long the client expects to be away after this request) and
// `session_end: true` on the session's last request.
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
  std::string session_id;          // empty: no session
  double cache_ttl_s = -1;         // the client's hint; < 0: none
  bool session_end = false;
};

struct Trace {
  std::string name;
  std::vector<TraceRequest> requests;
  uint32_t unique_blocks = 0;
  uint64_t total_blocks = 0;
  bool has_sessions = false;  // some request names a session
};

// kInvalidArgument naming the line of the first record that is not a trace request.
Result<Trace> LoadTrace(const std::string& path);
// A trace of these requests (their hash_ids; blocks are filled in by interning chains).
Trace MakeTrace(std::string name, std::vector<TraceRequest> requests);
// Writes the trace in the Mooncake format (its hash_ids), one request per line.
Status WriteTrace(const Trace& trace, const std::string& path);

// Synthetic traces of named shapes, deterministic in `seed`, for policy work and tests:
//   agentic            agentic sessions (AgentParams): turns appending tool output and
//                      answers to a long context, tool pauses, subagents, session hints
//   conversation       multi-turn chats under one shared system prompt; a turn extends its
//                      chat, mostly a recent one (short reuse distance)
//   conversation-long  the same with chats revisited long after (long reuse distance)
//   recency            the same few chains round robin, slowly replaced (LRU's best case)
//   zipf               Zipf-popular system prompts with unique tails (agents, tools)
//   scan               nothing repeats
// kInvalidArgument for another shape.
Result<Trace> GenerateTrace(std::string_view shape, uint32_t requests, uint64_t seed);
std::vector<std::string_view> TraceShapes();

// The agentic shape's parameters; defaults shaped like the vLLM AgentX figures (a median of
// 43 turns, 142K-token inputs, subagents in 44% of sessions), scaled down by `scale` in
// tokens (0.1: contexts of ~14K tokens) so a trace replays on a small machine.
struct AgentParams {
  uint32_t sessions = 120;
  double turns_mean = 43;       // turns of a session (geometric)
  double scale = 1.0;           // tokens scale
  uint32_t system_prompts = 4;  // shared system prompts (tool schemas), Zipf-chosen
  uint32_t system_prompt_tokens = 12'000;
  uint32_t task_tokens = 6'000;  // the user's first message
  uint32_t turn_tokens = 3'000;  // tool output + the model's answer a turn appends (mean)
  uint32_t output_tokens = 444;
  double pause_mean_s = 20;  // tool-call pause between turns (log-normal)
  double pause_sigma = 1.0;
  double session_gap_s = 6;      // mean gap between session starts
  double subagent_rate = 0.44;   // sessions that fork a subagent from their context
  uint32_t subagent_turns = 6;   // mean turns of a subagent
  double abandon_rate = 0.15;    // sessions that stop without session_end
  double ttl_noise_sigma = 0.3;  // the client's pause estimate (the TTL hint) vs the real pause
  double ttl_margin = 1.5;       // the TTL a client sends: its estimate x this
};
Result<Trace> GenerateAgenticTrace(const AgentParams& p, uint64_t seed);

}  // namespace kvtier
