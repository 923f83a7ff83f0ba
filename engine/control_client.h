#pragma once
// kvtier::ControlClient: an operator's (or monitor's) session with kvtierd — what kvctl
// speaks. No layout and no pools: stats, explain, blocks, and the admin operations evict,
// drain and verify. Engines use Client (engine/client.h).
//
// Errors: as Client's (kUnavailable for a daemon that is gone, kDeadlineExceeded for one
// silent past the timeout,
// kInvalidArgument for bad arguments), plus kPermissionDenied for an admin operation from
// a uid that is not root, the daemon's own or in security.admin_uids.
//
// Thread-compatible: one thread at a time.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "protocol/base/block_key.h"
#include "protocol/base/block_state.h"
#include "protocol/base/operator_reports.h"
#include "protocol/base/status.h"
#include "protocol/base/tier.h"

namespace kvtier {

struct ControlClientOptions {
  // Empty: $KVTIER_SOCKET, else kvtierd's default ./var/kvtierd.sock.
  std::string socket_path;
  std::string name = "kvctl";
  // Size of the hashes Explain sends: 16 or 32.
  size_t hash_bytes = 16;
  // Longest wait for one response (Verify waits as long as the scrub takes); 0 waits
  // forever. Default: 60 s.
  int timeout_ms = 60'000;
};

struct TierStatsInfo {
  std::optional<TierKind> tier;  // nullopt: a tier this client does not know (a newer daemon's); `name` names it
  std::string name;
  uint64_t page_bytes = 0;
  uint32_t capacity_pages = 0, free_pages = 0, leased_pages = 0, inflight_pages = 0, cached_pages = 0,
           referenced_pages = 0, quarantined_pages = 0;
  uint64_t blocks = 0;
  uint64_t evictions = 0;
  double high_watermark = 0, low_watermark = 0;
  std::string backend;
  std::string io_backend;     // nvme: io_uring | threads
  std::string index_backend;  // nvme: rocksdb | memory
  bool ready = true;          // nvme: index loaded

