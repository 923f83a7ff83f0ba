#include "daemon/cache/nvme_mover.h"

#include <stdlib.h>

#include "kernels/cpu_kernels.h"
#include "protocol/base/logging.h"

namespace kvtier {

NvmeMover::NvmeMover(std::unique_ptr<NvmeTier> nvme, const Options& options, BlockTable* blocks,
                     NamespaceTable* namespaces, CacheCounters* counters, Hooks hooks)
    : nvme_(std::move(nvme)),
      options_(options),
      blocks_(blocks),
      namespaces_(namespaces),
      counters_(counters),
      hooks_(std::move(hooks)) {}

NvmeMover::~NvmeMover() {
  nvme_.reset();
  for (uint8_t* p : staging_all_) ::free(p);
}

Result<std::unique_ptr<NvmeMover>> NvmeMover::Open(std::unique_ptr<NvmeTier> nvme, const Options& options,
                                                   BlockTable* blocks, NamespaceTable* namespaces,
                                                   CacheCounters* counters, Hooks hooks) {
  TierPool* host = blocks->pool(TierKind::kHost);
  if (host == nullptr) return InvalidArgument("the NVMe tier needs the host tier");
  if (options.quantization ? nvme->slot_bytes() > host->page_bytes() : nvme->slot_bytes() != host->page_bytes()) {
    return InvalidArgument("NVMe slots must be the size of host pages (smaller only for a quantized tier)");
  }
  if (options.quantization && options.workers == nullptr) return InvalidArgument("a quantized NVMe tier needs workers");
  std::unique_ptr<NvmeMover> m(new NvmeMover(std::move(nvme), options, blocks, namespaces, counters, std::move(hooks)));
  m->registered_segments_.assign(host->segment_count(), false);
  NvmeMover* raw = m.get();
  m->nvme_->SetDropListener([raw](const std::string& key, uint32_t slot) { raw->OnDropped(key, slot); });
  host->SetRenewListener([raw, host](uint32_t seg) {
    // A renewed segment is new memory: its registration must follow.
    if (raw->registered_segments_[seg]) {
      raw->nvme_->RegisterBuffer(seg, host->memory().HostAddress(seg), host->memory().segment_bytes());
    }
  });
  KVTIER_LOG(INFO) << "nvme tier: " << m->nvme_->Describe() << ", "
                   << (options.write_policy == WritePolicy::kWriteThrough ? "write_through" : "write_back")
                   << (!options.quantization                       ? ""
                       : *options.quantization == QuantKind::kInt8 ? ", int8 for tenants that opted in"
                                                                   : ", fp8 for tenants that opted in");
  return m;
}

int NvmeMover::BufferIndex(PageId page) {
  TierPool* pool = blocks_->pool(TierKind::kHost);
  const uint32_t seg = pool->SegmentOf(page);
  if (!registered_segments_[seg]) {
    nvme_->RegisterBuffer(seg, pool->memory().HostAddress(seg), pool->memory().segment_bytes());
    registered_segments_[seg] = true;
  }
  return static_cast<int>(seg);
}

Result<std::optional<BlockRecord>> NvmeMover::Find(NamespaceId ns, const BlockHash& hash) {
  return nvme_->Find(namespaces_->BlockKey(ns, hash));
}

std::vector<std::string> NvmeMover::BlockKeys(NamespaceId ns, std::span<const BlockHash> hashes) const {
  std::vector<std::string> keys;
  keys.reserve(hashes.size());
  for (const BlockHash& h : hashes) keys.push_back(namespaces_->BlockKey(ns, h));
  return keys;
}

Result<std::vector<std::optional<BlockRecord>>> NvmeMover::FindMany(NamespaceId ns, std::span<const BlockHash> hashes) {
  return nvme_->FindMany(BlockKeys(ns, hashes));
}

void NvmeMover::FindManyAsync(NamespaceId ns, std::span<const BlockHash> hashes, NvmeTier::FindManyDone done) {
  nvme_->FindManyAsync(BlockKeys(ns, hashes), std::move(done));
}

// ---- spills ----------------------------------------------------------------------------

bool NvmeMover::Quantizes(const NamespaceTable::Namespace& n) const {
  return options_.quantization && n.quantize && QuantizedBlockBytes(*n.kv_geometry) <= nvme_->slot_bytes();
}

bool NvmeMover::Spillable(const BlockTable::Block& b) const {
  const NamespaceTable::Namespace& n = namespaces_->Get(b.ns);
  return n.block_bytes <= nvme_->slot_bytes() || Quantizes(n);
}

uint8_t* NvmeMover::TakeStaging() {
  if (!staging_free_.empty()) {
    uint8_t* p = staging_free_.back();
    staging_free_.pop_back();
    return p;
  }
  void* p = nullptr;
  if (::posix_memalign(&p, 4096, nvme_->slot_bytes()) != 0) return nullptr;
  staging_all_.push_back(static_cast<uint8_t*>(p));
  return static_cast<uint8_t*>(p);
}

void NvmeMover::StartSpill(BlockId id, bool keep_host) {
  blocks_->BeginSpill(id);
  const BlockTable::Block& b = blocks_->block(id);
  ++spills_in_flight_;
  if (!keep_host) ++demotions_in_flight_;
  const int64_t started_ns = NowNanos();
  const PageId page = b.page[TierIndex(TierKind::kHost)];
  TierPool* pool = blocks_->pool(TierKind::kHost);
  const NamespaceTable::Namespace& n = namespaces_->Get(b.ns);
  BlockRecord meta;
  meta.length = static_cast<uint32_t>(n.block_bytes);
  meta.layout_fingerprint = n.fingerprint;
  meta.parent.assign(reinterpret_cast<const char*>(b.parent.bytes().data()), b.parent.size());
  uint8_t* staging = Quantizes(n) ? TakeStaging() : nullptr;
  if (staging == nullptr) {
    Spill(id, keep_host, started_ns, std::move(meta), {pool->PageAddress(page), pool->page_bytes()}, BufferIndex(page),
          nullptr);
    return;
  }
  // Quantized on a worker from the pinned page, then spilled from the staging buffer.
  const KvGeometry g = *n.kv_geometry;
  const QuantKind kind = *options_.quantization;
  meta.length = static_cast<uint32_t>(QuantizedBlockBytes(g));
  meta.quantization = kind == QuantKind::kInt8 ? 1 : 2;
  const uint8_t* src = pool->PageAddress(page);
  const FloatKind fk = n.float_kind;
  options_.workers->Run(
      [g, fk, kind, src, staging] {
        QuantizeBlockCpu(g, fk, kind, src, staging);
        return Status::Ok();
      },
      [this, id, keep_host, started_ns, meta = std::move(meta), staging](Status) mutable {
        Spill(id, keep_host, started_ns, std::move(meta), {staging, nvme_->slot_bytes()}, -1, staging);
      });
}

void NvmeMover::Spill(BlockId id, bool keep_host, int64_t started_ns, BlockRecord meta, std::span<const uint8_t> data,
                      int buf, uint8_t* staging) {
  const BlockTable::Block& b = blocks_->block(id);
  nvme_->Spill(namespaces_->BlockKey(b.ns, b.hash), std::move(meta), data, buf,
               [this, id, gen = b.gen, keep_host, started_ns, staging](Status st, uint32_t slot) {
                 if (staging) staging_free_.push_back(staging);
                 OnSpilled(id, gen, keep_host, started_ns, std::move(st), slot);
               });
}

void NvmeMover::OnSpilled(BlockId id, uint32_t gen, bool keep_host, int64_t started_ns, Status st, uint32_t slot) {
  --spills_in_flight_;
  if (!keep_host) --demotions_in_flight_;
  const BlockTable::Block& b = blocks_->block(id);
  KVTIER_CHECK(b.live && b.gen == gen && b.spilling()) << "spill completion for a block that moved";
  blocks_->EndSpill(id);
  if (st.ok()) {
    blocks_->SetNvmeSlot(id, slot);
    ++(keep_host ? counters_->write_throughs : counters_->demotions);
    // Demoted: the host copy goes unless someone took a reference meanwhile, or a lower-tier
    // put still reads it (the copy then stays, droppable now that NVMe has it).
    if (!keep_host && b.refs == 0 && b.readers[TierIndex(TierKind::kHost)] == 0)
      blocks_->RemoveResidency(id, TierKind::kHost);
    if (!keep_host && options_.clock && hooks_.demoted)
      hooks_.demoted(static_cast<double>(NowNanos() - started_ns) * 1e-9);
  } else {
    ++counters_->spill_failures;
    KVTIER_LOG(DEBUG) << "spill failed: " << st.ToString();
    // The tenant's NVMe quota is full of blocks it cannot give up now: a demotion has
    // nowhere to go, so the block leaves host as it would with no NVMe tier (else the same
    // victim would be spilled again and again).
    if (!keep_host && st.code() == StatusCode::kResourceExhausted && b.refs == 0 &&
        b.readers[TierIndex(TierKind::kHost)] == 0) {
      const std::string key = namespaces_->BlockKey(b.ns, b.hash);
      const bool last_copy = b.page[TierIndex(TierKind::kGpu)] == kNoPage;
      blocks_->RemoveResidency(id, TierKind::kHost);
      if (last_copy && hooks_.last_copy_dropped) hooks_.last_copy_dropped(key);
    }
  }
  hooks_.after_spill();
  PumpWriteThrough();
}

void NvmeMover::QueueWriteThrough(BlockId id) { write_through_queue_.emplace_back(id, blocks_->block(id).gen); }

void NvmeMover::PumpWriteThrough() {
  while (!write_through_queue_.empty() && !busy() && spillable()) {
    const auto [id, gen] = write_through_queue_.front();
    write_through_queue_.pop_front();
    const BlockTable::Block& b = blocks_->block(id);
    const PageId host = b.page[TierIndex(TierKind::kHost)];
    if (!b.live || b.gen != gen || b.spilling() || b.promoting() || host == kNoPage ||
        b.page[TierIndex(TierKind::kNvme)] != kNoPage || !Spillable(b) ||
        (blocks_->state(TierKind::kHost, host) != BlockTable::PageState::kBlock &&
         b.readers[TierIndex(TierKind::kHost)] == 0)) {
      continue;  // gone, or already on NVMe
    }
    StartSpill(id, /*keep_host=*/true);
  }
}

void NvmeMover::OnDropped(const std::string& key, uint32_t slot) {
  std::string encoded;
  BlockHash h;
  std::optional<NamespaceId> ns;
  if (DecodeBlockKey(key, nullptr, nullptr, &encoded, &h)) ns = namespaces_->Find(encoded);
  const BlockId id = ns ? blocks_->Find(*ns, h) : kNoBlock;
  if (id == kNoBlock) {
    if (hooks_.last_copy_dropped) hooks_.last_copy_dropped(key);
    return;
  }
  // Only that copy: the block may have been spilled again, to another slot.
  if (blocks_->block(id).page[TierIndex(TierKind::kNvme)] == slot) blocks_->SetNvmeSlot(id, kNoPage);
}

// ---- promotions ------------------------------------------------------------------------

BlockId NvmeMover::StartPromotion(NamespaceId ns, TenantId tenant, const BlockHash& hash, const BlockRecord& rec) {
  const std::optional<PageId> page = blocks_->Take(TierKind::kHost, tenant);
  if (!page) return kNoBlock;
  BlockHash parent;
  if (BlockHash::ValidSize(rec.parent.size())) {
    parent =
        BlockHash(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(rec.parent.data()), rec.parent.size()));
  }
  const BlockId id = blocks_->Create(ns, tenant, hash, parent);
  blocks_->SetNvmeSlot(id, rec.slot);
  blocks_->BeginFill(id, *page);
  const uint32_t gen = blocks_->block(id).gen;
  promotions_[id] = gen;
  TierPool* pool = blocks_->pool(TierKind::kHost);
  const int buf = BufferIndex(*page);
  uint8_t* dst = pool->PageAddress(*page);
  const NamespaceTable::Namespace& n = namespaces_->Get(ns);
  std::optional<KvGeometry> g = n.kv_geometry;
  const FloatKind fk = n.float_kind;
  nvme_->Fetch(namespaces_->BlockKey(ns, hash), rec, {dst, pool->page_bytes()}, buf,
               [this, id, gen, rec, dst, g, fk](Status st) {
                 if (!st.ok() || rec.quantization == 0) return OnPromoted(id, gen, std::move(st), rec);
                 // Stored quantized: back to the engine's floats, in the page, on a worker.
                 if (!g || !options_.workers || QuantizedBlockBytes(*g) != rec.length) {
                   return OnPromoted(id, gen, DataLoss("a quantized block this kvtierd cannot read back"), rec);
                 }
                 const QuantKind kind = rec.quantization == 1 ? QuantKind::kInt8 : QuantKind::kFp8E4M3;
                 options_.workers->Run(
                     [g = *g, fk, kind, dst] {
                       DequantizeBlockCpu(g, fk, kind, dst, dst);
                       return Status::Ok();
                     },
                     [this, id, gen, rec](Status s) { OnPromoted(id, gen, std::move(s), rec); });
               });
  return id;
}

void NvmeMover::OnPromoted(BlockId id, uint32_t gen, Status st, BlockRecord rec) {
  const BlockTable::Block& b = blocks_->block(id);
  KVTIER_CHECK(b.live && b.gen == gen && b.promoting()) << "promotion completion for a block that moved";
  promotions_.erase(id);
  if (st.ok()) {
    const std::string key = namespaces_->BlockKey(b.ns, b.hash);
    blocks_->EndFill(id, true);
    nvme_->RecordHit(key, rec);
    ++counters_->promotions;
  } else {
    blocks_->EndFill(id, false);
    ++counters_->promotion_failures;
  }
  hooks_.after_promotion(id, st);
}

}  // namespace kvtier
