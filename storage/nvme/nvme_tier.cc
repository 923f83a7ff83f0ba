#include "storage/nvme/nvme_tier.h"

#include <fcntl.h>
#include <malloc.h>
#include <stdlib.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <unordered_set>

#include "protocol/base/logging.h"
#include "protocol/base/mutex.h"
#include "protocol/base/units.h"
#include "storage/nvme/index_writer.h"

namespace kvtier {

NvmeTier::NvmeTier(const NvmeTierOptions& options, std::unique_ptr<IoEngine> io, std::unique_ptr<BlockIndexStore> store,
                   Post post, const Clock* clock)
    : options_(options),
      io_(std::move(io)),
      store_(std::move(store)),
      post_(std::move(post)),
      clock_(clock),
      self_(std::make_shared<NvmeTier*>(this)),
      scans_(std::make_unique<WorkerThread>("kvtier-nvmescan")),
      reader_(std::make_unique<WorkerThread>("kvtier-idxread")) {}

NvmeTier::~NvmeTier() {
  scans_->Stop();                  // the scans read store_ and files_: they end first
  reader_->Stop();                 // as do the asynchronous index reads
  io_.reset();                     // I/O still in flight ends before its files are closed
  writer_.reset();                 // applies what is queued
  self_.reset();                   // callbacks still queued on the control thread become no-ops
  if (store_ && !index_failed_) {  // a failed store is not written to, even to flush it
    Status st = store_->Flush();
    if (!st.ok()) KVTIER_LOG(WARNING) << "nvme index flush at shutdown: " << st.ToString();
  }
}

Result<std::unique_ptr<NvmeTier>> NvmeTier::Open(const NvmeTierOptions& options, std::unique_ptr<IoEngine> io,
                                                 std::unique_ptr<BlockIndexStore> store, Post post, const Clock* clock,
                                                 NvmeOwners owners, std::function<void()> before_load) {
  if (!(options.low_watermark < options.high_watermark)) {
    return InvalidArgument("nvme low_watermark must be below high_watermark");
  }
  std::unique_ptr<NvmeTier> t(new NvmeTier(options, std::move(io), std::move(store), std::move(post), clock));
  KVTIER_ASSIGN_OR_RETURN(t->files_, SlotFiles::Open(options.files, options.slot_bytes));
  t->owners_ = std::move(owners);
  t->before_load_ = std::move(before_load);
  const NvmeOwners& o = t->owners_;
  const size_t n = o.owner_of ? std::max<size_t>(1, o.quota_slots.size()) : 1;
  if (o.quota_slots.size() > 65535 || o.reserve_slots.size() > n) {
    return InvalidArgument("nvme owner limits out of range");
  }
  // The policies are built once the index has loaded (OnLoaded); a bad name fails here.
  KVTIER_RETURN_IF_ERROR(MakeEvictionPolicy(options.policy, 0).status());
  t->held_.assign(n, 0);
  if (o.owner_of) t->owner_.assign(t->files_->slot_count(), 0);
  KVTIER_RETURN_IF_ERROR(t->Start());
  return t;
}

void NvmeTier::PostSafe(std::function<void()> fn) {
  std::weak_ptr<NvmeTier*> weak = self_;
  post_([weak, fn = std::move(fn)] {
    if (weak.lock()) fn();
  });
}

Status NvmeTier::Start() {
  // An index written for other files or another slot size describes nothing here.
  const std::string geometry = files_->GeometryKey();
  KVTIER_ASSIGN_OR_RETURN(auto old, store_->GetMeta(kNvmeGeometryMeta));
  if (!old || *old != geometry) {
    if (old) {
      KVTIER_LOG(WARNING) << "nvme: the index does not describe these slot files (a file was recreated, truncated, "
                             "resized or replaced, or the slot size changed); discarding it";
    }
    KVTIER_RETURN_IF_ERROR(store_->Clear());
    KVTIER_RETURN_IF_ERROR(store_->PutMeta(kNvmeGeometryMeta, geometry));
  }
  state_ = ZeroedArray<SlotState>(files_->slot_count());  // kUnknown
  file_lost_.assign(files_->file_count(), false);
  owner_tag_ = ZeroedArray<uint64_t>(files_->slot_count());
  write_gen_ = std::make_shared<ZeroedArray<std::atomic<uint32_t>>>(files_->slot_count());
  writer_ = std::make_unique<IndexWriter>(store_.get());

  StartLoad();
  return Status::Ok();
}

// ---- index ----

Result<std::optional<BlockRecord>> NvmeTier::Find(const std::string& key) { return store_->Get(key); }

Result<std::vector<std::optional<BlockRecord>>> NvmeTier::FindMany(std::span<const std::string> keys) {
  return store_->MultiGet(keys);
}

void NvmeTier::FindManyAsync(std::vector<std::string> keys, FindManyDone done) {
  std::weak_ptr<NvmeTier*> weak = self_;
  Post post = post_;
  BlockIndexStore* store = store_.get();  // outlives reader_, which is stopped first
  reader_->Submit([weak, post, store, keys = std::move(keys), done = std::move(done)](std::stop_token) mutable {
    auto recs = store->MultiGet(keys);
    post([weak, keys = std::move(keys), recs = std::move(recs), done = std::move(done)]() mutable {
      auto self = weak.lock();
      if (!self) return;
      if (recs.ok()) {
        for (size_t i = 0; i < keys.size(); ++i) {
          auto& r = (*recs)[i];
          if (r && !(*self)->Owns(r->slot, keys[i])) r.reset();
        }
      }
      done(std::move(recs));
    });
  });
}

void NvmeTier::Apply(std::vector<IndexMutation> batch, bool sync, std::function<void(Status)> done) {
  ++writes_outstanding_;
  std::weak_ptr<NvmeTier*> weak = self_;
  Post post = post_;
  writer_->Submit(std::move(batch), sync, [weak, post, done = std::move(done)](Status st) {
    post([weak, st, done] {
      auto self = weak.lock();
      if (!self) return;
      --(*self)->writes_outstanding_;
      if (!st.ok()) (*self)->NoteIndexError(st);
      if (done) done(st);
    });
  });
}

// ---- I/O plumbing ----

uint32_t NvmeTier::IoLength(uint32_t length) const {
  const uint32_t b = files_->logical_block_bytes();
  return (length + b - 1) / b * b;
}

uint64_t NvmeTier::NewOp(Op op) {
  const uint64_t id = next_op_++;
  ops_.emplace(id, std::move(op));
  return id;
}

void NvmeTier::Issue(const IoRequest& r) {
  if (backlog_.empty() && io_->Enqueue(r).ok()) return;
  backlog_.push_back(r);
}

void NvmeTier::Submit() {
  if (batch_depth_ > 0) return;  // the last Batch submits
  while (!backlog_.empty() && io_->Enqueue(backlog_.front()).ok()) backlog_.pop_front();
  Status st = io_->Submit();
  if (!st.ok()) KVTIER_LOG(ERROR) << "nvme submit: " << st.ToString();
}

void NvmeTier::IssueSyncs() {
  for (auto& [fd, waiting] : sync_waiting_) {
    if (waiting.empty() || sync_in_flight_[fd]) continue;
    Op sync{Op::Kind::kSync};
    sync.fd = fd;
    sync.batch = std::move(waiting);
    waiting.clear();
    const uint64_t sid = NewOp(std::move(sync));
    sync_in_flight_[fd] = true;
    Issue(IoRequest{IoOp::kFdatasync, fd, 0, nullptr, 0, -1, sid});
  }
}

void NvmeTier::OnIoReady() {
  const std::vector<IoCompletion> done = io_->Reap();
  // The reaped I/Os' places on the device go to queued ones before anything else: the
  // device reads on while the completions are verified and answered.
  Submit();
  for (const IoCompletion& c : done) {
    auto it = ops_.find(c.tag);
    if (it == ops_.end()) continue;
    switch (it->second.kind) {
      case Op::Kind::kSpillWrite:
        OnSpillWritten(c.tag, c.result);
        break;
      case Op::Kind::kSync:
        OnSynced(c.tag, c.result);
        break;
      case Op::Kind::kFetch:
        OnFetched(c.tag, c.result);
        break;
    }
  }
  IssueSyncs();
  Submit();
}

void NvmeTier::RegisterBuffer(uint32_t index, uint8_t* addr, size_t len) {
  Status st = io_->RegisterBuffer(index, addr, len);
  if (!st.ok()) KVTIER_LOG(WARNING) << "nvme: register buffer " << index << ": " << st.ToString();
}

// ---- spill ----

void NvmeTier::Spill(std::string key, BlockRecord meta, std::span<const uint8_t> data, int buf_index, SpillDone done) {
  auto fail = [this, &done](Status st) { PostSafe([done = std::move(done), st] { done(st, 0); }); };
  if (!ready_) return fail(Unavailable("nvme tier still loading its index"));
  if (clock_->NowNanos() < backoff_until_ns_) return fail(Unavailable("nvme tier backing off after an I/O error"));
  if (index_failed_) return fail(Unavailable("nvme index writes are failing: spilling is stopped"));
  if (meta.length == 0 || meta.length > files_->slot_bytes() || IoLength(meta.length) > data.size()) {
    return fail(InvalidArgument("block does not fit an NVMe slot"));
  }
  // An owner at its quota makes room among its own blocks first.
  const uint16_t owner = OwnerOfKey(key);
  while (AtQuota(ShareOf(owner))) {
    if (EvictVictim(owner) == Victim::kNone) {
      ++counters_.quota_refusals;
      return fail(ResourceExhausted("the tenant's NVMe quota of " + std::to_string(ShareOf(owner).quota) +
                                    " slots is full of blocks being read or written"));
    }
  }
  std::optional<PageId> slot = free_->Allocate();
  if (!slot) {
    EnforceWatermark();
    // Full with nothing above the high watermark to drop (it may be 1.0): make room for the
    // next spill by dropping one block now, as the watermark would (its slot frees once
    // the delete is applied).
    if (deleting_ + retired_ == 0) {
      if (const std::optional<uint16_t> o = WatermarkOwner()) EvictVictim(*o);
    }
    return fail(Unavailable("nvme tier has no free slot yet"));
  }
  if (!owner_.empty()) owner_[*slot] = owner;
  ++held_[owner];
  state_[*slot] = SlotState::kWriting;
  (*write_gen_)[*slot].fetch_add(1, std::memory_order_release);
  ++writing_;
  meta.slot = *slot;
  meta.checksum = BlockChecksum(key, data.first(meta.length));
  meta.last_access = static_cast<uint32_t>(clock_->WallSeconds());
  meta.hit_count = 0;
  const SlotFiles::Location loc = files_->Locate(*slot);
  Op op{Op::Kind::kSpillWrite};
  op.slot = *slot;
  op.key = std::move(key);
  op.record = std::move(meta);
  op.spill_done = std::move(done);
  op.fd = loc.fd;
  const uint32_t len = IoLength(op.record.length);
  const uint64_t id = NewOp(std::move(op));
  Issue(IoRequest{IoOp::kWrite, loc.fd, loc.offset, const_cast<uint8_t*>(data.data()), len, buf_index, id});
  Submit();
  EnforceWatermark();
}

void NvmeTier::FailSpill(uint64_t id, Status status) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  Op op = std::move(it->second);
  ops_.erase(it);
  --writing_;
  Unhold(op.slot);
  ReleaseSlot(op.slot);
  ++counters_.spill_failures;
  if (op.spill_done) op.spill_done(std::move(status), op.slot);
}

