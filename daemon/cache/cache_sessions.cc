// CacheManager: agentic sessions' hints (cache_manager.h, "agentic sessions' hints"). A
// session table per tenant (storage/policy/session_table.h) says of each block whether a
// live session will use it again (protected), whether only ended sessions used it
// (expendable) or neither; the block table's policies apply the class in every pool tier
// the block is in (retention_policy.h), protection up to the tenant's share of the tier.
#include <algorithm>

#include "daemon/cache/cache_manager.h"

namespace kvtier {

SessionTable& CacheManager::SessionsOf(TenantId tenant) {
  if (session_tables_.size() <= tenant) session_tables_.resize(tenant + 1);
  auto& t = session_tables_[tenant];
  if (!t) {
    SessionTable::Options o;
    o.max_ttl_ns = options_.sessions.max_ttl_ns;
    o.max_sessions = options_.sessions.max_per_tenant;
    t = std::make_unique<SessionTable>(o,
                                       [this, tenant](uint32_t block, Retention r, int64_t expected, uint32_t depth) {
                                         ApplyRetention(tenant, block, r, expected, depth);
                                       });
  }
  return *t;
}

bool CacheManager::ProtectionRoom(TierKind tier, TenantId tenant) {
  if (!blocks_->enabled(tier)) return false;
  const double cap = options_.sessions.protected_share * static_cast<double>(blocks_->pool(tier)->capacity());
  return static_cast<double>(blocks_->Policy(tier, tenant).protected_blocks()) < cap;
}

void CacheManager::ApplyRetention(TenantId tenant, BlockId id, Retention r, int64_t expected_return, uint32_t depth) {
  const BlockTable::Block& b = blocks_->block(id);
  if (!b.live || b.tenant != tenant) return;
  for (TierKind tier : {TierKind::kGpu, TierKind::kHost}) {
    if (!blocks_->enabled(tier) || b.page[TierIndex(tier)] == kNoPage) continue;
    RetentionPolicy& p = blocks_->Policy(tier, tenant);
    Retention give = r;
    if (r == Retention::kProtected && p.retention(id) != Retention::kProtected && !ProtectionRoom(tier, tenant)) {
      ++session_counts_.over_share;  // the tenant's share is full: hints cannot pin a tier
      give = Retention::kOrdinary;
    }
    p.SetRetention(id, give, expected_return, depth);
  }
}

Result<uint32_t> CacheManager::Hint(TenantId tenant, NamespaceId ns, std::string_view session,
                                    std::span<const BlockHash> chain, int64_t ttl_ns, bool end, uint64_t hit_tokens,
                                    bool prefetch) {
  std::vector<BlockId> ids(chain.size());
  const size_t n = blocks_->FindPrefix(ns, chain, ids.data());
  std::vector<uint32_t> blocks(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n));
  SessionTable& t = SessionsOf(tenant);
  if (!t.Request(session, clock_->NowNanos(), blocks, ttl_ns, end)) {
    ++session_counts_.refused;
    return ResourceExhausted("the tenant holds " + std::to_string(t.live_sessions()) +
                             " live sessions (sessions.max_per_tenant): a new session's hint is dropped");
  }
  ++session_counts_.hints;
  session_counts_.hit_tokens += hit_tokens;
  t.CreditHits(session, hit_tokens);
  if (prefetch) {
    // From the first block no pool tier holds (or is reading up), as Lookup walks.
    size_t from = 0;
    while (from < n && (blocks_->ReadableTier(blocks_->block(ids[from])) || blocks_->block(ids[from]).promoting())) {
      ++from;
    }
    // The walk is the daemon's (a session id no client has), so the caller may go.
    if (from < chain.size()) walk_->Prefetch(kDaemonSession, ns, tenant, chain, from);
  }
  return static_cast<uint32_t>(n);
}

Result<std::pair<TenantId, NamespaceId>> CacheManager::ResolveNamespace(std::string_view hex,
                                                                        const std::string* tenant) {
  for (NamespaceId ns = 0; ns < namespaces_.id_limit(); ++ns) {
    if (!namespaces_.live(ns) || namespaces_.Hex(ns) != hex) continue;
    const std::string& owner = namespaces_.Get(ns).tenant;
    if (tenant != nullptr && *tenant != owner) {
      return PermissionDenied("namespace " + std::string(hex) + " is another tenant's");
    }
    return std::make_pair(namespaces_.InternTenant(owner), ns);
  }
  return NotFound("no namespace " + std::string(hex) + " is in use");
}

void CacheManager::ExpireSessions() {
  const int64_t now = clock_->NowNanos();
  for (auto& t : session_tables_) {
    if (t) t->Expire(now);
  }
}

std::vector<CacheManager::AgentSessionRow> CacheManager::AgentSessions(const std::string* tenant) {
  std::vector<AgentSessionRow> out;
  const int64_t now = clock_->NowNanos();
  for (TenantId t = 0; t < session_tables_.size(); ++t) {
    if (!session_tables_[t] || (tenant != nullptr && *tenant != namespaces_.tenant_name(t))) continue;
    session_tables_[t]->ForEachSession([&](const SessionTable::View& v, std::span<const uint32_t> ids) {
      AgentSessionRow r{namespaces_.tenant_name(t), std::string(v.id), std::string(v.state)};
      r.ttl_left_ns = v.state == "live" ? std::max<int64_t>(0, v.until - now) : 0;
      r.requests = v.requests;
      r.hit_tokens = v.hit_tokens;
      for (uint32_t id : ids) {
        const BlockTable::Block& b = blocks_->block(id);
        if (!b.live || b.tenant != t) continue;
        ++r.blocks;
        bool guarded = false;
        for (TierKind tier : {TierKind::kGpu, TierKind::kHost}) {
          if (!blocks_->enabled(tier) || b.page[TierIndex(tier)] == kNoPage) continue;
          ++(tier == TierKind::kGpu ? r.gpu_blocks : r.host_blocks);
          guarded = guarded || blocks_->Policy(tier, t).retention(id) == Retention::kProtected;
        }
        r.protected_blocks += guarded ? 1 : 0;
      }
      out.push_back(std::move(r));
    });
  }
  return out;
}

CacheManager::SessionStats CacheManager::session_stats() const {
  SessionStats s = session_counts_;
  for (const auto& t : session_tables_) {
    if (!t) continue;
    s.expired += t->expired();
    s.clamped += t->clamped();
    s.live += t->live_sessions();
    s.sessions += t->sessions();
  }
  for (TierKind tier : {TierKind::kGpu, TierKind::kHost}) {
    if (blocks_->enabled(tier)) s.protected_blocks[TierIndex(tier)] = blocks_->protected_blocks(tier);
  }
  return s;
}

}  // namespace kvtier