  uint64_t capacity_bytes() const { return uint64_t{capacity_pages} * page_bytes; }
  uint64_t used_bytes() const { return uint64_t{capacity_pages - free_pages} * page_bytes; }
};

// The remote tier (a Redis Cluster shared by kvtierd nodes) as one kvtierd sees it.
struct RemoteStatsInfo {
  struct Node {
    std::string address;
    bool up = true;  // false while its circuit breaker is open
    uint64_t failures = 0;
  };
  std::vector<Node> nodes;
  std::string write_policy;
  uint64_t lookups = 0, lookup_hits = 0;  // keys asked about, found
  uint64_t fetches = 0, fetch_hits = 0, fetch_bytes = 0;
  uint64_t puts = 0, put_bytes = 0;
  uint64_t errors = 0, checksum_failures = 0;
  double lookup_mean_s = 0, fetch_mean_s = 0, put_mean_s = 0;
  uint32_t puts_in_flight = 0, puts_queued = 0;
  uint64_t puts_skipped = 0, breaker_rejections = 0, timeouts = 0;
  uint64_t puts_failed = 0;    // refused or not answered (puts: stored)
  bool authenticated = false;  // values sealed with a fleet secret
};

// A tier below NVMe (the remote tier, the memory tier) as one kvtierd sees it: what every
// lower tier has, and the figures only it reports (LowerTier::Report).
struct LowerTierStatsInfo {
  std::optional<TierKind> tier;  // as TierStatsInfo's
  std::string name;
  std::string describe;  // one line: "redis cluster, 3 masters, 3 up, ..."
  bool available = false;
  std::string write_policy;
  uint64_t hits = 0, promotions = 0, puts = 0, put_failures = 0, puts_skipped = 0;
  uint32_t puts_in_flight = 0, puts_queued = 0;
  uint64_t put_backoffs = 0, quota_deletes = 0, checksum_failures = 0;
  bool authenticated = false;
  std::vector<RemoteStatsInfo::Node> nodes;
  struct Figure {
    std::string key;
    double value = 0;
    std::string label;  // "state=up", or empty
  };
  std::vector<Figure> figures;
};

struct SessionStatsInfo {
  uint64_t id = 0;
  bool control = false;
  std::string engine_name;
  int pid = 0;           // in kvtierd's PID namespace; 0 for a peer in a namespace kvtierd cannot see
  int engine_pid = 0;    // as the engine reported it (its own namespace); 0: not reported
  bool watched = false;  // kvtierd watches the process (else leases of an ended session wait for a restart)
  uint32_t uid = 0, gid = 0;
  std::string tenant, namespace_id, model;
  uint32_t leased_pages = 0, referenced_blocks = 0;
  uint64_t requests = 0;
  double connected_s = 0;
};

// An agentic session its hints made (kvctl agents).
struct AgentSessionStatsInfo {
  std::string tenant, session, state;  // state: live, ended, lapsed
  int64_t ttl_left_ms = 0;             // live: until its TTL runs out
  uint64_t requests = 0, hit_tokens = 0;
  uint32_t blocks = 0, gpu_blocks = 0, host_blocks = 0, protected_blocks = 0;  // of those it names, cached
};

struct DaemonStats {
  std::string version;
  double uptime_s = 0;
  std::string metrics_url;
  uint64_t epoch = 0;
  std::vector<TierStatsInfo> tiers;
  std::vector<SessionStatsInfo> sessions;             // when asked for
  std::vector<AgentSessionStatsInfo> agent_sessions;  // when asked for
  uint32_t session_count = 0;
  uint64_t lookups = 0, block_hits = 0, block_misses = 0;
  uint64_t checksum_failures = 0, io_errors = 0, demotions = 0, promotions = 0;
  uint32_t pending_fetches = 0;
  uint64_t gpu_demotions = 0, refetches_after_evict = 0, spill_bytes = 0, fetch_bytes = 0, evictions = 0;
  bool draining = false;
  std::optional<RemoteStatsInfo> remote;  // with a remote tier (its entry of `lower`, as older daemons sent it)
  std::vector<LowerTierStatsInfo> lower;  // the tiers below NVMe, in chain order
  struct Events {
    std::string publish, replay;
    uint32_t subscribers = 0, replay_peers = 0;
    uint64_t events = 0, messages = 0, dropped = 0, refused = 0, retracted = 0, first_sequence = 0;
  };
  std::optional<Events> events;  // with KV events on
};

class Connection;

class ControlClient {
 public:
  // Connects and says Hello as a control session. kUnavailable when no daemon answers.
  static Result<std::unique_ptr<ControlClient>> Connect(const ControlClientOptions& options);
  ~ControlClient();
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  // Tiers, counters, (with `with_sessions`) sessions and (with `with_agents`) agentic
  // sessions: a non-admin sees only its own tenant's.
  Result<DaemonStats> Stats(bool with_sessions = false, bool with_agents = false);
  // Round trip with `payload_bytes` of payload each way.
  Status Ping(size_t payload_bytes = 0);
  // One entry per hash: why it is or is not a hit. `namespace_id` "" asks every namespace
  // the caller may see (a non-admin: its own tenant's).
  // A router's or an operator's hint for an agentic session of namespace `namespace_id`
  // (hex; its tenant's, any for an admin): as Client::Hint. kPermissionDenied for another
  // tenant's namespace, kNotFound for one not in use. `prefetch`: the chain's blocks below
  // the host tier (NVMe, the lower tiers) are read into its free pages too, before the
  // session's next turn arrives (never evicting; kvtier_prefetches_total counts them).
  Result<uint32_t> Hint(const std::string& namespace_id, std::string_view session, std::span<const BlockHash> chain,
                        int64_t ttl_ms = -1, bool end = false, bool prefetch = false);
  Result<std::vector<BlockExplanation>> Explain(std::span<const BlockHash> hashes,
                                                const std::string& namespace_id = "");
  // The top blocks of a tier (nullopt: GPU and host) by hits, or by recency.
  // kFailedPrecondition for a tier that is not configured.
  Result<std::vector<BlockInfo>> Blocks(std::optional<TierKind> tier, const std::string& namespace_id = "",
                                        bool by_recent = false, uint32_t limit = 20);
  // Admin: evicts `bytes` of cached blocks from `tier` (kInvalidArgument: not configured).
  Result<EvictReport> Evict(TierKind tier, uint64_t bytes);
  // Admin: starts (start) or ends a drain; with `query` only reports its progress.
  Result<DrainStatus> Drain(bool start = true, bool query = false);
  // Admin: scrubs the NVMe tier — reads and verifies every block, drops the ones that fail
  // — and waits for it, however long it takes (no timeout). kFailedPrecondition without an
  // NVMe tier; kAborted when the daemon stopped the scrub (it is shutting down).
  Result<VerifyReport> Verify();

  uint64_t session_id() const;
  int fd() const;

 private:
  explicit ControlClient(std::unique_ptr<Connection> conn);
  std::unique_ptr<Connection> conn_;
};

}  // namespace kvtier
