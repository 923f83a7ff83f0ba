#pragma once
// GpuDemoter: the moves from the GPU tier down to the host tier, and what is in flight.
//
// A demotion copies a cached GPU block into a host page the caller took for it: the GPU
// page stays readable (pinned) while a thread of the demoter's own copies it down
// (Options::copy, or the GPU memory's CopyToHost); then, on the control thread, the host
// page becomes the block's copy — unless the copy failed or the block got a host copy
// meanwhile (a commit of the same key), when the page is freed — and the owner is told
// through a hook, which decides what happens to the GPU copy. Which block goes and where
// its host page comes from are the cache manager's to decide; this is the mechanism.
//
// Owned by the control thread; not thread-safe. Completions arrive through `post`, never
// inside Start.

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>

#include "daemon/cache/block_table.h"
#include "daemon/cache/block_workers.h"
#include "daemon/cache/namespace_table.h"
#include "protocol/base/clock.h"
#include "protocol/base/status.h"

namespace kvtier {

class GpuDemoter {
 public:
  // Copies a GPU page down into a host page (device -> host), on the demoter's thread.
  using Copy = std::function<Status(void* dst, const uint8_t* device_src, uint64_t bytes)>;
  struct Options {
    Copy copy;  // null: the GPU memory's own CopyToHost
    uint32_t max_in_flight = 16;
  };
  // Demotion of `id` ended: `resident` when its host page now holds it; `seconds` since
  // Start (a failed copy: status not OK, the page freed).
  using Demoted = std::function<void(BlockId id, const Status& status, bool resident, double seconds)>;

  // `blocks`, `namespaces` and `clock` outlive the demoter; the GPU tier is enabled.
  static Result<std::unique_ptr<GpuDemoter>> Open(const Options& options, BlockTable* blocks,
                                                  const NamespaceTable* namespaces, const Clock* clock, Post post,
                                                  Demoted demoted);

  // Starts copying cached GPU block `id` into `host_page` (taken from the host tier for the
  // block's tenant). REQUIRES: !busy(), the block has no host copy.
  void Start(BlockId id, PageId host_page);
  bool busy() const { return in_flight_.size() >= options_.max_in_flight; }
  size_t in_flight() const { return in_flight_.size(); }

 private:
  struct Demotion {
    uint32_t gen;
    PageId host_page;
    int64_t started_ns;
  };
  GpuDemoter(const Options& options, BlockTable* blocks, const NamespaceTable* namespaces, const Clock* clock,
             Demoted demoted)
      : options_(options), blocks_(blocks), namespaces_(namespaces), clock_(clock), demoted_(std::move(demoted)) {}
  void OnCopied(BlockId id, const Status& st);

  Options options_;
  BlockTable* blocks_;
  const NamespaceTable* namespaces_;
  const Clock* clock_;
  Demoted demoted_;
  std::unordered_map<BlockId, Demotion> in_flight_;
  std::unique_ptr<BlockWorkers> copier_;  // one thread; last, so it stops first
};

}  // namespace kvtier