void NvmeTier::OnSpillWritten(uint64_t id, int32_t result) {
  Op& op = ops_.at(id);
  if (result >= 0 && static_cast<uint32_t>(result) != IoLength(op.record.length)) result = -EIO;  // short
  if (result < 0) {
    KVTIER_LOG(WARNING) << "nvme: spill write to slot " << op.slot << " failed: " << std::strerror(-result);
    NoteIoError();
    return FailSpill(id, ErrnoStatus(-result, "nvme spill write"));
  }
  if (SlotLost(op.slot)) return FailSpill(id, DataLoss("the slot file was lost during the spill"));
  if (options_.durability == Durability::kRelaxed) return IndexSpills({id});
  // Strict: the data must be on stable storage before its entry exists. One fdatasync per
  // file covers every write completed before it was issued (IssueSyncs).
  sync_waiting_[op.fd].push_back(id);
}

void NvmeTier::OnSynced(uint64_t id, int32_t result) {
  Op op = std::move(ops_.at(id));
  ops_.erase(id);
  sync_in_flight_[op.fd] = false;
  ++counters_.syncs;
  if (result < 0) {
    // A failed fdatasync leaves the file's state unknown: the writes it covered are not
    // durable and are not indexed. The sync is not retried for them.
    KVTIER_LOG(WARNING) << "nvme: fdatasync failed: " << std::strerror(-result) << "; " << op.batch.size()
                        << " spills dropped";
    NoteIoError();
    for (uint64_t sid : op.batch) FailSpill(sid, ErrnoStatus(-result, "nvme fdatasync"));
    return;
  }
  IndexSpills(std::move(op.batch));
}

