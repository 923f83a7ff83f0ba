// NvmeTier at start: the background load that rebuilds slot occupancy, recency and
// owners from the index (StartLoad, on the scan thread) and its hand-over to the
// control thread (OnLoaded). Lookups and fetches work before it ends; spills do not.
#include <malloc.h>

#include <algorithm>
#include <unordered_set>

#include "protocol/base/logging.h"
#include "storage/nvme/nvme_tier.h"

namespace kvtier {

void NvmeTier::StartLoad() {
  // Rebuild slot occupancy and recency in the background; lookups work meanwhile.
  const uint32_t capacity = files_->slot_count();
  BlockIndexStore* store = store_.get();
  std::weak_ptr<NvmeTier*> weak = self_;
  Post post = post_;
  auto owner_of = owners_.owner_of;
  auto before_load = before_load_;
  const size_t owners = held_.size();
  scans_->Submit([store, capacity, weak, post, owner_of, owners, before_load](std::stop_token stop) {
    if (before_load) before_load();
    // One word per slot (its entry's last access + 1; 0: no entry), not a growing list:
    // this runs once per start over what may be millions of entries.
    std::vector<uint32_t> last(capacity, 0);
    std::vector<uint64_t> tags(capacity, 0);
    std::vector<uint16_t> who(owner_of ? capacity : 0, 0);
    auto owner_for = [&](std::string_view key) -> uint16_t {
      if (!owner_of) return 0;
      const uint16_t o = owner_of(key);
      return o < owners ? o : 0;
    };
    std::vector<std::pair<std::string, uint32_t>> stale;
    std::unordered_set<uint32_t> dup;
    // Entries come in key order, their slots at random: each is noted a few entries later,
    // after its slot's words were prefetched, so the scan does not wait on a cache miss per
    // entry (10M entries: the arrays are 120 MB).
    struct Noted {
      uint32_t slot, last;
      uint64_t tag;
      uint16_t owner;
    };
    constexpr size_t kAhead = 16;
    Noted ring[kAhead];
    size_t pending = 0, head = 0;
    auto apply = [&](const Noted& n) {
      if (last[n.slot] != 0) {
        dup.insert(n.slot);
        return;
      }
      last[n.slot] = n.last;
      tags[n.slot] = n.tag;
      if (owner_of) who[n.slot] = n.owner;
    };
    Status st = store->Scan([&](std::string_view key, const BlockRecord& r) {
      if (r.slot >= capacity) {
        stale.emplace_back(std::string(key), r.slot);
        return !stop.stop_requested();
      }
      __builtin_prefetch(&last[r.slot], 1);
      __builtin_prefetch(&tags[r.slot], 1);
      const uint16_t o = owner_for(key);
      if (pending == kAhead) {  // the oldest, prefetched kAhead entries ago
        apply(ring[head]);
        head = (head + 1) % kAhead;
        --pending;
      }
      ring[(head + pending) % kAhead] = Noted{r.slot, std::max<uint32_t>(r.last_access, 1), KeyTag(key), o};
      ++pending;
      return !stop.stop_requested();
    });
    for (; pending > 0; --pending, head = (head + 1) % kAhead) apply(ring[head]);
    if (!dup.empty()) {
      // Two entries claim a slot (a crash between a delete and a reuse): the slot map says
      // whose it is; the others are stale.
      (void)store->Scan([&](std::string_view key, const BlockRecord& r) {
        if (dup.count(r.slot)) {
          auto owner = store->KeyOfSlot(r.slot);
          if (owner.ok() && (!*owner || **owner != key)) {
            stale.emplace_back(std::string(key), r.slot);
          } else {
            tags[r.slot] = KeyTag(key);
            if (owner_of) who[r.slot] = owner_for(key);
          }
        }
        return !stop.stop_requested();
      });
    }
    if (stop.stop_requested()) return;  // shutting down: a partial view must not be used
    if (!st.ok()) KVTIER_LOG(ERROR) << "nvme: index scan: " << st.ToString();
    post([weak, last = std::move(last), tags = std::move(tags), who = std::move(who),
          stale = std::move(stale)]() mutable {
      if (auto self = weak.lock()) {
        (*self)->OnLoaded(std::move(last), std::move(tags), std::move(who), std::move(stale));
      }
    });
  });
}

void NvmeTier::OnLoaded(std::vector<uint32_t> last_access, std::vector<uint64_t> tags, std::vector<uint16_t> owners,
                        std::vector<std::pair<std::string, uint32_t>> stale) {
  const uint32_t capacity = files_->slot_count();
  for (size_t o = 0; o < held_.size(); ++o) {
    // The first is sized for every slot; the others grow with the slots they see.
    auto p = MakeEvictionPolicy(options_.policy, o == 0 ? capacity : 0);
    KVTIER_CHECK(p.ok()) << p.status().ToString();  // the name was checked at Open
    policies_.push_back(std::move(*p));
  }
  std::vector<uint32_t> order;
  for (uint32_t s = 0; s < capacity; ++s) {
    if (last_access[s] != 0) order.push_back(s);
  }
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return last_access[a] < last_access[b]; });
  for (uint32_t slot : order) {
    if (state_[slot] != SlotState::kUnknown) continue;  // dropped while we were scanning
    state_[slot] = SlotState::kIndexed;
    owner_tag_[slot] = tags[slot];
    if (!owner_.empty()) owner_[slot] = owners[slot];
    ++indexed_;
    ++held_[OwnerOfSlot(slot)];
    PolicyOf(slot).Insert(slot, kNoBlock, slot);  // oldest first: the first victims
    if (readers_.count(slot)) PolicyOf(slot).SetEvictable(slot, false);
  }
  std::vector<uint32_t>().swap(order);
  std::vector<uint32_t>().swap(last_access);
  std::vector<uint64_t>().swap(tags);
  std::vector<uint16_t>().swap(owners);
  std::vector<bool> used(capacity, false);
  for (uint32_t s = 0; s < capacity; ++s) {
    if (state_[s] == SlotState::kUnknown) state_[s] = SlotState::kFree;
    used[s] = state_[s] != SlotState::kFree;
  }
  free_ = std::make_unique<PageAllocator>(capacity, used);
  ready_ = true;
  // The scan's transient arrays were large; give the memory back to the system.
  ::malloc_trim(0);
  KVTIER_LOG(INFO) << "nvme: index loaded: " << indexed_ << " blocks in " << capacity << " slots";
  // Stale entries name a slot past the files' end or one another entry owns: only the
  // entry goes, never the slot.
  for (auto& [key, slot] : stale) {
    IndexMutation m{IndexMutation::Kind::kDeleteRecord, key, {}};
    m.record.slot = slot;
    Apply({std::move(m)}, false, nullptr);
  }
  EnforceWatermark();
}

}  // namespace kvtier
