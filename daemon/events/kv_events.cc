#include "daemon/events/kv_events.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#define MSGPACK_NO_BOOST 1
#include <algorithm>
#include <chrono>
#include <msgpack.hpp>
#include <zmq.hpp>

#include "protocol/base/logging.h"

namespace kvtier {

uint64_t EventHash(const BlockHash& hash, EventHashForm form) {
  auto b = hash.bytes();
  const size_t n = std::min<size_t>(b.size(), 8);
  const size_t from = form == EventHashForm::kSglang ? 0 : b.size() - n;
  uint64_t v = 0;
  for (size_t i = from; i < from + n; ++i) v = (v << 8) | b[i];
  return v;
}

std::string_view EventMedium(TierKind tier) {
  switch (tier) {
    case TierKind::kGpu:
      return "GPU";
    case TierKind::kHost:
      return "CPU_TIER1";
    case TierKind::kNvme:
      return "CPU_TIER2";
    case TierKind::kRemote:
      return "REMOTE";  // not published: see docs/architecture.md (KV events)
  }
  return "CPU_TIER1";
}

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackStr(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackHash(Packer& pk, uint64_t h, bool is_signed) {
  if (is_signed) {
    pk.pack_int64(static_cast<int64_t>(h));
  } else {
    pk.pack_uint64(h);
  }
}

void PackHashes(Packer& pk, const std::vector<uint64_t>& hashes, bool is_signed) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (uint64_t h : hashes) PackHash(pk, h, is_signed);
}

// One event, as a map keyed by field name (tagged) or an array in field order
// (positional); both name the same fields in the same order.
void PackEvent(Packer& pk, const KvEvent& e, KvEventEncoding encoding) {
  const bool tagged = encoding == KvEventEncoding::kTagged;
  auto field = [&](std::string_view name) {
    if (tagged) PackStr(pk, name);
  };
  const bool stored = e.kind == KvEvent::Kind::kStored;
  const uint32_t n = stored ? 8 : 3;
  if (tagged) {
    pk.pack_map(n);
  } else {
    pk.pack_array(n);
  }
  field("type");
  PackStr(pk, stored ? "BlockStored" : "BlockRemoved");
  field("block_hashes");
  PackHashes(pk, e.hashes, e.signed_hashes);
  if (stored) {
    field("parent_block_hash");
    if (e.parent) {
      PackHash(pk, *e.parent, e.signed_hashes);
    } else {
      pk.pack_nil();
    }
    field("token_ids");
    pk.pack_array(static_cast<uint32_t>(e.token_ids.size()));
    for (uint32_t t : e.token_ids) pk.pack_uint32(t);
    field("block_size");
    pk.pack_uint32(e.block_size);
    field("lora_id");
    pk.pack_nil();
  }
  field("medium");
  PackStr(pk, EventMedium(e.tier));
  if (stored) {
    field("lora_name");
    pk.pack_nil();
  }
}

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

}  // namespace

std::string EncodeEventBatch(double timestamp, std::span<const KvEvent> events, KvEventEncoding encoding,
                             std::optional<uint32_t> dp_rank) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(3);
  pk.pack_double(timestamp);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) PackEvent(pk, e, encoding);
  if (dp_rank) {
    pk.pack_uint32(*dp_rank);
  } else {
    pk.pack_nil();
  }
  return std::string(buf.data(), buf.size());
}

std::string ExpandTopic(std::string_view pattern, std::string_view engine, std::string_view host,
                        std::string_view model, std::string_view tenant) {
  std::string out;
  for (size_t i = 0; i < pattern.size();) {
    auto take = [&](std::string_view name, std::string_view value) {
      if (pattern.substr(i, name.size()) != name) return false;
      out.append(value);
      i += name.size();
      return true;
    };
    if (take("{engine}", engine) || take("{host}", host) || take("{model}", model) || take("{tenant}", tenant)) {
      continue;
    }
    out.push_back(pattern[i++]);
  }
  return out;
}

struct KvEvents::Sockets {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;
};

KvEvents::KvEvents(const KvEventsOptions& options) : options_(options), sockets_(std::make_unique<Sockets>()) {}

