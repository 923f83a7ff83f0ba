// CacheViews: what operators ask of the cache (kvctl explain, kvctl blocks).

#include "daemon/cache/cache_views.h"

#include <algorithm>
#include <cstdio>
#include <iterator>

#include "protocol/base/block_key.h"

namespace kvtier {
namespace {

std::string Ago(double s) {
  char buf[64];
  if (s < 120)
    std::snprintf(buf, sizeof(buf), "%.1f s ago", s);
  else if (s < 7200)
    std::snprintf(buf, sizeof(buf), "%.0f min ago", s / 60);
  else
    std::snprintf(buf, sizeof(buf), "%.1f h ago", s / 3600);
  return buf;
}

}  // namespace

CacheViews::CacheViews(const NamespaceTable* namespaces, const BlockTable* blocks, NvmeMover* mover,
                       const EvictionHistory* history, const Clock* clock, Post post)
    : namespaces_(namespaces),
      blocks_(blocks),
      mover_(mover),
      history_(history),
      clock_(clock),
      post_(std::move(post)) {}

bool CacheViews::Visible(NamespaceId ns, std::string_view ns_hex, const std::string* tenant) const {
  if (!namespaces_->live(ns)) return false;
  const NamespaceTable::Namespace& n = namespaces_->Get(ns);
  if (tenant && n.tenant != *tenant) return false;
  return ns_hex.empty() || namespaces_->Hex(ns) == ns_hex;
}

void CacheViews::ExplainScope(std::string_view ns_hex, const std::string* tenant, std::vector<NamespaceId>* asked,
                              std::vector<NamespaceId>* others) const {
  for (NamespaceId ns = 0; ns < namespaces_->id_limit(); ++ns) {
    if (Visible(ns, ns_hex, tenant)) {
      asked->push_back(ns);
    } else if (namespaces_->live(ns) && (!tenant || namespaces_->Get(ns).tenant == *tenant)) {
      others->push_back(ns);
    }
  }
}

struct CacheViews::ExplainJob {
  std::vector<BlockHash> hashes;
  std::string ns_hex;
  std::optional<std::string> tenant;
  std::string caller;  // jobs_by_caller_'s key: the tenant, "" for admins
  std::weak_ptr<const void> owner;
  size_t slice = 1;  // hashes per loop turn
  std::vector<BlockExplanation> out;
  ExplainDone done;
};

void CacheViews::Explain(std::span<const BlockHash> hashes, std::string_view ns_hex, const std::string* tenant,
                         std::weak_ptr<const void> owner, ExplainDone done) {
  std::vector<NamespaceId> asked, others;
  ExplainScope(ns_hex, tenant, &asked, &others);
  const size_t spaces = asked.size() + others.size();
  const uint64_t probes = static_cast<uint64_t>(hashes.size()) * spaces;
  if (tenant && probes > kMaxExplainProbes) {
    return done(InvalidArgument("explain of " + std::to_string(hashes.size()) + " hashes over " +
                                std::to_string(spaces) + " namespaces is " + std::to_string(probes) +
                                " index probes, over the " + std::to_string(kMaxExplainProbes) +
                                " a request may make: name a namespace or ask fewer hashes"));
  }
  const size_t slice = std::max<size_t>(1, kExplainSliceProbes / std::max<size_t>(1, spaces));
  if (!post_ || hashes.size() <= slice) {
    return done(ExplainSlice(hashes, ns_hex, tenant));  // one turn's work
  }
  const std::string caller = tenant ? *tenant : std::string();
  size_t& mine = jobs_by_caller_[caller];
  if (mine >= kMaxExplainJobsPerCaller || jobs_.size() >= kMaxExplainJobs) {
    ++jobs_refused_;
    const bool own = mine >= kMaxExplainJobsPerCaller;
    if (mine == 0) jobs_by_caller_.erase(caller);
    return done(
        ResourceExhausted(own ? "tenant '" + caller + "' has " + std::to_string(kMaxExplainJobsPerCaller) +
                                    " explains in progress: wait for one to answer"
                              : std::to_string(kMaxExplainJobs) + " explains are in progress: try again shortly"));
  }
  ++mine;
  auto job = std::make_shared<ExplainJob>();
  job->hashes.assign(hashes.begin(), hashes.end());
  job->ns_hex = ns_hex;
  if (tenant) job->tenant = *tenant;
  job->caller = caller;
  job->owner = std::move(owner);
  job->slice = slice;
  job->out.reserve(hashes.size());
  job->done = std::move(done);
  jobs_.push_back(std::move(job));
  if (!turn_posted_) {
    turn_posted_ = true;
    post_([this] { ExplainTurn(); });
  }
}

void CacheViews::ExplainTurn() {
  // One slice a loop turn, of each explain in turn: other sessions are served between any
  // two. The scope is computed again per slice, so a namespace ended (and its id reused)
  // meanwhile is never probed for a caller who may not see it.
  turn_posted_ = false;
  if (jobs_.empty()) return;
  std::shared_ptr<ExplainJob> job = std::move(jobs_.front());
  jobs_.pop_front();
  bool finished = job->owner.expired();
  if (finished) {
    ++jobs_dropped_;
  } else {
    const size_t at = job->out.size();
    const size_t n = std::min(job->slice, job->hashes.size() - at);
    std::vector<BlockExplanation> part = ExplainSlice(std::span<const BlockHash>(job->hashes).subspan(at, n),
                                                      job->ns_hex, job->tenant ? &*job->tenant : nullptr);
    std::move(part.begin(), part.end(), std::back_inserter(job->out));
    finished = job->out.size() == job->hashes.size();
  }
  if (finished) {
    auto it = jobs_by_caller_.find(job->caller);
    if (--it->second == 0) jobs_by_caller_.erase(it);
  } else {
    jobs_.push_back(job);
  }
  if (!jobs_.empty()) {
    turn_posted_ = true;
    post_([this] { ExplainTurn(); });
  }
  if (finished && !job->owner.expired()) job->done(std::move(job->out));
}

std::vector<BlockExplanation> CacheViews::ExplainSlice(std::span<const BlockHash> hashes, std::string_view ns_hex,
                                                       const std::string* tenant) {
  // The namespaces asked about, and the caller's others (step 3).
  std::vector<NamespaceId> asked, others;
  ExplainScope(ns_hex, tenant, &asked, &others);
  std::vector<BlockExplanation> out(hashes.size());
  std::vector<size_t> open(hashes.size());  // indices not yet explained
  for (size_t i = 0; i < open.size(); ++i) open[i] = i;
  auto found_in = [&](BlockExplanation& e, NamespaceId ns) {
    e.namespace_id = namespaces_->Hex(ns);
    e.tenant = namespaces_->Get(ns).tenant;
    e.model = namespaces_->Get(ns).model;
  };
  // Where each open hash is in `ns` (host/GPU block or NVMe index record), a namespace at a
  // time: one probe of the block table and one batched read of the index for all of them.
  std::vector<BlockHash> batch;
  std::vector<BlockId> ids;
  auto probe = [&](NamespaceId ns, auto&& on_found) {
    batch.clear();
    for (size_t i : open) batch.push_back(hashes[i]);
    ids.assign(batch.size(), kNoBlock);
    blocks_->FindMany(ns, batch, ids.data());
    std::vector<std::optional<BlockRecord>> recs(batch.size());
    if (mover_) {
      std::vector<BlockHash> missing;
      for (size_t k = 0; k < batch.size(); ++k) {
        if (ids[k] == kNoBlock) missing.push_back(batch[k]);
      }
      if (!missing.empty()) {
        auto r = mover_->FindMany(ns, missing);
        if (r.ok()) {
          for (size_t k = 0, m = 0; k < batch.size(); ++k) {
            if (ids[k] == kNoBlock) recs[k] = std::move((*r)[m++]);
          }
        }
      }
    }
    std::vector<size_t> still;
    for (size_t k = 0; k < batch.size(); ++k) {
      if (ids[k] == kNoBlock && !recs[k]) {
        still.push_back(open[k]);
      } else {
        on_found(out[open[k]], ns, ids[k]);
      }
    }
    open.swap(still);
  };
  // 1. Cached (or on its way up) in an asked namespace.
  for (NamespaceId ns : asked) {
    if (open.empty()) break;
    probe(ns, [&](BlockExplanation& e, NamespaceId at, BlockId id) {
      found_in(e, at);
      if (id != kNoBlock && blocks_->block(id).promoting()) {
        e.state = BlockExplanation::State::kInFlight;
        e.tier = TierKind::kHost;
        e.on_nvme = true;
        e.detail = "in flight: being read from NVMe into a host page; an Acquire now waits for it";
        return;
      }
      e.state = BlockExplanation::State::kCached;
      if (id != kNoBlock) {
        const Block& b = blocks_->block(id);
        e.tier = *blocks_->ReadableTier(b);
        e.on_nvme = b.page[TierIndex(TierKind::kNvme)] != kNoPage;
        e.writing = b.spilling();
      } else {
        e.tier = TierKind::kNvme;
        e.on_nvme = true;
      }
      e.detail = "a hit: cached in the " + std::string(TierKindName(e.tier)) + " tier" +
                 (e.tier != TierKind::kNvme && e.on_nvme ? " (and on NVMe)" : "") +
                 (e.writing ? "; its NVMe copy is being written" : "");
    });
  }
  // 2. Evicted from an asked namespace, while the history remembers it.
  const int64_t now = clock_->NowNanos();
  std::vector<size_t> still;
  for (size_t i : open) {
    BlockExplanation& e = out[i];
    for (NamespaceId ns : asked) {
      const EvictionHistory::Record* rec = history_->Find(namespaces_->BlockKey(ns, hashes[i]));
      if (rec == nullptr) continue;
      found_in(e, ns);
      e.state = BlockExplanation::State::kEvicted;
      e.tier = rec->tier;
      e.seconds_ago = static_cast<double>(now - rec->at_ns) * 1e-9;
      e.detail = "evicted: its last copy left the " + std::string(TierKindName(e.tier)) + " tier " +
                 Ago(e.seconds_ago) +
                 (e.tier == TierKind::kNvme ? " (the NVMe tier was full)"
                  : mover_                  ? " (not demoted: the NVMe tier was backing off or busy)"
                                            : " (no NVMe tier to demote it to)");
      break;
    }
    if (e.state == BlockExplanation::State::kNeverStored) still.push_back(i);
  }
  open.swap(still);
  // 3. Stored under another namespace the caller may see: another model or layout (its
  // fingerprint differs), or another tenant (admins only see those).
  for (NamespaceId ns : others) {
    if (open.empty()) break;
    probe(ns, [&](BlockExplanation& e, NamespaceId at, BlockId) {
      found_in(e, at);
      e.state = BlockExplanation::State::kOtherNamespace;
      e.detail = "not in the namespace asked about, but stored under tenant '" + e.tenant + "' model '" + e.model +
                 "' (namespace " + e.namespace_id +
                 "): engines see only blocks of their own tenant and exact layout (model, heads, dtype, "
                 "tokens per block, block bytes)";
    });
  }
  for (size_t i : open) {
    out[i].detail = "never stored (or evicted more than " + std::to_string(EvictionHistory::kCapacity) +
                    " evictions ago): no engine committed it, or it went before the history remembers";
  }
  return out;
}

BlockInfo CacheViews::InfoOf(BlockId id) const {
  const Block& b = blocks_->block(id);
  const NamespaceTable::Namespace& n = namespaces_->Get(b.ns);
  BlockInfo i;
  i.hash = b.hash;
  i.namespace_id = namespaces_->Hex(b.ns);
  i.tenant = n.tenant;
  i.model = n.model;
  i.tier = blocks_->ReadableTier(b).value_or(TierKind::kNvme);
  i.on_nvme = b.page[TierIndex(TierKind::kNvme)] != kNoPage;
  i.bytes = n.block_bytes;
  i.hits = b.hits;
  i.refs = b.refs;
  i.idle_s = static_cast<double>(clock_->NowNanos() - b.last_use_ns) * 1e-9;
  return i;
}

void CacheViews::TopBlocks(std::optional<TierKind> tier, std::string_view ns_hex, const std::string* tenant,
                           BlockOrder order, size_t limit, std::weak_ptr<const void> owner, BlocksDone done) {
  auto better = [order](const BlockInfo& a, const BlockInfo& b) {
    if (order == BlockOrder::kHits && a.hits != b.hits) return a.hits > b.hits;
    return a.idle_s < b.idle_s;
  };
  if (tier == TierKind::kNvme) {
    if (!mover_) return done({});
    // Only what the index knows: hit counts recorded when blocks were served from NVMe.
    // The tenant and namespace are taken on the scan thread (from the key alone), so the
    // control thread sees `limit` entries at most; the scan ends with its session.
    NvmeTier::ScanFilter filter;
    if (tenant || !ns_hex.empty()) {
      filter.keep = [want_ns = std::string(ns_hex),
                     want_tenant = tenant ? std::optional<std::string>(*tenant) : std::nullopt](std::string_view key) {
        std::string key_tenant, encoded;
        BlockHash hash;
        if (!DecodeBlockKey(key, &key_tenant, nullptr, &encoded, &hash)) return false;
        if (want_tenant && key_tenant != *want_tenant) return false;
        return want_ns.empty() || NamespaceTable::HexOf(encoded) == want_ns;
      };
    }
    filter.cancelled = [owner] { return owner.expired(); };
    const double now_s = clock_->WallSeconds();
    mover_->nvme().ScanTop(limit, order == BlockOrder::kRecent, std::move(filter),
                           [namespaces = namespaces_, now_s,
                            done = std::move(done)](std::vector<std::pair<std::string, BlockRecord>> entries) {
                             std::vector<BlockInfo> out;
                             for (const auto& [key, rec] : entries) {
                               BlockInfo i;
                               std::string encoded;
                               if (!DecodeBlockKey(key, &i.tenant, nullptr, &encoded, &i.hash)) continue;
                               i.namespace_id = NamespaceTable::HexOf(encoded);
                               if (auto ns = namespaces->Find(encoded)) i.model = namespaces->Get(*ns).model;
                               i.tier = TierKind::kNvme;
                               i.on_nvme = true;
                               i.bytes = rec.length;
                               i.hits = rec.hit_count;
                               i.idle_s = std::max(0.0, now_s - rec.last_access);
                               out.push_back(std::move(i));
                             }
                             done(std::move(out));
                           });
    return;
  }
  std::vector<BlockInfo> all;
  for (BlockId id = 0; id < blocks_->id_limit(); ++id) {
    const Block& b = blocks_->block(id);
    if (!b.live || b.promoting() || !Visible(b.ns, ns_hex, tenant)) continue;
    if (tier && b.page[TierIndex(*tier)] == kNoPage) continue;
    all.push_back(InfoOf(id));
    if (tier) all.back().tier = *tier;
  }
  const size_t n = std::min(limit, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), all.end(), better);
  all.resize(n);
  done(std::move(all));
}

}  // namespace kvtier
