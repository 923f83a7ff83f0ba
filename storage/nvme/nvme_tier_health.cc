// NvmeTier's health and checks of what it stores: I/O errors and their back-off, a failed
// index and its retries, slot-file health (a file gone or failing loses its slots), the
// scrub behind kvctl verify, and the index scans behind kvctl blocks and evict. The data
// path (spills, fetches, eviction) is in nvme_tier.cc, the start-up load in
// nvme_tier_load.cc, the index's group commit in index_writer.cc.
#include <algorithm>
#include <unordered_set>

#include "protocol/base/logging.h"
#include "storage/nvme/index_writer.h"
#include "storage/nvme/nvme_tier.h"

namespace kvtier {
namespace {
constexpr int64_t kBackoffBaseNs = 100'000'000;    // 100 ms
constexpr int64_t kBackoffMaxNs = 10'000'000'000;  // 10 s
constexpr int64_t kIndexRetryNs = 5'000'000'000;   // a failed index is tried again every 5 s
constexpr int64_t kFileCheckNs = 1'000'000'000;    // slot files are checked every second
}  // namespace

// ---- errors and back-off ----

void NvmeTier::NoteIndexError(const Status& st) {
  ++counters_.index_errors;
  if (index_failed_) return;  // one line per failure, not one per batch
  index_failed_ = true;
  next_index_retry_ns_ = clock_->NowNanos() + kIndexRetryNs;
  KVTIER_LOG(ERROR) << "nvme: index write failed: " << st.ToString()
                    << "; spilling to NVMe is stopped (blocks already indexed are still served) and the index is "
                       "tried again every "
                    << kIndexRetryNs / 1'000'000'000 << " s";
}

void NvmeTier::Maintain() {
  const int64_t now = clock_->NowNanos();
  if (index_failed_ && !index_retrying_ && now >= next_index_retry_ns_) {
    index_retrying_ = true;
    ++writes_outstanding_;
    std::weak_ptr<NvmeTier*> weak = self_;
    Post post = post_;
    writer_->Resume([weak, post](Status st) {
      post([weak, st] {
        auto self = weak.lock();
        if (!self) return;
        NvmeTier& t = **self;
        --t.writes_outstanding_;
        t.index_retrying_ = false;
        if (!st.ok()) {
          t.next_index_retry_ns_ = t.clock_->NowNanos() + kIndexRetryNs;
          return;
        }
        t.index_failed_ = false;
        KVTIER_LOG(NOTICE) << "nvme: index writes work again; spilling resumes";
        std::vector<std::pair<std::string, uint32_t>> again;
        again.swap(t.undeleted_);
        for (auto& [key, slot] : again) t.DeleteEntry(key, slot);
      });
    });
  }
  if (now >= next_file_check_ns_) {
    next_file_check_ns_ = now + kFileCheckNs;
    CheckFiles();
  }
}

void NvmeTier::NoteIoError() {
  ++counters_.io_errors;
  ++consecutive_errors_;
  const int64_t backoff = std::min<int64_t>(kBackoffMaxNs, kBackoffBaseNs << std::min(consecutive_errors_ - 1, 7));
  backoff_until_ns_ = clock_->NowNanos() + backoff;
}

bool NvmeTier::spill_available() const {
  if (!ready_ || index_failed_ || clock_->NowNanos() < backoff_until_ns_) return false;
  if (free_->free_count() > 0) return true;
  for (const auto& p : policies_) {
    if (p->evictable() > 0) return true;
  }
  return false;
}

// ---- file health ----

void NvmeTier::CheckFiles() {
  for (const SlotFiles::FileHealth& h : files_->Check()) {
    if (file_lost_[h.file]) continue;
    file_lost_[h.file] = true;
    any_file_lost_ = true;
    ++counters_.files_lost;
    ++counters_.io_errors;
    const auto [first, count] = files_->SlotRange(h.file);
    KVTIER_LOG(ERROR) << "nvme: slot file " << files_->path(h.file) << " was " << h.problem
                      << " while in use; dropping the blocks it held, its " << count
                      << " slots stay out of use until kvtierd restarts (which stamps the file anew)";
    LoseSlots(first, count);
  }
}

void NvmeTier::LoseSlots(uint32_t first, uint32_t count) {
  // Free and not-yet-loaded slots leave use now; indexed ones when their entries are
  // dropped (FreeSlot keeps a lost slot out of the free list); slots being written fail
  // their spill when the write completes.
  bool rebuild = false;
  for (uint32_t s = first; s < first + count; ++s) {
    if (state_[s] == SlotState::kFree || state_[s] == SlotState::kUnknown) {
      rebuild |= state_[s] == SlotState::kFree;
      state_[s] = SlotState::kLost;
      ++lost_;
    }
  }
  if (rebuild && free_) {
    std::vector<bool> used(state_.size());
    for (size_t s = 0; s < state_.size(); ++s) used[s] = state_[s] != SlotState::kFree;
    free_ = std::make_unique<PageAllocator>(static_cast<uint32_t>(state_.size()), used);
  }
  // The entries naming these slots, read on the scan thread and dropped here.
  BlockIndexStore* store = store_.get();
  std::weak_ptr<NvmeTier*> weak = self_;
  Post post = post_;
  scans_->Submit([store, first, count, weak, post](std::stop_token stop) {
    std::vector<std::pair<std::string, uint32_t>> entries;
    (void)store->Scan([&](std::string_view key, const BlockRecord& r) {
      if (r.slot >= first && r.slot - first < count) entries.emplace_back(std::string(key), r.slot);
      return !stop.stop_requested();
    });
    post([weak, entries = std::move(entries)] {
      auto self = weak.lock();
      if (!self) return;
      for (const auto& [key, slot] : entries) (*self)->Drop(key, slot);
    });
  });
}

bool NvmeTier::SlotLost(uint32_t slot) const { return any_file_lost_ && file_lost_[files_->FileOf(slot)]; }

// ---- scrub ----

void NvmeTier::Verify(std::function<void(VerifyReport)> done) {
  // The scrub reads on the scan thread with blocking I/O into its own buffer, so the
  // control thread never waits; bad entries are dropped through the control thread.
  const int64_t start = clock_->NowNanos();
  BlockIndexStore* store = store_.get();
  const SlotFiles* files = files_.get();
  const uint64_t rate = options_.verify_bytes_per_s;
  std::weak_ptr<NvmeTier*> weak = self_;
  Post post = post_;
  const Clock* clock = clock_;
  std::shared_ptr<ZeroedArray<std::atomic<uint32_t>>> gens = write_gen_;
  scans_->Submit([=, done = std::move(done)](std::stop_token stop) mutable {
    VerifyReport report;
    struct Bad {
      std::string key;
      uint32_t slot;
      uint32_t gen;  // writes into the slot before it was read
    };
    std::vector<Bad> bad;
    const uint32_t block = files->logical_block_bytes();
    const uint64_t slot_bytes = files->slot_bytes();
    uint64_t bytes_read = 0;
    void* raw = nullptr;
    if (::posix_memalign(&raw, 4096, slot_bytes) != 0) {
      report.status = ResourceExhausted("no memory for the scrub buffer");
    } else {
      report.status = store->Scan([&](std::string_view key, const BlockRecord& r) {
        if (rate > 0) {
          // Paced: the next read waits until the bytes so far fit the rate.
          const int64_t due = start + static_cast<int64_t>(static_cast<double>(bytes_read) * 1e9 / rate);
          const int64_t now = clock->NowNanos();
          if (due > now && !WorkerThread::Sleep(stop, std::chrono::nanoseconds(due - now))) return false;
        }
        if (stop.stop_requested()) return false;
        ++report.checked;
        const bool in_range = r.slot < files->slot_count();
        const uint32_t gen = in_range ? (*gens)[r.slot].load(std::memory_order_acquire) : 0;
        bool good = in_range && r.length > 0 && r.length <= slot_bytes;
        if (good) {
          const uint32_t len = (r.length + block - 1) / block * block;
          const SlotFiles::Location loc = files->Locate(r.slot);
          ssize_t n = ::pread(loc.fd, raw, len, static_cast<off_t>(loc.offset));
          bytes_read += len;
          good = n == static_cast<ssize_t>(len) &&
                 BlockChecksum(key, std::span<const uint8_t>(static_cast<uint8_t*>(raw), r.length)) == r.checksum;
        }
        if (!good) bad.push_back(Bad{std::string(key), r.slot, gen});
        return true;
      });
      ::free(raw);
      if (report.status.ok() && stop.stop_requested()) {
        report.status =
            Aborted("scrub stopped after " + std::to_string(report.checked) + " blocks: kvtierd is shutting down");
      }
    }
    report.seconds = static_cast<double>(clock->NowNanos() - start) * 1e-9;
    post([weak, report, bad = std::move(bad), done = std::move(done)]() mutable {
      auto self = weak.lock();
      if (!self) return;
      NvmeTier& t = **self;
      for (const Bad& b : bad) {
        // The scan reads a snapshot while spills go on: a block evicted, or its slot
        // rewritten, since the snapshot was taken is not a bad block.
        const bool moved = b.slot < t.state_.size() &&
                           (!t.Owns(b.slot, b.key) || (*t.write_gen_)[b.slot].load(std::memory_order_relaxed) != b.gen);
        if (moved) continue;
        ++report.dropped;
        ++t.counters_.checksum_failures;
        t.Drop(b.key, b.slot);
      }
      done(report);
    });
  });
}

void NvmeTier::ScanTop(size_t limit, bool by_recent, ScanFilter filter, ScanDone done) {
  BlockIndexStore* store = store_.get();
  std::weak_ptr<NvmeTier*> weak = self_;
  Post post = post_;
  scans_->Submit([=, filter = std::move(filter), done = std::move(done)](std::stop_token stop) mutable {
    auto over = [&] { return stop.stop_requested() || (filter.cancelled && filter.cancelled()); };
    using Entry = std::pair<std::string, BlockRecord>;
    auto rank = [by_recent](const Entry& e) {
      return by_recent ? uint64_t{e.second.last_access} : (uint64_t{e.second.hit_count} << 32) | e.second.last_access;
    };
    auto better = [&](const Entry& a, const Entry& b) { return rank(a) > rank(b); };
    std::vector<Entry> top;  // a min-heap on rank of the best `limit` so far
    size_t seen = 0;
    (void)store->Scan([&](std::string_view key, const BlockRecord& r) {
      if (stop.stop_requested() || (++seen % 4096 == 0 && over())) return false;
      if (filter.keep && !filter.keep(key)) return true;
      Entry e{std::string(key), r};
      if (top.size() < limit) {
        top.push_back(std::move(e));
        std::push_heap(top.begin(), top.end(), better);
      } else if (limit > 0 && rank(e) > rank(top.front())) {
        std::pop_heap(top.begin(), top.end(), better);
        top.back() = std::move(e);
        std::push_heap(top.begin(), top.end(), better);
      }
      return true;
    });
    if (over()) return;
    std::sort(top.begin(), top.end(), better);
    post([weak, top = std::move(top), done = std::move(done)]() mutable {
      if (weak.lock()) done(std::move(top));
    });
  });
}

uint32_t NvmeTier::EvictColdest(uint32_t n) {
  if (!ready_) return 0;
  uint32_t dropped = 0;
  // As the watermark does: from whoever holds the most above its reserve.
  while (dropped < n) {
    const std::optional<uint16_t> owner = WatermarkOwner();
    const Victim v = owner ? EvictVictim(*owner) : Victim::kNone;
    if (v == Victim::kNone) break;
    dropped += v == Victim::kDropped;
  }
  return dropped;
}

}  // namespace kvtier
