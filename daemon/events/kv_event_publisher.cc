// KvEvents' sockets and publisher thread: the endpoints bound and checked (ipc permissions,
// peers per user), the PUB and replay sockets, the monitor of their peers, publishing what
// the control thread queued and answering replay requests. The topics' state the control
// thread writes is kv_events.cc's.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <unordered_map>
#include <zmq.hpp>

#include "daemon/events/kv_events.h"
#include "protocol/base/clock.h"
#include "protocol/base/logging.h"
#include "protocol/base/thread_name.h"

namespace kvtier {

namespace {

// ZMQ's ipc bind replaces a socket file another process listens on (that process then
// publishes to nobody, and its subscribers read ours): refuse an ipc path in use.
Status CheckIpcFree(std::string_view key, const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) != 0) return Status::Ok();
  const std::string path = endpoint.substr(6);
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) return Status::Ok();  // ZMQ reports it
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool listening = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  if (fd >= 0) ::close(fd);
  if (listening) {
    return FailedPrecondition(std::string(key) + " '" + endpoint +
                              "': another process publishes there (a second kvtierd?); give each its own path");
  }
  return Status::Ok();
}

// An ipc endpoint's socket file: mode 0660, group `gid` (-1: the daemon's), so only the
// daemon's user and that group subscribe (ZMQ made it with the umask's mode).
Status RestrictIpc(std::string_view key, const std::string& endpoint, int64_t gid) {
  if (endpoint.rfind("ipc://", 0) != 0) return Status::Ok();
  const std::string path = endpoint.substr(6);
  if ((gid >= 0 && ::chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(gid)) != 0) ||
      ::chmod(path.c_str(), 0660) != 0) {
    return Internal(std::string(key) + " '" + endpoint + "': cannot restrict its socket file: " + std::strerror(errno));
  }
  return Status::Ok();
}

// A TCP endpoint on every interface ("tcp://*:5590", 0.0.0.0, [::]).
bool AllInterfaces(const std::string& endpoint) {
  return endpoint.rfind("tcp://*", 0) == 0 || endpoint.rfind("tcp://0.0.0.0:", 0) == 0 ||
         endpoint.rfind("tcp://[::]:", 0) == 0;
}

std::string SeqBytes(uint64_t seq) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, seq >>= 8) out[static_cast<size_t>(i)] = static_cast<char>(seq & 0xff);
  return out;
}

// Whether `fd` is a connection accepted on `endpoint` (as bound): a monitor event names
// an fd that ZMQ may have closed (and the number reused) before the event is read.
bool AcceptedOn(int fd, const std::string& endpoint) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return false;
  int listening = 0;
  socklen_t ol = sizeof(listening);
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) != 0 || listening) return false;
  if (endpoint.rfind("ipc://", 0) == 0) {
    const auto* u = reinterpret_cast<const sockaddr_un*>(&a);
    return a.ss_family == AF_UNIX && endpoint.compare(6, std::string::npos, u->sun_path) == 0;
  }
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) return false;
  const int port = std::atoi(endpoint.c_str() + colon + 1);
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port) == port;
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port) == port;
  return false;
}

// Starts monitoring `s` for accepted and closed connections on a new PAIR socket.
zmq::socket_t Monitor(zmq::context_t& ctx, zmq::socket_t& s, const std::string& name) {
  const std::string ep = "inproc://" + name;
  if (zmq_socket_monitor(s.handle(), ep.c_str(), ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0) {
    throw zmq::error_t();
  }
  zmq::socket_t m(ctx, zmq::socket_type::pair);
  m.connect(ep);
  return m;
}

}  // namespace

struct KvEvents::Sockets {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;
  // PAIR sockets receiving the monitor events of pub and replay.
  std::optional<zmq::socket_t> pub_monitor, replay_monitor;
  uint32_t peers[2] = {0, 0};  // pub, replay
  // Peers of local users (ipc:// endpoints, by SO_PEERCRED) within max_peer_share_per_user,
  // by socket: the user of each accepted connection, and each user's count.
  std::unordered_map<int, uid_t> peer_user[2];
  std::unordered_map<uid_t, uint32_t> user_peers[2];
  // The replay ring, oldest first: (sequence, payload); payloads shared with what pub
  // sent. At most replay_batches messages and replay_bytes of payloads.
  std::deque<std::pair<uint64_t, zmq::message_t>> ring;
  uint64_t ring_bytes = 0;
  int64_t last_refusal_log_ns = 0;
};

