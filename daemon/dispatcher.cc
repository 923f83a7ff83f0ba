#include "daemon/dispatcher.h"

#include <algorithm>

#include "protocol/base/logging.h"
#include "protocol/base/text.h"
#include "protocol/base/tier.h"
#include "protocol/op_table.h"

namespace kvtier {

Dispatcher::Dispatcher(CacheManager* cache, const DaemonInfo* info, const Clock* clock, MetricsRegistry* metrics,
                       SessionVisitor sessions, const TenantResolver* tenants)
    : cache_(cache), info_(info), clock_(clock), sessions_(std::move(sessions)), tenants_(tenants) {
  for (int op = 1; op <= static_cast<int>(fb::Op::MAX); ++op) {
    const std::string name(OpName(static_cast<fb::Op>(op)));
    op_metrics_[op].latency =
        metrics->AddHistogram("kvtier_rpc_duration_seconds",
                              "Time from a request frame being read to its response being queued, by operation.",
                              RpcLatencyBuckets(), {{"op", name}});
    op_metrics_[op].errors = metrics->AddCounter(
        "kvtier_rpc_errors_total", "Requests answered with a non-OK status, by operation.", {{"op", name}});
  }
  const char* help = "Inbound frames refused before any request was read, by reason.";
  rejected_malformed_ = metrics->AddCounter("kvtier_frames_rejected_total", help, {{"reason", "malformed"}});
  rejected_oversized_ = metrics->AddCounter("kvtier_frames_rejected_total", help, {{"reason", "oversized"}});
  rejected_truncated_ = metrics->AddCounter("kvtier_frames_rejected_total", help, {{"reason", "truncated"}});
}

void Dispatcher::Send(Builder& b, ReplySink& sink, uint64_t id, Reply reply) {
  if (!reply.status.ok()) {
    // No partial bodies with an error: start the response over.
    b.Clear();
    reply.type = fb::Reply::NONE;
    reply.fds.clear();
  }
  auto message =
      reply.status.ok() ? flatbuffers::Offset<flatbuffers::String>() : b.CreateString(reply.status.message());
  fb::ResponseBuilder rb(b);
  rb.add_id(id);
  rb.add_status(ToWire(reply.status.code()));
  if (!reply.status.ok()) rb.add_message(message);
  if (reply.type != fb::Reply::NONE) {
    rb.add_reply_type(reply.type);
    rb.add_reply(reply.body);
  }
  b.FinishSizePrefixed(rb.Finish());
  sink.Send({b.GetBufferPointer(), b.GetSize()}, reply.fds);
  b.Clear();
}

int64_t Dispatcher::Observe(int op, int64_t start_ns, const Status& st) {
  const int64_t now = clock_->NowNanos();
  if (op <= 0 || op > static_cast<int>(fb::Op::MAX)) return now;
  op_metrics_[op].latency->Observe(static_cast<double>(now - start_ns) * 1e-9);
  if (!st.ok()) op_metrics_[op].errors->Increment();
  return now;
}

void Dispatcher::RejectFrame(SessionContext& ctx, const Status& status, std::string_view reason, ReplySink& sink) {
  if (reason == "oversized")
    rejected_oversized_->Increment();
  else if (reason == "truncated")
    rejected_truncated_->Increment();
  else
    rejected_malformed_->Increment();
  KVTIER_LOG(NOTICE) << "session " << ctx.id << " (pid " << ctx.pid << "): " << reason << " frame: " << status.message()
                     << "; closing";
  builder_.Clear();
  Send(builder_, sink, 0, status);
  ctx.close_after_reply = true;
}

void Dispatcher::RejectConnection(SessionContext& ctx, const Status& status, ReplySink& sink) {
  builder_.Clear();
  Send(builder_, sink, 0, status);
  ctx.close_after_reply = true;
}

uint64_t Dispatcher::SessionClosed(SessionContext& ctx, bool quarantine_leases) {
  return cache_->Detach(ctx.cache, quarantine_leases);
}

void Dispatcher::QuarantineOver(uint64_t id) { cache_->ReleaseQuarantine(id); }

void Dispatcher::HandleFrame(SessionContext& ctx, std::span<const uint8_t> frame, ReplySink& sink) {
  // Frames served back to back start when the one before ended: one clock read a request.
  const int64_t start = chain_ns_ != 0 ? chain_ns_ : clock_->NowNanos();
  chain_ns_ = 0;
  frame_start_ns_ = start;
  auto req = VerifyRequestFrame(frame);
  if (!req.ok()) {
    RejectFrame(ctx, req.status(), "malformed", sink);
    return;
  }
  const fb::Request& r = **req;
  ++ctx.requests;
  builder_.Clear();
  Reply reply = Serve(ctx, r);
  if (reply.later && reply.status.ok()) return;  // answered later through ctx.async_sink
  const Status st = reply.status;
  if (reply.silent && st.ok()) {
    chain_ns_ = Observe(static_cast<int>(r.op_type()), start, st);
    return;
  }
  Send(builder_, sink, r.id(), std::move(reply));
  chain_ns_ = Observe(static_cast<int>(r.op_type()), start, st);
}

void Dispatcher::SendLater(SessionContext* ctx, uint64_t id, fb::Op op, int64_t start_ns, BuildReply build) {
  SendLater(ctx->async_sink, id, op, start_ns, std::move(build));
}

void Dispatcher::SendLater(const std::weak_ptr<ReplySink>& weak_sink, uint64_t id, fb::Op op, int64_t start_ns,
                           BuildReply build) {
  auto sink = weak_sink.lock();
  if (!sink) return;  // the connection is gone
  Builder& b = async_builder_;
  b.Clear();
  Reply reply = build(b);
  const Status st = reply.status;
  Send(b, *sink, id, std::move(reply));
  Observe(static_cast<int>(op), start_ns, st);
}

constexpr std::array<Dispatcher::HandlerRow, kOpCount> Dispatcher::kHandlers = {{
    {fb::Op::Hello, &Dispatcher::OnHello},
    {fb::Op::Allocate, &Dispatcher::OnAllocate},
    {fb::Op::Commit, &Dispatcher::OnCommit},
    {fb::Op::Release, &Dispatcher::OnRelease},
    {fb::Op::Lookup, &Dispatcher::OnLookup},
    {fb::Op::Acquire, &Dispatcher::OnAcquire},
    {fb::Op::Stats, &Dispatcher::OnStats},
    {fb::Op::Ping, &Dispatcher::OnPing},
    {fb::Op::VerifyTier, &Dispatcher::OnVerify},
    {fb::Op::Explain, &Dispatcher::OnExplain},
    {fb::Op::Blocks, &Dispatcher::OnBlocks},
    {fb::Op::Evict, &Dispatcher::OnEvict},
    {fb::Op::Drain, &Dispatcher::OnDrain},
    {fb::Op::SessionHint, &Dispatcher::OnSessionHint},
}};

Dispatcher::Reply Dispatcher::Serve(SessionContext& ctx, const fb::Request& req) {
  static_assert(
      [] {
        for (size_t i = 0; i < kOpCount; ++i) {
          if (kHandlers[i].op != kOpTable[i].op) return false;
        }
        return true;
      }(),
      "kHandlers must list one handler per op, in op_table.h's order");
  const OpSpec* spec = FindOp(req.op_type());
  if (spec == nullptr || spec->access != OpAccess::kOpen) {
    if (!ctx.hello_done) return FailedPrecondition("the first request must be Hello");
    if (spec == nullptr) return Unimplemented("unknown operation " + std::to_string(static_cast<int>(req.op_type())));
  }
  auto name = [spec] { return std::string(spec->name); };  // for the refusals only
  switch (spec->access) {
    case OpAccess::kOpen:
    case OpAccess::kSession:
      break;
    case OpAccess::kEngine:
      if (ctx.role != fb::Role::Engine) {
        return PermissionDenied("a control session cannot " + name() + "; connect with role Engine and a layout");
      }
      break;
    case OpAccess::kControl:
    case OpAccess::kAdmin:
      if (ctx.role != fb::Role::Control) return PermissionDenied(name() + " is for control sessions (kvctl)");
      // Changing the cache, or reading every block's bytes, is an admin's to do; explain and
      // blocks answer anyone, about their own tenant's namespaces.
      if (spec->access == OpAccess::kAdmin && !ctx.admin) {
        return PermissionDenied(name() + " is an admin operation: uid " + std::to_string(ctx.uid) +
                                " is not root, the daemon's uid or in security.admin_uids");
      }
      break;
  }
  return (this->*kHandlers[static_cast<size_t>(spec->op) - 1].fn)(ctx, req);
}

Dispatcher::Reply Dispatcher::OnPing(SessionContext&, const fb::Request& req) {
  const auto* p = req.op_as_Ping();
  if (p->no_reply()) return Reply::Silent();  // a keepalive: the frame itself was the point
  const uint8_t* data = p->payload() ? p->payload()->data() : nullptr;
  const size_t size = p->payload() ? p->payload()->size() : 0;
  return {fb::Reply::Pong, fb::CreatePong(builder_, builder_.CreateVector(data, size)).Union()};
}

Result<std::vector<BlockHash>> Dispatcher::Hashes(const SessionContext& ctx,
                                                  const flatbuffers::Vector<uint8_t>* v) const {
  KVTIER_ASSIGN_OR_RETURN(HashList list, HashList::Parse(v, ctx.hash_bytes));
  if (list.size() > info_->max_entries_per_request) {
    return InvalidArgument(std::to_string(list.size()) + " hashes exceed max_entries_per_request " +
                           std::to_string(info_->max_entries_per_request));
  }
  std::vector<BlockHash> out;
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) out.emplace_back(list.bytes(i));
  return out;
}

flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::Segment>>> Dispatcher::Segments(
    Builder& b, const std::vector<SegmentGrant>& grants, std::vector<int>* fds) {
  std::vector<flatbuffers::Offset<fb::Segment>> segs;
  for (const SegmentGrant& g : grants) {
    uint8_t slot = 255;
    if (g.fd >= 0) {
      slot = static_cast<uint8_t>(fds->size());
      fds->push_back(g.fd);
    }
    auto handle =
        g.ipc_handle.empty() ? flatbuffers::Offset<flatbuffers::Vector<uint8_t>>() : b.CreateVector(g.ipc_handle);
    segs.push_back(fb::CreateSegment(b, TierToWire(g.tier), g.index, g.first_page, g.num_pages, g.bytes, slot, handle));
  }
  return b.CreateVector(segs);
}

flatbuffers::Offset<flatbuffers::Vector<const fb::EntryResult*>> Dispatcher::Results(
    Builder& b, const std::vector<CacheResult>& results) {
  std::vector<fb::EntryResult> out;
  out.reserve(results.size());
  for (const CacheResult& r : results) {
    out.emplace_back(ToWire(r.status), r.duplicate ? fb::CommitOutcome::Duplicate : fb::CommitOutcome::Stored,
                     r.status == StatusCode::kOk ? TierToWire(r.tier) : fb::Tier::None, 0, r.page);
  }
  return b.CreateVectorOfStructs(out);
}

