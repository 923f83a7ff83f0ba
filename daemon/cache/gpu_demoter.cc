#include "daemon/cache/gpu_demoter.h"

#include "protocol/base/logging.h"

namespace kvtier {

Result<std::unique_ptr<GpuDemoter>> GpuDemoter::Open(const Options& options, BlockTable* blocks,
                                                     const NamespaceTable* namespaces, const Clock* clock, Post post,
                                                     Demoted demoted) {
  std::unique_ptr<GpuDemoter> d(new GpuDemoter(options, blocks, namespaces, clock, std::move(demoted)));
  KVTIER_ASSIGN_OR_RETURN(d->copier_, BlockWorkers::Open("kvtier-gpucopy", 1, std::move(post)));
  return d;
}

void GpuDemoter::Start(BlockId id, PageId host_page) {
  const BlockTable::Block& b = blocks_->block(id);
  // The GPU page stays readable, pinned, until its host copy is complete.
  blocks_->BeginRead(id, TierKind::kGpu);
  in_flight_[id] = Demotion{b.gen, host_page, clock_->NowNanos()};
  TierPool* gpu = blocks_->pool(TierKind::kGpu);
  const PageId gp = b.page[TierIndex(TierKind::kGpu)];
  const uint32_t segment = gpu->SegmentOf(gp);
  const uint64_t offset = gpu->OffsetInSegment(gp);
  const uint8_t* src = gpu->memory().DeviceAddress(segment) + offset;
  uint8_t* dst = blocks_->pool(TierKind::kHost)->PageAddress(host_page);
  const uint64_t bytes = namespaces_->Get(b.ns).block_bytes;
  auto copy = [copy = options_.copy, memory = &gpu->memory(), segment, offset, dst, src, bytes] {
    return copy ? copy(dst, src, bytes) : memory->CopyToHost(segment, offset, dst, bytes);
  };
  copier_->Run(std::move(copy), [this, id](Status st) { OnCopied(id, st); });
}

void GpuDemoter::OnCopied(BlockId id, const Status& st) {
  auto node = in_flight_.extract(id);
  KVTIER_CHECK(!node.empty()) << "a GPU demotion ended that did not begin";
  const BlockTable::Block& b = blocks_->block(id);
  KVTIER_CHECK(b.live && b.gen == node.mapped().gen) << "GPU demotion completion for a block that moved";
  blocks_->EndRead(id, TierKind::kGpu);
  const PageId hp = node.mapped().host_page;
  const double seconds = static_cast<double>(clock_->NowNanos() - node.mapped().started_ns) * 1e-9;
  const bool resident = st.ok() && b.page[TierIndex(TierKind::kHost)] == kNoPage;
  if (resident) {
    blocks_->Reside(id, TierKind::kHost, hp);
  } else {
    // Failed, or the block got a host copy meanwhile (a commit of the same key).
    if (!st.ok()) KVTIER_LOG(WARNING) << "GPU demotion copy failed: " << st.ToString() << "; dropping the block";
    blocks_->Free(TierKind::kHost, hp);
  }
  demoted_(id, st, resident, seconds);
}

}  // namespace kvtier