KvEventsOptions ResolveEventEndpoints(KvEventsOptions options, const std::string& data_dir) {
  if (options.publish.empty()) {
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::absolute(data_dir, ec).lexically_normal();
    options.publish = "ipc://" + (dir / kDefaultPublishFile).string();
  }
  return options;
}

Status CheckEventEndpoints(const KvEventsOptions& options, std::vector<std::string>* warnings) {
  KVTIER_RETURN_IF_ERROR(CheckIpcFree("events.publish", options.publish));
  if (!options.replay.empty()) KVTIER_RETURN_IF_ERROR(CheckIpcFree("events.replay", options.replay));
  for (const auto& [key, endpoint] : {std::pair<const char*, const std::string&>{"events.publish", options.publish},
                                      {"events.replay", options.replay}}) {
    if (warnings != nullptr && AllInterfaces(endpoint)) {
      warnings->push_back(std::string(key) + " '" + endpoint +
                          "' listens on every interface: whoever reaches this host reads every tenant's block "
                          "hashes (bind an address only routers reach, or use ipc:// with file permissions)");
    }
  }
  return Status::Ok();
}

KvEvents::KvEvents(const KvEventsOptions& options) : options_(options), sockets_(std::make_unique<Sockets>()) {}

Result<std::unique_ptr<KvEvents>> KvEvents::Open(const KvEventsOptions& options) {
  // Checked again here: another process may have bound the path since the start's check.
  KVTIER_RETURN_IF_ERROR(CheckEventEndpoints(options, nullptr));
  std::unique_ptr<KvEvents> e(new KvEvents(options));
  e->host_ = options.hostname;
  if (e->host_.empty()) {
    char name[256] = {};
    if (::gethostname(name, sizeof(name) - 1) == 0) e->host_ = name;
  }
  Sockets& s = *e->sockets_;
  try {
    s.pub.set(zmq::sockopt::sndhwm, options.send_hwm);
    s.pub.set(zmq::sockopt::linger, 200);
    s.pub.bind(options.publish);
    e->publish_endpoint_ = s.pub.get(zmq::sockopt::last_endpoint);
    KVTIER_RETURN_IF_ERROR(RestrictIpc("events.publish", e->publish_endpoint_, options.ipc_gid));
    s.pub_monitor.emplace(Monitor(s.ctx, s.pub, "kvtier-events-pub"));
  } catch (const zmq::error_t& err) {
    return InvalidArgument("events.publish '" + options.publish + "': cannot bind: " + err.what());
  }
  if (!options.replay.empty()) {
    try {
      s.replay.emplace(s.ctx, zmq::socket_type::router);
      s.replay->set(zmq::sockopt::linger, 0);
      s.replay->set(zmq::sockopt::sndhwm,
                    std::max<int>(options.send_hwm, static_cast<int>(options.replay_batches) + 1));
      s.replay->bind(options.replay);
      e->replay_endpoint_ = s.replay->get(zmq::sockopt::last_endpoint);
      KVTIER_RETURN_IF_ERROR(RestrictIpc("events.replay", e->replay_endpoint_, options.ipc_gid));
      s.replay_monitor.emplace(Monitor(s.ctx, *s.replay, "kvtier-events-replay"));
    } catch (const zmq::error_t& err) {
      return InvalidArgument("events.replay '" + options.replay + "': cannot bind: " + err.what());
    }
  }
  // Sequence numbers keep increasing across restarts (see the header).
  e->first_seq_ = e->next_seq_ = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  e->LoadState();
  KvEvents* raw = e.get();
  e->thread_ = std::thread([raw] {
    NameThisThread("kvtier-events");
    raw->Run();
  });
  KVTIER_LOG(NOTICE) << "events: publishing on " << e->publish_endpoint_
                     << (e->replay_endpoint_.empty() ? "" : ", replay on " + e->replay_endpoint_);
  return e;
}

