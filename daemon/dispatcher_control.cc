// The Dispatcher's handlers of operators' and routers' requests (the op table's Control and
// Admin rows): Stats, Explain, Blocks, Evict, Drain, SessionHint. Framing, verification,
// access and the engines' ops are dispatcher.cc's.
#include <algorithm>
#include <limits>
#include <tuple>

#include "daemon/dispatcher.h"  // IWYU pragma: associated
#include "protocol/base/logging.h"
#include "protocol/base/tier.h"

namespace kvtier {

Dispatcher::Reply Dispatcher::OnStats(SessionContext& ctx, const fb::Request& req) {
  const fb::Stats& m = *req.op_as_Stats();
  std::vector<flatbuffers::Offset<fb::TierStats>> tiers;
  const NvmeTier* nvme = cache_->nvme();
  for (TierKind kind : kAllTiers) {
    if (!cache_->tier_enabled(kind) || IsLowerTier(kind)) continue;  // StatsReply.lower
    const TierStats t = cache_->Stats(kind);
    const TierCounts& c = t.counts;
    auto name = builder_.CreateString(TierKindName(kind));
    auto be = builder_.CreateString(t.backend);
    auto io = builder_.CreateString(t.io_backend);
    auto index = builder_.CreateString(t.index_backend);
    tiers.push_back(fb::CreateTierStats(builder_, TierToWire(kind), name, c.page_bytes, c.capacity, c.free, c.leased,
                                        c.inflight, c.cached, c.referenced, c.blocks,
                                        static_cast<float>(t.high_watermark), static_cast<float>(t.low_watermark),
                                        t.evictions, be, io, index, t.ready, c.quarantined));
  }
  auto tiers_vec = builder_.CreateVector(tiers);
  std::vector<flatbuffers::Offset<fb::SessionInfo>> sessions;
  uint32_t session_count = 0;
  const int64_t now = clock_->NowNanos();
  sessions_([&](const SessionContext& s) {
    // Other tenants' sessions are an admin's to see.
    if (!ctx.admin && s.tenant != ctx.tenant) return;
    ++session_count;
    if (!m.sessions()) return;
    const bool engine = s.role == fb::Role::Engine && s.hello_done;
    sessions.push_back(fb::CreateSessionInfo(
        builder_, s.id, s.role, builder_.CreateString(s.engine_name), s.pid, s.uid, s.gid,
        builder_.CreateString(s.tenant),
        builder_.CreateString(engine ? cache_->NamespaceHex(s.cache.ns()) : std::string()),
        builder_.CreateString(engine ? s.layout.ToString() : std::string()),
        static_cast<uint32_t>(s.cache.leased_pages()), static_cast<uint32_t>(s.cache.referenced_blocks()), s.requests,
        static_cast<double>(now - s.connected_ns) * 1e-9, s.engine_pid, s.watched));
  });
  auto sessions_vec = builder_.CreateVector(sessions);
  const CacheCounters& cc = cache_->counters();
  uint64_t hits = 0;
  for (uint64_t h : cc.block_hits) hits += h;
  uint64_t checksum = nvme ? nvme->counters().checksum_failures : 0;
  uint64_t evictions_total = nvme ? nvme->counters().evictions : 0;
  for (uint64_t e : cc.evictions) evictions_total += e;
  const uint64_t io_errors = nvme ? nvme->counters().io_errors : 0;
  std::vector<flatbuffers::Offset<fb::LowerTierStats>> lower;
  flatbuffers::Offset<fb::RemoteTierStats> remote;
  for (const auto& mover : cache_->lower_tiers()) {
    const LowerTierReport r = mover->tier().Report();
    checksum += r.checksum_failures;
    std::vector<flatbuffers::Offset<fb::RemoteNode>> nodes;
    for (const TierNode& n : r.nodes) {
      nodes.push_back(fb::CreateRemoteNode(builder_, builder_.CreateString(n.address), n.up, n.failures));
    }
    auto nodes_vec = builder_.CreateVector(nodes);
    auto policy = builder_.CreateString(mover->write_through() ? "write_through" : "write_back");
    if (mover->kind() == TierKind::kRemote && remote.IsNull()) remote = LegacyRemoteStats(*mover, r, nodes_vec, policy);
    std::vector<flatbuffers::Offset<fb::TierFigure>> figures;
    for (const TierFigure& f : r.figures) {
      const std::string label =
          f.label.first.empty() ? std::string() : std::string(f.label.first) + "=" + std::string(f.label.second);
      figures.push_back(
          fb::CreateTierFigure(builder_, builder_.CreateString(f.key), f.value, builder_.CreateString(label)));
    }
    const LowerTierMover::Counters& mc = mover->counters();
    lower.push_back(fb::CreateLowerTierStats(
        builder_, TierToWire(mover->kind()), builder_.CreateString(TierKindName(mover->kind())),
        builder_.CreateString(mover->tier().Describe()), mover->available(), policy,
        cc.block_hits[TierIndex(mover->kind())], mc.promotions, mc.puts, mc.put_failures, mover->puts_skipped(),
        mover->puts_in_flight(), static_cast<uint32_t>(mover->puts_queued()), mover->put_backoffs(),
        mover->quota_deletes(), r.checksum_failures, r.authenticated, nodes_vec, builder_.CreateVector(figures)));
  }
  flatbuffers::Offset<fb::EventsStats> events;
  if (const KvEvents* ev = cache_->events()) {
    const KvEvents::Counters c = ev->counters();
    events = fb::CreateEventsStats(builder_, builder_.CreateString(ev->publish_endpoint()),
                                   builder_.CreateString(ev->replay_endpoint()), c.subscribers, c.replay_peers,
                                   c.events, c.messages, c.dropped, c.refused, c.retracted, c.first_sequence);
  }
  std::vector<flatbuffers::Offset<fb::AgentSessionInfo>> agents;
  if (m.agent_sessions()) {
    // Other tenants' sessions are an admin's to see.
    for (const CacheManager::AgentSessionRow& r : cache_->AgentSessions(ctx.admin ? nullptr : &ctx.tenant)) {
      agents.push_back(fb::CreateAgentSessionInfo(builder_, builder_.CreateString(r.tenant),
                                                  builder_.CreateString(r.session), builder_.CreateString(r.state),
                                                  r.ttl_left_ns / 1'000'000, r.requests, r.hit_tokens, r.blocks,
                                                  r.gpu_blocks, r.host_blocks, r.protected_blocks));
    }
  }
  auto agents_vec = builder_.CreateVector(agents);
  auto body = fb::CreateStatsReply(
                  builder_, builder_.CreateString(info_->version), static_cast<double>(now - info_->started_ns) * 1e-9,
                  builder_.CreateString(info_->metrics_url), info_->epoch, tiers_vec, sessions_vec, session_count,
                  cc.lookups, hits, cc.block_misses, checksum, io_errors, cc.demotions, cc.promotions,
                  static_cast<uint32_t>(cache_->pending_promotions()), cc.gpu_demotions, cc.refetches_after_evict,
                  nvme ? nvme->counters().spill_bytes : 0, nvme ? nvme->counters().fetch_bytes : 0, cache_->draining(),
                  evictions_total, remote, events, builder_.CreateVector(lower), agents_vec)
                  .Union();
  return {fb::Reply::StatsReply, body};
}

// StatsReply.remote, for clients older than StatsReply.lower: the remote tier's report in
// the old table's fields.
flatbuffers::Offset<fb::RemoteTierStats> Dispatcher::LegacyRemoteStats(
    const LowerTierMover& mover, const LowerTierReport& r,
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::RemoteNode>>> nodes,
    flatbuffers::Offset<flatbuffers::String> write_policy) {
  auto u = [&r](std::string_view key) { return static_cast<uint64_t>(r.Figure(key)); };
  auto mean = [&r](std::string_view seconds, double n) { return n > 0 ? r.Figure(seconds) / n : 0.0; };
  return fb::CreateRemoteTierStats(
      builder_, nodes, write_policy, u("lookups"), u("lookup_hits"), u("fetches"), u("fetch_hits"), u("fetch_bytes"),
      u("puts"), u("put_bytes"), u("errors"), r.checksum_failures, mean("exists_seconds", r.Figure("lookups")),
      mean("fetch_seconds", r.Figure("fetches")), mean("put_seconds", r.Figure("puts") + r.Figure("puts_failed")),
      mover.puts_in_flight(), static_cast<uint32_t>(mover.puts_queued()), mover.puts_skipped(), u("breaker_rejections"),
      u("timeouts"), u("puts_failed"), r.authenticated);
}

Dispatcher::Reply Dispatcher::ExplainReply(Builder& b, const Result<std::vector<BlockExplanation>>& entries) {
  if (!entries.ok()) return entries.status();
  std::vector<flatbuffers::Offset<fb::Explanation>> out;
  for (const BlockExplanation& e : *entries) {
    out.push_back(fb::CreateExplanation(b, BlockStateToWire(e.state), TierToWire(e.tier), e.on_nvme, e.writing,
                                        b.CreateString(e.namespace_id), b.CreateString(e.tenant),
                                        b.CreateString(e.model), e.seconds_ago, b.CreateString(e.detail)));
  }
  return {fb::Reply::ExplainReply, fb::CreateExplainReply(b, b.CreateVector(out)).Union()};
}

Dispatcher::Reply Dispatcher::OnExplain(SessionContext& ctx, const fb::Request& req) {
  const fb::Explain& m = *req.op_as_Explain();
  KVTIER_ASSIGN_OR_RETURN(auto hashes, Hashes(ctx, m.hashes()));
  const std::string ns = m.namespace_id() ? m.namespace_id()->str() : std::string();
  // Answered now when it fits one slice (or is refused), else later, a slice a loop turn.
  struct Answer {
    bool later = false;
    std::optional<Result<std::vector<BlockExplanation>>> now;
  };
  auto answer = std::make_shared<Answer>();
  std::weak_ptr<ReplySink> c = ctx.async_sink;  // the session may be gone by then
  const uint64_t id = req.id();
  const int64_t start = clock_->NowNanos();
  cache_->views().Explain(hashes, ns, ctx.admin ? nullptr : &ctx.tenant, c,
                          [this, answer, c, id, start](Result<std::vector<BlockExplanation>> entries) {
                            if (!answer->later) {
                              answer->now.emplace(std::move(entries));
                              return;
                            }
                            SendLater(c, id, fb::Op::Explain, start,
                                      [&](Builder& b) { return ExplainReply(b, entries); });
                          });
  if (answer->now) return ExplainReply(builder_, *answer->now);
  answer->later = true;
  return Reply::Later();
}

Dispatcher::Reply Dispatcher::OnBlocks(SessionContext& ctx, const fb::Request& req) {
  const fb::Blocks& m = *req.op_as_Blocks();
  const std::optional<TierKind> tier = TierFromWire(m.tier());
  if (m.tier() != fb::Tier::None && !tier) return InvalidArgument("unknown tier");
  if (tier && !cache_->tier_enabled(*tier)) {
    return FailedPrecondition("the " + std::string(TierKindName(*tier)) + " tier is not configured");
  }
  const size_t limit = std::min<uint32_t>(m.limit(), info_->max_entries_per_request);
  const std::string ns = m.namespace_id() ? m.namespace_id()->str() : std::string();
  auto build = [](Builder& b, const std::vector<BlockInfo>& blocks) -> Reply {
    std::vector<flatbuffers::Offset<fb::BlockInfo>> out;
    for (const BlockInfo& i : blocks) {
      out.push_back(fb::CreateBlockInfo(b, b.CreateVector(i.hash.bytes().data(), i.hash.size()),
                                        b.CreateString(i.namespace_id), b.CreateString(i.tenant),
                                        b.CreateString(i.model), TierToWire(i.tier), i.on_nvme, i.bytes, i.hits, i.refs,
                                        i.idle_s));
    }
    return {fb::Reply::BlocksReply, fb::CreateBlocksReply(b, b.CreateVector(out)).Union()};
  };
  const auto order =
      m.order() == fb::BlockOrder::Recent ? CacheViews::BlockOrder::kRecent : CacheViews::BlockOrder::kHits;
  std::weak_ptr<ReplySink> sink = ctx.async_sink;
  const uint64_t id = req.id();
  const int64_t start = clock_->NowNanos();
  const bool sync = tier != TierKind::kNvme;  // the NVMe index is scanned on a thread
  Reply reply = Reply::Later();
  cache_->views().TopBlocks(tier, ns, ctx.admin ? nullptr : &ctx.tenant, order, limit, sink,
                            [&, build, sink, id, start, sync](std::vector<BlockInfo> blocks) {
                              if (sync) {
                                reply = build(builder_, blocks);
                                return;
                              }
                              SendLater(sink, id, fb::Op::Blocks, start, [&](Builder& b) { return build(b, blocks); });
                            });
  return reply;
}

Dispatcher::Reply Dispatcher::OnEvict(SessionContext& ctx, const fb::Request& req) {
  const fb::Evict& m = *req.op_as_Evict();
  const std::optional<TierKind> tier = TierFromWire(m.tier());
  if (!tier || !cache_->tier_enabled(*tier)) return InvalidArgument("evict needs a configured tier");
  const EvictReport r = cache_->Evict(*tier, m.bytes());
  KVTIER_LOG(NOTICE) << "session " << ctx.id << " (uid " << ctx.uid << "): evicted " << r.blocks << " blocks ("
                     << r.bytes << " bytes) from the " << TierKindName(*tier) << " tier";
  return {fb::Reply::EvictReply, fb::CreateEvictReply(builder_, r.blocks, r.bytes, r.demoting).Union()};
}

Dispatcher::Reply Dispatcher::OnDrain(SessionContext& ctx, const fb::Request& req) {
  const fb::Drain& m = *req.op_as_Drain();
  if (!m.query() && m.start() != cache_->draining()) {
    KVTIER_LOG(NOTICE) << "session " << ctx.id << " (uid " << ctx.uid << "): drain "
                       << (m.start() ? "started: no new GPU leases, GPU -> host -> NVMe" : "ended");
    cache_->SetDrain(m.start());
  }
  const DrainStatus d = cache_->Drain();
  return {fb::Reply::DrainReply, fb::CreateDrainReply(builder_, d.draining, d.gpu_blocks_left, d.gpu_blocks_pinned,
                                                      d.host_blocks_unspilled, d.spills_in_flight)
                                     .Union()};
}

Dispatcher::Reply Dispatcher::OnSessionHint(SessionContext& ctx, const fb::Request& req) {
  const fb::SessionHint& m = *req.op_as_SessionHint();
  constexpr size_t kMaxSessionId = 256;
  if (m.session() == nullptr || m.session()->size() == 0) return InvalidArgument("a session hint needs a session id");
  if (m.session()->size() > kMaxSessionId) {
    return InvalidArgument("session id of " + std::to_string(m.session()->size()) + " bytes (at most " +
                           std::to_string(kMaxSessionId) + ")");
  }
  if (m.ttl_ms() < -1) return InvalidArgument("ttl_ms " + std::to_string(m.ttl_ms()) + ": -1 (none) or at least 0");
  KVTIER_ASSIGN_OR_RETURN(auto hashes, Hashes(ctx, m.hashes()));
  TenantId tenant = ctx.cache.tenant();
  NamespaceId ns = ctx.cache.ns();
  if (ctx.role == fb::Role::Control) {
    // A router or an operator: a namespace of its tenant (an admin's: any).
    if (m.namespace_id() == nullptr) return InvalidArgument("a control session's hint names its namespace_id");
    KVTIER_ASSIGN_OR_RETURN(
        auto found, cache_->ResolveNamespace(m.namespace_id()->string_view(), ctx.admin ? nullptr : &ctx.tenant));
    std::tie(tenant, ns) = found;
  } else if (m.namespace_id() != nullptr) {
    return InvalidArgument("an engine hints its own namespace: namespace_id is for control sessions");
  }
  // In nanoseconds without overflowing (sessions.max_ttl clamps it after).
  constexpr int64_t kMaxTtlMs = std::numeric_limits<int64_t>::max() / 1'000'000;
  const int64_t ttl_ns = m.ttl_ms() < 0 ? -1 : std::min(m.ttl_ms(), kMaxTtlMs) * 1'000'000;
  KVTIER_ASSIGN_OR_RETURN(uint32_t blocks, cache_->Hint(tenant, ns, m.session()->string_view(), hashes, ttl_ns, m.end(),
                                                        m.hit_tokens(), m.prefetch()));
  return {fb::Reply::SessionHintReply, fb::CreateSessionHintReply(builder_, blocks).Union()};
}

}  // namespace kvtier
