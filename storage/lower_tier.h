#pragma once
// LowerTier: a block store below the NVMe tier — the remote tier (a Redis Cluster shared by
// a fleet; storage/remote/remote_tier.h), or any store that keeps a block's bytes under its
// block key and answers later. The cache reaches each one through a LowerTierMover
// (daemon/cache/lower_tier_mover.h), which owns what moves between it and the host tier;
// CacheManager keeps them as an ordered chain and loops over it.
//
// The contract an implementation keeps:
//   - every method runs on the owner's (control) thread, and every callback is delivered
//     there, never inside the call that takes it;
//   - a Fetch that delivers kOk has put exactly the block stored under that key, with that
//     fingerprint and length, into `dst` (verified by whatever the store keeps: a value
//     that does not verify is kDataLoss and never served); kNotFound: not held;
//     kUnavailable: could not be asked;
//   - a Put delivers kResourceExhausted when the store refuses for space (the mover then
//     backs off), other errors when it failed, kOk once the value is stored;
//   - Exists answers false for anything it cannot vouch for;
//   - buffers passed to Put and Fetch stay valid until their callback, and not after: a
//     tier that is destroyed first drops the callbacks it has not delivered;
//   - Report() names the same figures, in the same order, every time it is asked (the
//     daemon registers its metrics once, from the first report).
//
// What is the same for every lower tier (puts, promotions, queues, quotas, hits) the mover
// and the cache count; Report() has what only the tier knows.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol/base/status.h"
#include "protocol/base/tier.h"

namespace kvtier {

// What a stored value says about its block besides the bytes.
struct LowerBlockMeta {
  uint32_t length = 0;      // payload bytes (the namespace's block_bytes)
  std::string fingerprint;  // layout fingerprint of the namespace
  std::string parent;       // parent hash bytes; empty for a chain's first block
};

// One figure a lower tier reports: what kvctl and the Stats reply call it, and the
// Prometheus series it is exported as. Strings are static.
struct TierFigure {
  std::string_view key;  // "lookups", "fetch_bytes": kvctl's and the Stats reply's name, unique in a report
  double value = 0;
  bool counter = true;  // else a gauge
  // The series, e.g. "kvtier_remote_lookups_total", with at most one label; empty: not
  // exported (e.g. latency sums the daemon's histograms already show).
  std::string_view metric;
  std::string_view help;
  std::pair<std::string_view, std::string_view> label;
};

// A node a lower tier spreads its blocks over (a cluster's master).
struct TierNode {
  std::string address;
  bool up = true;  // can be asked (its circuit breaker is closed)
  uint64_t failures = 0;
};

struct LowerTierReport {
  std::vector<TierFigure> figures;
  std::vector<TierNode> nodes;
  uint64_t checksum_failures = 0;  // values that did not verify (each a miss)
  bool authenticated = false;      // values are sealed so that nobody else can plant them

  // The value of the figure named `key` (and label value, if given); 0 when none is.
  double Figure(std::string_view key, std::string_view label = {}) const {
    for (const TierFigure& f : figures) {
      if (f.key == key && (label.empty() || f.label.second == label)) return f.value;
    }
    return 0;
  }
};

class LowerTier {
 public:
  virtual ~LowerTier() = default;

  // What sessions are told a block found here comes from; which tenant quota applies.
  virtual TierKind kind() const = 0;
  // One line for logs and kvctl: "redis cluster, 3 masters, 2 up, ...".
  virtual std::string Describe() const = 0;
  // Whether the store can be asked now (else lookups and acquires skip it).
  virtual bool available() const = 0;
  // What it has done and how it stands, for the Stats reply, /metrics and kvctl.
  virtual LowerTierReport Report() const = 0;

  // Whether the store holds each key (block keys).
  virtual void Exists(std::vector<std::string> block_keys, std::function<void(std::vector<bool>)> done) = 0;
  // Stores `data` under `block_key`.
  virtual void Put(const std::string& block_key, LowerBlockMeta meta, std::span<const uint8_t> data,
                   std::function<void(Status)> done) = 0;
  // Reads the block of `block_key` into dst[0, length).
  virtual void Fetch(const std::string& block_key, const std::string& fingerprint, uint32_t length,
                     std::span<uint8_t> dst, std::function<void(Status, LowerBlockMeta)> done) = 0;
  // Deletes the value of `block_key` (fire and forget).
  virtual void Delete(const std::string& block_key) = 0;
};

}  // namespace kvtier
