#include "daemon/events/kv_events.h"

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
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <zmq.hpp>

#include "protocol/base/clock.h"
#include "protocol/base/logging.h"

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
  e->thread_ = std::thread([raw] { raw->Run(); });
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

Result<uint64_t> KvEvents::AddNamespace(std::string_view encoded_ns, std::string_view tenant, std::string_view model,
                                        uint32_t tokens_per_block, const EventSource& source) {
  if (source.hashes == EventHashForm::kNone) return uint64_t{0};
  const std::string_view served = model.substr(0, model.find('|'));
  const std::string name = ExpandTopic(
      options_.topic, source.routable_id.empty() ? std::string_view(host_) : source.routable_id, host_, served, tenant);
  const std::optional<uint32_t> rank =
      source.dp_rank >= 0 ? std::optional(static_cast<uint32_t>(source.dp_rank)) : std::nullopt;
  MutexLock lock(&mu_);
  // Refused before anything changes.
  if (!source.routable_id.empty()) {
    auto held = routable_.find(source.routable_id);
    if (held != routable_.end() && held->second.first != tenant) {
      topics_refused_.fetch_add(1, std::memory_order_relaxed);
      return PermissionDenied("routable_id '" + std::string(source.routable_id) +
                              "' is declared by another tenant's engine; each engine declares its own address");
    }
  }
  auto found = by_name_.find({name, rank});
  Topic* t = found == by_name_.end() ? nullptr : found->second;
  TenantState& ts = tenants_[std::string(tenant)];
  const bool charged = t != nullptr && t->tenants.count(tenant) > 0;
  if (!charged && ts.topics >= options_.max_topics_per_tenant) {
    topics_refused_.fetch_add(1, std::memory_order_relaxed);
    if (ts.topics == 0 && ts.namespaces == 0) tenants_.erase(tenants_.find(tenant));
    return ResourceExhausted("tenant '" + std::string(tenant) + "' holds events.max_topics_per_tenant (" +
                             std::to_string(options_.max_topics_per_tenant) +
                             ") KV event topics, lingering ones among them (events.topic_linger after their last "
                             "engine detaches)");
  }
  if (t == nullptr) {
    topics_.push_back(std::make_unique<Topic>());
    t = topics_.back().get();
    t->key = {name, rank};
    by_name_[t->key] = t;
    topic_count_.store(static_cast<uint32_t>(topics_.size()), std::memory_order_relaxed);
  }
  if (t->links == 0) {
    // Revived, or new: tenants left charged at 0 while it lingered are released.
    for (auto it = t->tenants.begin(); it != t->tenants.end();) {
      if (it->first != tenant) {
        Uncharge(it->first);
        it = t->tenants.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (t->tenants.emplace(std::string(tenant), 0).second) ++ts.topics;
  ++t->tenants.find(tenant)->second;
  ++t->links;
  if (!source.routable_id.empty() &&
      std::find(t->routable_ids.begin(), t->routable_ids.end(), source.routable_id) == t->routable_ids.end()) {
    t->routable_ids.emplace_back(source.routable_id);
    auto& [holder, topics] = routable_[std::string(source.routable_id)];
    holder = tenant;
    ++topics;
  }
  auto it = by_namespace_.find(encoded_ns);
  if (it == by_namespace_.end()) {
    const uint32_t block_size = source.group.block_tokens ? source.group.block_tokens : tokens_per_block;
    it = by_namespace_
             .emplace(std::string(encoded_ns),
                      Announced{source.hashes, block_size, source.group, std::string(tenant), &ts, {}})
             .first;
    ++ts.namespaces;
  }
  std::vector<Topic*>& topics = it->second.topics;
  if (std::find(topics.begin(), topics.end(), t) == topics.end()) {
    topics.push_back(t);
    t->namespaces.emplace_back(encoded_ns);
  }
  const uint64_t link = next_link_++;
  links_.emplace(link, Link{t, std::string(tenant)});
  return link;
}

void KvEvents::RemoveNamespace(uint64_t link) {
  MutexLock lock(&mu_);
  auto it = links_.find(link);
  if (it == links_.end()) return;
  Topic* t = it->second.topic;
  auto charged = t->tenants.find(it->second.tenant);
  --charged->second;
  --t->links;
  if (charged->second == 0 && t->links > 0) {
    Uncharge(charged->first);
    t->tenants.erase(charged);
  }
  if (t->links == 0) t->idle_since_ns = SystemClock::Default()->NowNanos();
  links_.erase(it);
}

void KvEvents::Uncharge(const std::string& tenant) {
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return;
  --it->second.topics;
  if (it->second.topics == 0 && it->second.namespaces == 0) tenants_.erase(it);
}

std::vector<KvEvents::TopicKey> KvEvents::EndIdleTopics(int64_t now_ns) {
  std::vector<TopicKey> ended;
  for (auto it = topics_.begin(); it != topics_.end();) {
    Topic* t = it->get();
    if (t->links > 0 || now_ns - t->idle_since_ns < options_.topic_linger_ns) {
      ++it;
      continue;
    }
    for (const std::string& ns : t->namespaces) {
      auto a = by_namespace_.find(ns);
      if (a == by_namespace_.end()) continue;
      std::erase(a->second.topics, t);
      if (a->second.topics.empty()) {
        auto owner = tenants_.find(a->second.owner);
        by_namespace_.erase(a);
        if (owner != tenants_.end() && --owner->second.namespaces == 0 && owner->second.topics == 0) {
          tenants_.erase(owner);
        }
      }
    }
    for (const auto& [tenant, links] : t->tenants) Uncharge(tenant);
    for (const std::string& id : t->routable_ids) {
      auto r = routable_.find(id);
      if (r != routable_.end() && --r->second.second == 0) routable_.erase(r);
    }
    by_name_.erase(t->key);
    ended.push_back(t->key);
    it = topics_.erase(it);
  }
  if (!ended.empty()) topic_count_.store(static_cast<uint32_t>(topics_.size()), std::memory_order_relaxed);
  return ended;
}

bool KvEvents::Admit(TenantState* tenant, uint64_t bytes) {
  // An equal share of the buffer (events and bytes) for each tenant with namespaces, and
  // the buffer's bounds.
  const uint64_t tenants = std::max<size_t>(1, tenants_.size());
  const uint64_t share = std::max<uint64_t>(1, options_.queue_events / tenants);
  const uint64_t byte_share = options_.queue_bytes / tenants;
  if (queued_ >= options_.queue_events || tenant->queued >= share || queued_bytes_ + bytes > options_.queue_bytes ||
      tenant->queued_bytes + bytes > byte_share) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  ++queued_;
  ++tenant->queued;
  queued_bytes_ += bytes;
  tenant->queued_bytes += bytes;
  return true;
}

KvEvent* KvEvents::Append(Topic& t, const Announced& ns, KvEvent::Kind kind, TierKind tier, uint64_t bytes) {
  if (!Admit(ns.tenant, sizeof(KvEvent) + bytes)) return nullptr;
  if (t.pending.empty()) order_.push_back(&t);
  t.pending.push_back(KvEvent{.kind = kind,
                              .block_size = ns.block_size,
                              .tier = tier,
                              .signed_hashes = ns.hashes == EventHashForm::kSglang,
                              .bytes = bytes,
                              .group = ns.group});
  return &t.pending.back();
}

void KvEvents::Add(std::string_view encoded_ns, KvEvent::Kind kind, TierKind tier, const BlockHash& hash,
                   const BlockHash* parent, const StoredKeys& keys) {
  MutexLock lock(&mu_);
  auto it = by_namespace_.find(encoded_ns);
  if (it == by_namespace_.end()) return;
  const Announced& ns = it->second;
  const uint64_t h = EventHash(hash, ns.hashes);
  const std::optional<uint64_t> p =
      parent && !parent->empty() ? std::optional(EventHash(*parent, ns.hashes)) : std::nullopt;
  for (Topic* t : ns.topics) AddTo(*t, ns, kind, tier, h, p, keys);
}

void KvEvents::AddTo(Topic& t, const Announced& ns, KvEvent::Kind kind, TierKind tier, uint64_t h,
                     std::optional<uint64_t> p, StoredKeys keys) {
  if (!options_.token_ids || keys.tokens.size() != ns.block_size) keys.tokens = {};
  if (!options_.token_ids || keys.extra.size() != 1) keys.extra = {};
  const bool signed_hashes = ns.hashes == EventHashForm::kSglang;
  // What the event grows by (a new event adds its own size and the LoRA name).
  const uint64_t bytes = sizeof(h) + keys.tokens.size_bytes() + (keys.extra.empty() ? 0 : keys.extra.front().size());
  // Consecutive removals join one BlockRemoved; the next block of a chain being stored
  // joins the previous BlockStored (vLLM's form) when both have tokens or neither has,
  // likewise extra keys, and both name the same LoRA adapter.
  if (!t.pending.empty()) {
    KvEvent& last = t.pending.back();
    const bool joins = last.kind == kind && last.tier == tier && last.signed_hashes == signed_hashes &&
                       last.group == ns.group && last.block_size == ns.block_size &&
                       last.hashes.size() < options_.batch_size && last.bytes + bytes <= options_.message_bytes &&
                       (kind == KvEvent::Kind::kRemoved ||
                        (p && last.hashes.back() == *p && last.token_ids.empty() == keys.tokens.empty() &&
                         last.extra_keys.empty() == keys.extra.empty() && last.lora_name == keys.lora_name &&
                         last.lora_id == keys.lora_id));
    if (joins) {
      if (!Admit(ns.tenant, bytes)) return;
      last.hashes.push_back(h);
      last.bytes += bytes;
      last.token_ids.insert(last.token_ids.end(), keys.tokens.begin(), keys.tokens.end());
      last.extra_keys.insert(last.extra_keys.end(), keys.extra.begin(), keys.extra.end());
      return;
    }
  }
  KvEvent* e = Append(t, ns, kind, tier, bytes + keys.lora_name.size());
  if (e == nullptr) return;
  e->hashes.push_back(h);
  if (kind == KvEvent::Kind::kStored) {
    e->parent = p;
    e->token_ids.assign(keys.tokens.begin(), keys.tokens.end());
    e->extra_keys.assign(keys.extra.begin(), keys.extra.end());
    e->lora_name = keys.lora_name;
    e->lora_id = keys.lora_id;
  }
}

KvEvents::Counters KvEvents::counters() const {
  Counters c;
  c.events = events_.load(std::memory_order_relaxed);
  c.messages = messages_.load(std::memory_order_relaxed);
  c.dropped = dropped_.load(std::memory_order_relaxed);
  c.replays = replays_.load(std::memory_order_relaxed);
  c.refused = refused_.load(std::memory_order_relaxed);
  c.retracted = retracted_.load(std::memory_order_relaxed);
  c.topics_removed = topics_removed_.load(std::memory_order_relaxed);
  c.topics_refused = topics_refused_.load(std::memory_order_relaxed);
  c.topics = topic_count_.load(std::memory_order_relaxed);
  c.subscribers = subscribers_.load(std::memory_order_relaxed);
  c.replay_peers = replay_peers_.load(std::memory_order_relaxed);
  c.first_sequence = first_seq_;
  return c;
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

// ---- what was announced, across restarts ---------------------------------------------------

void KvEvents::LoadState() {
  if (options_.state_path.empty()) return;
  std::ifstream in(options_.state_path);
  if (!in) return;
  std::stringstream text;
  text << in.rdbuf();
  size_t n = 0;
  earlier_ = ParseAnnouncedState(text.str(), &n);
  if (n == 0) {
    earlier_.clear();
  } else {
    KVTIER_LOG(NOTICE) << "events: " << n << " block hashes announced by the last run are removed in "
                       << kRetractDelay_ns / 1'000'000 << " ms";
  }
}

void KvEvents::SaveState() {
  if (options_.state_path.empty() || !state_dirty_) return;
  // Write and rename: a crash leaves the old file or the new one, never half of one.
  const std::string tmp = options_.state_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << EncodeAnnouncedState(announced_);
    if (!out) {
      KVTIER_LOG(WARNING) << "events: cannot write " << tmp;
      return;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, options_.state_path, ec);
  if (ec) KVTIER_LOG(WARNING) << "events: cannot replace " << options_.state_path << ": " << ec.message();
  state_dirty_ = false;
}

void KvEvents::Retract() {
  std::vector<std::pair<TopicKey, KvEvent>> removals;
  uint64_t n = 0;
  for (auto& [key, a] : earlier_) {
    const auto now = announced_.find(key);
    for (auto& [medium, set] : a.hashes) {
      KvEvent e;
      e.kind = KvEvent::Kind::kRemoved;
      e.tier = medium.first;
      e.signed_hashes = a.signed_hashes;
      e.group.index = medium.second;
      for (uint64_t h : set) {
        // Announced again by this run: still true.
        if (now != announced_.end()) {
          auto it = now->second.hashes.find(medium);
          if (it != now->second.hashes.end() && it->second.count(h)) continue;
        }
        e.hashes.push_back(h);
      }
      n += e.hashes.size();
      if (!e.hashes.empty()) removals.emplace_back(key, std::move(e));
    }
  }
  earlier_.clear();
  const double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (auto& [key, e] : removals) PublishRemoved(key, e, ts);
  retracted_.fetch_add(n, std::memory_order_relaxed);
  events_.fetch_add(n, std::memory_order_relaxed);
  state_dirty_ = true;  // the earlier run's file is replaced by this run's
  KVTIER_LOG(NOTICE) << "events: removed " << n << " block hashes announced by the last run";
}

}  // namespace kvtier
