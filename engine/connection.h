#pragma once
// Connection: one session's socket to kvtierd. Says Hello, sends request frames, reads
// response frames and matches them to tickets; responses that arrive for other tickets
// are kept until their Wait. Internal to the client library (Client and ControlClient are
// built on it); the only place the client meets FlatBuffers.
//
// Descriptors arrive in stream order, one per granted segment that has one, always with
// or before the first byte of their frame; each response's are handed to the segment
// handler with it and closed after (the mappings keep the memory). A response with id 0
// (the daemon refused something it could not attribute) breaks the connection: every
// later call returns that status.
//
// Keepalive: when Welcome says sessions expire (heartbeat_ttl_ms > 0), a thread of the
// connection sends a keepalive Ping (no reply) whenever nothing was sent for a third of
// that, so a session whose process runs never expires for being quiet (a long prefill, a
// GC pause, a loaded host) and drops references its engine is reading. A process that does
// not run (SIGSTOP, a frozen cgroup) still expires, and learns it through Alive().
//
// Thread-compatible: one thread at a time (the keepalive thread only writes whole frames,
// under its own lock).

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/segment_map.h"
#include "protocol/base/block_key.h"
#include "protocol/base/layout.h"
#include "protocol/base/mutex.h"
#include "protocol/base/status.h"
#include "protocol/codec.h"
#include "protocol/framing.h"

namespace kvtier {

using Ticket = uint64_t;

class Connection {
 public:
  // Called for every segment a response grants, before the response is parsed.
  using SegmentHandler = std::function<Status(const SegmentGrantView&)>;
  // Called with a Welcome before its segments are handed to the segment handler.
  using WelcomeHandler = std::function<void(const fb::Welcome&)>;

  struct HelloArgs {
    fb::Role role = fb::Role::Engine;
    std::string engine_name;
    std::string routable_id;                            // engines only; may be empty
    int data_parallel_rank = -1;                        // engines only; -1: none
    EventHashForm event_hashes = EventHashForm::kVllm;  // engines only
    EventGroup event_group;                             // engines only
    const ModelLayout* layout = nullptr;                // engines only
    size_t hash_bytes = 16;
  };
  struct Session {
    uint64_t id = 0;
    uint64_t epoch = 0;
    std::string namespace_id;
    // The daemon's limits, from Welcome (0: not said). A request over max_frame_bytes is
    // refused here, before anything is sent, so the connection stays usable.
    uint32_t max_frame_bytes = 0;
    uint32_t max_entries_per_request = 0;
    // protocol.heartbeat_ttl (0: sessions never expire, or a daemon before minor 7).
    uint32_t heartbeat_ttl_ms = 0;
  };

  // Connects to `socket_path` (empty: $KVTIER_SOCKET, else the default) and says Hello.
  // kUnavailable when no daemon answers there; the daemon's refusal otherwise.
  static Result<std::unique_ptr<Connection>> Open(const std::string& socket_path, int timeout_ms,
                                                  const HelloArgs& hello, WelcomeHandler on_welcome,
                                                  SegmentHandler on_segment);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // The builder for the next request, cleared.
  flatbuffers::FlatBufferBuilder& builder() {
    builder_.Clear();
    return builder_;
  }
  // Finishes the request being built and sends it; its ticket.
  Result<Ticket> Send(fb::Op type, flatbuffers::Offset<void> op);
  // Finishes the request being built into the batch, unsent; its ticket. Flush() sends the
  // batch in one write. Errors as Send's; a request refused here leaves the batch as it was.
  Result<Ticket> Queue(fb::Op type, flatbuffers::Offset<void> op);
  Status Flush();
  // Forgets the batch (its tickets are never outstanding).
  void DropQueued() {
    batch_.clear();
    batch_ids_.clear();
  }

