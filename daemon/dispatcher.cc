#include "daemon/dispatcher.h"

#include <algorithm>
#include <limits>
#include <tuple>

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
  if (m->prefix()) {
    // A chain: its present prefix first (a lower tier may answer later), then only that.
    auto chain = std::make_shared<std::vector<BlockHash>>(std::move(hashes));
    auto found = cache_->Lookup(ctx.cache, *chain, [this, c, id, start, chain](CacheLookup r) {
      chain->resize(r.matched);
      auto now = StartAcquire(*c, *chain, id, start);
      if (now) SendLater(c, id, fb::Op::Acquire, start, [&](Builder& b) { return AcquireReply(b, *c, *now); });
    });
    if (!found) return Reply::Later();
    hashes = std::move(*chain);
    hashes.resize(found->matched);
  }
  auto now = StartAcquire(ctx, hashes, id, start);
  if (!now) return Reply::Later();
  return AcquireReply(builder_, ctx, *now);
}

std::optional<std::vector<CacheResult>> Dispatcher::StartAcquire(SessionContext& ctx, std::span<const BlockHash> hashes,
                                                                 uint64_t id, int64_t start) {
  SessionContext* c = &ctx;
  return cache_->Acquire(ctx.cache, hashes, [this, c, id, start](std::vector<CacheResult> results) {
    SendLater(c, id, fb::Op::Acquire, start, [&](Builder& b) { return AcquireReply(b, *c, results); });
  });
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