void NvmeTier::IndexSpills(std::vector<uint64_t> ids) {
  std::vector<IndexMutation> batch;
  for (uint64_t id : ids) {
    const Op& op = ops_.at(id);
    batch.push_back(IndexMutation{IndexMutation::Kind::kPut, op.key, op.record});
  }
  Apply(std::move(batch), options_.durability == Durability::kStrict, [this, ids](Status st) {
    for (uint64_t id : ids) {
      auto it = ops_.find(id);
      if (it == ops_.end()) continue;
      Op& op = it->second;
      if (!st.ok()) {
        FailSpill(id, st);
        continue;
      }
      consecutive_errors_ = 0;
      state_[op.slot] = SlotState::kIndexed;
      owner_tag_[op.slot] = KeyTag(op.key);
      --writing_;
      ++indexed_;
      PolicyOf(op.slot).Insert(op.slot, kNoBlock, XXH3_64bits(op.key.data(), op.key.size()));
      ++counters_.spills;
      counters_.spill_bytes += op.record.length;
      SpillDone done = std::move(op.spill_done);
      const uint32_t slot = op.slot;
      const std::string key = std::move(op.key);
      const BlockRecord record = std::move(op.record);
      ops_.erase(it);
      if (SlotLost(slot)) {
        // The file went while the entry was being written: the entry goes again.
        Drop(key, slot);
        if (done) done(DataLoss("the slot file was lost during the spill"), slot);
        continue;
      }
      if (index_listener_) index_listener_(key, &record);
      if (done) done(Status::Ok(), slot);
    }
  });
}

