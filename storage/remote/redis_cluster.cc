#include "storage/remote/redis_cluster.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "protocol/base/logging.h"
#include "protocol/base/thread_name.h"
#include "storage/remote/redis_cluster_internal.h"
#include "storage/remote/resp_reader.h"

namespace kvtier {
namespace {

using redis_internal::NowNs;
using redis_internal::ToTimeval;

}  // namespace

// ---- the cluster -----------------------------------------------------------------------

RedisCluster::RedisCluster(const RedisClusterOptions& options, Post post)
    : options_(options),
      max_value_bytes_(options.max_value_bytes ? options.max_value_bytes : uint64_t{64} << 20),
      post_(std::move(post)) {}

Result<std::unique_ptr<RedisCluster>> RedisCluster::Open(const RedisClusterOptions& options, Post post) {
  if (options.seeds.empty()) return InvalidArgument("a Redis Cluster needs at least one seed node");
  for (const std::string& s : options.seeds) {
    std::string host;
    int port = 0;
    if (!ParseAddress(s, &host, &port)) return InvalidArgument("'" + s + "' is not host:port");
  }
  if (options.connections_per_node == 0 || options.timeout_ns <= 0 || options.connect_timeout_ns <= 0 ||
      options.breaker_failures == 0 || options.max_nodes == 0) {
    return InvalidArgument("Redis Cluster options out of range");
  }
  std::unique_ptr<RedisCluster> c(new RedisCluster(options, std::move(post)));
  if (!c->RefreshOnce()) {
    KVTIER_LOG(WARNING) << "remote tier: no Redis Cluster node answered CLUSTER SLOTS yet (seeds "
                        << options.seeds.front() << (options.seeds.size() > 1 ? ", ..." : "")
                        << "); remote lookups miss until one does";
  }
  RedisCluster* raw = c.get();
  c->refresher_ = std::jthread([raw](std::stop_token st) {
    NameThisThread("kvtier-redismap");
    raw->RefreshLoop(st);
  });
  return c;
}

RedisCluster::~RedisCluster() {
  refresher_.request_stop();
  refresh_cv_.notify_all();
  if (refresher_.joinable()) refresher_.join();
  // From here no node is handed out (a redirect fails instead), so no connection thread
  // queues work on another; every thread is asked to end before any is joined. Callbacks
  // of requests failed from here on are posted, and dropped by owners that are gone.
  std::vector<std::shared_ptr<Node>> nodes;
  {
    MutexLock l(&mu_);
    stopping_ = true;
    nodes = std::move(nodes_);
    slots_.clear();
    masters_.clear();
  }
  for (auto& n : nodes) n->RequestStop();
  for (auto& n : nodes) n->Join();
}

void* RedisCluster::OpenContext(const std::string& host, int port, std::string* error) const {
  redisContext* ctx = redisConnectWithTimeout(host.c_str(), port, ToTimeval(options_.connect_timeout_ns));
  if (ctx == nullptr || ctx->err) {
    *error = ctx ? std::string(ctx->errstr) : std::string("out of memory");
    if (ctx) redisFree(ctx);
    return nullptr;
  }
  if (redisSetTimeout(ctx, ToTimeval(options_.timeout_ns)) != REDIS_OK) {
    *error = "cannot set socket timeouts";
    redisFree(ctx);
    return nullptr;
  }
  if (!options_.password.empty()) {
    const std::string user = options_.username.empty() ? "default" : options_.username;
    auto* r = static_cast<redisReply*>(
        redisCommand(ctx, "AUTH %b %b", user.data(), user.size(), options_.password.data(), options_.password.size()));
    const bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
    if (!ok)
      *error = r == nullptr ? std::string(ctx->errstr) : "AUTH as '" + user + "': " + std::string(r->str, r->len);
    if (r) freeReplyObject(r);
    if (!ok) {
      redisFree(ctx);
      return nullptr;
    }
  }
  return ctx;
}

void RedisCluster::LogError(const std::string& kind, const std::string& text) {
  constexpr int64_t kGap = 60'000'000'000;
  const int64_t now = NowNs();
  uint64_t unlogged = 0;
  {
    MutexLock l(&log_mu_);
    auto it = std::find_if(logged_.begin(), logged_.end(), [&](const ErrorLog& e) { return e.kind == kind; });
    if (it == logged_.end()) {
      if (logged_.size() >= 64) return;  // an endless variety of words is not worth a line each
      logged_.push_back(ErrorLog{kind, now, 0});
    } else if (now - it->last_ns < kGap) {
      ++it->unlogged;
      return;
    } else {
      unlogged = std::exchange(it->unlogged, 0);
      it->last_ns = now;
    }
  }
  KVTIER_LOG(WARNING) << "remote tier: " << text
                      << (unlogged ? " (and " + std::to_string(unlogged) + " more like it in the last minute)" : "");
}

std::shared_ptr<RedisCluster::Node> RedisCluster::NodeAt(const std::string& address, bool stranger) {
  MutexLock l(&mu_);
  if (stopping_) return nullptr;
  for (auto& n : nodes_) {
    if (n->address == address) return n;
  }
  std::string host;
  int port = 0;
  if (!ParseAddress(address, &host, &port)) return nullptr;
  // nodes_ holds the masters of the map and the strangers met since it was read.
  if (stranger && nodes_.size() >= masters_.size() + kMaxStrangers) return nullptr;
  nodes_.push_back(std::make_shared<Node>(this, address, host, port, options_.connections_per_node));
  return nodes_.back();
}

std::shared_ptr<RedisCluster::Node> RedisCluster::Route(uint16_t slot) const {
  MutexLock l(&mu_);
  return slots_.empty() ? nullptr : slots_[slot];
}

void RedisCluster::Deliver(std::vector<std::function<void()>> fns) {
  if (fns.empty()) return;
  post_([fns = std::move(fns)] {
    for (const auto& f : fns) f();
  });
}

void RedisCluster::FailRequest(Request& r, Status st) {
  counters_.requests.fetch_add(1, std::memory_order_relaxed);
  counters_.failures.fetch_add(1, std::memory_order_relaxed);
  RedisReply rep;
  rep.status = std::move(st);
  rep.latency_ns = NowNs() - r.start_ns;
  std::vector<std::function<void()>> fns;
  if (r.done) fns.push_back([done = std::move(r.done), rep] { done(rep); });
  Deliver(std::move(fns));
}

void RedisCluster::Submit(Request r) {
  r.start_ns = NowNs();
  r.deadline_ns = r.start_ns + options_.timeout_ns;
  r.slot = KeySlot(r.key);
  std::shared_ptr<Node> n = Route(r.slot);
  if (n == nullptr) {
    RequestRefresh();
    return FailRequest(r, Unavailable("no Redis Cluster slot map yet"));
  }
  if (!n->Admit(r.start_ns)) {
    counters_.breaker_rejections.fetch_add(1, std::memory_order_relaxed);
    return FailRequest(r, Unavailable("redis " + n->address + " is down (circuit breaker open)"));
  }
  n->Enqueue(std::move(r));
}

void RedisCluster::Redirect(Request r, uint16_t slot, const std::string& address, bool ask) {
  counters_.redirects.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<Node> n = ++r.redirects > kMaxRedirects ? nullptr : NodeAt(address, /*stranger=*/true);
  if (n != nullptr && !ask) {
    MutexLock l(&mu_);
    if (!slots_.empty()) slots_[slot] = n;
  }
  if (!ask) RequestRefresh();
  r.asking = ask;
  if (n == nullptr || !n->Admit(NowNs())) {
    LogError("redirect", "redis: slot " + std::to_string(slot) + " redirected to " + address + ", not followed");
    return FailRequest(r, Unavailable("redis: slot " + std::to_string(slot) + " redirected to " + address +
                                      ", not reachable or not followed"));
  }
  n->Enqueue(std::move(r));
}

void RedisCluster::Get(std::string key, ValueSink sink, Done done) {
  Request r;
  r.kind = Request::Kind::kGet;
  r.key = std::move(key);
  r.sink = std::move(sink);
  r.done = std::move(done);
  Submit(std::move(r));
}

void RedisCluster::Set(std::string key, Value value, Done done) {
  Request r;
  r.kind = Request::Kind::kSet;
  r.key = std::move(key);
  r.value = std::move(value);
  r.done = std::move(done);
  Submit(std::move(r));
}

void RedisCluster::Exists(std::string key, Done done) {
  Request r;
  r.kind = Request::Kind::kExists;
  r.key = std::move(key);
  r.done = std::move(done);
  Submit(std::move(r));
}

void RedisCluster::Del(std::string key, Done done) {
  Request r;
  r.kind = Request::Kind::kDel;
  r.key = std::move(key);
  r.done = std::move(done);
  Submit(std::move(r));
}

std::vector<RedisCluster::NodeState> RedisCluster::Masters() const {
  MutexLock l(&mu_);
  std::vector<NodeState> out;
  const int64_t now = NowNs();
  for (const auto& n : masters_) out.push_back(NodeState{n->address, n->open(now), n->failures()});
  return out;
}

bool RedisCluster::AnyMaster(bool open) const {
  MutexLock l(&mu_);
  const int64_t now = NowNs();
  return std::any_of(masters_.begin(), masters_.end(), [&](const auto& n) { return n->open(now) == open; });
}

size_t RedisCluster::connection_threads() const {
  MutexLock l(&mu_);
  size_t t = 0;
  for (const auto& n : nodes_) t += n->threads();
  return t;
}

void RedisCluster::RequestRefresh() {
  {
    MutexLock l(&refresh_mu_);
    refresh_wanted_ = true;
  }
  refresh_cv_.notify_one();
}

void RedisCluster::RefreshLoop(std::stop_token stop) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kMinGap = std::chrono::milliseconds(200);
  // While a breaker is open (a node died: its replica may be taking over) or no node has
  // answered yet, the map is read every second, not every refresh_interval.
  constexpr auto kUrgentGap = std::chrono::seconds(1);
  const auto interval = std::chrono::nanoseconds(options_.refresh_interval_ns);
  const auto probe_gap = std::chrono::nanoseconds(kProbeGap_ns);
  auto last = Clock::now();
  while (!stop.stop_requested()) {
    bool have_map;
    {
      MutexLock l(&mu_);
      have_map = !slots_.empty();
    }
    const bool probing = AnyMaster(/*open=*/true);
    const auto gap = have_map && !probing ? interval : std::min<Clock::duration>(interval, kUrgentGap);
    bool refresh;
    {
      MutexLock l(&refresh_mu_);
      // Wake for the next refresh, or sooner to probe open breakers.
      auto wake = last + gap;
      if (probing) wake = std::min(wake, Clock::now() + probe_gap);
      const bool asked = refresh_cv_.wait_until(l.native(), stop, wake, [this] {
        refresh_mu_.AssertHeld();
        return refresh_wanted_;
      });
      if (stop.stop_requested()) return;
      refresh = asked || Clock::now() >= last + gap;
      if (refresh) {
        // At most one refresh per kMinGap, however often it is asked for.
        const auto next = last + kMinGap;
        if (Clock::now() < next) {
          refresh_cv_.wait_until(l.native(), stop, next, [] { return false; });
          if (stop.stop_requested()) return;
        }
        refresh_wanted_ = false;
      }
    }
    if (probing) ProbeOpenNodes();
    if (refresh) {
      RefreshOnce();
      last = Clock::now();
    }
  }
}

