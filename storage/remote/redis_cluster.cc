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
#include "storage/remote/resp_reader.h"

namespace kvtier {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

timeval ToTimeval(int64_t ns) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
  tv.tv_usec = static_cast<suseconds_t>((ns % 1'000'000'000) / 1000);
  return tv;
}

void AppendCount(std::string& s, char kind, size_t n) {
  s += kind;
  s += std::to_string(n);
  s += "\r\n";
}

void AppendBulk(std::string& s, std::string_view a) {
  AppendCount(s, '$', a.size());
  s.append(a);
  s += "\r\n";
}

// Error replies that say the cluster (not this node) cannot serve now.
bool ClusterRefusal(std::string_view e) {
  for (std::string_view p : {"CLUSTERDOWN", "TRYAGAIN", "LOADING", "MASTERDOWN"}) {
    if (e.substr(0, p.size()) == p) return true;
  }
  return false;
}

}  // namespace

// ---- requests, nodes, connections ----------------------------------------------------

struct RedisCluster::Request {
  enum class Kind : uint8_t { kGet, kSet, kExists, kDel };
  Kind kind = Kind::kGet;
  std::string key;
  Value value;  // kSet
  bool prepared = false;
  ValueSink sink;  // kGet
  Done done;
  int64_t start_ns = 0;
  int64_t deadline_ns = 0;  // start + timeout: the reply must have arrived by then
  uint16_t slot = 0;
  int redirects = 0;
  bool asking = false;  // send ASKING first (an ASK redirect)
  bool small() const { return kind == Kind::kExists || kind == Kind::kDel; }
  const char* command() const {
    return kind == Kind::kGet ? "GET" : kind == Kind::kSet ? "SET" : kind == Kind::kExists ? "EXISTS" : "DEL";
  }
};

// One connection to one node: a thread that writes what is queued and reads the replies.
class RedisCluster::Connection {
 public:
  Connection(RedisCluster* owner, Node* node) : owner_(owner), node_(node), buf_(256 << 10) {
    thread_ = std::jthread([this](std::stop_token st) { Run(st); });
  }
  ~Connection() { Join(); }
  // The thread ends after the batch it is serving, failing what is still queued (and
  // whatever is queued later) with kUnavailable.
  void RequestStop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopped_ = true;
    }
    thread_.request_stop();
  }
  void Join() {
    RequestStop();
    if (thread_.joinable()) thread_.join();
  }
  void Enqueue(Request r) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!stopped_) {
        queue_.push_back(std::move(r));
        cv_.notify_one();
        return;
      }
    }
    owner_->FailRequest(r, Unavailable("redis " + NodeAddress() + ": node left the cluster's slot map"));
  }

 private:
  void Run(std::stop_token st);
  const std::string& NodeAddress() const;
  bool Connect(std::string* error);
  void Close();
  void Serve(std::vector<Request>& batch, std::vector<std::function<void()>>& out);
  // Writes requests [from, end) of the batch; false (with *error) on an I/O error.
  bool Write(std::vector<Request>& batch, size_t from, std::string* error);
  // Reads one reply into slot_ (a GET's value to `sink`) by `deadline_ns`. *oversized:
  // the reply is longer than max_value_bytes (it was not read; the connection must be
  // closed).
  bool Read(int64_t deadline_ns, const RespReader::Sink* sink, std::string* error, bool* timed_out, bool* oversized);
  // The outcome of request `r` from slot_ (or a redirect, which re-queues it).
  void Finish(Request& r, std::vector<std::function<void()>>& out);
  void Fail(Request& r, const Status& st, std::vector<std::function<void()>>& out);

  RedisCluster* owner_;
  Node* node_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<Request> queue_;
  bool stopped_ = false;
  // Connection thread only.
  redisContext* ctx_ = nullptr;
  std::unique_ptr<RespReader> reader_;
  std::vector<char> buf_;
  RespReader::Reply slot_;
  std::jthread thread_;  // last: started once the rest exists
};