// ---- fetch ----

void NvmeTier::Fetch(std::string key, const BlockRecord& record, std::span<uint8_t> dst, int buf_index, Done done) {
  const uint32_t slot = record.slot;
  auto fail = [this, &done](Status st) { PostSafe([done = std::move(done), st] { done(st); }); };
  if (slot >= files_->slot_count() || record.length == 0 || record.length > files_->slot_bytes()) {
    Drop(key, slot);
    return fail(DataLoss("index entry names no valid slot"));
  }
  if (IoLength(record.length) > dst.size()) return fail(InvalidArgument("fetch buffer too small"));
  if (SlotLost(slot)) {
    Drop(key, slot);
    return fail(NotFound("the slot file holding the block was lost"));
  }
  // A record read a while ago (a queued promotion) may name a slot evicted or reused since.
  if (!Owns(slot, key)) return fail(NotFound("block left the NVMe tier"));
  if (readers_[slot]++ == 0 && ready_ && state_[slot] == SlotState::kIndexed) PolicyOf(slot).SetEvictable(slot, false);
  const SlotFiles::Location loc = files_->Locate(slot);
  Op op{Op::Kind::kFetch};
  op.slot = slot;
  op.key = std::move(key);
  op.record = record;
  op.done = std::move(done);
  op.dst = dst;
  const uint64_t id = NewOp(std::move(op));
  Issue(IoRequest{IoOp::kRead, loc.fd, loc.offset, dst.data(), IoLength(record.length), buf_index, id});
  Submit();
}

