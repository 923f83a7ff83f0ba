#include "engine/tools/cache_sim.h"

#include <algorithm>
#include <memory>
#include <queue>
#include <vector>

#include "storage/policy/eviction_policy.h"
#include "storage/policy/retention_policy.h"
#include "storage/policy/session_table.h"

namespace kvtier {
namespace {

// One simulated tier: block identities -> policy ids (dense, reused like the daemon's).
class SimTier {
 public:
  // With `retention`, the policy is wrapped in a RetentionPolicy whose classes the owner
  // sets (SetRetention) and a block gets on arrival (`class_of`).
  SimTier(std::unique_ptr<EvictionPolicy> policy, uint64_t capacity, uint32_t identities, const SessionTable* classes)
      : capacity_(capacity), id_of_(identities, kNoBlock), classes_(classes) {
    if (classes != nullptr) {
      auto r = std::make_unique<RetentionPolicy>(std::move(policy));
      retention_ = r.get();
      policy = std::move(r);
    }
    policy_ = std::move(policy);
  }

  void SetRetention(uint32_t block, Retention r, int64_t expected, uint32_t depth) {
    if (retention_ != nullptr && Has(block)) retention_->SetRetention(id_of_[block], r, expected, depth);
  }

  bool Has(uint32_t block) const { return id_of_[block] != kNoBlock; }
  bool Full() const { return size_ >= capacity_; }
  void Touch(uint32_t block) { policy_->Touch(id_of_[block]); }
  // REQUIRES: !Full() && !Has(block).
  void Insert(uint32_t block, uint32_t parent_block) {
    BlockId id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = static_cast<BlockId>(block_of_.size());
      block_of_.push_back(0);
    }
    block_of_[id] = block;
    id_of_[block] = id;
    ++size_;
    const BlockId parent = parent_block != kNoBlock && Has(parent_block) ? id_of_[parent_block] : kNoBlock;
    policy_->Insert(id, parent, block);
    if (classes_ != nullptr && classes_->Class(block) != Retention::kOrdinary) {
      retention_->SetRetention(id, classes_->Class(block), classes_->ExpectedReturn(block), classes_->Depth(block));
    }
  }
  void Remove(uint32_t block) {
    const BlockId id = id_of_[block];
    policy_->Erase(id);
    id_of_[block] = kNoBlock;
    free_.push_back(id);
    --size_;
  }
  // Evicts the policy's victim; returns its block identity.
  uint32_t Evict() {
    const BlockId v = policy_->Victim();
    const uint32_t block = block_of_[v];
    Remove(block);
    return block;
  }
  bool prefix_ordered() const { return policy_->touch_prefix_deepest_first(); }
  uint64_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<EvictionPolicy> policy_;
  RetentionPolicy* retention_ = nullptr;
  uint64_t capacity_;
  std::vector<BlockId> id_of_;
  std::vector<uint32_t> block_of_;
  std::vector<BlockId> free_;
  uint64_t size_ = 0;
  const SessionTable* classes_ = nullptr;
};

}  // namespace