KvEvents::~KvEvents() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// ---- the publisher thread ---------------------------------------------------------------

void KvEvents::Run() {
  using Clock = std::chrono::steady_clock;
  const auto interval = std::chrono::nanoseconds(std::max<int64_t>(options_.flush_interval_ns, 1'000'000));
  auto next_flush = Clock::now() + interval;
  const auto retract_at = Clock::now() + std::chrono::nanoseconds(kRetractDelay_ns);
  auto next_save = Clock::now() + std::chrono::nanoseconds(kStateInterval_ns);
  for (;;) {
    bool stopping;
    {
      MutexLock lock(&mu_);
      stopping = stop_;
    }
    // Replay requests and peers' connections are served as they come; the batches go out
    // every interval.
    std::vector<zmq::pollitem_t> items = {{static_cast<void*>(*sockets_->pub_monitor), 0, ZMQ_POLLIN, 0}};
    if (sockets_->replay) {
      items.push_back({static_cast<void*>(*sockets_->replay_monitor), 0, ZMQ_POLLIN, 0});
      items.push_back({static_cast<void*>(*sockets_->replay), 0, ZMQ_POLLIN, 0});
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_flush - Clock::now());
    try {
      // At most 100 ms at a time, so a stop is seen promptly.
      zmq::poll(items.data(), items.size(),
                std::chrono::milliseconds(stopping ? 0 : std::clamp<int64_t>(wait.count(), 0, 100)));
    } catch (const zmq::error_t&) {
      for (auto& i : items) i.revents = 0;
    }
    if (items[0].revents & ZMQ_POLLIN) WatchPeers(false);
    if (items.size() > 1 && (items[1].revents & ZMQ_POLLIN)) WatchPeers(true);
    if (items.size() > 2 && (items[2].revents & ZMQ_POLLIN)) ServeReplay();
    if (!earlier_.empty() && Clock::now() >= retract_at) Retract();
    if (stopping || Clock::now() >= next_flush) {
      PublishPending();
      next_flush = Clock::now() + interval;
    }
    if (stopping || Clock::now() >= next_save) {
      SaveState();
      next_save = Clock::now() + std::chrono::nanoseconds(kStateInterval_ns);
    }
    if (stopping) return;
  }
}

void KvEvents::WatchPeers(bool replay) {
  zmq::socket_t& mon = replay ? *sockets_->replay_monitor : *sockets_->pub_monitor;
  uint32_t& peers = sockets_->peers[replay ? 1 : 0];
  auto& peer_user = sockets_->peer_user[replay ? 1 : 0];
  auto& user_peers = sockets_->user_peers[replay ? 1 : 0];
  const uint32_t max = replay ? options_.max_replay_peers : options_.max_subscribers;
  const uint32_t per_user = std::max<uint32_t>(1, static_cast<uint32_t>(max * options_.max_peer_share_per_user));
  const std::string& endpoint = replay ? replay_endpoint_ : publish_endpoint_;
  const bool local = endpoint.rfind("ipc://", 0) == 0;
  auto refuse = [&](int fd, const std::string& why) {
    // ZMQ reads the end of the stream and closes the connection itself.
    ::shutdown(fd, SHUT_RDWR);
    refused_.fetch_add(1, std::memory_order_relaxed);
    const int64_t now = SystemClock::Default()->NowNanos();
    if (now - sockets_->last_refusal_log_ns > 60'000'000'000) {
      sockets_->last_refusal_log_ns = now;
      KVTIER_LOG(WARNING) << "events: a connection to " << endpoint << " refused: " << why
                          << " (logged once a minute; kvtier_events_peers_refused_total counts)";
    }
  };
  for (int n = 0; n < 1024; ++n) {
    zmq::message_t event, address;
    try {
      if (!mon.recv(event, zmq::recv_flags::dontwait)) break;
      if (event.more()) (void)mon.recv(address, zmq::recv_flags::none);
    } catch (const zmq::error_t&) {
      break;
    }
    if (event.size() < 6) continue;
    uint16_t id = 0;
    uint32_t value = 0;
    std::memcpy(&id, event.data(), 2);
    std::memcpy(&value, static_cast<const char*>(event.data()) + 2, 4);
    const int fd = static_cast<int>(value);
    if (id == ZMQ_EVENT_DISCONNECTED) {
      peers -= peers > 0 ? 1 : 0;
      if (auto it = peer_user.find(fd); it != peer_user.end()) {
        --user_peers[it->second];
        peer_user.erase(it);
      }
    } else if (id == ZMQ_EVENT_ACCEPTED) {
      ++peers;
      if (!AcceptedOn(fd, endpoint)) continue;
      if (peers > max) {
        refuse(fd, std::string(replay ? "events.max_replay_peers (" : "events.max_subscribers (") +
                       std::to_string(max) + ") are connected");
        continue;
      }
      ucred cred{};
      socklen_t len = sizeof(cred);
      if (!local || ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) continue;
      // An admin (root, the daemon's own user) is never capped per user.
      if (cred.uid == 0 || cred.uid == ::geteuid()) continue;
      if (user_peers[cred.uid] >= per_user) {
        refuse(fd, "uid " + std::to_string(cred.uid) + " holds " + std::to_string(per_user) +
                       " of them (events.max_peer_share_per_user of " + std::to_string(max) + ")");
        continue;
      }
      ++user_peers[cred.uid];
      peer_user[fd] = cred.uid;
    }
  }
  (replay ? replay_peers_ : subscribers_).store(peers, std::memory_order_relaxed);
}

