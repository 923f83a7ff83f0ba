#pragma once
// Dispatcher: turns one inbound frame into a call on the CacheManager and one response
// frame. Transport-free (the session moves bytes; the dispatcher never touches a socket),
// so the fuzzer and unit tests drive it directly.
//
// Most requests are answered before HandleFrame returns. Acquire of NVMe or remote
// blocks, Lookup that asks the remote tier, Allocate that waits for demotions, and Verify
// are answered later, through the session's
// `async_sink`, while the session's other requests keep flowing.
//
// Protocol rules enforced here: every frame passes the FlatBuffers Verifier first; a frame
// that fails is answered with INVALID_ARGUMENT (request id 0) and the connection marked
// for closing; nothing but Ping is served before Hello; who may send each op is its row
// of kOpTable (protocol/op_table.h); every vector request is bounded by
// max_entries_per_request.
//
// Owned by the control thread; not thread-safe.

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "daemon/cache/cache_manager.h"
#include "daemon/metrics.h"
#include "daemon/tenants.h"
#include "protocol/base/clock.h"
#include "protocol/base/layout.h"
#include "protocol/codec.h"
#include "protocol/framing.h"
#include "protocol/op_table.h"

namespace kvtier {

class ReplySink;

// Per-connection protocol state: everything about a session but its socket.
struct SessionContext {
  explicit SessionContext(SessionId id) : id(id), cache(id) {}

  SessionId id;
  pid_t pid = 0;         // SO_PEERCRED's, in kvtierd's PID namespace: 0 for a peer it cannot see
  pid_t engine_pid = 0;  // what the peer's Hello says its pid is (its own namespace); shown only
  bool watched = false;  // the peer's process is watched through a pidfd (Session)
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary (SO_PEERGROUPS)
  int64_t connected_ns = 0;
  bool admin = false;  // decided at Hello by the TenantResolver

  bool hello_done = false;
  fb::Role role = fb::Role::Engine;
  std::string engine_name;
  size_t hash_bytes = 16;
  std::string tenant;
  ModelLayout layout;
  SessionCache cache;

  uint64_t requests = 0;
  bool close_after_reply = false;  // set after a frame the session cannot recover from
  // Where deferred responses go; expires with the connection.
  std::weak_ptr<ReplySink> async_sink;
};

// Where responses go. Implementations copy `frame` and the descriptors before returning.
class ReplySink {
 public:
  virtual ~ReplySink() = default;
  virtual void Send(std::span<const uint8_t> frame, std::span<const int> fds) = 0;
};

// Facts about the daemon reported in Welcome and Stats.
struct DaemonInfo {
  std::string version;
  std::string metrics_url;
  uint64_t epoch = 0;      // random per start; handles from another epoch are stale
  int64_t started_ns = 0;  // Clock::NowNanos() at start
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;
  uint32_t max_entries_per_request = kDefaultMaxEntriesPerRequest;
  int gpu_device = 0;             // the CUDA device of the GPU tier
  uint32_t heartbeat_ttl_ms = 0;  // protocol.heartbeat_ttl (0: sessions never expire)
};

class Dispatcher {
 public:
  // Calls `fn` for each live session (for Stats).
  using SessionVisitor = std::function<void(const std::function<void(const SessionContext&)>&)>;

  // `tenants` decides who each peer is; it and the rest outlive the dispatcher.
  Dispatcher(CacheManager* cache, const DaemonInfo* info, const Clock* clock, MetricsRegistry* metrics,
             SessionVisitor sessions, const TenantResolver* tenants);

  // Verifies and serves one whole frame (prefix included), sending exactly one response
  // (none to a keepalive Ping).
  void HandleFrame(SessionContext& ctx, std::span<const uint8_t> frame, ReplySink& sink);
  // The frames served back to back (one read's worth) are done: the next HandleFrame reads
  // the clock afresh instead of starting where the last one ended.
  void EndBatch() { chain_ns_ = 0; }
  // Answers a frame that could not be read at all (oversized, truncated at EOF) with
  // request id 0 and `status`, and marks the session for closing.
  void RejectFrame(SessionContext& ctx, const Status& status, std::string_view reason, ReplySink& sink);
  // Answers a connection the server will not serve (no room, no Hello in time) with
  // `status` (request id 0) and marks it for closing.
  void RejectConnection(SessionContext& ctx, const Status& status, ReplySink& sink);
  // The session is gone: drop everything it holds. With `quarantine_leases` (its process
  // still lives) leased pages are quarantined; returns the quarantine's id (0: none) for
  // QuarantineOver once the process has exited.
  uint64_t SessionClosed(SessionContext& ctx, bool quarantine_leases);
  void QuarantineOver(uint64_t id);

 private:
  struct OpMetrics {
    Histogram* latency = nullptr;
    Counter* errors = nullptr;
  };
  using Builder = flatbuffers::FlatBufferBuilder;
  using BodyOffset = flatbuffers::Offset<void>;

