#include "daemon/cache/lower_tier_mover.h"

#include "protocol/base/clock.h"
#include "protocol/base/logging.h"

namespace kvtier {

LowerTierMover::LowerTierMover(std::unique_ptr<LowerTier> tier, size_t index, const Options& options,
                               BlockTable* blocks, NamespaceTable* namespaces, Hooks hooks)
    : tier_(std::move(tier)),
      index_(index),
      options_(options),
      blocks_(blocks),
      namespaces_(namespaces),
      hooks_(std::move(hooks)) {}

std::string LowerTierMover::LowerBlockKey(NamespaceId ns, const BlockHash& hash) const {
  const NamespaceTable::Namespace& n = namespaces_->Get(ns);
  // '=' only appears in the names of unknown tenants (TenantResolver).
  if (n.tenant.find('=') == std::string::npos) return namespaces_->BlockKey(ns, hash);
  return EncodeBlockKey(EncodeNamespace(n.tenant + "@" + options_.node_name, n.fingerprint), hash);
}

LowerTierMover::~LowerTierMover() { tier_.reset(); }

Result<std::unique_ptr<LowerTierMover>> LowerTierMover::Open(std::unique_ptr<LowerTier> tier, size_t index,
                                                             const Options& options, BlockTable* blocks,
                                                             NamespaceTable* namespaces, Hooks hooks) {
  const std::string name(TierKindName(tier->kind()));
  if (!blocks->enabled(TierKind::kHost)) return InvalidArgument("the " + name + " tier needs the host tier");
  if (index >= kMaxLowerTiers) return InvalidArgument("at most " + std::to_string(kMaxLowerTiers) + " lower tiers");
  if (options.max_puts_in_flight == 0) return InvalidArgument("max_puts_in_flight must be at least 1");
  KVTIER_LOG(INFO) << name << " tier: " << tier->Describe() << ", "
                   << (options.write_policy == WritePolicy::kWriteThrough ? "write_through" : "write_back");
  return std::unique_ptr<LowerTierMover>(
      new LowerTierMover(std::move(tier), index, options, blocks, namespaces, std::move(hooks)));
}

// ---- puts --------------------------------------------------------------------------------

void LowerTierMover::QueuePut(BlockId id) {
  if (put_queue_.size() >= options_.max_queued_puts || backing_off()) {
    ++puts_skipped_;
    return;
  }
  put_queue_.emplace_back(id, blocks_->block(id).gen);
}

// No clock read until a first back-off: this is asked before every put and every
// write-back eviction.
bool LowerTierMover::backing_off() const {
  return backoff_until_ns_ != 0 && SystemClock::Default()->NowNanos() < backoff_until_ns_;
}

void LowerTierMover::PumpPuts() {
  while (!put_queue_.empty() && !busy() && tier_->available()) {
    const auto [id, gen] = put_queue_.front();
    put_queue_.pop_front();
    const BlockTable::Block& b = blocks_->block(id);
    if (!b.live || b.gen != gen || b.promoting() || Holds(b) || b.page[TierIndex(TierKind::kHost)] == kNoPage) {
      if (!b.live || b.gen != gen || b.page[TierIndex(TierKind::kHost)] == kNoPage) ++puts_skipped_;
      continue;  // gone from host before its turn, or already there
    }
    StartPut(id);
  }
}

void LowerTierMover::StartPut(BlockId id) {
  blocks_->BeginRead(id);
  const BlockTable::Block& b = blocks_->block(id);
  ++puts_in_flight_;
  const NamespaceTable::Namespace& n = namespaces_->Get(b.ns);
  LowerBlockMeta meta;
  meta.length = static_cast<uint32_t>(n.block_bytes);
  meta.fingerprint = n.fingerprint;
  meta.parent.assign(reinterpret_cast<const char*>(b.parent.bytes().data()), b.parent.size());
  const TierPool* pool = blocks_->pool(TierKind::kHost);
  const PageId page = b.page[TierIndex(TierKind::kHost)];
  tier_->Put(LowerBlockKey(b.ns, b.hash), std::move(meta), {pool->PageAddress(page), n.block_bytes},
             [this, id, gen = b.gen](Status st) { OnPut(id, gen, st); });
}

void LowerTierMover::Charge(TenantId tenant, std::string key, uint64_t bytes) {
  const uint64_t quota = namespaces_->limits(tenant).quota_bytes[TierIndex(kind())];
  if (quota == 0) return;  // nothing to keep: no memory spent on tenants without one
  if (accounts_.size() <= tenant) accounts_.resize(tenant + 1);
  Account& a = accounts_[tenant];
  a.keys.emplace_back(std::move(key), bytes);
  a.bytes += bytes;
  while (a.bytes > quota && !a.keys.empty()) {
    tier_->Delete(a.keys.front().first);
    a.bytes -= a.keys.front().second;
    a.keys.pop_front();
    ++quota_deletes_;
  }
}

void LowerTierMover::OnPut(BlockId id, uint32_t gen, const Status& st) {
  --puts_in_flight_;
  const BlockTable::Block& b = blocks_->block(id);
  // The page was pinned: the block cannot have left host meanwhile.
  KVTIER_CHECK(b.live && b.gen == gen && b.readers[TierIndex(TierKind::kHost)] > 0)
      << "lower-tier put completion for a block that moved";
  blocks_->EndRead(id);
  if (st.code() == StatusCode::kResourceExhausted) {
    const int64_t now = SystemClock::Default()->NowNanos();
    if (now >= backoff_until_ns_) {
      backoff_ns_ = backoff_ns_ ? std::min(backoff_ns_ * 2, kMaxBackoff_ns) : kFirstBackoff_ns;
      backoff_until_ns_ = now + backoff_ns_;
      ++put_backoffs_;
      // What waits would be refused too: skipped, not sent after the pause.
      puts_skipped_ += put_queue_.size();
      put_queue_.clear();
      KVTIER_LOG(WARNING) << TierKindName(kind()) << " tier: puts back off for " << backoff_ns_ / 1'000'000
                          << " ms: the tier refuses writes for space (" << st.message() << ")";
    }
  } else if (st.ok() && backoff_ns_ != 0 && !backing_off()) {
    // A put answered after the pause ended: the tier takes writes again. One sent before
    // the pause and stored (memory hovers at the limit) neither ends the pause nor resets it.
    backoff_ns_ = 0;
  }
  if (st.ok()) {
    blocks_->SetBelow(id, index_, true);
    ++counters_.puts;
    Charge(b.tenant, LowerBlockKey(b.ns, b.hash), namespaces_->Get(b.ns).block_bytes);
  } else {
    ++counters_.put_failures;
    KVTIER_LOG(DEBUG) << TierKindName(kind()) << " put failed: " << st.ToString();
  }
  hooks_.after_put();
  PumpPuts();
}

// ---- promotions ----------------------------------------------------------------------------

BlockId LowerTierMover::StartPromotion(NamespaceId ns, TenantId tenant, const BlockHash& hash) {
  const std::optional<PageId> page = blocks_->Take(TierKind::kHost, tenant);
  if (!page) return kNoBlock;
  const BlockId id = blocks_->Create(ns, tenant, hash, BlockHash());  // the parent comes with the value
  blocks_->SetBelow(id, index_, true);
  blocks_->BeginFill(id, *page);
  const uint32_t gen = blocks_->block(id).gen;
  promotions_[id] = gen;
  const NamespaceTable::Namespace& n = namespaces_->Get(ns);
  TierPool* pool = blocks_->pool(TierKind::kHost);
  tier_->Fetch(LowerBlockKey(ns, hash), n.fingerprint, static_cast<uint32_t>(n.block_bytes),
               {pool->PageAddress(*page), pool->page_bytes()},
               [this, id, gen](Status st, LowerBlockMeta meta) { OnPromoted(id, gen, st, meta); });
  return id;
}

void LowerTierMover::OnPromoted(BlockId id, uint32_t gen, const Status& st, const LowerBlockMeta& meta) {
  const BlockTable::Block& b = blocks_->block(id);
  KVTIER_CHECK(b.live && b.gen == gen && b.promoting()) << "lower-tier promotion completion for a block that moved";
  promotions_.erase(id);
  if (st.ok()) {
    if (BlockHash::ValidSize(meta.parent.size())) {
      blocks_->SetParent(id, BlockHash(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(meta.parent.data()),
                                                                meta.parent.size())));
    }
    blocks_->EndFill(id, true);
    ++counters_.promotions;
  } else {
    blocks_->EndFill(id, false);
    if (st.code() != StatusCode::kNotFound) ++counters_.promotion_failures;
  }
  hooks_.after_promotion(id, st);
}

// ---- lookups -------------------------------------------------------------------------------

void LowerTierMover::FindPrefix(NamespaceId ns, std::span<const BlockHash> hashes, std::function<void(size_t)> done) {
  auto keys_of = [this, ns](std::span<const BlockHash> hs) {
    std::vector<std::string> keys;
    keys.reserve(hs.size());
    for (const BlockHash& h : hs) keys.push_back(LowerBlockKey(ns, h));
    return keys;
  };
  auto leading = [](const std::vector<bool>& found) {
    size_t n = 0;
    while (n < found.size() && found[n]) ++n;
    return n;
  };
  const size_t first = std::min(hashes.size(), kFirstProbe);
  std::vector<std::string> rest = keys_of(hashes.subspan(first));
  tier_->Exists(keys_of(hashes.first(first)), [this, first, leading, rest = std::move(rest),
                                               done = std::move(done)](std::vector<bool> found) mutable {
    const size_t n = leading(found);
    if (n < first || rest.empty()) return done(n);
    // All of the first ones are there: the rest of the chain is worth asking about.
    tier_->Exists(std::move(rest),
                  [first, leading, done = std::move(done)](std::vector<bool> more) { done(first + leading(more)); });
  });
}

}  // namespace kvtier