class RedisCluster::Node {
 public:
  Node(RedisCluster* owner, std::string address, std::string host, int port, uint32_t value_connections)
      : address(std::move(address)),
        host(std::move(host)),
        port(port),
        owner_(owner),
        open_period_ns_(owner->options_.breaker_open_ns) {
    for (uint32_t i = 0; i <= value_connections; ++i) conns_.push_back(std::make_unique<Connection>(owner, this));
  }
  // Asks the connection threads to end; Join waits for them.
  void RequestStop() {
    for (auto& c : conns_) c->RequestStop();
  }
  void Join() {
    for (auto& c : conns_) c->Join();
  }
  size_t threads() const { return conns_.size(); }

  void Enqueue(Request r) {
    if (r.small() || conns_.size() == 1) {
      conns_[0]->Enqueue(std::move(r));
      return;
    }
    const uint32_t n = static_cast<uint32_t>(conns_.size() - 1);
    conns_[1 + next_.fetch_add(1, std::memory_order_relaxed) % n]->Enqueue(std::move(r));
  }
  bool Admit(int64_t now) const { return now >= open_until_ns_.load(std::memory_order_acquire); }
  bool open(int64_t now) const { return !Admit(now); }
  void Success() {
    if (consecutive_.exchange(0, std::memory_order_acq_rel) == 0) return;
    open_period_ns_.store(owner_->options_.breaker_open_ns, std::memory_order_relaxed);
    open_until_ns_.store(0, std::memory_order_release);
  }
  void Failure(int64_t now) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    if (consecutive_.fetch_add(1, std::memory_order_acq_rel) + 1 < owner_->options_.breaker_failures) return;
    const int64_t period = open_period_ns_.load(std::memory_order_relaxed);
    if (open_until_ns_.load(std::memory_order_acquire) < now) {
      KVTIER_LOG(WARNING) << "remote tier: node " << address << " failed " << consecutive_.load()
                          << " times in a row; circuit breaker open for " << period / 1'000'000 << " ms";
    }
    open_until_ns_.store(now + period, std::memory_order_release);
    open_period_ns_.store(std::min(period * 2, owner_->options_.breaker_open_ns * 8), std::memory_order_relaxed);
    owner_->RequestRefresh();  // the slots may have moved (a failover)
  }
  uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }

  const std::string address;
  const std::string host;
  const int port;

 private:
  RedisCluster* owner_;
  std::atomic<int64_t> open_until_ns_{0};
  std::atomic<uint32_t> consecutive_{0};
  std::atomic<int64_t> open_period_ns_;
  std::atomic<uint64_t> failures_{0};
  std::atomic<uint32_t> next_{0};
  std::vector<std::unique_ptr<Connection>> conns_;  // [0]: small requests; the rest: values
};

// ---- a connection's thread -------------------------------------------------------------

void RedisCluster::Connection::Run(std::stop_token st) {
  const uint32_t max_batch = std::max<uint32_t>(1, owner_->options_.max_batch);
  while (!st.stop_requested()) {
    std::vector<Request> batch;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (!cv_.wait(l, st, [this] { return !queue_.empty(); })) break;
      const size_t n = std::min<size_t>(queue_.size(), max_batch);
      batch.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    std::vector<std::function<void()>> out;
    out.reserve(batch.size());
    Serve(batch, out);
    owner_->Deliver(std::move(out));
  }
  Close();
  // Dropped from the slot map (not the cluster being destroyed): what was queued fails.
  std::deque<Request> left;
  {
    std::lock_guard<std::mutex> l(mu_);
    stopped_ = true;
    left.swap(queue_);
  }
  for (Request& r : left) owner_->FailRequest(r, Unavailable("redis " + node_->address + ": node left the slot map"));
}

const std::string& RedisCluster::Connection::NodeAddress() const { return node_->address; }