  // Waits for the response to `t`, then runs `parse` on it unless the request failed as a
  // whole (its status is returned then). kInvalidArgument at once for a ticket that is not
  // outstanding (never sent, or already waited for); kDeadlineExceeded when no response
  // comes within the timeout, kUnavailable when the daemon closed the connection.
  Status Wait(Ticket t, fb::Reply expected, const std::function<Status(const fb::Response&)>& parse);
  // Blocks until one of `tickets` has its response; returns that ticket (its Wait then
  // returns at once). kInvalidArgument for an empty list or a ticket not outstanding.
  Result<Ticket> WaitAny(std::span<const Ticket> tickets);
  // Gives up on `t`'s response: it is read and dropped with a later one (a reply whose
  // request is not outstanding is never kept).
  void Forget(Ticket t) {
    outstanding_.erase(t);
    stash_.erase(t);
  }

  // Round trip with `payload_bytes` of payload each way (any session may Ping).
  Status Ping(size_t payload_bytes);
  // A SessionHint (protocol minor 8) over `chain` (hashes of the session's size); control
  // sessions name the namespace (hex), engines leave it empty. The blocks it named.
  Result<uint32_t> SessionHint(std::string_view session, std::span<const BlockHash> chain, int64_t ttl_ms, bool end,
                               std::string_view namespace_id, uint64_t hit_tokens, bool prefetch = false);
  // Whether the session still lives, without a round trip: OK, or why it ended — the
  // daemon closed it (expired it, stopped, or crashed: its message when it sent one, else
  // kUnavailable) or the connection broke earlier. Pages read through references are only
  // known to hold the referenced blocks' bytes if the session lived until after the read.
  Status Alive();

  const Session& session() const { return session_; }
  int timeout_ms() const { return timeout_ms_; }
  // 0: wait forever. Fails only if the socket refuses the option.
  Status set_timeout_ms(int ms);
  int fd() const { return fd_; }

 private:
  Connection(int timeout_ms, SegmentHandler on_segment)
      : timeout_ms_(timeout_ms), on_segment_(std::move(on_segment)), in_(64u << 20) {}
  Status Dial(const std::string& socket_path);
  Status Hello(const HelloArgs& hello, WelcomeHandler on_welcome);
  // The next response frame off the socket, verified and its segments handed over:
  // (request id, frame bytes valid until the next read).
  Result<std::pair<uint64_t, std::span<const uint8_t>>> NextResponse();
  Status TakeSegments(const fb::Response& r);
  Status ReadMore();
  // Sets the socket's receive timeout to timeout_ms_ (0: none).
  Status ApplyTimeout();
  // After a failed write: the daemon may have refused the connection with an error frame
  // and closed it before the request arrived (a full session table), and that frame says
  // why. Returns its status if one is already received, else `failed`.
  Status RefusalOr(Status failed);
  Status Parse(std::span<const uint8_t> frame, fb::Reply expected,
               const std::function<Status(const fb::Response&)>& parse);
  // Starts the keepalive thread when the daemon says sessions expire.
  void StartKeepalive();
  void Keepalive(std::chrono::nanoseconds period);
  static int64_t NowNs();

  int fd_ = -1;
  int timeout_ms_;
  SegmentHandler on_segment_;
  WelcomeHandler on_welcome_;
  FrameAssembler in_;
  std::deque<int> fds_;
  flatbuffers::FlatBufferBuilder builder_{1024};
  Ticket next_id_ = 1;
  std::unordered_set<Ticket> outstanding_;  // sent, not yet waited for
  std::vector<uint8_t> batch_;              // queued request frames, not sent yet
  std::vector<Ticket> batch_ids_;
  std::unordered_map<Ticket, std::vector<uint8_t>> stash_;
  Status broken_;
  Session session_;

  // Writes of whole frames: the caller's, and the keepalive thread's.
  Mutex write_mu_;
  std::atomic<int64_t> last_send_ns_{0};
  std::vector<uint8_t> keepalive_frame_;  // set before the thread starts; read-only after
  Mutex keepalive_mu_;
  std::condition_variable keepalive_cv_;
  bool keepalive_stop_ KVTIER_GUARDED_BY(keepalive_mu_) = false;
  std::unique_ptr<std::thread> keepalive_;
  pid_t owner_pid_ = 0;  // the process that started keepalive_ (a forked child has no such thread)
};

}  // namespace kvtier