void NvmeTier::OnFetched(uint64_t id, int32_t result) {
  Op op = std::move(ops_.at(id));
  ops_.erase(id);
  auto r = readers_.find(op.slot);
  if (r != readers_.end() && --r->second == 0) {
    readers_.erase(r);
    if (ready_ && state_[op.slot] == SlotState::kIndexed) PolicyOf(op.slot).SetEvictable(op.slot, true);
    if (state_[op.slot] == SlotState::kRetired) {
      --retired_;
      ReleaseSlot(op.slot);
    }
  }
  if (result >= 0 && static_cast<uint32_t>(result) != IoLength(op.record.length)) result = -ENODATA;  // short
  if (result < 0) {
    ++counters_.fetch_failures;
    ++counters_.io_errors;
    KVTIER_LOG(WARNING) << "nvme: read of slot " << op.slot << " failed: " << std::strerror(-result)
                        << "; dropping the entry";
    Drop(op.key, op.slot);
    return op.done(ErrnoStatus(-result, "nvme read"));
  }
  const auto data = std::span<const uint8_t>(op.dst.data(), op.record.length);
  if (BlockChecksum(op.key, data) != op.record.checksum) {
    ++counters_.checksum_failures;
    ++counters_.fetch_failures;
    KVTIER_LOG(WARNING) << "nvme: block in slot " << op.slot << " failed its checksum; dropped";
    Drop(op.key, op.slot);
    return op.done(DataLoss("block failed its checksum"));
  }
  ++counters_.fetches;
  counters_.fetch_bytes += op.record.length;
  op.done(Status::Ok());
}

// ---- recency, drops, eviction ----

void NvmeTier::Touch(uint32_t slot) {
  if (ready_ && slot < state_.size() && state_[slot] == SlotState::kIndexed) PolicyOf(slot).Touch(slot);
}

void NvmeTier::RecordHit(const std::string& key, const BlockRecord& record) {
  if (record.slot >= state_.size() || state_[record.slot] != SlotState::kIndexed || !Owns(record.slot, key)) return;
  Touch(record.slot);
  BlockRecord r = record;
  r.last_access = static_cast<uint32_t>(clock_->WallSeconds());
  ++r.hit_count;
  Apply({IndexMutation{IndexMutation::Kind::kPutRecord, key, r}}, false, nullptr);
}

bool NvmeTier::Owns(uint32_t slot, const std::string& key) const {
  if (slot >= state_.size()) return false;
  if (state_[slot] == SlotState::kIndexed) return owner_tag_[slot] == KeyTag(key);
  return state_[slot] == SlotState::kUnknown;  // still loading: no slot has been reused
}

uint64_t NvmeTier::KeyTag(std::string_view key) { return XXH3_64bits(key.data(), key.size()) | 1; }

void NvmeTier::FreeSlot(uint32_t slot) {
  owner_tag_[slot] = 0;
  if (readers_.count(slot)) {
    state_[slot] = SlotState::kRetired;
    ++retired_;
    return;
  }
  ReleaseSlot(slot);
}

void NvmeTier::ReleaseSlot(uint32_t slot) {
  if (SlotLost(slot)) {
    state_[slot] = SlotState::kLost;
    ++lost_;
    return;
  }
  state_[slot] = SlotState::kFree;
  if (ready_) (void)free_->Free(slot);
}

void NvmeTier::Drop(const std::string& key, uint32_t slot) {
  // While the index loads, which key a slot holds is known only to the index itself.
  const bool mine = slot < state_.size() &&
                    (state_[slot] == SlotState::kUnknown ? [&] {
                      auto owner = store_->KeyOfSlot(slot);
                      return owner.ok() && *owner && **owner == key;
                    }()
                                                         : Owns(slot, key));
  if (!mine) {
    // The slot is someone else's (or nobody's): only an entry of `key` naming it goes.
    IndexMutation m{IndexMutation::Kind::kDeleteRecord, key, {}};
    m.record.slot = slot;
    Apply({std::move(m)}, false, [this, key, slot](Status) {
      if (drop_listener_) drop_listener_(key, slot);
    });
    return;
  }
  if (state_[slot] == SlotState::kIndexed) {
    if (ready_) PolicyOf(slot).Erase(slot);
    --indexed_;
    Unhold(slot);
  }
  state_[slot] = SlotState::kDeleting;
  ++deleting_;
  DeleteEntry(key, slot);
}