Dispatcher::Reply Dispatcher::OnHello(SessionContext& ctx, const fb::Request& req) {
  const fb::Hello& m = *req.op_as_Hello();
  if (ctx.hello_done) return FailedPrecondition("Hello was already received on this session");
  if (m.major() != kProtocolMajor) {
    ctx.close_after_reply = true;
    return FailedPrecondition("protocol major version " + std::to_string(m.major()) +
                              " is not supported (kvtierd speaks " + std::to_string(kProtocolMajor) + ")");
  }
  ctx.role = m.role();
  if (ctx.role != fb::Role::Engine && ctx.role != fb::Role::Control) {
    return InvalidArgument("unknown role");
  }
  // Shown in logs and kvctl's tables: control characters escaped, never written raw.
  ctx.engine_name = EscapeControlCharacters(m.engine_name() ? m.engine_name()->str().substr(0, 128) : "");
  ctx.engine_pid = m.pid() > 0 ? m.pid() : 0;
  auto grant = tenants_->Resolve(PeerCredentials{ctx.pid, ctx.uid, ctx.gid, ctx.groups});
  if (!grant.ok()) {
    ctx.close_after_reply = true;
    KVTIER_LOG(WARNING) << "session " << ctx.id << " refused: pid " << ctx.pid << ": " << grant.status().message();
    return grant.status();
  }
  ctx.tenant = grant->tenant;
  ctx.admin = grant->admin;
  if (ctx.role == fb::Role::Engine) {
    if (!BlockHash::ValidSize(m.hash_bytes())) return InvalidArgument("hash_bytes must be 16 or 32");
    if (m.layout() == nullptr) return InvalidArgument("an engine's Hello needs a layout");
    ctx.hash_bytes = m.hash_bytes();
    ctx.layout = LayoutFromWire(*m.layout());
    const std::string routable = m.routable_id() ? m.routable_id()->str() : "";
    if (routable.size() > 255 || routable.find('@') != std::string::npos || HasControlCharacters(routable)) {
      return InvalidArgument("routable_id must be at most 255 bytes without '@' or control characters");
    }
    if (m.data_parallel_rank() < -1) return InvalidArgument("data_parallel_rank must be -1 (none) or a rank");
    const std::optional<EventHashForm> hashes = EventHashesFromWire(m.event_hashes());
    if (!hashes) return InvalidArgument("event_hashes must be Vllm, Sglang or None");
    if (m.event_group() < -1) return InvalidArgument("event_group must be -1 (none) or a group index");
    EventGroup group{
        .index = m.event_group(), .sliding_window = m.event_sliding_window(), .block_tokens = m.event_block_tokens()};
    if (m.event_spec_kind() && m.event_spec_kind()->size() > 0) {
      const std::optional<std::string_view> kind = EventSpecKind(m.event_spec_kind()->string_view());
      if (!kind) return InvalidArgument("event_spec_kind is not a vLLM KVCacheSpecKind value");
      group.kind = *kind;
    }
    KVTIER_RETURN_IF_ERROR(cache_->Attach(
        ctx.cache, ctx.tenant, ctx.layout,
        EventSource{.routable_id = routable, .dp_rank = m.data_parallel_rank(), .hashes = *hashes, .group = group}));
  }
  ctx.hello_done = true;
  KVTIER_LOG(INFO) << "session " << ctx.id << " hello: pid " << ctx.pid << " uid " << ctx.uid << " engine '"
                   << ctx.engine_name << "' role "
                   << (ctx.role == fb::Role::Engine ? "engine " + ctx.layout.ToString() : "control")
                   << (ctx.pid == 0 && ctx.engine_pid != 0
                           ? " (pid " + std::to_string(ctx.engine_pid) + " in its own PID namespace)"
                           : std::string())
                   << (ctx.watched ? "" : "; its process is not watched");

  std::vector<flatbuffers::Offset<fb::TierInfo>> tiers;
  for (TierKind kind : kAllTiers) {
    if (!cache_->tier_enabled(kind) || IsLowerTier(kind)) continue;  // no pages or slots to describe
    const TierCounts c = cache_->Counts(kind);
    const TierPool* pool = cache_->pool(kind);
    const uint32_t pps = pool ? pool->pages_per_segment() : 0;
    auto name = builder_.CreateString(TierKindName(kind));
    auto backend = builder_.CreateString(pool ? std::string(pool->memory().backend()) : std::string("slots"));
    tiers.push_back(fb::CreateTierInfo(builder_, TierToWire(kind), name, c.page_bytes, c.capacity, pps, backend,
                                       kind == TierKind::kGpu ? info_->gpu_device : -1));
  }
  auto tiers_vec = builder_.CreateVector(tiers);
  std::vector<SegmentGrant> grants;
  if (ctx.role == fb::Role::Engine) grants = cache_->TakeAllSegmentGrants(ctx.cache);
  std::vector<int> fds;
  auto segs = Segments(builder_, grants, &fds);
  auto ns = builder_.CreateString(ctx.role == fb::Role::Engine ? cache_->NamespaceHex(ctx.cache.ns()) : std::string());
  auto version = builder_.CreateString(info_->version);
  const uint16_t minor = std::min<uint16_t>(m.minor(), kProtocolMinor);
  return {fb::Reply::Welcome,
          fb::CreateWelcome(builder_, kProtocolMajor, minor, ctx.id, info_->epoch, ns, tiers_vec, segs,
                            info_->max_frame_bytes, version, info_->max_entries_per_request, info_->heartbeat_ttl_ms)
              .Union(),
          std::move(fds)};
}