void KvEvents::PublishPending() {
  struct Batch {
    std::string topic;
    std::optional<uint32_t> dp_rank;
    std::vector<KvEvent> events;
  };
  std::vector<Batch> batches;
  std::vector<TopicKey> ended;
  {
    MutexLock lock(&mu_);
    for (Topic* t : order_) batches.push_back(Batch{t->key.first, t->key.second, std::move(t->pending)});
    for (Topic* t : order_) t->pending.clear();
    order_.clear();
    queued_ = queued_bytes_ = 0;
    for (auto& [name, tenant] : tenants_) tenant.queued = tenant.queued_bytes = 0;
    // After their last batches are taken: a topic revived later is a new one, whose events
    // go out after this retraction.
    ended = EndIdleTopics(SystemClock::Default()->NowNanos());
  }
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (auto& [topic, dp_rank, events] : batches) {
    AnnouncedState& known = announced_[{topic, dp_rank}];
    for (const KvEvent& e : events) {
      known.signed_hashes = e.signed_hashes;
      auto& set = known.hashes[{e.tier, e.group.index}];
      for (uint64_t h : e.hashes) {
        if (e.kind == KvEvent::Kind::kStored) {
          set.insert(h);
        } else {
          set.erase(h);
        }
      }
      state_dirty_ = true;
    }
    // At most batch_size hashes and message_bytes a message.
    for (size_t at = 0; at < events.size();) {
      size_t end = at, hashes = 0;
      uint64_t bytes = 0;
      while (end < events.size() && (end == at || (hashes + events[end].hashes.size() <= options_.batch_size &&
                                                   bytes + events[end].bytes <= options_.message_bytes))) {
        hashes += events[end].hashes.size();
        bytes += events[end].bytes;
        ++end;
      }
      Publish(topic, EncodeEventBatch(now, std::span<const KvEvent>(events.data() + at, end - at), options_.encoding,
                                      dp_rank));
      events_.fetch_add(hashes, std::memory_order_relaxed);
      at = end;
    }
  }
  for (const TopicKey& key : ended) RetractTopic(key);
}

void KvEvents::PublishRemoved(const TopicKey& key, const KvEvent& removed, double timestamp) {
  for (size_t at = 0; at < removed.hashes.size(); at += options_.batch_size) {
    KvEvent part = removed;
    part.hashes.assign(
        removed.hashes.begin() + static_cast<long>(at),
        removed.hashes.begin() + static_cast<long>(std::min(removed.hashes.size(), at + options_.batch_size)));
    Publish(key.first, EncodeEventBatch(timestamp, std::span<const KvEvent>(&part, 1), options_.encoding, key.second));
  }
}