void NvmeTier::DeleteEntry(const std::string& key, uint32_t slot) {
  IndexMutation m{IndexMutation::Kind::kDelete, key, {}};
  m.record.slot = slot;
  // The slot is free for reuse only once the entry naming it is gone.
  Apply({std::move(m)}, false, [this, key, slot](Status st) {
    if (!st.ok()) {
      // The entry may still exist: the slot stays out of use (deleting) rather than risk
      // two entries on one slot, and the delete is tried again when the index recovers.
      undeleted_.emplace_back(key, slot);
      return;
    }
    --deleting_;
    FreeSlot(slot);
    if (index_listener_) index_listener_(key, nullptr);
    if (drop_listener_) drop_listener_(key, slot);
  });
}

void NvmeTier::EnforceWatermark() {
  if (!ready_) return;
  const double cap = files_->slot_count();
  auto used = [&] { return static_cast<double>(files_->slot_count() - free_->free_count() - deleting_ - retired_); };
  if (used() <= options_.high_watermark * cap) return;
  while (used() > options_.low_watermark * cap) {
    const std::optional<uint16_t> owner = WatermarkOwner();
    if (!owner || EvictVictim(*owner) == Victim::kNone) break;
  }
}

Share NvmeTier::ShareOf(uint16_t owner) const {
  Share s;
  s.held = held_[owner];
  s.quota = owner < owners_.quota_slots.size() ? owners_.quota_slots[owner] : 0;
  s.reserve = owner < owners_.reserve_slots.size() ? owners_.reserve_slots[owner] : 0;
  return s;
}

std::optional<uint16_t> NvmeTier::WatermarkOwner() const {
  return OwnerToShrink<uint16_t>(
      static_cast<uint16_t>(held_.size()), [this](uint16_t o) { return ShareOf(o); },
      [this](uint16_t o) { return policies_[o]->evictable() > 0 ? held_[o] : 0u; });
}

uint16_t NvmeTier::OwnerOfKey(std::string_view key) const {
  if (!owners_.owner_of) return 0;
  const uint16_t o = owners_.owner_of(key);
  return o < held_.size() ? o : 0;
}

NvmeTier::Victim NvmeTier::EvictVictim(uint16_t owner) {
  const BlockId victim = policies_[owner]->Victim();
  if (victim == kNoBlock) return Victim::kNone;
  auto key = store_->KeyOfSlot(victim);
  if (!key.ok() || !*key || !Owns(victim, **key)) {
    // No entry names this slot any more: it is simply free.
    PolicyOf(victim).Erase(victim);
    --indexed_;
    Unhold(victim);
    FreeSlot(victim);
    return Victim::kFreed;
  }
  ++counters_.evictions;
  Drop(**key, victim);  // takes it out of the policy
  return Victim::kDropped;
}

// ---- accounting ----

NvmeCounts NvmeTier::Counts() const {
  NvmeCounts c;
  c.capacity = files_->slot_count();
  if (!ready_) {
    c.inflight = c.capacity;  // not known yet: being loaded
    return c;
  }
  c.free = free_->free_count();
  c.inflight = writing_ + deleting_ + retired_;
  c.cached = indexed_;
  c.lost = lost_;
  return c;
}

uint64_t NvmeTier::MemoryUsage() const {
  const uint64_t slots = files_->slot_count();
  // state byte + owner tag + write generation + free list entry + free bit + LRU node (two
  // links) + LRU flag bits; with owners, a 2-byte owner and each further owner's policy.
  const uint64_t owners = slots * (owner_.empty() ? 0 : 2 + 8 * (policies_.size() - 1));
  return slots * (1 + 8 + 4 + 4 + 8) + slots * 3 / 8 + owners + store_->MemoryUsage();
}

std::string NvmeTier::Describe() const {
  return files_->Describe() + ", io " + std::string(io_->name()) + ", index " + std::string(store_->name());
}

}  // namespace kvtier
