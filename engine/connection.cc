#include "engine/connection.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "protocol/base/defaults.h"
#include "protocol/base/thread_name.h"

namespace kvtier {

Result<std::unique_ptr<Connection>> Connection::Open(const std::string& socket_path, int timeout_ms,
                                                     const HelloArgs& hello, WelcomeHandler on_welcome,
                                                     SegmentHandler on_segment) {
  std::unique_ptr<Connection> c(new Connection(timeout_ms, std::move(on_segment)));
  KVTIER_RETURN_IF_ERROR(c->Dial(ResolveSocketPath(socket_path.c_str())));
  KVTIER_RETURN_IF_ERROR(c->Hello(hello, std::move(on_welcome)));
  return c;
}

Connection::~Connection() {
  if (keepalive_ && owner_pid_ != ::getpid()) {
    (void)keepalive_.release();  // a forked child: that thread is not in this process
  } else if (keepalive_) {
    {
      MutexLock lock(&keepalive_mu_);
      keepalive_stop_ = true;
    }
    keepalive_cv_.notify_all();
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);  // a keepalive blocked on a full socket returns
    keepalive_->join();
  }
  for (int fd : fds_) ::close(fd);
  if (fd_ >= 0) ::close(fd_);
}

int64_t Connection::NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Connection::StartKeepalive() {
  if (session_.heartbeat_ttl_ms == 0 || keepalive_) return;
  flatbuffers::FlatBufferBuilder b(64);
  fb::PingBuilder ping(b);
  ping.add_no_reply(true);
  const auto op = ping.Finish().Union();
  // Never answered, so its id is never waited for; one no ticket can take.
  b.FinishSizePrefixed(fb::CreateRequest(b, UINT64_MAX, fb::Op::Ping, op));
  keepalive_frame_.assign(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  // A third of the TTL: two keepalives may be late (a loaded host) before the daemon expires
  // the session.
  const auto period = std::chrono::milliseconds(std::max<uint32_t>(session_.heartbeat_ttl_ms / 3, 1));
  owner_pid_ = ::getpid();
  keepalive_ = std::make_unique<std::thread>([this, period] {
    NameThisThread("kvtier-ping");
    Keepalive(period);
  });
}

void Connection::Keepalive(std::chrono::nanoseconds period) {
  MutexLock lock(&keepalive_mu_);
  while (!keepalive_stop_) {
    keepalive_cv_.wait_for(lock.native(), period, [this] {
      keepalive_mu_.AssertHeld();
      return keepalive_stop_;
    });
    if (keepalive_stop_) break;
    if (NowNs() - last_send_ns_.load(std::memory_order_relaxed) < period.count()) continue;
    lock.Unlock();
    bool sent = false;
    {
      MutexLock write(&write_mu_);
      sent = SendFrame(fd_, keepalive_frame_, {}).ok();
      if (sent) last_send_ns_.store(NowNs(), std::memory_order_relaxed);
    }
    lock.Lock();
    if (!sent) break;  // the caller finds the failure on its next call
  }
}

Status Connection::Alive() {
  if (!broken_.ok()) return broken_;
  if (!PeerHungUp(fd_)) return Status::Ok();
  broken_ = RefusalOr(Unavailable("kvtierd ended this session (it closed the connection)"));
  return broken_;
}

Status Connection::Dial(const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un::sun_path)) return InvalidArgument("socket path too long: " + path);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return ErrnoStatus(errno, "socket");
  KVTIER_RETURN_IF_ERROR(ApplyTimeout());
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
  return Status::Ok();
}

