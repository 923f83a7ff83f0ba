#pragma once
// MemoryTier: a lower tier (storage/lower_tier.h) in kvtierd's own memory — plain, unpinned
// RAM, unlike the host pool engines map (pinned, shared by memfd, bounded by what may be
// locked). Blocks that leave the host and NVMe tiers are kept here under their block keys,
// the least recently used dropped first when it is full; a value whose bytes, layout or
// length do not verify is a miss and is dropped, never served. It lives and dies with the
// process: a restarted kvtierd starts it empty (the NVMe index is what survives restarts).
// Config: tiers.memory (daemon/lower_tiers.cc).
//
// Thread-compatible: every method on the owner's (control) thread; callbacks are posted
// there, never run inside the call, and dropped once the tier is destroyed.

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "protocol/base/post.h"
#include "storage/lower_tier.h"

namespace kvtier {

struct MemoryTierOptions {
  uint64_t capacity_bytes = 0;  // most payload bytes held; 0: no memory tier
  bool operator==(const MemoryTierOptions&) const = default;
};

class MemoryTier final : public LowerTier {
 public:
  // kInvalidArgument without a capacity or a way to post.
  static Result<std::unique_ptr<MemoryTier>> Open(const MemoryTierOptions& options, Post post);
  ~MemoryTier() override;

  TierKind kind() const override { return TierKind::kMemory; }
  // "kvtierd's memory, 12 blocks, 384 KiB of 8 MiB".
  std::string Describe() const override;
  bool available() const override { return true; }
  // Blocks and bytes held; lookups, fetches (hit, miss, dropped for not verifying), puts,
  // evictions (exported as kvtier_memory_*).
  LowerTierReport Report() const override;

  void Exists(std::vector<std::string> block_keys, std::function<void(std::vector<bool>)> done) override;
  // kResourceExhausted for a block larger than the whole tier; otherwise stored, the least
  // recently used values dropped to make room.
  void Put(const std::string& block_key, LowerBlockMeta meta, std::span<const uint8_t> data,
           std::function<void(Status)> done) override;
  void Fetch(const std::string& block_key, const std::string& fingerprint, uint32_t length, std::span<uint8_t> dst,
             std::function<void(Status, LowerBlockMeta)> done) override;
  void Delete(const std::string& block_key) override;

 private:
  struct Value {
    LowerBlockMeta meta;
    std::vector<uint8_t> bytes;
    uint64_t checksum = 0;                 // XXH3 of bytes, as put
    std::list<std::string>::iterator lru;  // in lru_
  };
  struct Counters {
    uint64_t lookups = 0, lookup_hits = 0;
    uint64_t fetch_hits = 0, fetch_misses = 0, fetch_bytes = 0, checksum_failures = 0;
    uint64_t puts = 0, put_bytes = 0, evictions = 0;
  };

  MemoryTier(const MemoryTierOptions& options, Post post);
  void Drop(std::unordered_map<std::string, Value>::iterator it);
  // Runs `fn` on the owner's thread unless this tier is gone by then.
  void PostSafe(std::function<void()> fn);

  MemoryTierOptions options_;
  Post post_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::unordered_map<std::string, Value> values_;
  std::list<std::string> lru_;  // block keys, most recently used first
  uint64_t bytes_ = 0;          // payload bytes held
  Counters counters_;
};

}  // namespace kvtier
