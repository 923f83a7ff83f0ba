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
// per node. A request has `timeout` from the call to its reply, queueing included: one
// still queued at its deadline fails unsent, and a node that does not answer by a
// request's deadline fails what it was sent (kUnavailable) and its connection is reopened
// for the next batch. hiredis makes the connection (redisConnectWithTimeout, then AUTH
// when a password is set) and parses replies (redisReader, with reply functions that hand
// a GET's value to its sink straight from the reader's buffer); commands are written with
// writev so a SET's value goes from the caller's memory to the socket without a copy.
//
// Untrusted replies: a bulk longer than `max_value_bytes` is refused from its length line,
// before its bytes are read (the GET is kDataLoss, the connection reopened, the rest of
// its batch sent again), and no reply may hold more than that in the reader's buffer, so
// a connection's memory is bounded by it. A slot map naming more than `max_nodes` masters
// is not installed; a redirect may name at most kMaxStrangers nodes outside the slot map,
// and every node that is not a master of a newly read map is dropped with its threads.
// Threads: (masters + strangers) x (connections_per_node + 1), plus the refresh thread.
//
// Circuit breaker, per node: after `breaker_failures` consecutive failed batches (connect
// refused or timed out, an I/O error, a missed deadline) the node is open for
// `breaker_open`: requests for it fail at once (kUnavailable) without being queued. The
// period doubles (up to 8x) while the node keeps failing; meanwhile the refresh thread
// PINGs it every kProbeGap and closes the breaker as soon as it answers, and reads the
// slot map every second (a replica may be taking over), as it does until a first map is
// read; otherwise every refresh_interval, and at once (at most every 200 ms) after a
// failure or a MOVED. Cluster-level
// refusals (CLUSTERDOWN, TRYAGAIN, LOADING, MASTERDOWN) fail their requests with
// kUnavailable without counting against the node, which answered.
//
// Errors are logged, not only counted: the first of each kind (Redis' own error word:
// NOAUTH, OOM, CLUSTERDOWN, ...; or "connect", "timeout") with the server's text, then at
// most one line per kind per minute with how many were not logged.
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

#include "protocol/base/mutex.h"
#include "protocol/base/post.h"
#include "protocol/base/status.h"

struct redisReply;

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
  uint32_t max_nodes = 64;                       // masters in a slot map; Default: 64
  uint64_t max_value_bytes = 0;                  // longest bulk reply read; 0: 64 MiB
  std::string username;                          // AUTH user (ACL); empty: "default"
  std::string password;                          // AUTH password; empty: no AUTH
  bool operator==(const RedisClusterOptions&) const = default;
};

struct RedisReply {
  // OK; kNotFound for a nil GET; kUnavailable when not sent (breaker open, no node for the
  // slot), not answered in time, or refused by a cluster that is down; kDataLoss for a GET
  // of a key of another type (WRONGTYPE) or of a value longer than max_value_bytes;
  // kResourceExhausted for a write refused for memory (OOM); kInternal for any other
  // error reply; or what a GET's sink returned.
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
  std::atomic<uint64_t> oversized{0};           // replies refused for their length
  std::atomic<uint64_t> nodes_dropped{0};       // nodes dropped with their threads
  std::atomic<uint64_t> maps_refused{0};        // slot maps not installed (too many masters)
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_received{0};
};

class RedisCluster {
 public:
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
  static constexpr size_t kMaxStrangers = 4;
  static constexpr int64_t kProbeGap_ns = 250'000'000;

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
  bool Available() const { return AnyMaster(/*open=*/false); }
  // Asks the refresh thread to read the slot map again soon.
  void RequestRefresh();
  const RedisClusterCounters& counters() const { return counters_; }

  // Threads serving connections now (for tests and the daemon's metrics).
  size_t connection_threads() const;

  // The hash slot of a key, as Redis computes it (CRC16-XMODEM of the key or of the first
  // non-empty {tag}, mod 16384).
  static uint16_t KeySlot(std::string_view key);
  // Splits "host:port" ("[v6]:port" too); false when it is not one.
  static bool ParseAddress(std::string_view address, std::string* host, int* port);
  // "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381"; false for anything else.
  static bool ParseRedirect(std::string_view error, bool* ask, uint16_t* slot, std::string* address);
  // A CLUSTER SLOTS reply (or a standalone server's refusal of it) from the node at
  // `address`: each slot range's master as "host:port". kInvalidArgument for a reply that
  // is not one (the text says what is wrong), or that names no master.
  struct SlotRange {
    uint32_t first = 0, last = 0;
    std::string master;
  };
  static Result<std::vector<SlotRange>> ParseSlots(const redisReply& reply, const std::string& address);

 private:
  class Node;
  class Connection;
  struct Request;

  RedisCluster(const RedisClusterOptions& options, Post post);
  void Submit(Request r);
  // The node serving `slot`, or null (no map yet).
  std::shared_ptr<Node> Route(uint16_t slot) const;
  // The node at `address`, created (with its connection threads) on first use; null when
  // stopping, or when it would be a stranger (not in the slot map) past kMaxStrangers.
  std::shared_ptr<Node> NodeAt(const std::string& address, bool stranger);
  // A MOVED or ASK reply: the slot moves to `address` (MOVED) and the request goes there.
  void Redirect(Request r, uint16_t slot, const std::string& address, bool ask);
  // Fails `r` with `st`, its callback posted.
  void FailRequest(Request& r, Status st);
  // Delivers finished requests' callbacks on the owner's thread, in order.
  void Deliver(std::vector<std::function<void()>> fns);
  void RefreshLoop(std::stop_token stop);
  // Reads CLUSTER SLOTS from the first node that answers; installs the map and drops the
  // nodes it does not name.
  bool RefreshOnce();
  // PINGs every node whose breaker is open; one that answers is closed.
  void ProbeOpenNodes();
  // Whether some master of the slot map has its breaker open (open) / closed (!open).
  bool AnyMaster(bool open) const;
  // A connection to host:port, authenticated when a password is set; null with *error.
  void* OpenContext(const std::string& host, int port, std::string* error) const;
  // Logs an error of `kind` (the first, then at most once a minute per kind).
  void LogError(const std::string& kind, const std::string& text);

  RedisClusterOptions options_;
  uint64_t max_value_bytes_;  // options_.max_value_bytes, or its default
  Post post_;
  RedisClusterCounters counters_;
  mutable Mutex mu_;
  std::vector<std::shared_ptr<Node>> nodes_ KVTIER_GUARDED_BY(mu_);
  // slot -> master; empty until a map is read.
  std::vector<std::shared_ptr<Node>> slots_ KVTIER_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Node>> masters_ KVTIER_GUARDED_BY(mu_);
  bool stopping_ KVTIER_GUARDED_BY(mu_) = false;  // no node is handed out any more
  Mutex log_mu_;
  struct ErrorLog {
    std::string kind;
    int64_t last_ns = 0;
    uint64_t unlogged = 0;
  };
  std::vector<ErrorLog> logged_ KVTIER_GUARDED_BY(log_mu_);  // by kind; at most a few dozen kinds
  Mutex refresh_mu_;
  std::condition_variable_any refresh_cv_;
  bool refresh_wanted_ KVTIER_GUARDED_BY(refresh_mu_) = false;
  std::jthread refresher_;
};

}  // namespace kvtier