Status Connection::Hello(const HelloArgs& args, WelcomeHandler on_welcome) {
  on_welcome_ = std::move(on_welcome);
  auto& b = builder();
  auto name = b.CreateString(args.engine_name);
  auto routable =
      args.routable_id.empty() ? flatbuffers::Offset<flatbuffers::String>() : b.CreateString(args.routable_id);
  flatbuffers::Offset<fb::Layout> layout;
  if (args.layout) layout = LayoutToWire(b, *args.layout);
  const auto kind = args.event_group.kind.empty() ? flatbuffers::Offset<flatbuffers::String>()
                                                  : b.CreateString(args.event_group.kind);
  fb::HelloBuilder h(b);
  h.add_major(kProtocolMajor);
  h.add_minor(kProtocolMinor);
  h.add_role(args.role);
  h.add_engine_name(name);
  if (!args.routable_id.empty()) h.add_routable_id(routable);
  h.add_data_parallel_rank(args.data_parallel_rank);
  h.add_event_hashes(EventHashesToWire(args.event_hashes));
  h.add_event_group(args.event_group.index);
  if (!args.event_group.kind.empty()) h.add_event_spec_kind(kind);
  h.add_event_sliding_window(args.event_group.sliding_window);
  h.add_event_block_tokens(args.event_group.block_tokens);
  if (args.layout) h.add_layout(layout);
  h.add_hash_bytes(static_cast<uint8_t>(args.hash_bytes));
  h.add_pid(static_cast<int32_t>(::getpid()));
  KVTIER_ASSIGN_OR_RETURN(Ticket t, Send(fb::Op::Hello, h.Finish().Union()));
  return Wait(t, fb::Reply::Welcome, [this](const fb::Response& r) -> Status {
    const fb::Welcome* w = r.reply_as_Welcome();
    session_.id = w->session_id();
    session_.epoch = w->daemon_epoch();
    if (w->namespace_id()) session_.namespace_id = w->namespace_id()->str();
    session_.max_frame_bytes = w->max_frame_bytes();
    session_.max_entries_per_request = w->max_entries_per_request();
    session_.heartbeat_ttl_ms = w->heartbeat_ttl_ms();
    StartKeepalive();
    return Status::Ok();
  });
}

Result<Ticket> Connection::Send(fb::Op type, flatbuffers::Offset<void> op) {
  KVTIER_ASSIGN_OR_RETURN(Ticket id, Queue(type, op));
  KVTIER_RETURN_IF_ERROR(Flush());
  return id;
}

Result<Ticket> Connection::Queue(fb::Op type, flatbuffers::Offset<void> op) {
  if (!broken_.ok()) return broken_;
  const Ticket id = next_id_++;
  builder_.FinishSizePrefixed(fb::CreateRequest(builder_, id, type, op));
  const size_t body = builder_.GetSize() - kFramePrefixBytes;
  if (session_.max_frame_bytes != 0 && body > session_.max_frame_bytes) {
    builder_.Clear();
    --next_id_;
    std::string hint;
    if (session_.max_entries_per_request != 0) {
      hint = " (at most " + std::to_string(session_.max_entries_per_request) + " entries a request)";
    }
    return InvalidArgument("request of " + std::to_string(body) +
                           " bytes is over kvtierd's protocol.max_frame_bytes (" +
                           std::to_string(session_.max_frame_bytes) + "): split it into smaller requests" + hint);
  }
  batch_.insert(batch_.end(), builder_.GetBufferPointer(), builder_.GetBufferPointer() + builder_.GetSize());
  batch_ids_.push_back(id);
  builder_.Clear();
  return id;
}

Status Connection::Flush() {
  if (batch_.empty()) return broken_;
  Status st = broken_;
  if (st.ok()) {
    MutexLock write(&write_mu_);
    st = SendFrame(fd_, batch_, {});
    if (keepalive_) last_send_ns_.store(NowNs(), std::memory_order_relaxed);
  }
  batch_.clear();
  if (!st.ok()) {
    batch_ids_.clear();
    if (broken_.ok()) {
      broken_ =
          RefusalOr(st.code() == StatusCode::kUnavailable ? st : Unavailable("kvtierd connection: " + st.message()));
    }
    return broken_;
  }
  outstanding_.insert(batch_ids_.begin(), batch_ids_.end());
  batch_ids_.clear();
  return Status::Ok();
}