void RedisCluster::ProbeOpenNodes() {
  std::vector<std::shared_ptr<Node>> open;
  {
    MutexLock l(&mu_);
    const int64_t now = NowNs();
    for (const auto& n : masters_) {
      if (n->open(now)) open.push_back(n);
    }
  }
  for (const auto& n : open) {
    std::string error;
    auto* ctx = static_cast<redisContext*>(OpenContext(n->host, n->port, &error));
    if (ctx == nullptr) continue;
    auto* r = static_cast<redisReply*>(redisCommand(ctx, "PING"));
    const bool up = r != nullptr && r->type == REDIS_REPLY_STATUS;
    if (r) freeReplyObject(r);
    redisFree(ctx);
    if (up) {
      KVTIER_LOG(INFO) << "remote tier: node " << n->address << " answers again; circuit breaker closed";
      n->Success();
    }
  }
}

bool RedisCluster::RefreshOnce() {
  std::vector<std::string> candidates;
  {
    MutexLock l(&mu_);
    for (const auto& n : masters_) candidates.push_back(n->address);
  }
  for (const std::string& s : options_.seeds) {
    if (std::find(candidates.begin(), candidates.end(), s) == candidates.end()) candidates.push_back(s);
  }
  std::string why;  // what the last candidate said, for the log
  for (const std::string& address : candidates) {
    std::string host;
    int port = 0;
    if (!ParseAddress(address, &host, &port)) continue;
    std::string error;
    auto* ctx = static_cast<redisContext*>(OpenContext(host, port, &error));
    if (ctx == nullptr) {
      why = address + ": " + error;
      continue;
    }
    auto* reply = static_cast<redisReply*>(redisCommand(ctx, "CLUSTER SLOTS"));
    Result<std::vector<SlotRange>> parsed =
        InvalidArgument(reply == nullptr ? std::string(ctx->errstr) : std::string("no reply"));
    if (reply != nullptr) parsed = ParseSlots(*reply, address);
    if (!parsed.ok()) why = address + ": " + parsed.status().message();
    if (reply) freeReplyObject(reply);
    redisFree(ctx);
    if (!parsed.ok()) continue;
    const std::vector<SlotRange>& ranges = *parsed;
    std::vector<std::string> addresses;
    for (const auto& r : ranges) {
      if (std::find(addresses.begin(), addresses.end(), r.master) == addresses.end()) addresses.push_back(r.master);
    }
    if (addresses.size() > options_.max_nodes) {
      counters_.maps_refused.fetch_add(1, std::memory_order_relaxed);
      LogError("slot-map", "redis " + address + ": CLUSTER SLOTS names " + std::to_string(addresses.size()) +
                               " masters, more than tiers.remote.max_nodes (" + std::to_string(options_.max_nodes) +
                               "); map not used");
      continue;
    }
    // Install the map; every node it does not name (a stranger met by a redirect, a
    // master that left) is dropped, its threads stopped once they are out of the lock.
    std::vector<std::shared_ptr<Node>> gone;
    {
      MutexLock l(&mu_);
      if (stopping_) return false;
      std::vector<std::shared_ptr<Node>> masters;
      for (const std::string& a : addresses) {
        auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n->address == a; });
        std::string h;
        int pt = 0;
        ParseAddress(a, &h, &pt);
        masters.push_back(it != nodes_.end() ? *it
                                             : std::make_shared<Node>(this, a, h, pt, options_.connections_per_node));
      }
      std::vector<std::shared_ptr<Node>> slots(kSlots);
      for (const SlotRange& r : ranges) {
        const size_t i = std::find(addresses.begin(), addresses.end(), r.master) - addresses.begin();
        for (uint32_t s = r.first; s <= r.last; ++s) slots[s] = masters[i];
      }
      for (auto& n : nodes_) {
        if (std::find(masters.begin(), masters.end(), n) == masters.end()) gone.push_back(std::move(n));
      }
      nodes_ = masters;
      slots_ = std::move(slots);
      masters_ = std::move(masters);
    }
    for (const auto& n : gone) n->RequestStop();
    for (const auto& n : gone) n->Join();
    counters_.nodes_dropped.fetch_add(gone.size(), std::memory_order_relaxed);
    counters_.refreshes.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  if (!why.empty()) LogError("slot-map", "no Redis Cluster node answered CLUSTER SLOTS (" + why + ")");
  return false;
}

}  // namespace kvtier
