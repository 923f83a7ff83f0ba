#include "engine/client.h"

#include "engine/connection.h"
#include "engine/segment_map.h"

namespace kvtier {
namespace {

std::vector<BlockResult> ResultsFromWire(const flatbuffers::Vector<const fb::EntryResult*>* v) {
  std::vector<BlockResult> out;
  if (!v) return out;
  out.reserve(v->size());
  for (const fb::EntryResult* e : *v) {
    BlockResult& r = out.emplace_back();
    r.status = StatusFromWire(e->status());
    r.tier = TierFromWire(e->tier()).value_or(TierKind::kHost);
    r.page = e->page();
    r.duplicate = e->outcome() == fb::CommitOutcome::Duplicate;
  }
  return out;
}

}  // namespace

Client::Client(const ClientOptions& options, std::unique_ptr<SegmentMap> segments)
    : options_(options), segments_(std::move(segments)) {}
Client::~Client() {
  conn_.reset();  // before the mappings: the session ends first
}

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  KVTIER_RETURN_IF_ERROR(options.layout.Validate());
  if (!BlockHash::ValidSize(options.hash_bytes)) return InvalidArgument("hash_bytes must be 16 or 32");
  const EventGroup& group = options.event_group;
  if (group.index < -1) return InvalidArgument("event_group.index must be -1 (none) or a group index");
  if (!group.kind.empty() && !EventSpecKind(group.kind)) {
    return InvalidArgument("event_group.kind '" + std::string(group.kind) + "' is not a vLLM KVCacheSpecKind value");
  }
  std::unique_ptr<Client> c(new Client(
      options, std::make_unique<SegmentMap>(options.device, options.cuda_device, options.protect_committed_pages)));
  SegmentMap* segments = c->segments_.get();
  Connection::HelloArgs hello;
  hello.role = fb::Role::Engine;
  hello.engine_name = options.engine_name;
  hello.routable_id = options.routable_id;
  hello.data_parallel_rank = options.data_parallel_rank;
  hello.event_hashes = options.event_hashes;
  hello.event_group = options.event_group;
  hello.layout = &c->options_.layout;
  hello.hash_bytes = options.hash_bytes;
  auto on_welcome = [segments](const fb::Welcome& w) {
    std::vector<TierInfo> tiers;
    std::string gpu_backend;
    if (w.tiers()) {
      for (const fb::TierInfo* t : *w.tiers()) {
        const auto kind = TierFromWire(t->tier());
        if (!kind) continue;
        tiers.push_back(TierInfo{*kind, t->page_bytes(), t->capacity_pages()});
        if (*kind == TierKind::kGpu && t->backend()) gpu_backend = t->backend()->str();
      }
    }
    segments->SetTiers(std::move(tiers), std::move(gpu_backend));
  };
  KVTIER_ASSIGN_OR_RETURN(c->conn_,
                          Connection::Open(options.socket_path, options.timeout_ms, hello, on_welcome,
                                           [segments](const SegmentGrantView& g) { return segments->Map(g); }));
  return c;
}

Result<Connection*> Client::Conn() const {
  if (!conn_) return FailedPrecondition("the client was closed");
  return conn_.get();
}

void Client::Close() { conn_.reset(); }

Status Client::CheckHashes(std::span<const BlockHash> hs) const {
  for (const BlockHash& h : hs) {
    if (h.size() != options_.hash_bytes) {
      return InvalidArgument("hash of " + std::to_string(h.size()) + " bytes; this session uses " +
                             std::to_string(options_.hash_bytes));
    }
  }
  return Status::Ok();
}

Status Client::CheckTokenIds(size_t blocks, std::span<const uint32_t> token_ids) const {
  const uint64_t want = uint64_t{blocks} * options_.layout.tokens_per_block;
  if (token_ids.empty() || token_ids.size() == want) return Status::Ok();
  return InvalidArgument("commit token_ids: " + std::to_string(token_ids.size()) + " for " + std::to_string(blocks) +
                         " blocks of " + std::to_string(options_.layout.tokens_per_block) + " tokens");
}

// ---- Allocate ----
Result<Ticket> Client::StartAllocate(TierKind tier, uint32_t count) {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  auto& b = conn->builder();
  return conn->Send(fb::Op::Allocate, fb::CreateAllocate(b, TierToWire(tier), count).Union());
}