Dispatcher::Reply Dispatcher::AllocateReply(Builder& b, SessionContext& ctx, TierKind tier,
                                            const std::vector<PageId>& pages) {
  auto grants = cache_->TakeSegmentGrants(ctx.cache, tier, pages);
  auto pages_vec = b.CreateVector(pages);
  std::vector<int> fds;
  auto segs = Segments(b, grants, &fds);
  return {fb::Reply::AllocateReply, fb::CreateAllocateReply(b, TierToWire(tier), pages_vec, segs).Union(),
          std::move(fds)};
}

Dispatcher::Reply Dispatcher::OnAllocate(SessionContext& ctx, const fb::Request& req) {
  const fb::Allocate& m = *req.op_as_Allocate();
  auto tier = TierFromWire(m.tier());
  if (!tier) return InvalidArgument("unknown tier");
  SessionContext* c = &ctx;
  const uint64_t id = req.id();
  const int64_t start = clock_->NowNanos();
  const TierKind t = *tier;
  auto now = cache_->Allocate(ctx.cache, t, m.count(), [this, c, id, start, t](Result<std::vector<PageId>> r) {
    SendLater(c, id, fb::Op::Allocate, start, [&](Builder& b) -> Reply {
      if (!r.ok()) return r.status();
      return AllocateReply(b, *c, t, *r);
    });
  });
  if (!now) return Reply::Later();
  KVTIER_RETURN_IF_ERROR(now->status());
  return AllocateReply(builder_, ctx, t, now->value());
}