bool RedisCluster::Connection::Connect(std::string* error) {
  ctx_ = static_cast<redisContext*>(owner_->OpenContext(node_->host, node_->port, error));
  if (ctx_ == nullptr) return false;
  reader_ = std::make_unique<RespReader>(owner_->max_value_bytes_);
  if (!reader_->ok()) {
    *error = "out of memory";
    Close();
    return false;
  }
  owner_->counters_.connects.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void RedisCluster::Connection::Close() {
  reader_.reset();
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
}

bool RedisCluster::Connection::Write(std::vector<Request>& batch, size_t from, std::string* error) {
  // The RESP framing of every request, then one writev loop over framing and values.
  std::vector<std::string> frames(batch.size() - from);
  std::vector<iovec> iov;
  iov.reserve(frames.size() * 3);
  static const char kAsking[] = "*1\r\n$6\r\nASKING\r\n";
  static const char kCrLf[] = "\r\n";
  size_t total = 0;
  auto add = [&](const void* p, size_t n) {
    if (n == 0) return;
    iov.push_back(iovec{const_cast<void*>(p), n});
    total += n;
  };
  for (size_t i = from; i < batch.size(); ++i) {
    Request& r = batch[i];
    std::string& f = frames[i - from];
    if (r.asking) add(kAsking, sizeof(kAsking) - 1);
    switch (r.kind) {
      case Request::Kind::kGet:
        f = "*2\r\n$3\r\nGET\r\n";
        AppendBulk(f, r.key);
        add(f.data(), f.size());
        break;
      case Request::Kind::kExists:
        f = "*2\r\n$6\r\nEXISTS\r\n";
        AppendBulk(f, r.key);
        add(f.data(), f.size());
        break;
      case Request::Kind::kDel:
        f = "*2\r\n$3\r\nDEL\r\n";
        AppendBulk(f, r.key);
        add(f.data(), f.size());
        break;
      case Request::Kind::kSet:
        if (!r.prepared && r.value.prepare) r.value.prepare(r.value);
        r.prepared = true;
        f = "*3\r\n$3\r\nSET\r\n";
        AppendBulk(f, r.key);
        AppendCount(f, '$', r.value.head.size() + r.value.body.size());
        add(f.data(), f.size());
        add(r.value.head.data(), r.value.head.size());
        add(r.value.body.data(), r.value.body.size());
        add(kCrLf, 2);
        break;
    }
  }
  size_t at = 0;  // first iovec not fully written
  while (at < iov.size()) {
    const int n = static_cast<int>(std::min<size_t>(iov.size() - at, IOV_MAX));
    const ssize_t w = ::writev(ctx_->fd, iov.data() + at, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      *error = errno == EAGAIN || errno == EWOULDBLOCK ? "write timed out" : std::string("write: ") + strerror(errno);
      return false;
    }
    size_t left = static_cast<size_t>(w);
    while (at < iov.size() && left >= iov[at].iov_len) left -= iov[at++].iov_len;
    if (left > 0) {
      iov[at].iov_base = static_cast<char*>(iov[at].iov_base) + left;
      iov[at].iov_len -= left;
    }
  }
  owner_->counters_.bytes_sent.fetch_add(total, std::memory_order_relaxed);
  return true;
}

bool RedisCluster::Connection::Read(int64_t deadline_ns, const RespReader::Sink* sink, std::string* error,
                                    bool* timed_out, bool* oversized) {
  slot_ = RespReader::Reply{};
  for (;;) {
    switch (reader_->Read(&slot_, sink, error)) {
      case RespReader::Next::kReply:
        return true;
      case RespReader::Next::kOversized:
        *oversized = true;
        return false;
      case RespReader::Next::kError:
        return false;
      case RespReader::Next::kMore:
        break;
    }
    const int64_t left = deadline_ns - NowNs();
    if (left <= 0) {
      *timed_out = true;
      *error = "no reply within the timeout";
      return false;
    }
    pollfd p{ctx_->fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, left / 1'000'000)));
    if (ready < 0 && errno != EINTR) {
      *error = std::string("poll: ") + strerror(errno);
      return false;
    }
    if (ready <= 0) continue;  // deadline checked above
    const ssize_t n = ::read(ctx_->fd, buf_.data(), buf_.size());
    if (n == 0) {
      *error = "connection closed by the server";
      return false;
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      *error = std::string("read: ") + strerror(errno);
      return false;
    }
    owner_->counters_.bytes_received.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    if (!reader_->Feed(buf_.data(), static_cast<size_t>(n))) {
      *error = "out of memory";
      return false;
    }
  }
}

void RedisCluster::Connection::Fail(Request& r, const Status& st, std::vector<std::function<void()>>& out) {
  RedisReply rep;
  rep.status = st;
  rep.latency_ns = NowNs() - r.start_ns;
  owner_->counters_.requests.fetch_add(1, std::memory_order_relaxed);
  owner_->counters_.failures.fetch_add(1, std::memory_order_relaxed);
  if (r.done) out.push_back([done = std::move(r.done), rep] { done(rep); });
}