Result<SimResult> Simulate(const Trace& trace, const SimConfig& cfg) {
  if (cfg.host_capacity == 0) return InvalidArgument("host capacity must be at least one block");
  // The session hints, in trace time; their class changes go to both tiers.
  const bool hints = cfg.hints && trace.has_sessions;
  SimTier* tiers[2] = {nullptr, nullptr};
  SessionTable::Options so;
  so.max_ttl_ns = static_cast<int64_t>(cfg.max_ttl_s * 1e9);
  SessionTable sessions(so, [&](uint32_t block, Retention r, int64_t expected, uint32_t depth) {
    for (SimTier* t : tiers) {
      if (t != nullptr) t->SetRetention(block, r, expected, depth);
    }
  });
  const SessionTable* classes = hints ? &sessions : nullptr;
  KVTIER_ASSIGN_OR_RETURN(auto hp, MakeEvictionPolicy(cfg.host_policy, cfg.host_capacity, cfg.nvme_capacity > 0));
  SimTier host(std::move(hp), cfg.host_capacity, trace.unique_blocks, classes);
  std::unique_ptr<SimTier> nvme;
  if (cfg.nvme_capacity > 0) {
    KVTIER_ASSIGN_OR_RETURN(auto np, MakeEvictionPolicy(cfg.nvme_policy, cfg.nvme_capacity));
    nvme = std::make_unique<SimTier>(std::move(np), cfg.nvme_capacity, trace.unique_blocks, classes);
  }
  tiers[0] = &host;
  tiers[1] = nvme.get();
  std::vector<uint8_t> uses(trace.unique_blocks, 0);
  SimResult r;
  // Room in the host tier: its victim is demoted when the NVMe tier admits it.
  auto make_room = [&] {
    if (!host.Full()) return;
    const uint32_t v = host.Evict();
    if (!nvme || (cfg.nvme_admit_reused_only && uses[v] < 2)) return;
    if (nvme->Full()) nvme->Evict();
    nvme->Insert(v, kNoBlock);
    ++r.nvme_writes;
  };
  auto bring_in = [&](uint32_t block, uint32_t parent) {
    if (nvme && nvme->Has(block)) nvme->Remove(block);  // promoted
    make_room();
    host.Insert(block, parent);
  };
  for (const TraceRequest& q : trace.requests) {
    const auto& b = q.blocks;
    const int64_t now = q.timestamp_ms * 1'000'000;
    if (hints) sessions.Expire(now);
    size_t j = 0;
    while (j < b.size() && (host.Has(b[j]) || (nvme && nvme->Has(b[j])))) {
      ++(host.Has(b[j]) ? r.host_hits : r.nvme_hits);
      ++j;
    }
    r.blocks += b.size();
    r.hits += j;
    if (cfg.per_request) r.request_hits.push_back(static_cast<uint32_t>(j));
    for (uint32_t x : b) uses[x] = static_cast<uint8_t>(std::min(255, uses[x] + 1));
    // The matched prefix: touched (deepest first for prefix order), NVMe hits promoted.
    for (size_t n = 0; n < j; ++n) {
      const size_t i = host.prefix_ordered() ? j - 1 - n : n;
      if (host.Has(b[i]))
        host.Touch(b[i]);
      else
        bring_in(b[i], i ? b[i - 1] : kNoBlock);
    }
    // The rest: committed by the engine after it computed them.
    for (size_t i = j; i < b.size(); ++i) {
      if (host.Has(b[i]))
        host.Touch(b[i]);
      else
        bring_in(b[i], i ? b[i - 1] : kNoBlock);
    }
    if (hints && !q.session_id.empty()) {
      const int64_t ttl = q.cache_ttl_s < 0 ? -1 : static_cast<int64_t>(q.cache_ttl_s * 1e9);
      (void)sessions.Request(q.session_id, now, b, ttl, q.session_end);
    }
  }
  return r;
}

SimResult SimulateBelady(const Trace& trace, uint64_t capacity) {
  // Next use of each access in the flattened stream.
  std::vector<uint32_t> stream;
  for (const auto& q : trace.requests) stream.insert(stream.end(), q.blocks.begin(), q.blocks.end());
  const uint64_t kNever = ~0ull;
  std::vector<uint64_t> next(stream.size());
  std::vector<uint64_t> last(trace.unique_blocks, kNever);
  for (size_t i = stream.size(); i-- > 0;) {
    next[i] = last[stream[i]];
    last[stream[i]] = i;
  }
  std::vector<bool> cached(trace.unique_blocks, false);
  std::vector<uint64_t> next_use(trace.unique_blocks, 0);
  std::priority_queue<std::pair<uint64_t, uint32_t>> heap;  // (next use, block), lazy
  uint64_t size = 0;
  SimResult r;
  size_t pos = 0;
  for (const auto& q : trace.requests) {
    size_t j = 0;
    while (j < q.blocks.size() && cached[q.blocks[j]]) ++j;
    r.blocks += q.blocks.size();
    r.hits += j;
    r.host_hits += j;
    for (uint32_t x : q.blocks) {
      const uint64_t n = next[pos++];
      r.block_hits += cached[x] ? 1 : 0;
      if (!cached[x]) {
        if (size >= capacity) {
          for (;;) {  // the cached block used furthest ahead (never: first)
            auto [nu, v] = heap.top();
            heap.pop();
            if (cached[v] && next_use[v] == nu) {
              cached[v] = false;
              --size;
              break;
            }
          }
        }
        cached[x] = true;
        ++size;
      }
      next_use[x] = n;
      heap.emplace(n, x);
    }
  }
  return r;
}

}  // namespace kvtier
