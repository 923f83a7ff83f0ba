#include "storage/memory/memory_tier.h"

#include <xxhash.h>

#include <algorithm>

#include "protocol/base/units.h"

namespace kvtier {

Result<std::unique_ptr<MemoryTier>> MemoryTier::Open(const MemoryTierOptions& options, Post post) {
  if (options.capacity_bytes == 0) return InvalidArgument("memory tier: no capacity");
  if (!post) return InvalidArgument("memory tier: no way to post callbacks");
  return std::unique_ptr<MemoryTier>(new MemoryTier(options, std::move(post)));
}

MemoryTier::MemoryTier(const MemoryTierOptions& options, Post post) : options_(options), post_(std::move(post)) {}

MemoryTier::~MemoryTier() = default;

void MemoryTier::PostSafe(std::function<void()> fn) {
  post_([weak = std::weak_ptr<bool>(alive_), fn = std::move(fn)] {
    if (weak.lock()) fn();
  });
}

std::string MemoryTier::Describe() const {
  return "kvtierd's memory, " + std::to_string(values_.size()) + " blocks, " + FormatBytes(bytes_) + " of " +
         FormatBytes(options_.capacity_bytes);
}

LowerTierReport MemoryTier::Report() const {
  LowerTierReport r;
  const Counters& c = counters_;
  auto n = [](uint64_t v) { return static_cast<double>(v); };
  const char* fetch_help = "Memory-tier blocks read into host pages, by result (miss: gone; corrupt: did not verify).";
  const char* moved = "Block bytes moved between tiers, by path.";
  r.checksum_failures = c.checksum_failures;
  r.authenticated = true;  // only this process writes it
  r.figures = {
      {"blocks", n(values_.size()), false, "kvtier_memory_blocks", "Blocks the memory tier holds."},
      {"bytes", n(bytes_), false, "kvtier_memory_bytes", "Payload bytes the memory tier holds."},
      {"capacity_bytes", n(options_.capacity_bytes), false, "kvtier_memory_capacity_bytes",
       "Most payload bytes the memory tier holds (tiers.memory.capacity)."},
      {"lookups", n(c.lookups), true, "kvtier_memory_lookups_total", "Block keys looked for in the memory tier."},
      {"lookup_hits", n(c.lookup_hits), true, "kvtier_memory_lookup_hits_total",
       "Block keys the memory tier held when looked for."},
      {"fetch_hits", n(c.fetch_hits), true, "kvtier_memory_fetches_total", fetch_help, {"result", "hit"}},
      {"fetch_misses", n(c.fetch_misses), true, "kvtier_memory_fetches_total", fetch_help, {"result", "miss"}},
      {"checksum_failures",
       n(c.checksum_failures),
       true,
       "kvtier_memory_fetches_total",
       fetch_help,
       {"result", "corrupt"}},
      {"fetch_bytes", n(c.fetch_bytes), true, "kvtier_bytes_moved_total", moved, {"path", "memory_to_host"}},
      {"put_bytes", n(c.put_bytes), true, "kvtier_bytes_moved_total", moved, {"path", "host_to_memory"}},
      {"evictions", n(c.evictions), true, "kvtier_memory_evictions_total",
       "Values the memory tier dropped to make room (least recently used first)."},
  };
  return r;
}

void MemoryTier::Exists(std::vector<std::string> block_keys, std::function<void(std::vector<bool>)> done) {
  std::vector<bool> found(block_keys.size());
  for (size_t i = 0; i < block_keys.size(); ++i) found[i] = values_.count(block_keys[i]) > 0;
  counters_.lookups += block_keys.size();
  counters_.lookup_hits += static_cast<uint64_t>(std::count(found.begin(), found.end(), true));
  PostSafe([done = std::move(done), found = std::move(found)] { done(found); });
}

void MemoryTier::Drop(std::unordered_map<std::string, Value>::iterator it) {
  bytes_ -= it->second.bytes.size();
  lru_.erase(it->second.lru);
  values_.erase(it);
}

void MemoryTier::Put(const std::string& block_key, LowerBlockMeta meta, std::span<const uint8_t> data,
                     std::function<void(Status)> done) {
  if (data.size() > options_.capacity_bytes) {
    PostSafe([done = std::move(done), n = data.size()] {
      done(ResourceExhausted("memory tier: a block of " + std::to_string(n) + " bytes is larger than the tier"));
    });
    return;
  }
  if (auto it = values_.find(block_key); it != values_.end()) Drop(it);
  while (bytes_ + data.size() > options_.capacity_bytes && !lru_.empty()) {
    Drop(values_.find(lru_.back()));
    ++counters_.evictions;
  }
  lru_.push_front(block_key);
  Value& v = values_[block_key];
  v.meta = std::move(meta);
  v.bytes.assign(data.begin(), data.end());
  v.checksum = XXH3_64bits(data.data(), data.size());
  v.lru = lru_.begin();
  bytes_ += data.size();
  ++counters_.puts;
  counters_.put_bytes += data.size();
  PostSafe([done = std::move(done)] { done(Status::Ok()); });
}

void MemoryTier::Fetch(const std::string& block_key, const std::string& fingerprint, uint32_t length,
                       std::span<uint8_t> dst, std::function<void(Status, LowerBlockMeta)> done) {
  Status st;
  LowerBlockMeta meta;
  auto it = values_.find(block_key);
  if (it == values_.end()) {
    ++counters_.fetch_misses;
    st = NotFound("not in the memory tier");
  } else {
    const Value& v = it->second;
    if (v.meta.fingerprint != fingerprint || v.meta.length != length || v.bytes.size() != length ||
        length > dst.size() || XXH3_64bits(v.bytes.data(), v.bytes.size()) != v.checksum) {
      ++counters_.checksum_failures;
      st = DataLoss("memory tier: the value under this key does not verify (layout, length or bytes)");
      Drop(it);
    } else {
      std::copy(v.bytes.begin(), v.bytes.end(), dst.begin());
      meta = v.meta;
      lru_.splice(lru_.begin(), lru_, v.lru);
      ++counters_.fetch_hits;
      counters_.fetch_bytes += length;
    }
  }
  PostSafe([done = std::move(done), st = std::move(st), meta = std::move(meta)]() mutable { done(st, meta); });
}

void MemoryTier::Delete(const std::string& block_key) {
  if (auto it = values_.find(block_key); it != values_.end()) Drop(it);
}

}  // namespace kvtier