Status Dispatcher::CheckEpoch(uint64_t epoch) const {
  if (epoch == 0 || epoch == info_->epoch) return Status::Ok();
  return FailedPrecondition("page handles from daemon epoch " + std::to_string(epoch) +
                            " are stale: this kvtierd runs epoch " + std::to_string(info_->epoch) +
                            " (it restarted); lease pages again");
}

Dispatcher::Reply Dispatcher::OnCommit(SessionContext& ctx, const fb::Request& req) {
  const fb::Commit& m = *req.op_as_Commit();
  KVTIER_RETURN_IF_ERROR(CheckEpoch(m.daemon_epoch()));
  auto tier = TierFromWire(m.tier());
  if (!tier) return InvalidArgument("unknown tier");
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockHash> hashes, Hashes(ctx, m.hashes()));
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockHash> parents, Hashes(ctx, m.parents()));
  const size_t n = m.pages() ? m.pages()->size() : 0;
  if (hashes.size() != n) {
    return InvalidArgument("commit names " + std::to_string(n) + " pages but " + std::to_string(hashes.size()) +
                           " hashes");
  }
  if (!parents.empty() && parents.size() != n) {
    return InvalidArgument("commit parents must be empty or one per page");
  }
  std::span<const uint32_t> tokens;
  if (m.token_ids() && m.token_ids()->size() > 0) {
    const uint64_t want = uint64_t{n} * ctx.layout.tokens_per_block;
    if (m.token_ids()->size() != want) {
      return InvalidArgument("commit token_ids must be empty or " + std::to_string(ctx.layout.tokens_per_block) +
                             " per page (" + std::to_string(want) + "), not " + std::to_string(m.token_ids()->size()));
    }
    tokens = std::span<const uint32_t>(m.token_ids()->data(), m.token_ids()->size());
  }
  std::vector<std::string> extra;
  if (m.extra_keys() && m.extra_keys()->size() > 0) {
    KVTIER_ASSIGN_OR_RETURN(extra, SplitExtraKeys({m.extra_keys()->data(), m.extra_keys()->size()}, n));
  }
  const std::string_view lora = m.lora_name() ? m.lora_name()->string_view() : std::string_view();
  if (lora.size() > StoredKeys::kMaxLoraName) {
    return InvalidArgument("commit lora_name longer than " + std::to_string(StoredKeys::kMaxLoraName) + " bytes");
  }
  std::vector<PageId> pages(n);
  for (size_t i = 0; i < n; ++i) pages[i] = m.pages()->Get(static_cast<flatbuffers::uoffset_t>(i));
  auto results = cache_->Commit(ctx.cache, *tier, pages, hashes, parents, m.retain(),
                                {.tokens = tokens, .extra = extra, .lora_name = lora, .lora_id = m.lora_id()});
  return {fb::Reply::CommitReply, fb::CreateCommitReply(builder_, Results(builder_, results)).Union()};
}

Dispatcher::Reply Dispatcher::OnRelease(SessionContext& ctx, const fb::Request& req) {
  const fb::Release& m = *req.op_as_Release();
  KVTIER_RETURN_IF_ERROR(CheckEpoch(m.daemon_epoch()));
  auto tier = TierFromWire(m.tier());
  if (!tier) return InvalidArgument("unknown tier");
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockHash> hashes, Hashes(ctx, m.hashes()));
  const size_t n = m.pages() ? m.pages()->size() : 0;
  if (n > info_->max_entries_per_request) return InvalidArgument("too many pages in one request");
  std::vector<PageId> pages(n);
  for (size_t i = 0; i < n; ++i) pages[i] = m.pages()->Get(static_cast<flatbuffers::uoffset_t>(i));
  auto codes = cache_->Release(ctx.cache, *tier, pages, hashes);
  std::vector<uint8_t> wire(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) wire[i] = static_cast<uint8_t>(codes[i]);
  auto v = builder_.CreateVector(reinterpret_cast<const fb::Status*>(wire.data()), wire.size());
  return {fb::Reply::ReleaseReply, fb::CreateReleaseReply(builder_, v).Union()};
}

