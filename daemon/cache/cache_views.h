#pragma once
// CacheViews: what operators ask of the cache without changing it — where a hash is and why
// (kvctl explain), the top blocks of a tier (kvctl blocks). It reads the tables
// CacheManager owns (namespaces, blocks, the NVMe index, the eviction history) and owns
// only its explains in progress. Control thread only; CacheManager owns it and outlives it.

#include <functional>
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
  // kExplainSliceProbes probes, each in a loop turn of its own (posted; all at once
  // without `post`), so one request holds the control thread for a slice at a time; `done`
  // on the control thread. A tenant's request is refused (kInvalidArgument) when hashes x
  // its namespaces exceeds kMaxExplainProbes.
  static constexpr uint64_t kMaxExplainProbes = 1 << 20;
  static constexpr size_t kExplainSliceProbes = 2048;
  using ExplainDone = std::function<void(Result<std::vector<BlockExplanation>>)>;
  void Explain(std::span<const BlockHash> hashes, std::string_view ns_hex, const std::string* tenant, ExplainDone done);

  enum class BlockOrder { kHits, kRecent };
  using BlocksDone = std::function<void(std::vector<BlockInfo>)>;
  // The top `limit` blocks of a tier (nullopt: the GPU and host tiers) by hits or recency.
  // For the NVMe tier the index is scanned on its scan thread and `done` runs later;
  // otherwise it runs before this returns.
  void TopBlocks(std::optional<TierKind> tier, std::string_view ns_hex, const std::string* tenant, BlockOrder order,
                 size_t limit, BlocksDone done);

 private:
  using Block = BlockTable::Block;
  struct ExplainJob;

  BlockInfo InfoOf(BlockId id) const;
  bool Visible(NamespaceId ns, std::string_view ns_hex, const std::string* tenant) const;
  // Explain's namespaces: those asked about, and the caller's others.
  void ExplainScope(std::string_view ns_hex, const std::string* tenant, std::vector<NamespaceId>* asked,
                    std::vector<NamespaceId>* others) const;
  void ExplainStep(std::shared_ptr<ExplainJob> job);
  std::vector<BlockExplanation> ExplainSlice(std::span<const BlockHash> hashes, std::string_view ns_hex,
                                             const std::string* tenant);

  const NamespaceTable* namespaces_;
  const BlockTable* blocks_;
  NvmeMover* mover_;
  const EvictionHistory* history_;
  const Clock* clock_;
  Post post_;
};

}  // namespace kvtier
