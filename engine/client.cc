#include "engine/client.h"

#include <errno.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <map>
#include <unordered_map>

#include "protocol/base/defaults.h"
#include "protocol/codec.h"
#include "protocol/framing.h"

namespace kvtier {
namespace {

fb::Tier TierToWire(TierKind t) { return static_cast<fb::Tier>(static_cast<uint8_t>(t)); }

TierKind TierFromWireOr(fb::Tier t, TierKind fallback) {
  const int v = static_cast<int>(t);
  return v < kTierCount ? static_cast<TierKind>(v) : fallback;
}

Status StatusOf(fb::Status s) {
  const StatusCode c = FromWire(s);
  return c == StatusCode::kOk ? Status::Ok() : Status(c, std::string(StatusCodeName(c)));
}

std::vector<BlockResult> ResultsFromWire(const flatbuffers::Vector<const fb::EntryResult*>* v) {
  std::vector<BlockResult> out;
  if (!v) return out;
  out.reserve(v->size());
  for (const fb::EntryResult* e : *v) {
    BlockResult r;
    r.status = StatusOf(e->status());
    r.tier = TierFromWireOr(e->tier(), TierKind::kHost);
    r.page = e->page();
    r.duplicate = e->outcome() == fb::CommitOutcome::Duplicate;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

class Client::Impl {
 public:
  explicit Impl(const ClientOptions& o) : options_(o), in_(64u << 20) {}
  ~Impl() {
    for (auto& [key, m] : mappings_) ::munmap(m.addr, m.bytes);
    for (int fd : fds_) ::close(fd);
    if (fd_ >= 0) ::close(fd_);
  }

  Status Connect() {
    const std::string path = ResolveSocketPath(options_.socket_path.c_str());
    if (path.size() >= sizeof(sockaddr_un::sun_path)) return InvalidArgument("socket path too long: " + path);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return ErrnoStatus(errno, "socket");
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      const int err = errno;
      if (err == ENOENT || err == ECONNREFUSED) {
        return Unavailable("no kvtierd answers at " + path + " (" + std::strerror(err) +
                           "); start it or pass --socket / $KVTIER_SOCKET");
      }
      return ErrnoStatus(err, "connect " + path);
    }
    return Hello();
  }

  Status Hello() {
    builder_.Clear();
    auto name = builder_.CreateString(options_.engine_name);
    flatbuffers::Offset<fb::Layout> layout;
    if (!options_.control) layout = LayoutToWire(builder_, options_.layout);
    fb::HelloBuilder h(builder_);
    h.add_major(kProtocolMajor);
    h.add_minor(kProtocolMinor);
    h.add_role(options_.control ? fb::Role::Control : fb::Role::Engine);
    h.add_engine_name(name);
    if (!options_.control) h.add_layout(layout);
    h.add_hash_bytes(static_cast<uint8_t>(options_.hash_bytes));
    KVTIER_ASSIGN_OR_RETURN(Ticket t, Finish(fb::Op::Hello, h.Finish().Union()));
    return Wait(t, fb::Reply::Welcome, [this](const fb::Response& r) -> Status {
      const fb::Welcome* w = r.reply_as_Welcome();
      session_id_ = w->session_id();
      epoch_ = w->daemon_epoch();
      if (w->namespace_id()) namespace_id_ = w->namespace_id()->str();
      if (w->tiers()) {
        for (const fb::TierInfo* t : *w->tiers()) {
          tiers_.push_back(TierInfo{TierFromWireOr(t->tier(), TierKind::kHost), t->page_bytes(),
                                    t->capacity_pages()});
        }
      }
      return Status::Ok();
    });
  }

  // Finishes the request being built in builder_ and sends it.
  Result<Ticket> Finish(fb::Op type, flatbuffers::Offset<void> op) {
    const Ticket id = next_id_++;
    builder_.FinishSizePrefixed(fb::CreateRequest(builder_, id, type, op));
    KVTIER_RETURN_IF_ERROR(SendFrame(fd_, {builder_.GetBufferPointer(), builder_.GetSize()}, {}));
    builder_.Clear();
    return id;
  }

  // Reads frames until the response to `t` arrives, then runs `parse` on it (unless the
  // request failed as a whole). Other responses are kept for their own Wait.
  template <class Fn>
  Status Wait(Ticket t, fb::Reply expected, Fn&& parse) {
    auto it = stash_.find(t);
    if (it != stash_.end()) {
      std::vector<uint8_t> frame = std::move(it->second);
      stash_.erase(it);
      return Parse(frame, expected, parse);
    }
    for (;;) {
      auto frame = in_.Next();
      if (!frame.ok()) return Internal("daemon sent an oversized frame");
      if (!frame->has_value()) {
        KVTIER_RETURN_IF_ERROR(ReadMore());
        continue;
      }
      std::span<const uint8_t> bytes = (*frame)->frame;
      auto resp = VerifyResponseFrame(bytes);
      if (!resp.ok()) return Internal("daemon sent a malformed frame: " + resp.status().message());
      KVTIER_RETURN_IF_ERROR(TakeSegments(**resp));
      const uint64_t id = (*resp)->id();
      if (id == t) return Parse(bytes, expected, parse);
      if (id == 0) {
        // The daemon refused something it could not attribute; the connection is done.
        broken_ = StatusFromResponse(**resp);
        return broken_;
      }
      stash_[id].assign(bytes.begin(), bytes.end());
    }
  }

  Result<Ticket> WaitAny(std::span<const Ticket> tickets) {
    if (tickets.empty()) return InvalidArgument("WaitAny of no tickets");
    for (;;) {
      for (Ticket t : tickets) {
        if (stash_.count(t)) return t;
      }
      auto frame = in_.Next();
      if (!frame.ok()) return Internal("daemon sent an oversized frame");
      if (!frame->has_value()) {
        KVTIER_RETURN_IF_ERROR(ReadMore());
        continue;
      }
      std::span<const uint8_t> bytes = (*frame)->frame;
      auto resp = VerifyResponseFrame(bytes);
      if (!resp.ok()) return Internal("daemon sent a malformed frame: " + resp.status().message());
      KVTIER_RETURN_IF_ERROR(TakeSegments(**resp));
      if ((*resp)->id() == 0) {
        broken_ = StatusFromResponse(**resp);
        return broken_;
      }
      stash_[(*resp)->id()].assign(bytes.begin(), bytes.end());
    }
  }

  template <class Fn>
  Status Parse(std::span<const uint8_t> bytes, fb::Reply expected, Fn&& parse) {
    const fb::Response* r = flatbuffers::GetSizePrefixedRoot<fb::Response>(bytes.data());
    Status st = StatusFromResponse(*r);
    if (!st.ok()) return st;
    if (r->reply_type() != expected) return Internal("daemon answered with an unexpected reply type");
    return parse(*r);
  }

  Status ReadMore() {
    if (!broken_.ok()) return broken_;
    if (options_.timeout_ms > 0) {
      pollfd p{fd_, POLLIN, 0};
      int n;
      do n = ::poll(&p, 1, options_.timeout_ms); while (n < 0 && errno == EINTR);
      if (n == 0) return Unavailable("no response from kvtierd within " + std::to_string(options_.timeout_ms) + " ms");
      if (n < 0) return ErrnoStatus(errno, "poll");
    }
    auto space = in_.WritableSpace(64 * 1024);
    KVTIER_ASSIGN_OR_RETURN(size_t n, RecvSome(fd_, space, &fds_));
    if (n == 0) {
      broken_ = Unavailable("kvtierd closed the connection");
      return broken_;
    }
    in_.Produced(n);
    return Status::Ok();
  }

  // Maps the segments a response grants. Descriptors arrive in frame order, one per
  // segment.
  Status TakeSegments(const fb::Response& r) {
    const flatbuffers::Vector<flatbuffers::Offset<fb::Segment>>* segs = nullptr;
    switch (r.reply_type()) {
      case fb::Reply::Welcome: segs = r.reply_as_Welcome()->segments(); break;
      case fb::Reply::AllocateReply: segs = r.reply_as_AllocateReply()->segments(); break;
      case fb::Reply::AcquireReply: segs = r.reply_as_AcquireReply()->segments(); break;
      default: break;
    }
    if (!segs || segs->size() == 0) return Status::Ok();
    if (fds_.size() < segs->size()) return Internal("segment descriptors missing from the stream");
    std::vector<int> mine(fds_.begin(), fds_.begin() + segs->size());
    fds_.erase(fds_.begin(), fds_.begin() + segs->size());
    Status result;
    for (const fb::Segment* s : *segs) {
      if (s->fd_slot() >= mine.size()) {
        result = Internal("segment names a descriptor that was not sent");
        continue;
      }
      const int fd = mine[s->fd_slot()];
      void* addr = ::mmap(nullptr, s->bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (addr == MAP_FAILED) {
        result = ErrnoStatus(errno, "mmap of a pool segment");
        continue;
      }
      const auto key = std::make_pair(static_cast<int>(s->tier()), s->index());
      auto old = mappings_.find(key);
      if (old != mappings_.end()) ::munmap(old->second.addr, old->second.bytes);
      mappings_[key] = Mapping{static_cast<uint8_t*>(addr), s->bytes(), s->first_page(), s->num_pages()};
    }
    for (int fd : mine) ::close(fd);  // the mappings keep the memory
    return result;
  }

  std::span<uint8_t> PageBytes(TierKind tier, PageId page) const {
    const uint64_t pb = PageBytesOf(tier);
    if (pb == 0) return {};
    for (const auto& [key, m] : mappings_) {
      if (key.first != static_cast<int>(tier)) continue;
      if (page >= m.first_page && page < m.first_page + m.num_pages) {
        const uint64_t off = uint64_t{page - m.first_page} * pb;
        if (off + pb > m.bytes) return {};
        return {m.addr + off, pb};
      }
    }
    return {};
  }

  uint64_t PageBytesOf(TierKind tier) const {
    for (const TierInfo& t : tiers_) {
      if (t.tier == tier) return t.page_bytes;
    }
    return 0;
  }

  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> Hashes(std::span<const BlockHash> hs) {
    return HashesToWire(builder_, hs);
  }

  Status CheckHashes(std::span<const BlockHash> hs) const {
    for (const BlockHash& h : hs) {
      if (h.size() != options_.hash_bytes) {
        return InvalidArgument("hash of " + std::to_string(h.size()) + " bytes; this session uses " +
                               std::to_string(options_.hash_bytes));
      }
    }
    return Status::Ok();
  }

  ClientOptions options_;
  int fd_ = -1;
  FrameAssembler in_;
  std::deque<int> fds_;
  flatbuffers::FlatBufferBuilder builder_{1024};
  Ticket next_id_ = 1;
  std::unordered_map<Ticket, std::vector<uint8_t>> stash_;
  Status broken_;
  struct Mapping {
    uint8_t* addr;
    uint64_t bytes;
    uint32_t first_page;
    uint32_t num_pages;
  };
  std::map<std::pair<int, uint32_t>, Mapping> mappings_;
  std::vector<TierInfo> tiers_;
  uint64_t session_id_ = 0;
  uint64_t epoch_ = 0;
  std::string namespace_id_;
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (!options.control) {
    KVTIER_RETURN_IF_ERROR(options.layout.Validate());
    if (!BlockHash::ValidSize(options.hash_bytes)) return InvalidArgument("hash_bytes must be 16 or 32");
  }
  auto impl = std::make_unique<Impl>(options);
  KVTIER_RETURN_IF_ERROR(impl->Connect());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

// ---- Allocate ----
Result<Ticket> Client::StartAllocate(TierKind tier, uint32_t count) {
  auto& b = impl_->builder_;
  b.Clear();
  return impl_->Finish(fb::Op::Allocate, fb::CreateAllocate(b, TierToWire(tier), count).Union());
}

Result<std::vector<PageId>> Client::WaitAllocate(Ticket t) {
  std::vector<PageId> pages;
  KVTIER_RETURN_IF_ERROR(impl_->Wait(t, fb::Reply::AllocateReply, [&](const fb::Response& r) {
    const auto* v = r.reply_as_AllocateReply()->pages();
    if (v) pages.assign(v->begin(), v->end());
    return Status::Ok();
  }));
  return pages;
}

Result<std::vector<PageId>> Client::Allocate(TierKind tier, uint32_t count) {
  KVTIER_ASSIGN_OR_RETURN(Ticket t, StartAllocate(tier, count));
  return WaitAllocate(t);
}

// ---- Commit ----
Result<Ticket> Client::StartCommit(TierKind tier, std::span<const CommitEntry> entries, bool retain) {
  std::vector<BlockHash> hashes, parents;
  std::vector<PageId> pages;
  bool any_parent = false;
  for (const CommitEntry& e : entries) {
    pages.push_back(e.page);
    hashes.push_back(e.hash);
    any_parent |= !e.parent.empty();
  }
  if (any_parent) {
    for (const CommitEntry& e : entries) {
      parents.push_back(e.parent.empty()
                            ? BlockHash(std::vector<uint8_t>(impl_->options_.hash_bytes, 0))
                            : e.parent);
    }
  }
  KVTIER_RETURN_IF_ERROR(impl_->CheckHashes(hashes));
  KVTIER_RETURN_IF_ERROR(impl_->CheckHashes(parents));
  auto& b = impl_->builder_;
  b.Clear();
  auto pv = b.CreateVector(pages);
  auto hv = impl_->Hashes(hashes);
  auto parv = impl_->Hashes(parents);
  return impl_->Finish(fb::Op::Commit,
                       fb::CreateCommit(b, TierToWire(tier), pv, hv, parv, retain).Union());
}

Result<std::vector<BlockResult>> Client::WaitCommit(Ticket t) {
  std::vector<BlockResult> out;
  KVTIER_RETURN_IF_ERROR(impl_->Wait(t, fb::Reply::CommitReply, [&](const fb::Response& r) {
    out = ResultsFromWire(r.reply_as_CommitReply()->results());
    return Status::Ok();
  }));
  return out;
}

Result<std::vector<BlockResult>> Client::Commit(TierKind tier, std::span<const CommitEntry> entries,
                                                bool retain) {
  KVTIER_ASSIGN_OR_RETURN(Ticket t, StartCommit(tier, entries, retain));
  return WaitCommit(t);
}

// ---- Release ----
Result<Ticket> Client::StartRelease(TierKind tier, std::span<const PageId> pages,
                                    std::span<const BlockHash> hashes) {
  KVTIER_RETURN_IF_ERROR(impl_->CheckHashes(hashes));
  auto& b = impl_->builder_;
  b.Clear();
  auto pv = b.CreateVector(pages.data(), pages.size());
  auto hv = impl_->Hashes(hashes);
  return impl_->Finish(fb::Op::Release, fb::CreateRelease(b, TierToWire(tier), pv, hv).Union());
}

Result<std::vector<Status>> Client::WaitRelease(Ticket t) {
  std::vector<Status> out;
  KVTIER_RETURN_IF_ERROR(impl_->Wait(t, fb::Reply::ReleaseReply, [&](const fb::Response& r) {
    const auto* v = r.reply_as_ReleaseReply()->statuses();
    if (v) {
      for (fb::Status s : *v) out.push_back(StatusOf(s));
    }
    return Status::Ok();
  }));
  return out;
}

Result<std::vector<Status>> Client::Release(TierKind tier, std::span<const PageId> pages,
                                            std::span<const BlockHash> hashes) {
  KVTIER_ASSIGN_OR_RETURN(Ticket t, StartRelease(tier, pages, hashes));
  return WaitRelease(t);
}

// ---- Lookup ----
Result<Ticket> Client::StartLookup(std::span<const BlockHash> chain) {
  KVTIER_RETURN_IF_ERROR(impl_->CheckHashes(chain));
  auto& b = impl_->builder_;
  b.Clear();
  auto hv = impl_->Hashes(chain);
  return impl_->Finish(fb::Op::Lookup, fb::CreateLookup(b, hv).Union());
}

Result<LookupResult> Client::WaitLookup(Ticket t) {
  LookupResult out;
  KVTIER_RETURN_IF_ERROR(impl_->Wait(t, fb::Reply::LookupReply, [&](const fb::Response& r) {
    const fb::LookupReply* l = r.reply_as_LookupReply();
    out.matched = l->matched();
    if (l->tiers()) {
      for (fb::Tier tier : *l->tiers()) out.tiers.push_back(TierFromWireOr(tier, TierKind::kHost));
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
Result<Ticket> Client::StartAcquire(std::span<const BlockHash> hashes) {
  KVTIER_RETURN_IF_ERROR(impl_->CheckHashes(hashes));
  auto& b = impl_->builder_;
  b.Clear();
  auto hv = impl_->Hashes(hashes);
  return impl_->Finish(fb::Op::Acquire, fb::CreateAcquire(b, hv).Union());
}

Result<std::vector<BlockResult>> Client::WaitAcquire(Ticket t) {
  std::vector<BlockResult> out;
  KVTIER_RETURN_IF_ERROR(impl_->Wait(t, fb::Reply::AcquireReply, [&](const fb::Response& r) {
    out = ResultsFromWire(r.reply_as_AcquireReply()->results());
    return Status::Ok();
  }));
  return out;
}

Result<std::vector<BlockResult>> Client::Acquire(std::span<const BlockHash> hashes) {
  KVTIER_ASSIGN_OR_RETURN(Ticket t, StartAcquire(hashes));
  return WaitAcquire(t);
}

Result<Ticket> Client::WaitAny(std::span<const Ticket> tickets) { return impl_->WaitAny(tickets); }

// ---- Stats / Ping ----
Result<DaemonStats> Client::Stats(bool with_sessions) {
  auto& b = impl_->builder_;
  b.Clear();
  KVTIER_ASSIGN_OR_RETURN(Ticket t, impl_->Finish(fb::Op::Stats, fb::CreateStats(b, with_sessions).Union()));
  DaemonStats out;
  KVTIER_RETURN_IF_ERROR(impl_->Wait(t, fb::Reply::StatsReply, [&](const fb::Response& r) {
    const fb::StatsReply* s = r.reply_as_StatsReply();
    auto str = [](const flatbuffers::String* v) { return v ? v->str() : std::string(); };
    out.version = str(s->version());
    out.uptime_s = s->uptime_s();
    out.metrics_url = str(s->metrics_url());
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
    if (s->tiers()) {
      for (const fb::TierStats* t : *s->tiers()) {
        TierStatsInfo i;
        i.tier = TierFromWireOr(t->tier(), TierKind::kHost);
        i.name = str(t->name());
        i.page_bytes = t->page_bytes();
        i.capacity_pages = t->capacity_pages();
        i.free_pages = t->free_pages();
        i.leased_pages = t->leased_pages();
        i.inflight_pages = t->inflight_pages();
        i.cached_pages = t->cached_pages();
        i.referenced_pages = t->referenced_pages();
        i.blocks = t->blocks();
        i.evictions = t->evictions();
        i.high_watermark = t->high_watermark();
        i.low_watermark = t->low_watermark();
        i.backend = str(t->backend());
        i.io_backend = str(t->io_backend());
        i.index_backend = str(t->index_backend());
        i.ready = t->ready();
        out.tiers.push_back(std::move(i));
      }
    }
    if (s->sessions()) {
      for (const fb::SessionInfo* x : *s->sessions()) {
        SessionStatsInfo i;
        i.id = x->id();
        i.control = x->role() == fb::Role::Control;
        i.engine_name = str(x->engine_name());
        i.pid = x->pid();
        i.uid = x->uid();
        i.gid = x->gid();
        i.tenant = str(x->tenant());
        i.namespace_id = str(x->namespace_id());
        i.model = str(x->model());
        i.leased_pages = x->leased_pages();
        i.referenced_blocks = x->referenced_blocks();
        i.requests = x->requests();
        i.connected_s = x->connected_s();
        out.sessions.push_back(std::move(i));
      }
    }
    return Status::Ok();
  }));
  return out;
}

Status Client::Ping(size_t payload_bytes) {
  auto& b = impl_->builder_;
  b.Clear();
  std::vector<uint8_t> payload(payload_bytes, 0x5a);
  auto pv = b.CreateVector(payload);
  KVTIER_ASSIGN_OR_RETURN(Ticket t, impl_->Finish(fb::Op::Ping, fb::CreatePing(b, pv).Union()));
  return impl_->Wait(t, fb::Reply::Pong, [&](const fb::Response& r) -> Status {
    const auto* p = r.reply_as_Pong()->payload();
    if ((p ? p->size() : 0) != payload_bytes) return Internal("pong payload differs");
    return Status::Ok();
  });
}

Result<VerifyResult> Client::Verify() {
  auto& b = impl_->builder_;
  b.Clear();
  KVTIER_ASSIGN_OR_RETURN(Ticket t, impl_->Finish(fb::Op::VerifyTier, fb::CreateVerifyTier(b).Union()));
  const int saved = impl_->options_.timeout_ms;
  impl_->options_.timeout_ms = 0;  // a scrub of a large tier takes as long as it takes
  VerifyResult out;
  Status st = impl_->Wait(t, fb::Reply::VerifyTierReply, [&](const fb::Response& r) {
    const fb::VerifyTierReply* v = r.reply_as_VerifyTierReply();
    out.checked = v->checked();
    out.dropped = v->dropped();
    out.seconds = v->seconds();
    return Status::Ok();
  });
  impl_->options_.timeout_ms = saved;
  KVTIER_RETURN_IF_ERROR(st);
  return out;
}

// ---- accessors ----
std::span<uint8_t> Client::PageBytes(TierKind tier, PageId page) const { return impl_->PageBytes(tier, page); }
const std::vector<TierInfo>& Client::tiers() const { return impl_->tiers_; }
uint64_t Client::page_bytes(TierKind tier) const { return impl_->PageBytesOf(tier); }
uint64_t Client::session_id() const { return impl_->session_id_; }
uint64_t Client::daemon_epoch() const { return impl_->epoch_; }
const std::string& Client::namespace_id() const { return impl_->namespace_id_; }
size_t Client::hash_bytes() const { return impl_->options_.hash_bytes; }
int Client::fd() const { return impl_->fd_; }

}  // namespace kvtier
