#pragma once
// Trace-driven cache simulation with the daemon's own EvictionPolicy classes (the same
// code, no I/O), for kvtier-sim and the policy tests.
//
// Per request, as the daemon sees it: a Lookup of the whole chain (block i is a hit only
// if blocks 0..i all are: prefix hits), touches of the matched blocks (deepest first for
// prefix-ordered policies), then the engine commits every block it had to compute, each
// with its parent. A tier that is full asks its policy for a victim first. With an NVMe
// tier, host victims are demoted into it (optionally only blocks used at least twice) and
// NVMe hits are promoted back; a hit counts on either tier.
// Belady's MIN (evict the block used furthest in the future) is the reference: optimal for
// blocks found cached, not for prefix hits (it may keep a chain's tail and drop its head),
// so a policy that keeps chains whole can get more prefix hits than MIN's, never more than
// MIN's block_hits.
// With `hints`, a trace's session fields (session id, TTL, end) drive the same session
// table and retention classes as the daemon's (storage/policy/session_table.h), in trace
// time, over each tier's policy.

#include <cstdint>
#include <string>
#include <vector>

#include "engine/tools/trace.h"
#include "protocol/base/status.h"

namespace kvtier {

struct SimConfig {
  std::string host_policy = "lru";
  uint64_t host_capacity = 0;  // blocks
  std::string nvme_policy = "lru";
  uint64_t nvme_capacity = 0;  // 0: one tier
  bool nvme_admit_reused_only = false;
  bool per_request = false;  // fill SimResult::request_hits
  bool hints = false;        // use the trace's session hints (a trace without them: no effect)
  double max_ttl_s = 3600;   // hints' TTLs are clamped to it
};

struct SimResult {
  uint64_t blocks = 0;  // looked up
  uint64_t hits = 0;    // prefix hits, any tier
  uint64_t host_hits = 0;
  uint64_t nvme_hits = 0;
  uint64_t nvme_writes = 0;            // blocks written to the NVMe tier (disk wear)
  uint64_t block_hits = 0;             // SimulateBelady: blocks found cached, prefix or not
  std::vector<uint32_t> request_hits;  // with per_request: prefix hits of each request
  double hit_ratio() const { return blocks ? static_cast<double>(hits) / static_cast<double>(blocks) : 0; }
};

Result<SimResult> Simulate(const Trace& trace, const SimConfig& config);
// Belady's MIN over `capacity` blocks: its prefix hits, and its block_hits.
SimResult SimulateBelady(const Trace& trace, uint64_t capacity);

}  // namespace kvtier
