#pragma once
// RedisCluster's insides, shared by its two files and by nothing else: a request, a
// connection (one thread, one socket to one node) and a node (its connections and circuit
// breaker). redis_cluster.cc is the cluster (routing, redirects, the slot map's refresh),
// redis_connection.cc a connection's thread.

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "protocol/base/mutex.h"
#include "protocol/base/thread_name.h"
#include "storage/remote/redis_cluster.h"
#include "storage/remote/resp_reader.h"

namespace kvtier {
namespace redis_internal {

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline timeval ToTimeval(int64_t ns) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
  tv.tv_usec = static_cast<suseconds_t>((ns % 1'000'000'000) / 1000);
  return tv;
}

}  // namespace redis_internal

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
    thread_ = std::jthread([this](std::stop_token st) {
      NameThisThread("kvtier-redis");
      Run(st);
    });
  }
  ~Connection() { Join(); }
  // The thread ends after the batch it is serving, failing what is still queued (and
  // whatever is queued later) with kUnavailable.
  void RequestStop() {
    {
      MutexLock l(&mu_);
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
      MutexLock l(&mu_);
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
  Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<Request> queue_ KVTIER_GUARDED_BY(mu_);
  bool stopped_ KVTIER_GUARDED_BY(mu_) = false;
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

}  // namespace kvtier
