#pragma once
// The reports of the operator operations (kvctl explain, blocks, evict, drain, verify):
// one type each, filled by the daemon's cache and NVMe tier and returned by ControlClient
// from the wire replies of the same names. No behaviour; thread-compatible.

#include <cstdint>
#include <string>

#include "protocol/base/block_key.h"
#include "protocol/base/block_state.h"
#include "protocol/base/status.h"
#include "protocol/base/tier.h"

namespace kvtier {

// Why a block is or is not a hit (kvctl explain).
struct BlockExplanation {
  using State = BlockState;
  // kCached: readable in `tier`; kInFlight: being read into `tier` (host); kEvicted: its
  // last copy left `tier` seconds_ago.
  State state = State::kNeverStored;
  TierKind tier = TierKind::kHost;
  bool on_nvme = false;                     // kCached: an NVMe copy exists too
  bool writing = false;                     // kCached: its NVMe copy is being written
  std::string namespace_id, tenant, model;  // where it was found (namespace id in hex)
  double seconds_ago = 0;                   // kEvicted
  std::string detail;                       // one sentence for people
};

// One block, for kvctl blocks.
struct BlockInfo {
  BlockHash hash;
  std::string namespace_id, tenant, model;
  TierKind tier = TierKind::kHost;  // the fastest tier holding it
  bool on_nvme = false;
  uint64_t bytes = 0;
  uint32_t hits = 0;
  uint32_t refs = 0;
  double idle_s = 0;  // since its last hit (or store)
};

// What an operator's evict did.
struct EvictReport {
  uint64_t blocks = 0;  // dropped or demoted
  uint64_t bytes = 0;
  uint64_t demoting = 0;  // of which still being written to NVMe (pages free after)
};

// The state of a maintenance drain (kvctl drain).
struct DrainStatus {
  bool draining = false;
  uint64_t gpu_blocks_left = 0;        // cached GPU blocks not yet demoted to host
  uint64_t gpu_blocks_pinned = 0;      // GPU blocks referenced by sessions: they stay
  uint64_t host_blocks_unspilled = 0;  // host blocks with no NVMe copy yet
  uint32_t spills_in_flight = 0;
};

// A scrub of the NVMe tier (kvctl verify).
struct VerifyReport {
  uint64_t checked = 0;
  uint64_t dropped = 0;  // did not verify (or could not be read); entry removed
  double seconds = 0;
  Status status;  // OK unless the scrub itself could not run (the daemon's side only)
};

}  // namespace kvtier