Result<std::vector<PageId>> Client::WaitAllocate(Ticket t) {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  std::vector<PageId> pages;
  TierKind tier = TierKind::kHost;
  KVTIER_RETURN_IF_ERROR(conn->Wait(t, fb::Reply::AllocateReply, [&](const fb::Response& r) {
    if (const auto* v = r.reply_as_AllocateReply()->pages()) pages.assign(v->begin(), v->end());
    tier = TierFromWire(r.reply_as_AllocateReply()->tier()).value_or(TierKind::kHost);
    return Status::Ok();
  }));
  segments_->SetWritable(tier, pages, true);  // leased: ours to write until committed
  return pages;
}

Result<std::vector<PageId>> Client::Allocate(TierKind tier, uint32_t count) {
  KVTIER_ASSIGN_OR_RETURN(Ticket t, StartAllocate(tier, count));
  return WaitAllocate(t);
}

// ---- Commit ----
Result<Ticket> Client::StartCommit(TierKind tier, std::span<const CommitEntry> entries, bool retain,
                                   const CommitKeys& keys) {
  KVTIER_RETURN_IF_ERROR(CheckTokenIds(entries.size(), keys.token_ids));
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  std::vector<BlockHash> hashes, parents;
  std::vector<PageId> pages;
  bool any_parent = false;
  for (const CommitEntry& e : entries) {
    pages.push_back(e.page);
    hashes.push_back(e.hash);
    any_parent |= !e.parent.empty();
  }
  if (any_parent) {
    const BlockHash none(std::vector<uint8_t>(options_.hash_bytes, 0));
    for (const CommitEntry& e : entries) parents.push_back(e.parent.empty() ? none : e.parent);
  }
  KVTIER_RETURN_IF_ERROR(CheckHashes(hashes));
  KVTIER_RETURN_IF_ERROR(CheckHashes(parents));
  auto& b = conn->builder();
  auto pv = b.CreateVector(pages);
  auto hv = HashesToWire(b, hashes);
  auto parv = HashesToWire(b, parents);
  auto tv = keys.token_ids.empty() ? flatbuffers::Offset<flatbuffers::Vector<uint32_t>>()
                                   : b.CreateVector(keys.token_ids.data(), keys.token_ids.size());
  auto ev = keys.extra_keys.empty() ? flatbuffers::Offset<flatbuffers::Vector<uint8_t>>()
                                    : b.CreateVector(keys.extra_keys.data(), keys.extra_keys.size());
  auto lv = keys.lora_name.empty() ? flatbuffers::Offset<flatbuffers::String>() : b.CreateString(keys.lora_name);
  KVTIER_ASSIGN_OR_RETURN(Ticket t,
                          conn->Send(fb::Op::Commit, fb::CreateCommit(b, TierToWire(tier), pv, hv, parv, retain,
                                                                      conn->session().epoch, tv, ev, lv, keys.lora_id)
                                                         .Union()));
  lease_ends_[t] = {tier, std::move(pages)};
  return t;
}

void Client::EndLeases(Ticket t, const std::function<bool(size_t)>& ended) {
  auto it = lease_ends_.find(t);
  if (it == lease_ends_.end()) return;
  std::vector<PageId> done;
  for (size_t i = 0; i < it->second.pages.size(); ++i) {
    if (ended(i)) done.push_back(it->second.pages[i]);
  }
  segments_->SetWritable(it->second.tier, done, false);
  lease_ends_.erase(it);
}

Result<std::vector<BlockResult>> Client::WaitCommit(Ticket t) {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  std::vector<BlockResult> out;
  KVTIER_RETURN_IF_ERROR(conn->Wait(t, fb::Reply::CommitReply, [&](const fb::Response& r) {
    out = ResultsFromWire(r.reply_as_CommitReply()->results());
    return Status::Ok();
  }));
  // A committed page is the cache's now (a duplicate's page was freed): read-only.
  EndLeases(t, [&](size_t i) { return i < out.size() && out[i].status.ok(); });
  return out;
}

Result<std::vector<BlockResult>> Client::Commit(TierKind tier, std::span<const CommitEntry> entries, bool retain,
                                                const CommitKeys& keys) {
  KVTIER_ASSIGN_OR_RETURN(Ticket t, StartCommit(tier, entries, retain, keys));
  return WaitCommit(t);
}

// ---- Release ----
Result<Ticket> Client::StartRelease(TierKind tier, std::span<const PageId> pages, std::span<const BlockHash> hashes) {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  KVTIER_RETURN_IF_ERROR(CheckHashes(hashes));
  auto& b = conn->builder();
  auto pv = b.CreateVector(pages.data(), pages.size());
  auto hv = HashesToWire(b, hashes);
  KVTIER_ASSIGN_OR_RETURN(
      Ticket t,
      conn->Send(fb::Op::Release, fb::CreateRelease(b, TierToWire(tier), pv, hv, conn->session().epoch).Union()));
  if (!pages.empty()) lease_ends_[t] = {tier, std::vector<PageId>(pages.begin(), pages.end())};
  return t;
}