void RedisCluster::Connection::Finish(Request& r, std::vector<std::function<void()>>& out) {
  RedisReply rep;
  switch (slot_.type) {
    case REDIS_REPLY_ERROR: {
      bool ask = false;
      uint16_t slot = 0;
      std::string address;
      if (ParseRedirect(slot_.text, &ask, &slot, &address)) {
        owner_->Redirect(std::move(r), slot, address, ask);
        return;
      }
      if (r.kind == Request::Kind::kGet && slot_.text.rfind("WRONGTYPE", 0) == 0) {
        // Another Redis type at a value's key: not a value (the caller's miss and delete).
        rep.status = DataLoss("redis " + node_->address + ": " + slot_.text);
        break;
      }
      const std::string text = "redis " + node_->address + ": " + slot_.text;
      owner_->LogError(slot_.text.substr(0, slot_.text.find(' ')), text);
      if (ClusterRefusal(slot_.text)) {
        rep.status = Unavailable(text);
      } else if (slot_.text.rfind("OOM", 0) == 0) {
        rep.status = ResourceExhausted(text);
      } else {
        rep.status = Internal(text);
      }
      break;
    }
    case REDIS_REPLY_NIL:
      if (r.kind == Request::Kind::kGet) rep.status = NotFound("no such key");
      break;
    case REDIS_REPLY_STRING:
      if (r.kind == Request::Kind::kGet) rep.status = slot_.sink_status;
      break;
    case REDIS_REPLY_INTEGER:
      rep.integer = slot_.integer;
      break;
    case REDIS_REPLY_STATUS:
      break;
  }
  // Only the reply each command has is taken as its answer: a GET answered with anything
  // but a bulk or nil (a status, an integer, an array) is no value — a miss, as a value
  // that does not verify is, never a hit with nothing checked.
  const bool expected =
      slot_.type == REDIS_REPLY_ERROR ||
      (r.kind == Request::Kind::kGet   ? slot_.type == REDIS_REPLY_STRING || slot_.type == REDIS_REPLY_NIL
       : r.kind == Request::Kind::kSet ? slot_.type == REDIS_REPLY_STATUS
                                       : slot_.type == REDIS_REPLY_INTEGER);
  if (!expected) {
    const std::string text =
        "redis " + node_->address + ": reply of type " + std::to_string(slot_.type) + " to " + r.command();
    owner_->LogError("unexpected-reply", text);
    rep.status = r.kind == Request::Kind::kGet ? DataLoss(text) : Internal(text);
    rep.integer = 0;
  }
  rep.latency_ns = NowNs() - r.start_ns;
  owner_->counters_.requests.fetch_add(1, std::memory_order_relaxed);
  if (!rep.status.ok() && rep.status.code() != StatusCode::kNotFound && rep.status.code() != StatusCode::kDataLoss) {
    owner_->counters_.failures.fetch_add(1, std::memory_order_relaxed);
  }
  if (r.done) out.push_back([done = std::move(r.done), rep = std::move(rep)] { done(rep); });
}

