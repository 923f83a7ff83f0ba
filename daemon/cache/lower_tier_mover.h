#pragma once
// LowerTierMover: the moves between the host tier and one lower tier (a LowerTier: the
// remote tier, or any block store below NVMe), and what is in flight. CacheManager keeps
// one per lower tier, in chain order, and loops over them.
//
// Puts. write_through (the default) puts every block that arrives in host by a Commit or
// a GPU demotion, in the background, at most max_puts_in_flight at once; the rest wait in
// a bounded queue (a block that leaves host before its turn is skipped, counted as
// skipped). write_back puts a host block when eviction picks it and the tier does not
// hold it yet; the block is evicted once the put is answered. During a put the block's
// host page is pinned (BlockTable::BeginRead): the tier may read it on its own threads,
// and it is neither evicted nor reused until the put is answered. Sessions still read it.
//
// Back-off: a put the tier refuses for space (kResourceExhausted: a Redis Cluster with
// noeviction and full masters) stops puts for kFirstBackoff, doubling up to kMaxBackoff
// while they keep being refused, so a full tier is not sent the bytes of every block:
// write-throughs queued or committed meanwhile are skipped (counted in puts_skipped), and
// write-back evicts without putting. Logged once per back-off; counted in put_backoffs.
//
// Quotas: a tenant with a quota on the tier's kind (security.tenants[].quota.remote) has
// what this kvtierd put for it remembered, oldest first (its block keys: about 50 bytes
// each); past the quota the oldest are deleted. Each node keeps its own account (a fleet
// of N nodes holds at most N quotas of a tenant) and starts it anew at restart.
//
// Promotions: a block found only in the tier is read into a fresh host page, verified by
// the tier, then becomes a host block (remembered as held there, so it is never put back).
//
// Lookups: how many of a chain's next blocks the tier holds — Exists for the first
// kFirstProbe, then for the rest only when all of those were there, so a chain the tier
// does not hold costs one small round trip.
//
// Keys: a block's key below is its NVMe block key (tenant x model fingerprint x hash),
// except that an unknown tenant ("uid=U", a uid of this host only) is "uid=U@node" there
// (Options::node_name), so the same uid on two nodes never shares blocks.
//
// Which lower tiers hold a block is BlockTable::Block::below, bit `index` (this mover's
// place in the chain). Owns the LowerTier. Owned by the control thread; not thread-safe.
// Completions arrive through the event loop, never inside the call that started them.

#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "daemon/cache/block_table.h"
#include "daemon/cache/cache_types.h"
#include "daemon/cache/namespace_table.h"
#include "storage/lower_tier.h"

namespace kvtier {

class LowerTierMover {
 public:
  struct Hooks {
    // A put ended, well or not: the block's page may be evictable again.
    std::function<void()> after_put;
    // A promotion ended. OK: block `id` is readable in host; otherwise it is gone.
    std::function<void(BlockId id, const Status& status)> after_promotion;
  };
  struct Options {
    WritePolicy write_policy = WritePolicy::kWriteThrough;
    uint32_t max_puts_in_flight = 32;
    uint32_t max_queued_puts = 65536;
    // Names this node in unknown tenants' keys ("uid=U@node_name"): the daemon gives
    // NodeName(config), the config's node_name or the host name.
    std::string node_name;
    bool operator==(const Options&) const = default;
  };
  // What this mover did, cumulative.
  struct Counters {
    uint64_t puts = 0;                // blocks stored in the tier
    uint64_t put_failures = 0;        // refused or not answered
    uint64_t promotions = 0;          // blocks read and verified into host pages
    uint64_t promotion_failures = 0;  // reads that failed or did not verify (absent keys not counted)
  };
  static constexpr size_t kFirstProbe = 16;
  static constexpr int64_t kFirstBackoff_ns = 1'000'000'000;
  static constexpr int64_t kMaxBackoff_ns = 30'000'000'000;

  // The most lower tiers a chain has (bits of BlockTable::Block::below).
  static constexpr size_t kMaxLowerTiers = 8;

