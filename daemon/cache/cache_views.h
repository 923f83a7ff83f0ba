#pragma once
// CacheViews: what operators ask of the cache without changing it — where a hash is and why
// (kvctl explain), the top blocks of a tier (kvctl blocks). It reads the tables
// CacheManager owns (namespaces, blocks, the NVMe index, the eviction history) and owns
// only its explains in progress. Control thread only; CacheManager owns it and outlives it.

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/cache/block_table.h"
#include "daemon/cache/eviction_history.h"
#include "daemon/cache/namespace_table.h"
#include "daemon/cache/nvme_mover.h"
#include "protocol/base/clock.h"
#include "protocol/base/operator_reports.h"
#include "protocol/base/post.h"
#include "protocol/base/status.h"

namespace kvtier {

class CacheViews {
 public:
  // `mover` may be null (no NVMe tier); `post` may be null (explains answered in one turn).
  CacheViews(const NamespaceTable* namespaces, const BlockTable* blocks, NvmeMover* mover,
             const EvictionHistory* history, const Clock* clock, Post post);

  // `tenant`: only that tenant's namespaces are visible; null: every namespace (admins).
  // `ns_hex`: one namespace (NamespaceTable::Hex), or empty for every visible one. Probed a
  // namespace at a time (one batched read of the NVMe index each), in slices of about
  // kExplainSliceProbes probes. An explain that fits one slice is answered before this
  // returns; a longer one joins the queue of explains in progress, which runs one slice
  // of one explain per loop turn (posted; the queue in turn), so however many there are,
  // other sessions are served between any two slices. `done` on the control thread; never
  // called for an explain whose `owner` expired (its session closed: the job is dropped at
  // its next turn). Refused before any work: a tenant's request of more than
  // kMaxExplainProbes probes (hashes x its namespaces; kInvalidArgument), and an explain
  // past kMaxExplainJobsPerCaller in progress for its tenant (admins: for all admins
  // together) or kMaxExplainJobs in all (kResourceExhausted). Without `post`, all at once.
  static constexpr uint64_t kMaxExplainProbes = 1 << 20;
  static constexpr size_t kExplainSliceProbes = 2048;
  static constexpr size_t kMaxExplainJobsPerCaller = 4;
  static constexpr size_t kMaxExplainJobs = 32;
  using ExplainDone = std::function<void(Result<std::vector<BlockExplanation>>)>;
  void Explain(std::span<const BlockHash> hashes, std::string_view ns_hex, const std::string* tenant,
               std::weak_ptr<const void> owner, ExplainDone done);
  struct ExplainCounts {
    size_t in_progress = 0;  // queued explains
    uint64_t refused = 0;    // past kMaxExplainJobsPerCaller / kMaxExplainJobs
    uint64_t dropped = 0;    // their session closed first
  };
  ExplainCounts explain_counts() const { return {jobs_.size(), jobs_refused_, jobs_dropped_}; }

  enum class BlockOrder { kHits, kRecent };
  using BlocksDone = std::function<void(std::vector<BlockInfo>)>;
  // The top `limit` blocks of a tier (nullopt: the GPU and host tiers) by hits or recency.
  // For the NVMe tier the index is scanned (and filtered) on its scan thread and `done`
  // runs later, never once `owner` expired (the scan stops); otherwise it runs before this
  // returns.
  void TopBlocks(std::optional<TierKind> tier, std::string_view ns_hex, const std::string* tenant, BlockOrder order,
                 size_t limit, std::weak_ptr<const void> owner, BlocksDone done);

 private:
  using Block = BlockTable::Block;
  struct ExplainJob;

  BlockInfo InfoOf(BlockId id) const;
  bool Visible(NamespaceId ns, std::string_view ns_hex, const std::string* tenant) const;
  // Explain's namespaces: those asked about, and the caller's others.
  void ExplainScope(std::string_view ns_hex, const std::string* tenant, std::vector<NamespaceId>* asked,
                    std::vector<NamespaceId>* others) const;
  // One slice of the queue's front explain; then it goes to the back, or is answered.
  void ExplainTurn();
  std::vector<BlockExplanation> ExplainSlice(std::span<const BlockHash> hashes, std::string_view ns_hex,
                                             const std::string* tenant);

  const NamespaceTable* namespaces_;
  const BlockTable* blocks_;
  NvmeMover* mover_;
  const EvictionHistory* history_;
  const Clock* clock_;
  Post post_;
  std::deque<std::shared_ptr<ExplainJob>> jobs_;  // explains in progress, in turn
  std::map<std::string, size_t, std::less<>> jobs_by_caller_;
  bool turn_posted_ = false;
  uint64_t jobs_refused_ = 0, jobs_dropped_ = 0;
};

}  // namespace kvtier