Result<std::unique_ptr<KvEvents>> KvEvents::Open(const KvEventsOptions& options) {
  KVTIER_RETURN_IF_ERROR(CheckIpcFree("events.publish", options.publish));
  if (!options.replay.empty()) KVTIER_RETURN_IF_ERROR(CheckIpcFree("events.replay", options.replay));
  for (const std::string* ep : {&options.publish, &options.replay}) {
    if (AllInterfaces(*ep)) {
      KVTIER_LOG(WARNING) << "events: " << *ep
                          << " listens on every interface: whoever reaches it reads every tenant's block "
                             "hashes (bind an address routers reach, or use ipc:// with file permissions)";
    }
  }
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
    } catch (const zmq::error_t& err) {
      return InvalidArgument("events.replay '" + options.replay + "': cannot bind: " + err.what());
    }
  }
  KvEvents* raw = e.get();
  e->thread_ = std::thread([raw] { raw->Run(); });
  KVTIER_LOG(NOTICE) << "events: publishing on " << e->publish_endpoint_
                     << (e->replay_endpoint_.empty() ? "" : ", replay on " + e->replay_endpoint_);
  return e;
}

KvEvents::~KvEvents() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void KvEvents::AddNamespace(std::string_view encoded_ns, std::string_view tenant, std::string_view model,
                            uint32_t tokens_per_block, const EventSource& source) {
  if (source.hashes == EventHashForm::kNone) return;
  const std::string_view served = model.substr(0, model.find('|'));
  const std::string name = ExpandTopic(
      options_.topic, source.routable_id.empty() ? std::string_view(host_) : source.routable_id, host_, served, tenant);
  const std::optional<uint32_t> rank =
      source.dp_rank >= 0 ? std::optional(static_cast<uint32_t>(source.dp_rank)) : std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  Topic*& t = by_name_[{name, rank}];
  if (t == nullptr) {
    topics_.push_back(std::make_unique<Topic>());
    t = topics_.back().get();
    t->name = name;
    t->dp_rank = rank;
    t->block_size = tokens_per_block;
  }
  auto it = by_namespace_.find(encoded_ns);
  if (it == by_namespace_.end())
    it = by_namespace_.emplace(std::string(encoded_ns), Announced{source.hashes, {}}).first;
  std::vector<Topic*>& topics = it->second.topics;
  if (std::find(topics.begin(), topics.end(), t) == topics.end()) topics.push_back(t);
}

KvEvent* KvEvents::Append(Topic& t, KvEvent::Kind kind, TierKind tier) {
  if (queued_ >= options_.queue_events) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  if (t.pending.empty()) order_.push_back(&t);
  ++queued_;
  t.pending.push_back(KvEvent{kind, {}, std::nullopt, t.block_size, {}, tier});
  return &t.pending.back();
}

void KvEvents::Add(std::string_view encoded_ns, KvEvent::Kind kind, TierKind tier, const BlockHash& hash,
                   const BlockHash* parent, std::span<const uint32_t> tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_namespace_.find(encoded_ns);
  if (it == by_namespace_.end()) return;
  const EventHashForm form = it->second.hashes;
  const uint64_t h = EventHash(hash, form);
  const std::optional<uint64_t> p = parent && !parent->empty() ? std::optional(EventHash(*parent, form)) : std::nullopt;
  for (Topic* t : it->second.topics) AddTo(*t, kind, tier, form == EventHashForm::kSglang, h, p, tokens);
}

void KvEvents::AddTo(Topic& t, KvEvent::Kind kind, TierKind tier, bool signed_hashes, uint64_t h,
                     std::optional<uint64_t> p, std::span<const uint32_t> tokens) {
  if (tokens.size() != t.block_size) tokens = {};
  // Consecutive removals join one BlockRemoved; the next block of a chain being stored
  // joins the previous BlockStored (vLLM's form) when both have tokens or neither has.
  if (!t.pending.empty()) {
    KvEvent& last = t.pending.back();
    const bool joins = last.kind == kind && last.tier == tier && last.signed_hashes == signed_hashes &&
                       last.hashes.size() < options_.batch_size &&
                       (kind == KvEvent::Kind::kRemoved ||
                        (p && last.hashes.back() == *p && last.token_ids.empty() == tokens.empty()));
    if (joins) {
      if (queued_ >= options_.queue_events) {
        dropped_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      ++queued_;
      last.hashes.push_back(h);
      last.token_ids.insert(last.token_ids.end(), tokens.begin(), tokens.end());
      return;
    }
  }
  KvEvent* e = Append(t, kind, tier);
  if (e == nullptr) return;
  e->signed_hashes = signed_hashes;
  e->hashes.push_back(h);
  if (kind == KvEvent::Kind::kStored) {
    e->parent = p;
    e->token_ids.assign(tokens.begin(), tokens.end());
  }
}

KvEvents::Counters KvEvents::counters() const {
  Counters c;
  c.events = events_.load(std::memory_order_relaxed);
  c.messages = messages_.load(std::memory_order_relaxed);
  c.dropped = dropped_.load(std::memory_order_relaxed);
  c.replays = replays_.load(std::memory_order_relaxed);
  return c;
}

// ---- the publisher thread ---------------------------------------------------------------

void KvEvents::Run() {
  using Clock = std::chrono::steady_clock;
  const auto interval = std::chrono::nanoseconds(std::max<int64_t>(options_.flush_interval_ns, 1'000'000));
  auto next_flush = Clock::now() + interval;
  for (;;) {
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mu_);
      stopping = stop_;
    }
    if (sockets_->replay) {
      // Replay requests are served as they come; the batches go out every interval.
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_flush - Clock::now());
      zmq::pollitem_t item{static_cast<void*>(*sockets_->replay), 0, ZMQ_POLLIN, 0};
      try {
        // At most 100 ms at a time, so a stop is seen promptly.
        zmq::poll(&item, 1, std::chrono::milliseconds(stopping ? 0 : std::clamp<int64_t>(wait.count(), 0, 100)));
      } catch (const zmq::error_t&) {
        item.revents = 0;
      }
      if (item.revents & ZMQ_POLLIN) ServeReplay();
    } else if (!stopping) {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_until(lock, next_flush, [&] { return stop_; });
    }
    if (stopping || Clock::now() >= next_flush) {
      PublishPending();
      next_flush = Clock::now() + interval;
    }
    if (stopping) return;
  }
}