  // What a handler answers: an error status, or a body built in the builder it was given
  // (with the descriptors the frame carries), or "later" (the handler arranged for the
  // response to go through the session's async_sink), or nothing at all (a keepalive Ping).
  // Handlers `return SomeError(...)`.
  struct Reply {
    Reply(Status s) : status(std::move(s)) {}  // NOLINT(google-explicit-constructor): errors convert
    Reply(fb::Reply type, BodyOffset body, std::vector<int> fds = {}) : type(type), body(body), fds(std::move(fds)) {}
    static Reply Later() {
      Reply r(Status::Ok());
      r.later = true;
      return r;
    }
    static Reply Silent() {
      Reply r(Status::Ok());
      r.silent = true;
      return r;
    }

    Status status;
    fb::Reply type = fb::Reply::NONE;
    BodyOffset body;
    std::vector<int> fds;
    bool later = false;
    bool silent = false;
  };
  using Handler = Reply (Dispatcher::*)(SessionContext& ctx, const fb::Request& req);

  // Checks the op's access rule (op_table.h) and calls its handler.
  Reply Serve(SessionContext& ctx, const fb::Request& req);
  // The handler of each op, in op_table.h's order (row i: op i + 1).
  struct HandlerRow {
    fb::Op op;
    Handler fn;
  };
  static const std::array<HandlerRow, kOpCount> kHandlers;

  // The deferred response to request `id`: `build` fills it in async_builder_.
  using BuildReply = std::function<Reply(Builder&)>;
  void SendLater(SessionContext* ctx, uint64_t id, fb::Op op, int64_t start_ns, BuildReply build);
  // For completions that may outlive the session (a scrub, an index scan): only the sink.
  void SendLater(const std::weak_ptr<ReplySink>& sink, uint64_t id, fb::Op op, int64_t start_ns, BuildReply build);

  Reply OnHello(SessionContext& ctx, const fb::Request& req);
  Reply OnPing(SessionContext& ctx, const fb::Request& req);
  Reply OnAllocate(SessionContext& ctx, const fb::Request& req);
  Reply OnCommit(SessionContext& ctx, const fb::Request& req);
  Reply OnRelease(SessionContext& ctx, const fb::Request& req);
  Reply OnLookup(SessionContext& ctx, const fb::Request& req);
  Reply OnAcquire(SessionContext& ctx, const fb::Request& req);
  Reply OnStats(SessionContext& ctx, const fb::Request& req);
  // Operator requests (control sessions).
  Reply OnVerify(SessionContext& ctx, const fb::Request& req);
  Reply OnExplain(SessionContext& ctx, const fb::Request& req);
  Reply OnBlocks(SessionContext& ctx, const fb::Request& req);
  Reply OnEvict(SessionContext& ctx, const fb::Request& req);
  Reply OnDrain(SessionContext& ctx, const fb::Request& req);
  Reply OnSessionHint(SessionContext& ctx, const fb::Request& req);

  // kFailedPrecondition for handles of another daemon epoch (0: unchecked).
  Status CheckEpoch(uint64_t epoch) const;
  Reply AllocateReply(Builder& b, SessionContext& ctx, TierKind tier, const std::vector<PageId>& pages);
  static Reply LookupReply(Builder& b, const CacheLookup& r);
  Reply AcquireReply(Builder& b, SessionContext& ctx, const std::vector<CacheResult>& results);
  static Reply ExplainReply(Builder& b, const Result<std::vector<BlockExplanation>>& entries);
  flatbuffers::Offset<fb::RemoteTierStats> LegacyRemoteStats(
      const LowerTierMover& mover, const LowerTierReport& r,
      flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::RemoteNode>>> nodes,
      flatbuffers::Offset<flatbuffers::String> write_policy);

  Result<std::vector<BlockHash>> Hashes(const SessionContext& ctx, const flatbuffers::Vector<uint8_t>* v) const;
  static flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::Segment>>> Segments(
      Builder& b, const std::vector<SegmentGrant>& grants, std::vector<int>* fds);
  static flatbuffers::Offset<flatbuffers::Vector<const fb::EntryResult*>> Results(
      Builder& b, const std::vector<CacheResult>& results);
  // Sends `reply` (not a later one) to request `id`; an error goes without a body.
  void Send(Builder& b, ReplySink& sink, uint64_t id, Reply reply);
  // Records a request's latency and errors; returns the clock it read (the request's end).
  int64_t Observe(int op, int64_t start_ns, const Status& st);

  CacheManager* cache_;
  const DaemonInfo* info_;
  const Clock* clock_;
  SessionVisitor sessions_;
  const TenantResolver* tenants_;
  Builder builder_{4096};
  // Deferred responses are built here: they may be produced while builder_ holds a
  // response half-built (a Release that frees pages completes a waiting Allocate).
  Builder async_builder_{4096};
  int64_t chain_ns_ = 0;        // the end of the frame just served, within a batch (0: none)
  int64_t frame_start_ns_ = 0;  // the start of the frame being served
  OpMetrics op_metrics_[static_cast<int>(fb::Op::MAX) + 1];
  Counter* rejected_malformed_;
  Counter* rejected_oversized_;
  Counter* rejected_truncated_;
};

}  // namespace kvtier