Status Connection::Wait(Ticket t, fb::Reply expected, const std::function<Status(const fb::Response&)>& parse) {
  if (!outstanding_.count(t)) {
    return InvalidArgument("ticket " + std::to_string(t) + " is not outstanding (never issued, or already waited for)");
  }
  if (auto it = stash_.find(t); it != stash_.end()) {
    std::vector<uint8_t> frame = std::move(it->second);
    stash_.erase(it);
    outstanding_.erase(t);
    return Parse(frame, expected, parse);
  }
  for (;;) {
    auto next = NextResponse();
    if (!next.ok()) return next.status();
    if (next->first == t) {
      outstanding_.erase(t);
      return Parse(next->second, expected, parse);
    }
    if (outstanding_.count(next->first)) stash_[next->first].assign(next->second.begin(), next->second.end());
  }
}

Result<Ticket> Connection::WaitAny(std::span<const Ticket> tickets) {
  if (tickets.empty()) return InvalidArgument("WaitAny of no tickets");
  for (Ticket t : tickets) {
    if (!outstanding_.count(t)) return InvalidArgument("ticket " + std::to_string(t) + " is not outstanding");
  }
  for (;;) {
    for (Ticket t : tickets) {
      if (stash_.count(t)) return t;
    }
    KVTIER_ASSIGN_OR_RETURN(auto next, NextResponse());
    if (outstanding_.count(next.first)) stash_[next.first].assign(next.second.begin(), next.second.end());
  }
}

Status Connection::Ping(size_t payload_bytes) {
  auto& b = builder();
  std::vector<uint8_t> payload(payload_bytes, 0x5a);
  auto pv = b.CreateVector(payload);
  KVTIER_ASSIGN_OR_RETURN(Ticket t, Send(fb::Op::Ping, fb::CreatePing(b, pv).Union()));
  return Wait(t, fb::Reply::Pong, [&](const fb::Response& r) -> Status {
    const auto* p = r.reply_as_Pong()->payload();
    if ((p ? p->size() : 0) != payload_bytes) return Internal("pong payload differs");
    return Status::Ok();
  });
}

Result<uint32_t> Connection::SessionHint(std::string_view session, std::span<const BlockHash> chain, int64_t ttl_ms,
                                         bool end, std::string_view namespace_id, uint64_t hit_tokens, bool prefetch) {
  auto& b = builder();
  auto sid = b.CreateString(session.data(), session.size());
  auto hv = HashesToWire(b, chain);
  auto ns = namespace_id.empty() ? flatbuffers::Offset<flatbuffers::String>()
                                 : b.CreateString(namespace_id.data(), namespace_id.size());
  KVTIER_ASSIGN_OR_RETURN(
      Ticket t,
      Send(fb::Op::SessionHint, fb::CreateSessionHint(b, sid, hv, ttl_ms, end, ns, hit_tokens, prefetch).Union()));
  uint32_t blocks = 0;
  KVTIER_RETURN_IF_ERROR(Wait(t, fb::Reply::SessionHintReply, [&](const fb::Response& r) {
    blocks = r.reply_as_SessionHintReply()->blocks();
    return Status::Ok();
  }));
  return blocks;
}