void KvEvents::PublishPending() {
  struct Batch {
    std::string topic;
    std::optional<uint32_t> dp_rank;
    std::vector<KvEvent> events;
  };
  std::vector<Batch> batches;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Topic* t : order_) batches.push_back(Batch{t->name, t->dp_rank, std::move(t->pending)});
    for (Topic* t : order_) t->pending.clear();
    order_.clear();
    queued_ = 0;
  }
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (auto& [topic, dp_rank, events] : batches) {
    // At most batch_size hashes a message.
    for (size_t at = 0; at < events.size();) {
      size_t end = at, hashes = 0;
      while (end < events.size() && (end == at || hashes + events[end].hashes.size() <= options_.batch_size)) {
        hashes += events[end].hashes.size();
        ++end;
      }
      std::string payload =
          EncodeEventBatch(now, std::span<const KvEvent>(events.data() + at, end - at), options_.encoding, dp_rank);
      const uint64_t seq = next_seq_++;
      const std::string seq_bytes = SeqBytes(seq);
      try {
        sockets_->pub.send(zmq::buffer(topic), zmq::send_flags::sndmore);
        sockets_->pub.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
        sockets_->pub.send(zmq::buffer(payload), zmq::send_flags::none);
      } catch (const zmq::error_t& err) {
        KVTIER_LOG(WARNING) << "events: send failed: " << err.what();
      }
      messages_.fetch_add(1, std::memory_order_relaxed);
      events_.fetch_add(hashes, std::memory_order_relaxed);
      if (options_.replay_batches > 0 && sockets_->replay) {
        auto entry = std::make_pair(seq, std::make_pair(topic, std::move(payload)));
        if (ring_.size() < options_.replay_batches) {
          ring_.push_back(std::move(entry));
        } else {
          ring_[ring_next_] = std::move(entry);
          ring_next_ = (ring_next_ + 1) % ring_.size();
        }
      }
      at = end;
    }
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
        parts.push_back(std::move(m));
        if (!more) break;
      }
    } catch (const zmq::error_t&) {
      return;
    }
    if (parts.empty()) return;
    // [identity, "", start sequence]; anything else is ignored.
    if (parts.size() != 3 || parts[2].size() != 8) continue;
    uint64_t start = 0;
    const auto* b = static_cast<const uint8_t*>(parts[2].data());
    for (int i = 0; i < 8; ++i) start = (start << 8) | b[i];
    const std::string identity(static_cast<const char*>(parts[0].data()), parts[0].size());
    auto send = [&](const std::string& seq, const std::string& payload) {
      r.send(zmq::buffer(identity), zmq::send_flags::sndmore);
      r.send(zmq::const_buffer(), zmq::send_flags::sndmore);
      r.send(zmq::buffer(seq), zmq::send_flags::sndmore);
      r.send(zmq::buffer(payload), zmq::send_flags::none);
    };
    try {
      // Oldest first: the ring's next slot is its oldest entry once it is full.
      for (size_t i = 0; i < ring_.size(); ++i) {
        const auto& [seq, kept] = ring_[(ring_next_ + i) % ring_.size()];
        if (seq >= start) send(SeqBytes(seq), kept.second);
      }
      replays_.fetch_add(1, std::memory_order_relaxed);  // before the end mark its reader waits for
      send(std::string(8, '\xff'), std::string());
    } catch (const zmq::error_t& err) {
      KVTIER_LOG(WARNING) << "events: replay failed: " << err.what();
    }
  }
}

}  // namespace kvtier