Result<std::vector<Status>> Client::WaitRelease(Ticket t) {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  std::vector<Status> out;
  KVTIER_RETURN_IF_ERROR(conn->Wait(t, fb::Reply::ReleaseReply, [&](const fb::Response& r) {
    if (const auto* v = r.reply_as_ReleaseReply()->statuses()) {
      out.reserve(v->size());
      for (fb::Status s : *v) out.push_back(StatusFromWire(s));
    }
    return Status::Ok();
  }));
  // Statuses come pages first, then hashes.
  EndLeases(t, [&](size_t i) { return i < out.size() && out[i].ok(); });
  return out;
}

Result<std::vector<Status>> Client::Release(TierKind tier, std::span<const PageId> pages,
                                            std::span<const BlockHash> hashes) {
  KVTIER_ASSIGN_OR_RETURN(Ticket t, StartRelease(tier, pages, hashes));
  return WaitRelease(t);
}

Status Client::ReleaseUnwaited(std::span<const BlockHash> hashes) {
  KVTIER_ASSIGN_OR_RETURN(Ticket t, StartRelease(TierKind::kHost, {}, hashes));
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  conn->Forget(t);
  return Status::Ok();
}

// ---- Lookup ----
Result<Ticket> Client::StartLookup(std::span<const BlockHash> chain) {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  KVTIER_RETURN_IF_ERROR(CheckHashes(chain));
  auto& b = conn->builder();
  auto hv = HashesToWire(b, chain);
  return conn->Send(fb::Op::Lookup, fb::CreateLookup(b, hv).Union());
}

Result<std::vector<Ticket>> Client::StartLookups(std::span<const std::vector<BlockHash>> chains) {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  for (const auto& chain : chains) KVTIER_RETURN_IF_ERROR(CheckHashes(chain));
  std::vector<Ticket> tickets;
  tickets.reserve(chains.size());
  for (const auto& chain : chains) {
    auto& b = conn->builder();
    auto hv = HashesToWire(b, chain);
    auto t = conn->Queue(fb::Op::Lookup, fb::CreateLookup(b, hv).Union());
    if (!t.ok()) {
      conn->DropQueued();
      return t.status();
    }
    tickets.push_back(*t);
  }
  KVTIER_RETURN_IF_ERROR(conn->Flush());
  return tickets;
}

Result<LookupResult> Client::WaitLookup(Ticket t) {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  LookupResult out;
  KVTIER_RETURN_IF_ERROR(conn->Wait(t, fb::Reply::LookupReply, [&](const fb::Response& r) {
    const fb::LookupReply* l = r.reply_as_LookupReply();
    out.matched = l->matched();
    if (l->tiers()) {
      for (fb::Tier tier : *l->tiers()) out.tiers.push_back(TierFromWire(tier).value_or(TierKind::kHost));
    }
    if (out.tiers.size() != out.matched) return Internal("lookup reply tiers disagree with matched");
    return Status::Ok();
  }));
  return out;
}

Result<LookupResult> Client::Lookup(std::span<const BlockHash> chain) {
  KVTIER_ASSIGN_OR_RETURN(Ticket t, StartLookup(chain));
  return WaitLookup(t);
}

// ---- Acquire ----
Result<Ticket> Client::StartAcquire(std::span<const BlockHash> hashes, bool prefix) {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  KVTIER_RETURN_IF_ERROR(CheckHashes(hashes));
  auto& b = conn->builder();
  auto hv = HashesToWire(b, hashes);
  return conn->Send(fb::Op::Acquire, fb::CreateAcquire(b, hv, prefix).Union());
}

Result<std::vector<BlockResult>> Client::WaitAcquire(Ticket t) {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  std::vector<BlockResult> out;
  KVTIER_RETURN_IF_ERROR(conn->Wait(t, fb::Reply::AcquireReply, [&](const fb::Response& r) {
    out = ResultsFromWire(r.reply_as_AcquireReply()->results());
    return Status::Ok();
  }));
  return out;
}

Result<std::vector<BlockResult>> Client::Acquire(std::span<const BlockHash> hashes) {
  KVTIER_ASSIGN_OR_RETURN(Ticket t, StartAcquire(hashes));
  return WaitAcquire(t);
}

Result<std::vector<BlockResult>> Client::AcquirePrefix(std::span<const BlockHash> chain) {
  KVTIER_ASSIGN_OR_RETURN(Ticket t, StartAcquire(chain, /*prefix=*/true));
  return WaitAcquire(t);
}