Result<std::pair<uint64_t, std::span<const uint8_t>>> Connection::NextResponse() {
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

Status Connection::Parse(std::span<const uint8_t> bytes, fb::Reply expected,
                         const std::function<Status(const fb::Response&)>& parse) {
  const fb::Response* r = flatbuffers::GetSizePrefixedRoot<fb::Response>(bytes.data());
  Status st = StatusFromResponse(*r);
  if (!st.ok()) return st;
  if (r->reply_type() != expected) return Internal("daemon answered with an unexpected reply type");
  return parse(*r);
}

Status Connection::ApplyTimeout() {
  // The receive timeout lives on the socket, so a wait is one recvmsg (no poll before it):
  // on this path every system call is a noticeable share of a round trip.
  timeval tv{timeout_ms_ / 1000, (timeout_ms_ % 1000) * 1000};
  if (::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) return ErrnoStatus(errno, "SO_RCVTIMEO");
  return Status::Ok();
}

Status Connection::set_timeout_ms(int ms) {
  timeout_ms_ = ms;
  return fd_ >= 0 ? ApplyTimeout() : Status::Ok();
}

Status Connection::ReadMore() {
  if (!broken_.ok()) return broken_;
  auto space = in_.WritableSpace(64 * 1024);
  auto n = RecvSome(fd_, space, &fds_);
  if (!n.ok()) {
    // EAGAIN from a blocking socket: SO_RCVTIMEO ran out.
    if (n.status().code() == StatusCode::kUnavailable) {
      return DeadlineExceeded("no response from kvtierd within " + std::to_string(timeout_ms_) + " ms");
    }
    return n.status();
  }
  if (*n == 0) {
    broken_ = Unavailable("kvtierd closed the connection");
    return broken_;
  }
  in_.Produced(*n);
  return Status::Ok();
}

Status Connection::RefusalOr(Status failed) {
  // Only what is already queued: never wait on a connection that is gone.
  for (int reads = 0; reads < 16; ++reads) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0 || !(p.revents & POLLIN)) break;
    auto n = RecvSome(fd_, in_.WritableSpace(64 * 1024), &fds_);
    if (!n.ok() || *n == 0) break;
    in_.Produced(*n);
  }
  for (;;) {
    auto frame = in_.Next();
    if (!frame.ok() || !frame->has_value()) return failed;
    auto resp = VerifyResponseFrame((*frame)->frame);
    if (resp.ok() && (*resp)->id() == 0) return StatusFromResponse(**resp);
  }
}

Status Connection::TakeSegments(const fb::Response& r) {
  const flatbuffers::Vector<flatbuffers::Offset<fb::Segment>>* segs = nullptr;
  switch (r.reply_type()) {
    case fb::Reply::Welcome:
      if (on_welcome_) on_welcome_(*r.reply_as_Welcome());  // how to map each tier, before mapping
      segs = r.reply_as_Welcome()->segments();
      break;
    case fb::Reply::AllocateReply:
      segs = r.reply_as_AllocateReply()->segments();
      break;
    case fb::Reply::AcquireReply:
      segs = r.reply_as_AcquireReply()->segments();
      break;
    default:
      break;
  }
  if (!segs || segs->size() == 0) return Status::Ok();
  size_t with_fd = 0;
  for (const fb::Segment* s : *segs) with_fd += s->fd_slot() != 255;
  if (fds_.size() < with_fd) return Internal("segment descriptors missing from the stream");
  std::vector<int> mine(fds_.begin(), fds_.begin() + static_cast<std::ptrdiff_t>(with_fd));
  fds_.erase(fds_.begin(), fds_.begin() + static_cast<std::ptrdiff_t>(with_fd));
  Status result;
  for (const fb::Segment* s : *segs) {
    const int fd = s->fd_slot() == 255 ? -1 : (s->fd_slot() < mine.size() ? mine[s->fd_slot()] : -2);
    const auto tier = TierFromWire(s->tier());
    if (fd == -2 || !tier) {
      result = Internal("segment names a descriptor that was not sent, or no tier");
      continue;
    }
    SegmentGrantView g;
    g.tier = *tier;
    g.index = s->index();
    g.first_page = s->first_page();
    g.num_pages = s->num_pages();
    g.bytes = s->bytes();
    g.fd = fd;
    if (s->ipc_handle()) g.ipc_handle = {s->ipc_handle()->data(), s->ipc_handle()->size()};
    Status st = on_segment_ ? on_segment_(g) : Status::Ok();
    if (!st.ok()) result = st;
  }
  for (int fd : mine) ::close(fd);  // the mappings keep the memory
  return result;
}

}  // namespace kvtier