void RedisCluster::Connection::Serve(std::vector<Request>& batch, std::vector<std::function<void()>>& out) {
  // A request whose deadline passed while it waited (behind a slow node) is not sent.
  size_t live = 0;
  const int64_t now = NowNs();
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].deadline_ns <= now) {
      owner_->counters_.timeouts.fetch_add(1, std::memory_order_relaxed);
      Fail(batch[i], Unavailable("redis " + node_->address + ": not sent within the timeout (the node is slow)"), out);
    } else if (live++ != i) {
      batch[live - 1] = std::move(batch[i]);
    }
  }
  batch.resize(live);
  size_t from = 0;
  // A connection the server closed while it was idle fails its next batch; the rest of
  // that batch is tried once more on a new connection (every command here is idempotent).
  for (int attempt = 0; attempt < 2 && from < batch.size(); ++attempt) {
    std::string error;
    const bool reused = ctx_ != nullptr;
    if (!ctx_ && !Connect(&error)) {
      owner_->LogError("connect", "redis " + node_->address + ": cannot connect: " + error);
      node_->Failure(NowNs());
      for (size_t i = from; i < batch.size(); ++i) {
        Fail(batch[i], Unavailable("redis " + node_->address + ": cannot connect: " + error), out);
      }
      return;
    }
    bool timed_out = false, oversized = false;
    bool ok = Write(batch, from, &error);
    const size_t written_from = from;
    for (; ok && from < batch.size(); ++from) {
      Request& r = batch[from];
      if (r.asking && !(ok = Read(r.deadline_ns, nullptr, &error, &timed_out, &oversized))) break;  // ASKING's +OK
      ok = Read(r.deadline_ns, r.sink ? &r.sink : nullptr, &error, &timed_out, &oversized);
      if (!ok) break;
      Finish(r, out);
    }
    if (ok) {
      node_->Success();
      return;
    }
    Close();
    if (oversized) {
      // The node answered, with something no block is: a miss (the caller deletes it), not
      // a node failure. The rest of the batch goes again on a new connection.
      owner_->counters_.oversized.fetch_add(1, std::memory_order_relaxed);
      owner_->LogError("oversized", "redis " + node_->address + ": " + error + " refused");
      Request& r = batch[from];
      Fail(r, r.kind == Request::Kind::kGet ? DataLoss("redis " + node_->address + ": " + error) : Unavailable(error),
           out);
      std::lock_guard<std::mutex> l(mu_);
      for (size_t i = batch.size(); i > from + 1; --i) queue_.push_front(std::move(batch[i - 1]));
      return;
    }
    if (timed_out) {
      owner_->counters_.timeouts.fetch_add(1, std::memory_order_relaxed);
      owner_->LogError("timeout", "redis " + node_->address + ": " + error);
    }
    // Retry only what a stale idle connection lost: nothing of this batch was answered.
    if (reused && !timed_out && from == written_from && attempt == 0) continue;
    if (!timed_out) owner_->LogError("io", "redis " + node_->address + ": " + error);
    node_->Failure(NowNs());
    for (; from < batch.size(); ++from) Fail(batch[from], Unavailable("redis " + node_->address + ": " + error), out);
  }
}

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
  c->refresher_ = std::jthread([raw](std::stop_token st) { raw->RefreshLoop(st); });
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
    std::lock_guard<std::mutex> l(mu_);
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
    std::lock_guard<std::mutex> l(log_mu_);
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
  std::lock_guard<std::mutex> l(mu_);
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
  std::lock_guard<std::mutex> l(mu_);
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
    std::lock_guard<std::mutex> l(mu_);
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
  std::lock_guard<std::mutex> l(mu_);
  std::vector<NodeState> out;
  const int64_t now = NowNs();
  for (const auto& n : masters_) out.push_back(NodeState{n->address, n->open(now), n->failures()});
  return out;
}

bool RedisCluster::AnyMaster(bool open) const {
  std::lock_guard<std::mutex> l(mu_);
  const int64_t now = NowNs();
  return std::any_of(masters_.begin(), masters_.end(), [&](const auto& n) { return n->open(now) == open; });
}

size_t RedisCluster::connection_threads() const {
  std::lock_guard<std::mutex> l(mu_);
  size_t t = 0;
  for (const auto& n : nodes_) t += n->threads();
  return t;
}

void RedisCluster::RequestRefresh() {
  {
    std::lock_guard<std::mutex> l(refresh_mu_);
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
      std::lock_guard<std::mutex> l(mu_);
      have_map = !slots_.empty();
    }
    const bool probing = AnyMaster(/*open=*/true);
    const auto gap = have_map && !probing ? interval : std::min<Clock::duration>(interval, kUrgentGap);
    bool refresh;
    {
      std::unique_lock<std::mutex> l(refresh_mu_);
      // Wake for the next refresh, or sooner to probe open breakers.
      auto wake = last + gap;
      if (probing) wake = std::min(wake, Clock::now() + probe_gap);
      const bool asked = refresh_cv_.wait_until(l, stop, wake, [this] { return refresh_wanted_; });
      if (stop.stop_requested()) return;
      refresh = asked || Clock::now() >= last + gap;
      if (refresh) {
        // At most one refresh per kMinGap, however often it is asked for.
        const auto next = last + kMinGap;
        if (Clock::now() < next) {
          refresh_cv_.wait_until(l, stop, next, [] { return false; });
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
    std::lock_guard<std::mutex> l(mu_);
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
    std::lock_guard<std::mutex> l(mu_);
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
      std::lock_guard<std::mutex> l(mu_);
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