Result<Ticket> Client::WaitAny(std::span<const Ticket> tickets) {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  return conn->WaitAny(tickets);
}

Status Client::Ping(size_t payload_bytes) {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  return conn->Ping(payload_bytes);
}

Result<uint32_t> Client::Hint(std::string_view session, std::span<const BlockHash> chain, int64_t ttl_ms, bool end,
                              uint64_t hit_tokens) {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  KVTIER_RETURN_IF_ERROR(CheckHashes(chain));
  return conn->SessionHint(session, chain, ttl_ms, end, {}, hit_tokens);
}

Status Client::Alive() {
  KVTIER_ASSIGN_OR_RETURN(Connection * conn, Conn());
  return conn->Alive();
}

// ---- accessors ----
std::span<uint8_t> Client::PageBytes(TierKind tier, PageId page) const { return segments_->PageBytes(tier, page); }
bool Client::PageWritable(TierKind tier, PageId page) const {
  return tier != TierKind::kHost || segments_->IsWritable(page);
}
const std::vector<TierInfo>& Client::tiers() const { return segments_->tiers(); }
uint64_t Client::page_bytes(TierKind tier) const { return segments_->page_bytes(tier); }
void* Client::PageAddress(TierKind tier, PageId page) const { return segments_->PageAddress(tier, page); }
std::string_view Client::device_backend() const { return segments_->device_name(); }
Result<std::string_view> Client::OpenDevice() {
  KVTIER_RETURN_IF_ERROR(segments_->EnsureDevice());
  return segments_->device_name();
}
uint64_t Client::session_id() const { return conn_ ? conn_->session().id : 0; }
uint64_t Client::daemon_epoch() const { return conn_ ? conn_->session().epoch : 0; }
uint32_t Client::max_entries_per_request() const { return conn_ ? conn_->session().max_entries_per_request : 0; }
const std::string& Client::namespace_id() const {
  static const std::string kNone;
  return conn_ ? conn_->session().namespace_id : kNone;
}
size_t Client::hash_bytes() const { return options_.hash_bytes; }
int Client::fd() const { return conn_ ? conn_->fd() : -1; }

// ---- KV transfer helpers ----

namespace {

Result<KvTransfer> TransferFor(const ModelLayout& layout, const EngineKv& kv) {
  KvTransfer t;
  KvGeometry& g = t.geometry;
  g.kind = kv.layout;
  g.num_layers = layout.num_layers;
  g.num_blocks = kv.num_blocks;
  g.block_tokens = layout.tokens_per_block;
  g.kv_heads = layout.kv_heads;
  g.head_dim = layout.head_dim;
  g.elem_bytes = static_cast<uint32_t>(DTypeBytes(layout.dtype));
  g.block_stride_bytes = kv.block_stride_bytes;
  KVTIER_RETURN_IF_ERROR(g.Validate());
  if (kv.layers.size() != layout.num_layers) return InvalidArgument("EngineKv needs one tensor per layer");
  if (g.BlockBytes() != layout.block_bytes) {
    return InvalidArgument(
        "layout.block_bytes is not 2 x layers x tokens x heads x dim x dtype bytes: "
        "the transfer helpers need the natural block size");
  }
  for (uint32_t l = 0; l < layout.num_layers; ++l) t.layers[l] = static_cast<uint8_t*>(kv.layers[l]);
  return t;
}

}  // namespace

Result<std::vector<BlockResult>> Client::StoreBlocks(const EngineKv& kv, std::span<const uint32_t> engine_blocks,
                                                     std::span<const BlockHash> hashes,
                                                     std::span<const BlockHash> parents, const CommitKeys& keys) {
  if (engine_blocks.size() != hashes.size() || (!parents.empty() && parents.size() != hashes.size())) {
    return InvalidArgument("StoreBlocks: one engine block and hash (and parent) per block");
  }
  KVTIER_RETURN_IF_ERROR(CheckTokenIds(hashes.size(), keys.token_ids));  // before leasing anything
  for (uint32_t b : engine_blocks) {
    if (b >= kv.num_blocks) return InvalidArgument("StoreBlocks: engine block out of range");
  }
  KVTIER_RETURN_IF_ERROR(segments_->EnsureDevice());
  KVTIER_ASSIGN_OR_RETURN(KvTransfer t, TransferFor(options_.layout, kv));
  KVTIER_ASSIGN_OR_RETURN(std::vector<PageId> pages, Allocate(TierKind::kHost, static_cast<uint32_t>(hashes.size())));
  std::vector<uint8_t*> addrs;
  for (PageId p : pages) addrs.push_back(static_cast<uint8_t*>(PageAddress(TierKind::kHost, p)));
  t.blocks = engine_blocks.data();
  t.pages = addrs.data();
  t.count = static_cast<uint32_t>(pages.size());
  DeviceBackend* device = segments_->device();
  Status st = device->Gather(t, kv.stream);
  if (st.ok()) st = device->Synchronize(kv.stream);
  if (!st.ok()) {
    (void)Release(TierKind::kHost, pages);
    return st;
  }
  std::vector<CommitEntry> entries;
  for (size_t i = 0; i < pages.size(); ++i) {
    entries.push_back({pages[i], hashes[i], parents.empty() ? BlockHash() : parents[i]});
  }
  return Commit(TierKind::kHost, entries, /*retain=*/false, keys);
}

