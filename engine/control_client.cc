#include "engine/control_client.h"

#include "engine/connection.h"
#include "engine/control_wire.h"

namespace kvtier {
namespace {

std::string Str(const flatbuffers::String* v) { return v ? v->str() : std::string(); }

}  // namespace

ControlClient::ControlClient(std::unique_ptr<Connection> conn) : conn_(std::move(conn)) {}
ControlClient::~ControlClient() = default;

Result<std::unique_ptr<ControlClient>> ControlClient::Connect(const ControlClientOptions& options) {
  if (!BlockHash::ValidSize(options.hash_bytes)) return InvalidArgument("hash_bytes must be 16 or 32");
  Connection::HelloArgs hello;
  hello.role = fb::Role::Control;
  hello.engine_name = options.name;
  hello.hash_bytes = options.hash_bytes;
  KVTIER_ASSIGN_OR_RETURN(auto conn,
                          Connection::Open(options.socket_path, options.timeout_ms, hello, nullptr, nullptr));
  return std::unique_ptr<ControlClient>(new ControlClient(std::move(conn)));
}

uint64_t ControlClient::session_id() const { return conn_->session().id; }
int ControlClient::fd() const { return conn_->fd(); }

Status ControlClient::Ping(size_t payload_bytes) { return conn_->Ping(payload_bytes); }

DaemonStats StatsFromWire(const fb::StatsReply& reply) {
  const fb::StatsReply* s = &reply;
  DaemonStats out;
  out.version = Str(s->version());
  out.uptime_s = s->uptime_s();
  out.metrics_url = Str(s->metrics_url());
  out.epoch = s->daemon_epoch();
  out.session_count = s->session_count();
  out.lookups = s->lookups();
  out.block_hits = s->block_hits();
  out.block_misses = s->block_misses();
  out.checksum_failures = s->checksum_failures();
  out.io_errors = s->io_errors();
  out.demotions = s->demotions();
  out.promotions = s->promotions();
  out.pending_fetches = s->pending_fetches();
  out.gpu_demotions = s->gpu_demotions();
  out.refetches_after_evict = s->refetches_after_evict();
  out.spill_bytes = s->spill_bytes();
  out.fetch_bytes = s->fetch_bytes();
  out.draining = s->draining();
  out.evictions = s->evictions();
  if (const fb::RemoteTierStats* rs = s->remote()) {
    RemoteStatsInfo ri;
    if (rs->nodes()) {
      for (const fb::RemoteNode* n : *rs->nodes()) ri.nodes.push_back({Str(n->address()), n->up(), n->failures()});
    }
    ri.write_policy = Str(rs->write_policy());
    ri.lookups = rs->lookups();
    ri.lookup_hits = rs->lookup_hits();
    ri.fetches = rs->fetches();
    ri.fetch_hits = rs->fetch_hits();
    ri.fetch_bytes = rs->fetch_bytes();
    ri.puts = rs->puts();
    ri.put_bytes = rs->put_bytes();
    ri.errors = rs->errors();
    ri.checksum_failures = rs->checksum_failures();
    ri.lookup_mean_s = rs->lookup_mean_s();
    ri.fetch_mean_s = rs->fetch_mean_s();
    ri.put_mean_s = rs->put_mean_s();
    ri.puts_in_flight = rs->puts_in_flight();
    ri.puts_queued = rs->puts_queued();
    ri.puts_skipped = rs->puts_skipped();
    ri.breaker_rejections = rs->breaker_rejections();
    ri.timeouts = rs->timeouts();
    ri.puts_failed = rs->puts_failed();
    ri.authenticated = rs->authenticated();
    out.remote = std::move(ri);
  }
  if (s->lower()) {
    for (const fb::LowerTierStats* l : *s->lower()) {
      LowerTierStatsInfo li;
      li.tier = TierFromWire(l->tier());
      li.name = Str(l->name());
      li.describe = Str(l->describe());
      li.available = l->available();
      li.write_policy = Str(l->write_policy());
      li.hits = l->hits();
      li.promotions = l->promotions();
      li.puts = l->puts();
      li.put_failures = l->put_failures();
      li.puts_skipped = l->puts_skipped();
      li.puts_in_flight = l->puts_in_flight();
      li.puts_queued = l->puts_queued();
      li.put_backoffs = l->put_backoffs();
      li.quota_deletes = l->quota_deletes();
      li.checksum_failures = l->checksum_failures();
      li.authenticated = l->authenticated();
      if (l->nodes()) {
        for (const fb::RemoteNode* n : *l->nodes()) li.nodes.push_back({Str(n->address()), n->up(), n->failures()});
      }
      if (l->figures()) {
        for (const fb::TierFigure* f : *l->figures())
          li.figures.push_back({Str(f->key()), f->value(), Str(f->label())});
      }
      out.lower.push_back(std::move(li));
    }
  }
  if (const fb::EventsStats* es = s->events()) {
    out.events = DaemonStats::Events{Str(es->publish()), Str(es->replay()),   es->subscribers(), es->replay_peers(),
                                     es->events(),       es->messages(),      es->dropped(),     es->refused(),
                                     es->retracted(),    es->first_sequence()};
  }
  if (s->tiers()) {
    for (const fb::TierStats* t : *s->tiers()) {
      TierStatsInfo i;
      i.tier = TierFromWire(t->tier());
      i.name = Str(t->name());
      i.page_bytes = t->page_bytes();
      i.capacity_pages = t->capacity_pages();
      i.free_pages = t->free_pages();
      i.leased_pages = t->leased_pages();
      i.inflight_pages = t->inflight_pages();
      i.cached_pages = t->cached_pages();
      i.referenced_pages = t->referenced_pages();
      i.quarantined_pages = t->quarantined_pages();
      i.blocks = t->blocks();
      i.evictions = t->evictions();
      i.high_watermark = t->high_watermark();
      i.low_watermark = t->low_watermark();
      i.backend = Str(t->backend());
      i.io_backend = Str(t->io_backend());
      i.index_backend = Str(t->index_backend());
      i.ready = t->ready();
      out.tiers.push_back(std::move(i));
    }
  }
  if (s->sessions()) {
    for (const fb::SessionInfo* x : *s->sessions()) {
      SessionStatsInfo i;
      i.id = x->id();
      i.control = x->role() == fb::Role::Control;
      i.engine_name = Str(x->engine_name());
      i.pid = x->pid();
      i.engine_pid = x->engine_pid();
      i.watched = x->watched();
      i.uid = x->uid();
      i.gid = x->gid();
      i.tenant = Str(x->tenant());
      i.namespace_id = Str(x->namespace_id());
      i.model = Str(x->model());
      i.leased_pages = x->leased_pages();
      i.referenced_blocks = x->referenced_blocks();
      i.requests = x->requests();
      i.connected_s = x->connected_s();
      out.sessions.push_back(std::move(i));
    }
  }
  if (s->agent_sessions()) {
    for (const fb::AgentSessionInfo* x : *s->agent_sessions()) {
      out.agent_sessions.push_back(AgentSessionStatsInfo{Str(x->tenant()), Str(x->session()), Str(x->state()),
                                                         x->ttl_left_ms(), x->requests(), x->hit_tokens(), x->blocks(),
                                                         x->gpu_blocks(), x->host_blocks(), x->protected_blocks()});
    }
  }
  return out;
}

Result<DaemonStats> ControlClient::Stats(bool with_sessions, bool with_agents) {
  auto& b = conn_->builder();
  KVTIER_ASSIGN_OR_RETURN(Ticket t, conn_->Send(fb::Op::Stats, fb::CreateStats(b, with_sessions, with_agents).Union()));
  DaemonStats out;
  KVTIER_RETURN_IF_ERROR(conn_->Wait(t, fb::Reply::StatsReply, [&](const fb::Response& r) {
    out = StatsFromWire(*r.reply_as_StatsReply());
    return Status::Ok();
  }));
  return out;
}

Result<VerifyReport> ControlClient::Verify() {
  auto& b = conn_->builder();
  KVTIER_ASSIGN_OR_RETURN(Ticket t, conn_->Send(fb::Op::VerifyTier, fb::CreateVerifyTier(b).Union()));
  const int saved = conn_->timeout_ms();
  KVTIER_RETURN_IF_ERROR(conn_->set_timeout_ms(0));  // a scrub of a large tier takes as long as it takes
  VerifyReport out;
  Status st = conn_->Wait(t, fb::Reply::VerifyTierReply, [&](const fb::Response& r) {
    const fb::VerifyTierReply* v = r.reply_as_VerifyTierReply();
    out.checked = v->checked();
    out.dropped = v->dropped();
    out.seconds = v->seconds();
    return Status::Ok();
  });
  KVTIER_RETURN_IF_ERROR(conn_->set_timeout_ms(saved));
  KVTIER_RETURN_IF_ERROR(st);
  return out;
}

Result<uint32_t> ControlClient::Hint(const std::string& namespace_id, std::string_view session,
                                     std::span<const BlockHash> chain, int64_t ttl_ms, bool end, bool prefetch) {
  if (namespace_id.empty()) return InvalidArgument("a control session's hint names its namespace");
  return conn_->SessionHint(session, chain, ttl_ms, end, namespace_id, 0, prefetch);
}

Result<std::vector<BlockExplanation>> ControlClient::Explain(std::span<const BlockHash> hashes,
                                                             const std::string& namespace_id) {
  auto& b = conn_->builder();
  auto hv = HashesToWire(b, hashes);
  auto ns = b.CreateString(namespace_id);
  KVTIER_ASSIGN_OR_RETURN(Ticket t, conn_->Send(fb::Op::Explain, fb::CreateExplain(b, hv, ns).Union()));
  std::vector<BlockExplanation> out;
  KVTIER_RETURN_IF_ERROR(conn_->Wait(t, fb::Reply::ExplainReply, [&](const fb::Response& r) {
    const auto* entries = r.reply_as_ExplainReply()->entries();
    if (!entries || entries->size() != hashes.size()) return Internal("explain reply has the wrong entry count");
    for (const fb::Explanation* e : *entries) {
      BlockExplanation i;
      i.state = BlockStateFromWire(e->state());
      i.tier = TierFromWire(e->tier()).value_or(TierKind::kHost);
      i.on_nvme = e->on_nvme();
      i.writing = e->writing();
      i.namespace_id = Str(e->namespace_id());
      i.tenant = Str(e->tenant());
      i.model = Str(e->model());
      i.seconds_ago = e->seconds_ago();
      i.detail = Str(e->detail());
      out.push_back(std::move(i));
    }
    return Status::Ok();
  }));
  return out;
}

Result<std::vector<BlockInfo>> ControlClient::Blocks(std::optional<TierKind> tier, const std::string& namespace_id,
                                                     bool by_recent, uint32_t limit) {
  auto& b = conn_->builder();
  auto ns = b.CreateString(namespace_id);
  const auto order = by_recent ? fb::BlockOrder::Recent : fb::BlockOrder::Hits;
  KVTIER_ASSIGN_OR_RETURN(Ticket t,
                          conn_->Send(fb::Op::Blocks, fb::CreateBlocks(b, TierToWire(tier), ns, order, limit).Union()));
  std::vector<BlockInfo> out;
  KVTIER_RETURN_IF_ERROR(conn_->Wait(t, fb::Reply::BlocksReply, [&](const fb::Response& r) {
    const auto* blocks = r.reply_as_BlocksReply()->blocks();
    if (!blocks) return Status::Ok();
    for (const fb::BlockInfo* x : *blocks) {
      BlockInfo i;
      if (x->hash() && BlockHash::ValidSize(x->hash()->size())) {
        i.hash = BlockHash(std::span<const uint8_t>(x->hash()->data(), x->hash()->size()));
      }
      i.namespace_id = Str(x->namespace_id());
      i.tenant = Str(x->tenant());
      i.model = Str(x->model());
      i.tier = TierFromWire(x->tier()).value_or(TierKind::kHost);
      i.on_nvme = x->on_nvme();
      i.bytes = x->bytes();
      i.hits = x->hits();
      i.refs = x->refs();
      i.idle_s = x->idle_s();
      out.push_back(std::move(i));
    }
    return Status::Ok();
  }));
  return out;
}

Result<EvictReport> ControlClient::Evict(TierKind tier, uint64_t bytes) {
  auto& b = conn_->builder();
  KVTIER_ASSIGN_OR_RETURN(Ticket t, conn_->Send(fb::Op::Evict, fb::CreateEvict(b, TierToWire(tier), bytes).Union()));
  EvictReport out;
  KVTIER_RETURN_IF_ERROR(conn_->Wait(t, fb::Reply::EvictReply, [&](const fb::Response& r) {
    const auto* e = r.reply_as_EvictReply();
    out.blocks = e->blocks();
    out.bytes = e->bytes();
    out.demoting = e->demoting();
    return Status::Ok();
  }));
  return out;
}

Result<DrainStatus> ControlClient::Drain(bool start, bool query) {
  auto& b = conn_->builder();
  KVTIER_ASSIGN_OR_RETURN(Ticket t, conn_->Send(fb::Op::Drain, fb::CreateDrain(b, start, query).Union()));
  DrainStatus out;
  KVTIER_RETURN_IF_ERROR(conn_->Wait(t, fb::Reply::DrainReply, [&](const fb::Response& r) {
    const auto* d = r.reply_as_DrainReply();
    out.draining = d->draining();
    out.gpu_blocks_left = d->gpu_blocks_left();
    out.gpu_blocks_pinned = d->gpu_blocks_pinned();
    out.host_blocks_unspilled = d->host_blocks_unspilled();
    out.spills_in_flight = d->spills_in_flight();
    return Status::Ok();
  }));
  return out;
}

}  // namespace kvtier
