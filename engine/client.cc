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

#include "kernels/device_backend.h"
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
    for (auto& [key, m] : mappings_) Unmap(m);
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
      KVTIER_ASSIGN_OR_RETURN(auto next, NextResponse());
      if (next.first == t) return Parse(next.second, expected, parse);
      stash_[next.first].assign(next.second.begin(), next.second.end());
    }
  }

  // The next response frame off the socket, verified, its segments taken: (request id,
  // bytes valid until the next read). A response with id 0 — the daemon refused something
  // it could not attribute — breaks the connection.
  Result<std::pair<uint64_t, std::span<const uint8_t>>> NextResponse() {
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
      if (id == 0) {
        broken_ = StatusFromResponse(**resp);
        return broken_;
      }
      return std::make_pair(id, bytes);
    }
  }

  Result<Ticket> WaitAny(std::span<const Ticket> tickets) {
    if (tickets.empty()) return InvalidArgument("WaitAny of no tickets");
    for (;;) {
      for (Ticket t : tickets) {
        if (stash_.count(t)) return t;
      }
      KVTIER_ASSIGN_OR_RETURN(auto next, NextResponse());
      stash_[next.first].assign(next.second.begin(), next.second.end());
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
  // segment that has one (a legacy CUDA IPC segment comes with its handle instead).
  Status TakeSegments(const fb::Response& r) {
    const flatbuffers::Vector<flatbuffers::Offset<fb::Segment>>* segs = nullptr;
    switch (r.reply_type()) {
      case fb::Reply::Welcome: {
        const fb::Welcome* w = r.reply_as_Welcome();
        segs = w->segments();
        if (w->tiers()) {  // how to map each tier, before mapping anything
          for (const fb::TierInfo* t : *w->tiers()) {
            if (t->tier() == fb::Tier::Gpu && t->backend()) gpu_backend_ = t->backend()->str();
          }
        }
        break;
      }
      case fb::Reply::AllocateReply: segs = r.reply_as_AllocateReply()->segments(); break;
      case fb::Reply::AcquireReply: segs = r.reply_as_AcquireReply()->segments(); break;
      default: break;
    }
    if (!segs || segs->size() == 0) return Status::Ok();
    size_t with_fd = 0;
    for (const fb::Segment* s : *segs) with_fd += s->fd_slot() != 255;
    if (fds_.size() < with_fd) return Internal("segment descriptors missing from the stream");
    std::vector<int> mine(fds_.begin(), fds_.begin() + with_fd);
    fds_.erase(fds_.begin(), fds_.begin() + with_fd);
    Status result;
    for (const fb::Segment* s : *segs) {
      const int fd = s->fd_slot() == 255 ? -1 : (s->fd_slot() < mine.size() ? mine[s->fd_slot()] : -2);
      if (fd == -2) {
        result = Internal("segment names a descriptor that was not sent");
        continue;
      }
      auto m = Map(*s, fd);
      if (!m.ok()) {
        result = m.status();
        continue;
      }
      const auto key = std::make_pair(static_cast<int>(s->tier()), s->index());
      auto old = mappings_.find(key);
      if (old != mappings_.end()) Unmap(old->second);
      mappings_[key] = *m;
    }
    for (int fd : mine) ::close(fd);  // the mappings keep the memory
    return result;
  }

  struct Mapping {
    uint8_t* addr = nullptr;
    uint64_t bytes = 0;
    uint32_t first_page = 0;
    uint32_t num_pages = 0;
    bool device = false;      // imported through the device backend
    bool registered = false;  // host memory pinned for the device
  };

  Result<Mapping> Map(const fb::Segment& s, int fd) {
    Mapping m{nullptr, s.bytes(), s.first_page(), s.num_pages(), false, false};
    if (s.tier() == fb::Tier::Gpu && gpu_backend_ == "cuda") {
      KVTIER_RETURN_IF_ERROR(EnsureDevice());
      if (device_->name() != "cuda") return FailedPrecondition("the daemon's GPU tier is CUDA; this client has no CUDA");
      const uint8_t* handle = s.ipc_handle() && s.ipc_handle()->size() >= 64 ? s.ipc_handle()->data() : nullptr;
      if (fd < 0 && handle == nullptr) return Internal("GPU segment with neither descriptor nor handle");
      KVTIER_ASSIGN_OR_RETURN(m.addr, device_->Import(options_.cuda_device, fd, handle, s.bytes()));
      m.device = true;
      return m;
    }
    if (fd < 0) return Internal("segment without a descriptor");
    void* addr = ::mmap(nullptr, s.bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) return ErrnoStatus(errno, "mmap of a pool segment");
    m.addr = static_cast<uint8_t*>(addr);
    if (s.tier() == fb::Tier::Host && EnsureDevice().ok() && device_->name() == "cuda") {
      // Pinned and mapped for the device: the gather kernel writes it over the bus.
      m.registered = device_->RegisterHost(m.addr, m.bytes).ok();
    }
    return m;
  }

  void Unmap(const Mapping& m) {
    if (m.device) {
      device_->Unimport(m.addr, m.bytes);
      return;
    }
    if (m.registered) device_->UnregisterHost(m.addr);
    ::munmap(m.addr, m.bytes);
  }

  Status EnsureDevice() {
    if (device_) return Status::Ok();
    const std::string& want = options_.device;
    if (want == "host-emulated") {
      KVTIER_ASSIGN_OR_RETURN(device_, OpenHostDeviceBackend());
    } else if (want == "cuda") {
      KVTIER_ASSIGN_OR_RETURN(device_, OpenCudaDeviceBackend());
    } else if (want == "auto") {
      auto cuda = OpenCudaDeviceBackend();
      if (cuda.ok()) {
        device_ = std::move(cuda).value();
      } else {
        KVTIER_ASSIGN_OR_RETURN(device_, OpenHostDeviceBackend());
      }
    } else {
      return InvalidArgument("device '" + want + "' is not auto, cuda or host-emulated");
    }
    return Status::Ok();
  }

  void* PageAddress(TierKind tier, PageId page) const {
    const uint64_t pb = PageBytesOf(tier);
    if (pb == 0) return nullptr;
    for (const auto& [key, m] : mappings_) {
      if (key.first != static_cast<int>(tier)) continue;
      if (page >= m.first_page && page < m.first_page + m.num_pages) {
        const uint64_t off = uint64_t{page - m.first_page} * pb;
        return off + pb > m.bytes ? nullptr : m.addr + off;
      }
    }
    return nullptr;
  }

  // Host-addressable bytes of a page: the host tier, and the GPU tier when emulated.
  std::span<uint8_t> PageBytes(TierKind tier, PageId page) const {
    if (tier == TierKind::kGpu && gpu_backend_ == "cuda") return {};
    uint8_t* p = static_cast<uint8_t*>(PageAddress(tier, page));
    return p ? std::span<uint8_t>(p, PageBytesOf(tier)) : std::span<uint8_t>();
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
  std::map<std::pair<int, uint32_t>, Mapping> mappings_;
  std::string gpu_backend_;
  std::unique_ptr<DeviceBackend> device_;
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
                       fb::CreateCommit(b, TierToWire(tier), pv, hv, parv, retain, impl_->epoch_).Union());
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
  return impl_->Finish(fb::Op::Release, fb::CreateRelease(b, TierToWire(tier), pv, hv, impl_->epoch_).Union());
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
    out.gpu_demotions = s->gpu_demotions();
    out.refetches_after_evict = s->refetches_after_evict();
    out.spill_bytes = s->spill_bytes();
    out.fetch_bytes = s->fetch_bytes();
    out.draining = s->draining();
    out.evictions = s->evictions();
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
        i.quarantined_pages = t->quarantined_pages();
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

Result<std::vector<BlockExplanationInfo>> Client::Explain(std::span<const BlockHash> hashes,
                                                          const std::string& namespace_id) {
  auto& b = impl_->builder_;
  b.Clear();
  auto hv = impl_->Hashes(hashes);
  auto ns = b.CreateString(namespace_id);
  KVTIER_ASSIGN_OR_RETURN(Ticket t, impl_->Finish(fb::Op::Explain, fb::CreateExplain(b, hv, ns).Union()));
  std::vector<BlockExplanationInfo> out;
  KVTIER_RETURN_IF_ERROR(impl_->Wait(t, fb::Reply::ExplainReply, [&](const fb::Response& r) {
    auto str = [](const flatbuffers::String* v) { return v ? v->str() : std::string(); };
    const auto* entries = r.reply_as_ExplainReply()->entries();
    if (!entries || entries->size() != hashes.size()) return Internal("explain reply has the wrong entry count");
    for (const fb::Explanation* e : *entries) {
      BlockExplanationInfo i;
      i.state = static_cast<BlockExplanationInfo::State>(e->state());
      i.tier = TierFromWireOr(e->tier(), TierKind::kHost);
      i.on_nvme = e->on_nvme();
      i.writing = e->writing();
      i.namespace_id = str(e->namespace_id());
      i.tenant = str(e->tenant());
      i.model = str(e->model());
      i.seconds_ago = e->seconds_ago();
      i.detail = str(e->detail());
      out.push_back(std::move(i));
    }
    return Status::Ok();
  }));
  return out;
}

Result<std::vector<BlockInfoEntry>> Client::Blocks(std::optional<TierKind> tier, const std::string& namespace_id,
                                                   bool by_recent, uint32_t limit) {
  auto& b = impl_->builder_;
  b.Clear();
  auto ns = b.CreateString(namespace_id);
  const fb::Tier wt = tier ? static_cast<fb::Tier>(static_cast<uint8_t>(*tier)) : fb::Tier::None;
  KVTIER_ASSIGN_OR_RETURN(
      Ticket t, impl_->Finish(fb::Op::Blocks,
                              fb::CreateBlocks(b, wt, ns, by_recent ? fb::BlockOrder::Recent : fb::BlockOrder::Hits, limit)
                                  .Union()));
  std::vector<BlockInfoEntry> out;
  KVTIER_RETURN_IF_ERROR(impl_->Wait(t, fb::Reply::BlocksReply, [&](const fb::Response& r) {
    auto str = [](const flatbuffers::String* v) { return v ? v->str() : std::string(); };
    const auto* blocks = r.reply_as_BlocksReply()->blocks();
    if (!blocks) return Status::Ok();
    for (const fb::BlockInfo* x : *blocks) {
      BlockInfoEntry i;
      if (x->hash() && BlockHash::ValidSize(x->hash()->size())) {
        i.hash = BlockHash(std::span<const uint8_t>(x->hash()->data(), x->hash()->size()));
      }
      i.namespace_id = str(x->namespace_id());
      i.tenant = str(x->tenant());
      i.model = str(x->model());
      i.tier = TierFromWireOr(x->tier(), TierKind::kHost);
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

Result<EvictResult> Client::Evict(TierKind tier, uint64_t bytes) {
  auto& b = impl_->builder_;
  b.Clear();
  KVTIER_ASSIGN_OR_RETURN(
      Ticket t, impl_->Finish(fb::Op::Evict,
                              fb::CreateEvict(b, static_cast<fb::Tier>(static_cast<uint8_t>(tier)), bytes).Union()));
  EvictResult out;
  KVTIER_RETURN_IF_ERROR(impl_->Wait(t, fb::Reply::EvictReply, [&](const fb::Response& r) {
    const auto* e = r.reply_as_EvictReply();
    out.blocks = e->blocks();
    out.bytes = e->bytes();
    out.demoting = e->demoting();
    return Status::Ok();
  }));
  return out;
}

Result<DrainResult> Client::Drain(bool start, bool query) {
  auto& b = impl_->builder_;
  b.Clear();
  KVTIER_ASSIGN_OR_RETURN(Ticket t, impl_->Finish(fb::Op::Drain, fb::CreateDrain(b, start, query).Union()));
  DrainResult out;
  KVTIER_RETURN_IF_ERROR(impl_->Wait(t, fb::Reply::DrainReply, [&](const fb::Response& r) {
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

// ---- accessors ----
std::span<uint8_t> Client::PageBytes(TierKind tier, PageId page) const { return impl_->PageBytes(tier, page); }
const std::vector<TierInfo>& Client::tiers() const { return impl_->tiers_; }
uint64_t Client::page_bytes(TierKind tier) const { return impl_->PageBytesOf(tier); }
void* Client::PageAddress(TierKind tier, PageId page) const { return impl_->PageAddress(tier, page); }
std::string_view Client::device_backend() const {
  return impl_->device_ ? impl_->device_->name() : std::string_view("none");
}

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
  KVTIER_RETURN_IF_ERROR(g.Validate());
  if (kv.layers.size() != layout.num_layers) return InvalidArgument("EngineKv needs one tensor per layer");
  if (g.BlockBytes() != layout.block_bytes) {
    return InvalidArgument("layout.block_bytes is not 2 x layers x tokens x heads x dim x dtype bytes: "
                           "the transfer helpers need the natural block size");
  }
  for (uint32_t l = 0; l < layout.num_layers; ++l) t.layers[l] = static_cast<uint8_t*>(kv.layers[l]);
  return t;
}

}  // namespace

Result<std::vector<BlockResult>> Client::StoreBlocks(const EngineKv& kv, std::span<const uint32_t> engine_blocks,
                                                     std::span<const BlockHash> hashes,
                                                     std::span<const BlockHash> parents) {
  if (engine_blocks.size() != hashes.size() || (!parents.empty() && parents.size() != hashes.size())) {
    return InvalidArgument("StoreBlocks: one engine block and hash (and parent) per block");
  }
  for (uint32_t b : engine_blocks) {
    if (b >= kv.num_blocks) return InvalidArgument("StoreBlocks: engine block out of range");
  }
  KVTIER_RETURN_IF_ERROR(impl_->EnsureDevice());
  KVTIER_ASSIGN_OR_RETURN(KvTransfer t, TransferFor(impl_->options_.layout, kv));
  KVTIER_ASSIGN_OR_RETURN(std::vector<PageId> pages,
                          Allocate(TierKind::kHost, static_cast<uint32_t>(hashes.size())));
  std::vector<uint8_t*> addrs;
  for (PageId p : pages) addrs.push_back(static_cast<uint8_t*>(PageAddress(TierKind::kHost, p)));
  t.blocks = engine_blocks.data();
  t.pages = addrs.data();
  t.count = static_cast<uint32_t>(pages.size());
  Status st = impl_->device_->Gather(t, kv.stream);
  if (st.ok()) st = impl_->device_->Synchronize(kv.stream);
  if (!st.ok()) {
    (void)Release(TierKind::kHost, pages);
    return st;
  }
  std::vector<CommitEntry> entries;
  for (size_t i = 0; i < pages.size(); ++i) {
    entries.push_back({pages[i], hashes[i], parents.empty() ? BlockHash() : parents[i]});
  }
  return Commit(TierKind::kHost, entries);
}

Result<size_t> Client::LoadBlocks(const EngineKv& kv, std::span<const BlockHash> chain,
                                  std::span<const uint32_t> engine_blocks) {
  if (engine_blocks.size() < chain.size()) return InvalidArgument("LoadBlocks: fewer engine blocks than hashes");
  for (size_t i = 0; i < chain.size(); ++i) {
    if (engine_blocks[i] >= kv.num_blocks) return InvalidArgument("LoadBlocks: engine block out of range");
  }
  KVTIER_RETURN_IF_ERROR(impl_->EnsureDevice());
  KVTIER_ASSIGN_OR_RETURN(KvTransfer t, TransferFor(impl_->options_.layout, kv));
  KVTIER_ASSIGN_OR_RETURN(LookupResult l, Lookup(chain));
  if (l.matched == 0) return size_t{0};
  std::span<const BlockHash> prefix = chain.first(l.matched);
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockResult> got, Acquire(prefix));
  size_t n = 0;
  std::vector<uint8_t*> addrs;
  std::vector<BlockHash> held;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i].status.ok()) continue;
    held.push_back(prefix[i]);
    if (n == i) {  // the loaded prefix stops at the first block not acquired
      void* a = PageAddress(got[i].tier, got[i].page);
      if (a == nullptr) continue;
      addrs.push_back(static_cast<uint8_t*>(a));
      ++n;
    }
  }
  Status st;
  if (n > 0) {
    t.blocks = engine_blocks.data();
    t.pages = addrs.data();
    t.count = static_cast<uint32_t>(n);
    st = impl_->device_->Scatter(t, kv.stream);
    if (st.ok()) st = impl_->device_->Synchronize(kv.stream);
  }
  (void)Release(TierKind::kHost, {}, held);
  KVTIER_RETURN_IF_ERROR(st);
  return n;
}
uint64_t Client::session_id() const { return impl_->session_id_; }
uint64_t Client::daemon_epoch() const { return impl_->epoch_; }
const std::string& Client::namespace_id() const { return impl_->namespace_id_; }
size_t Client::hash_bytes() const { return impl_->options_.hash_bytes; }
int Client::fd() const { return impl_->fd_; }

}  // namespace kvtier
