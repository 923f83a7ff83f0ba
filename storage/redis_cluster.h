#pragma once
// RedisCluster: a client of a Redis Cluster (or Valkey cluster, or one standalone server)
// on hiredis, for the remote tier.
//
// Routing: a key goes to the master serving its hash slot (CRC16 of the key, or of its
// {hash tag}, modulo 16384, as Redis computes it), from a slot map read with CLUSTER SLOTS
// from any reachable node (the known masters, then the seeds). A MOVED reply re-points that
// slot at once, asks for a refresh of the whole map and sends the request on to the node
// it names; an ASK reply sends it there once, after ASKING. At most kMaxRedirects hops. A
// server with cluster support disabled serves every slot (one standalone Redis).
//
// Connections: per master, one connection for small requests (EXISTS, DEL) and
// `connections_per_node` for values (GET, SET), so a lookup never queues behind megabytes
// of values. Each connection is a thread with a queue: it takes what is queued (up to
// max_batch requests), writes them in one go and reads the replies in order — pipelining
// per node. A batch's replies must arrive within `timeout` of it being written: a node
// that does not answer in time fails what it was sent (kUnavailable) and its connection is
// reopened for the next batch. hiredis makes the connection (redisConnectWithTimeout) and
// parses replies (redisReader, with reply functions that hand a GET's value to its sink
// straight from the reader's buffer); commands are written with writev so a SET's value
// goes from the caller's memory to the socket without a copy.
//
// Circuit breaker, per node: after `breaker_failures` consecutive failed batches (connect
// refused or timed out, an I/O error, a missed deadline) the node is open for
// `breaker_open`: requests for it fail at once (kUnavailable) without being queued. The
// period doubles (up to 8x) while the node keeps failing and resets once a request
// succeeds; after it, requests go through again (half-open). Cluster-level refusals
// (CLUSTERDOWN, TRYAGAIN, LOADING, MASTERDOWN) fail their requests with kUnavailable
// without counting against the node, which answered.
//
// Threads: Get, Set, Exists and Del may be called from any thread. `done` runs through
// `post` (the owner's executor), one post per batch; a GET's sink runs on the connection's
// thread (so checking and copying a value costs the owner's thread nothing), and a SET's
// `prepare` too. The destructor stops and joins every thread; requests not answered by
// then are dropped without their `done`.

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "protocol/base/status.h"

namespace kvtier {

struct RedisClusterOptions {
  std::vector<std::string> seeds;                // "host:port" (IPv4 or a name; [v6]:port)
  int64_t connect_timeout_ns = 200'000'000;      // Default: 200 ms
  int64_t timeout_ns = 1'000'000'000;            // a batch's replies; Default: 1 s
  uint32_t connections_per_node = 2;             // for values; Default: 2
  uint32_t max_batch = 64;                       // requests written at once per connection
  uint32_t breaker_failures = 3;                 // consecutive failures that open a node
  int64_t breaker_open_ns = 1'000'000'000;       // first open period; Default: 1 s
  int64_t refresh_interval_ns = 10'000'000'000;  // slot map re-read; Default: 10 s
};

struct RedisReply {
  // OK; kNotFound for a nil GET; kUnavailable when not sent (breaker open, no node for the
  // slot), not answered in time, or refused by a cluster that is down; kDataLoss for a GET
  // of a key of another type (WRONGTYPE); kInternal for any other error reply; or what a
  // GET's sink returned.
  Status status;
  int64_t integer = 0;     // EXISTS, DEL
  int64_t latency_ns = 0;  // from the call to the reply
};

// Counters, updated by the connection threads; read at any time.
struct RedisClusterCounters {
  std::atomic<uint64_t> requests{0};            // answered, well or not
  std::atomic<uint64_t> failures{0};            // answered kUnavailable or kInternal
  std::atomic<uint64_t> timeouts{0};            // batches whose replies were late
  std::atomic<uint64_t> breaker_rejections{0};  // failed at once: their node was open
  std::atomic<uint64_t> redirects{0};           // MOVED and ASK replies followed
  std::atomic<uint64_t> refreshes{0};           // slot maps installed
  std::atomic<uint64_t> connects{0};            // connections opened
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_received{0};
};

class RedisCluster {
 public:
  using Post = std::function<void(std::function<void()>)>;
  using Done = std::function<void(const RedisReply&)>;
  // A GET's value, on a connection thread; the bytes are valid only during the call. Its
  // status becomes the reply's (e.g. kDataLoss for a value that does not verify; a key of
  // another Redis type, answered WRONGTYPE, is kDataLoss too).
  using ValueSink = std::function<Status(std::span<const uint8_t> value)>;
  // A SET's value: head ‖ body. `body` is borrowed and must stay unchanged until `done`
  // runs; `prepare`, if set, runs on the connection thread before the value is first
  // written and may fill `head` (e.g. a checksum of the body).
  struct Value {
    std::string head;
    std::span<const uint8_t> body;
    std::function<void(Value&)> prepare;
  };
  static constexpr int kMaxRedirects = 3;
  static constexpr uint32_t kSlots = 16384;

  // kInvalidArgument for a malformed seed or option. The cluster need not be reachable:
  // the first slot map is read here (bounded by connect_timeout per seed) and, failing
  // that, in the background; until one is read every request is kUnavailable.
  static Result<std::unique_ptr<RedisCluster>> Open(const RedisClusterOptions& options, Post post);
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  void Get(std::string key, ValueSink sink, Done done);
  void Set(std::string key, Value value, Done done);
  void Exists(std::string key, Done done);
  void Del(std::string key, Done done);

  struct NodeState {
    std::string address;
    bool breaker_open = false;
    uint64_t failures = 0;  // failed batches, in all
  };
  // The masters of the current slot map.
  std::vector<NodeState> Masters() const;
  // Whether a request could be sent now: a slot map is known and some master is not open.
  bool Available() const;
  // Asks the refresh thread to read the slot map again soon.
  void RequestRefresh();
  const RedisClusterCounters& counters() const { return counters_; }

  // The hash slot of a key, as Redis computes it (CRC16-XMODEM of the key or of the first
  // non-empty {tag}, mod 16384).
  static uint16_t KeySlot(std::string_view key);
  // Splits "host:port" ("[v6]:port" too); false when it is not one.
  static bool ParseAddress(std::string_view address, std::string* host, int* port);

 private:
  class Node;
  class Connection;
  struct Request;

  RedisCluster(const RedisClusterOptions& options, Post post);
  void Submit(Request r);
  // The node serving `slot`, or null (no map yet).
  Node* Route(uint16_t slot) const;
  // The node at `address`, created (with its connection threads) on first use.
  Node* NodeAt(const std::string& address);
  // A MOVED or ASK reply: the slot moves to `address` (MOVED) and the request goes there.
  void Redirect(Request r, uint16_t slot, const std::string& address, bool ask);
  // Delivers finished requests' callbacks on the owner's thread, in order.
  void Deliver(std::vector<std::function<void()>> fns);
  void RefreshLoop(std::stop_token stop);
  // Reads CLUSTER SLOTS from the first node that answers; installs the map.
  bool RefreshOnce();

  RedisClusterOptions options_;
  Post post_;
  RedisClusterCounters counters_;
  mutable std::mutex mu_;  // nodes_, slots_, masters_
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<Node*> slots_;  // slot -> master; empty until a map is read
  std::vector<Node*> masters_;
  bool stopping_ = false;  // no node is handed out any more
  std::mutex refresh_mu_;
  std::condition_variable_any refresh_cv_;
  bool refresh_wanted_ = false;
  std::jthread refresher_;
};

}  // namespace kvtier