Dispatcher::Reply Dispatcher::LookupReply(Builder& b, const CacheLookup& r) {
  std::vector<uint8_t> tiers(r.tiers.size());
  for (size_t i = 0; i < r.tiers.size(); ++i) tiers[i] = static_cast<uint8_t>(r.tiers[i]);
  auto v = b.CreateVector(reinterpret_cast<const fb::Tier*>(tiers.data()), tiers.size());
  return {fb::Reply::LookupReply, fb::CreateLookupReply(b, static_cast<uint32_t>(r.matched), v).Union()};
}

Dispatcher::Reply Dispatcher::OnLookup(SessionContext& ctx, const fb::Request& req) {
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockHash> hashes, Hashes(ctx, req.op_as_Lookup()->hashes()));
  SessionContext* c = &ctx;
  const uint64_t id = req.id();
  const int64_t start = frame_start_ns_;
  auto now = cache_->Lookup(ctx.cache, hashes, [this, c, id, start](CacheLookup r) {
    SendLater(c, id, fb::Op::Lookup, start, [&](Builder& b) { return LookupReply(b, r); });
  });
  if (!now) return Reply::Later();  // a lower tier is asked
  return LookupReply(builder_, *now);
}

Dispatcher::Reply Dispatcher::AcquireReply(Builder& b, SessionContext& ctx, const std::vector<CacheResult>& results) {
  std::vector<SegmentGrant> grants;
  for (TierKind kind : {TierKind::kGpu, TierKind::kHost}) {
    std::vector<PageId> pages;
    for (const CacheResult& r : results) {
      if (r.status == StatusCode::kOk && r.tier == kind) pages.push_back(r.page);
    }
    if (pages.empty()) continue;
    auto g = cache_->TakeSegmentGrants(ctx.cache, kind, pages);
    grants.insert(grants.end(), g.begin(), g.end());
  }
  auto res = Results(b, results);
  std::vector<int> fds;
  auto segs = Segments(b, grants, &fds);
  return {fb::Reply::AcquireReply, fb::CreateAcquireReply(b, res, segs).Union(), std::move(fds)};
}

Dispatcher::Reply Dispatcher::OnAcquire(SessionContext& ctx, const fb::Request& req) {
  const fb::Acquire* m = req.op_as_Acquire();
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockHash> hashes, Hashes(ctx, m->hashes()));
  SessionContext* c = &ctx;
  const uint64_t id = req.id();
  const int64_t start = frame_start_ns_;
  auto later = [this, c, id, start](std::vector<CacheResult> results) {
    SendLater(c, id, fb::Op::Acquire, start, [&](Builder& b) { return AcquireReply(b, *c, results); });
  };
  // A chain: its present prefix, in one walk of the tiers.
  auto now = m->prefix() ? cache_->AcquirePrefix(ctx.cache, hashes, std::move(later))
                         : cache_->Acquire(ctx.cache, hashes, std::move(later));
  if (!now) return Reply::Later();
  return AcquireReply(builder_, ctx, *now);
}

Dispatcher::Reply Dispatcher::OnVerify(SessionContext& ctx, const fb::Request& req) {
  if (!cache_->tier_enabled(TierKind::kNvme)) return FailedPrecondition("no NVMe tier is configured");
  std::weak_ptr<ReplySink> c = ctx.async_sink;  // the session may be gone when it ends
  const uint64_t id = req.id();
  const int64_t start = clock_->NowNanos();
  KVTIER_LOG(NOTICE) << "session " << ctx.id << ": verify of the NVMe tier started";
  cache_->VerifyNvme([this, c, id, start](VerifyReport report) {
    KVTIER_LOG(NOTICE) << "verify: " << report.checked << " blocks checked, " << report.dropped << " dropped, "
                       << report.seconds << " s";
    SendLater(c, id, fb::Op::VerifyTier, start, [&](Builder& b) -> Reply {
      if (!report.status.ok()) return report.status;
      return {fb::Reply::VerifyTierReply,
              fb::CreateVerifyTierReply(b, report.checked, report.dropped, report.seconds).Union()};
    });
  });
  return Reply::Later();
}

}  // namespace kvtier