Result<size_t> Client::LoadBlocks(const EngineKv& kv, std::span<const BlockHash> chain,
                                  std::span<const uint32_t> engine_blocks) {
  KVTIER_ASSIGN_OR_RETURN(KvLoad load, StartLoad(kv, chain, engine_blocks));
  const Status st = ScatterLayers(load, 0, load.transfer.geometry.num_layers, kv.stream, /*wait=*/true);
  const Status finished = FinishLoad(load);
  KVTIER_RETURN_IF_ERROR(st);
  KVTIER_RETURN_IF_ERROR(finished);  // e.g. read after the session ended: not a load
  return load.loaded();
}

Result<KvLoad> Client::StartLoad(const EngineKv& kv, std::span<const BlockHash> chain,
                                 std::span<const uint32_t> engine_blocks) {
  if (engine_blocks.size() < chain.size()) return InvalidArgument("LoadBlocks: fewer engine blocks than hashes");
  for (size_t i = 0; i < chain.size(); ++i) {
    if (engine_blocks[i] >= kv.num_blocks) return InvalidArgument("LoadBlocks: engine block out of range");
  }
  KVTIER_RETURN_IF_ERROR(segments_->EnsureDevice());
  KvLoad load;
  KVTIER_ASSIGN_OR_RETURN(load.transfer, TransferFor(options_.layout, kv));
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockResult> got, AcquirePrefix(chain));
  const size_t prefix = std::min(got.size(), chain.size());
  for (size_t i = 0; i < prefix; ++i) {
    if (!got[i].status.ok()) continue;
    load.held.push_back(chain[i]);
    if (load.loaded() == i) {  // the loaded prefix stops at the first block not acquired
      void* a = PageAddress(got[i].tier, got[i].page);
      if (a == nullptr) continue;
      load.pages.push_back(static_cast<uint8_t*>(a));
      load.blocks.push_back(engine_blocks[i]);
    }
  }
  load.transfer.blocks = load.blocks.data();
  load.transfer.pages = load.pages.data();
  load.transfer.count = static_cast<uint32_t>(load.loaded());
  return load;
}

Status Client::ScatterLayers(const KvLoad& load, uint32_t first, uint32_t last, void* stream, bool wait) {
  const KvGeometry& g = load.transfer.geometry;
  if (load.finished) return InvalidArgument("ScatterLayers: the load is finished");
  if (first > last || last > g.num_layers) return InvalidArgument("ScatterLayers: layers out of range");
  if (load.loaded() == 0 || first == last) return Status::Ok();
  // Layers [first, last) of a page are one run from slab (first, 0): the transfer of
  // those layers alone, over pages offset to it.
  KvTransfer t = load.transfer;
  t.geometry.num_layers = last - first;
  for (uint32_t l = first; l < last; ++l) t.layers[l - first] = load.transfer.layers[l];
  std::vector<uint8_t*> pages;
  if (first > 0) {
    pages.reserve(load.loaded());
    for (uint8_t* p : load.pages) pages.push_back(p + g.PageSlabOffset(first, 0));
    t.pages = pages.data();
  }
  DeviceBackend* device = segments_->device();
  KVTIER_RETURN_IF_ERROR(device->Scatter(t, stream));
  return wait ? device->Synchronize(stream) : Status::Ok();
}

Status Client::FinishLoad(KvLoad& load) {
  if (load.finished) return InvalidArgument("FinishLoad: the load is finished");
  load.finished = true;
  if (load.held.empty()) return Status::Ok();
  // Every scatter of the load has completed: its bytes are the blocks' only if the session
  // (and so its references) outlived them.
  if (Status alive = Alive(); !alive.ok()) {
    return Aborted("the session ended while a load read its blocks (" + alive.message() +
                   "): the pages may hold other blocks' bytes; count the load as failed");
  }
  return ReleaseUnwaited(load.held);
}

}  // namespace kvtier
