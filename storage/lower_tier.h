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
//     tier that is destroyed first drops the callbacks it has not delivered.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
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

class LowerTier {
 public:
  virtual ~LowerTier() = default;

  // What sessions are told a block found here comes from; which tenant quota applies.
  virtual TierKind kind() const = 0;
  // One line for logs and kvctl: "redis cluster: 3 masters (2 reachable), ...".
  virtual std::string Describe() const = 0;
  // Whether the store can be asked now (else lookups and acquires skip it).
  virtual bool available() const = 0;

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