  // `index`: the mover's place in the chain (< kMaxLowerTiers). kInvalidArgument unless the
  // host tier is enabled. The tables outlive the mover.
  static Result<std::unique_ptr<LowerTierMover>> Open(std::unique_ptr<LowerTier> tier, size_t index,
                                                      const Options& options, BlockTable* blocks,
                                                      NamespaceTable* namespaces, Hooks hooks);
  // Stops the tier (its threads) before the pages they read go.
  ~LowerTierMover();

  LowerTier& tier() { return *tier_; }
  const LowerTier& tier() const { return *tier_; }
  TierKind kind() const { return tier_->kind(); }
  const Counters& counters() const { return counters_; }
  // Whether the tier holds block `b` (put by us, or read from it).
  bool Holds(const BlockTable::Block& b) const { return (b.below >> index_) & 1; }
  // Whether the tier can be asked now (else lookups and acquires skip it).
  bool available() const { return tier_->available(); }
  bool write_through() const { return options_.write_policy == WritePolicy::kWriteThrough; }

  // ---- puts ----
  // write-through: `id` (in host, not held by the tier) is put when its turn comes.
  void QueuePut(BlockId id);
  void PumpPuts();
  // write-back: puts `id` now. REQUIRES: resident in host, not promoting, !Holds.
  void StartPut(BlockId id);
  // No put may start now: max_puts_in_flight are out, or puts are backing off.
  bool busy() const { return puts_in_flight_ >= options_.max_puts_in_flight || backing_off(); }
  bool backing_off() const;
  uint64_t put_backoffs() const { return put_backoffs_; }
  uint32_t puts_in_flight() const { return puts_in_flight_; }
  size_t puts_queued() const { return put_queue_.size(); }
  uint64_t puts_skipped() const { return puts_skipped_; }
  // Values deleted because their tenant was past its quota on the tier.
  uint64_t quota_deletes() const { return quota_deletes_; }
  // Bytes this kvtierd keeps in the tier for `tenant` (tenants with a quota only).
  uint64_t stored_bytes(TenantId tenant) const { return tenant < accounts_.size() ? accounts_[tenant].bytes : 0; }

  // ---- promotions ----
  // Reads the block (ns, hash) from the tier into a new host block of `tenant`;
  // kNoBlock when the host tier has no page for the tenant now (the caller makes room).
  BlockId StartPromotion(NamespaceId ns, TenantId tenant, const BlockHash& hash);
  size_t promotions_in_flight() const { return promotions_.size(); }

  // ---- lookups ----
  // done(n): the tier holds hashes[0, n) (the first missing one ends the run).
  void FindPrefix(NamespaceId ns, std::span<const BlockHash> hashes, std::function<void(size_t)> done);

 private:
  LowerTierMover(std::unique_ptr<LowerTier> tier, size_t index, const Options& options, BlockTable* blocks,
                 NamespaceTable* namespaces, Hooks hooks);
  void OnPut(BlockId id, uint32_t gen, const Status& st);
  // A put of `key` (`bytes`) for `tenant` succeeded: counts against its quota, if any.
  void Charge(TenantId tenant, std::string key, uint64_t bytes);
  void OnPromoted(BlockId id, uint32_t gen, const Status& st, const LowerBlockMeta& meta);
  // The block key (ns, hash) has in the tier.
  std::string LowerBlockKey(NamespaceId ns, const BlockHash& hash) const;

  std::unique_ptr<LowerTier> tier_;
  size_t index_;
  Options options_;
  BlockTable* blocks_;
  NamespaceTable* namespaces_;
  Counters counters_;
  Hooks hooks_;
  uint32_t puts_in_flight_ = 0;
  uint64_t puts_skipped_ = 0;
  uint64_t quota_deletes_ = 0;
  int64_t backoff_until_ns_ = 0;  // steady clock
  int64_t backoff_ns_ = 0;        // the last pause; doubles per refusal, 0 once a put is stored after it
  uint64_t put_backoffs_ = 0;
  struct Account {
    uint64_t bytes = 0;
    std::deque<std::pair<std::string, uint64_t>> keys;  // oldest first
  };
  std::vector<Account> accounts_;                       // by tenant
  std::deque<std::pair<BlockId, uint32_t>> put_queue_;  // (block, gen)
  std::unordered_map<BlockId, uint32_t> promotions_;    // block -> gen
};

}  // namespace kvtier