void KvEvents::RetractTopic(const TopicKey& key) {
  auto it = announced_.find(key);
  uint64_t n = 0;
  if (it != announced_.end()) {
    const double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    for (const auto& [medium, set] : it->second.hashes) {
      KvEvent e{.kind = KvEvent::Kind::kRemoved,
                .tier = medium.first,
                .signed_hashes = it->second.signed_hashes,
                .group = EventGroup{.index = medium.second}};
      e.hashes.assign(set.begin(), set.end());
      n += e.hashes.size();
      PublishRemoved(key, e, ts);
    }
    announced_.erase(it);
    state_dirty_ = true;
  }
  events_.fetch_add(n, std::memory_order_relaxed);
  topics_removed_.fetch_add(1, std::memory_order_relaxed);
  KVTIER_LOG(INFO) << "events: topic " << key.first << " ended (" << n << " block hashes removed)";
}

void KvEvents::Publish(const std::string& topic, const std::string& payload) {
  const uint64_t seq = next_seq_++;
  zmq::message_t body(payload.data(), payload.size());
  const bool keep = options_.replay_batches > 0 && sockets_->replay;
  zmq::message_t kept;
  if (keep) kept.copy(body);  // shares the payload
  try {
    sockets_->pub.send(zmq::buffer(topic), zmq::send_flags::sndmore);
    sockets_->pub.send(zmq::buffer(SeqBytes(seq)), zmq::send_flags::sndmore);
    sockets_->pub.send(body, zmq::send_flags::none);
  } catch (const zmq::error_t& err) {
    KVTIER_LOG(WARNING) << "events: send failed: " << err.what();
  }
  messages_.fetch_add(1, std::memory_order_relaxed);
  if (!keep) return;
  auto& ring = sockets_->ring;
  sockets_->ring_bytes += kept.size();
  ring.emplace_back(seq, std::move(kept));
  while (ring.size() > options_.replay_batches || (ring.size() > 1 && sockets_->ring_bytes > options_.replay_bytes)) {
    sockets_->ring_bytes -= ring.front().second.size();
    ring.pop_front();
  }
}

void KvEvents::ServeReplay() {
  zmq::socket_t& r = *sockets_->replay;
  for (int served = 0; served < 16; ++served) {
    std::vector<zmq::message_t> parts;
    try {
      for (;;) {
        zmq::message_t m;
        if (!r.recv(m, zmq::recv_flags::dontwait)) break;
        const bool more = m.more();
        if (parts.size() < 4) parts.push_back(std::move(m));  // more is never a request
        if (!more) break;
      }
    } catch (const zmq::error_t&) {
      return;
    }
    if (parts.empty()) return;
    // [identity, "", start sequence]; anything else is ignored.
    std::vector<std::string_view> views;
    for (const zmq::message_t& m : parts) views.emplace_back(static_cast<const char*>(m.data()), m.size());
    const std::optional<uint64_t> parsed = ParseReplayRequest(views);
    if (!parsed) continue;
    const uint64_t start = *parsed;
    const std::string identity(static_cast<const char*>(parts[0].data()), parts[0].size());
    auto send = [&](const std::string& seq, zmq::message_t& payload) {
      r.send(zmq::buffer(identity), zmq::send_flags::sndmore);
      r.send(zmq::const_buffer(), zmq::send_flags::sndmore);
      r.send(zmq::buffer(seq), zmq::send_flags::sndmore);
      r.send(payload, zmq::send_flags::none);
    };
    try {
      for (auto& [seq, kept] : sockets_->ring) {  // oldest first
        if (seq < start) continue;
        zmq::message_t shared;
        shared.copy(kept);
        send(SeqBytes(seq), shared);
      }
      replays_.fetch_add(1, std::memory_order_relaxed);  // before the end mark its reader waits for
      zmq::message_t end;
      send(std::string(8, '\xff'), end);
    } catch (const zmq::error_t& err) {
      KVTIER_LOG(WARNING) << "events: replay failed: " << err.what();
    }
  }
}

}  // namespace kvtier
