#pragma once
// kvtier::Client: an engine's (or kvctl's) connection to kvtierd.
//
// One Client is one session: it says Hello with the engine's layout, maps the pool
// segments the daemon grants (host pages are then plain memory: PageBytes()), and issues
// requests. Every call returns a Status or Result; per-block outcomes are typed
// (BlockResult::status) and the client never aborts the host process.
//
// Blocking calls (Lookup, Acquire, ...) send one request and wait for its response.
// Pipelined use: StartX() sends and returns a Ticket at once; WaitX(ticket) waits for that
// response. Any number may be in flight; they may be waited for in any order.
//
// Closing the client (or the process dying) ends the session: the daemon returns its
// leased pages to free and drops its references.
//
// Thread-compatible: use one Client per thread, or serialize calls.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/kv_layout.h"
#include "protocol/base/block_key.h"
#include "protocol/base/layout.h"
#include "protocol/base/status.h"
#include "protocol/base/tier.h"

namespace kvtier {

using PageId = uint32_t;
using Ticket = uint64_t;

struct ClientOptions {
  // Empty: $KVTIER_SOCKET, else kvtierd's default ./var/kvtierd.sock.
  std::string socket_path;
  std::string engine_name = "engine";
  // A control session (kvctl, monitoring): no layout, no pools, Stats and Ping only.
  bool control = false;
  // Required unless control.
  ModelLayout layout;
  // Size of every block hash this session sends: 16 or 32.
  size_t hash_bytes = 16;
  // Longest wait for one response; 0 waits forever. Default: 60 s.
  int timeout_ms = 60'000;
  // The device side of this engine: "auto" (CUDA when a GPU is visible, else
  // host-emulated), "cuda", or "host-emulated" (engine KV memory is host memory). Used to
  // map the daemon's GPU tier, to pin the host pool for DMA, and by StoreBlocks /
  // LoadBlocks. Default: "auto".
  std::string device = "auto";
  int cuda_device = 0;
};

// An engine's paged KV cache in its own (device) memory: one tensor per layer, in one of
// the two layouts of kernels/kv_layout.h, with the geometry of ClientOptions::layout.
struct EngineKv {
  KvLayoutKind layout = KvLayoutKind::kKvFirst;
  uint32_t num_blocks = 0;         // blocks in each layer's tensor
  std::vector<void*> layers;       // one tensor per layer
  void* stream = nullptr;          // the engine's CUDA stream (ignored when emulated)
};

struct BlockResult {
  Status status;               // OK, or why this entry failed
  TierKind tier = TierKind::kHost;  // where the block can be read
  PageId page = 0;
  bool duplicate = false;      // Commit: the key existed already
};

struct LookupResult {
  size_t matched = 0;          // blocks 0..matched-1 are cached
  std::vector<TierKind> tiers; // the tier of each matched block
};

struct CommitEntry {
  PageId page = 0;
  BlockHash hash;
  BlockHash parent;            // empty: no parent (first block of a sequence)
};

struct TierStatsInfo {
  TierKind tier = TierKind::kHost;
  std::string name;
  uint64_t page_bytes = 0;
  uint32_t capacity_pages = 0, free_pages = 0, leased_pages = 0, inflight_pages = 0,
           cached_pages = 0, referenced_pages = 0, quarantined_pages = 0;
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

struct SessionStatsInfo {
  uint64_t id = 0;
  bool control = false;
  std::string engine_name;
  int pid = 0;
  uint32_t uid = 0, gid = 0;
  std::string tenant, namespace_id, model;
  uint32_t leased_pages = 0, referenced_blocks = 0;
  uint64_t requests = 0;
  double connected_s = 0;
};

struct DaemonStats {
  std::string version;
  double uptime_s = 0;
  std::string metrics_url;
  uint64_t epoch = 0;
  std::vector<TierStatsInfo> tiers;
  std::vector<SessionStatsInfo> sessions;  // when asked for
  uint32_t session_count = 0;
  uint64_t lookups = 0, block_hits = 0, block_misses = 0;
  uint64_t checksum_failures = 0, io_errors = 0, demotions = 0, promotions = 0;
  uint32_t pending_fetches = 0;
  uint64_t gpu_demotions = 0, refetches_after_evict = 0, spill_bytes = 0, fetch_bytes = 0, evictions = 0;
  bool draining = false;
};

// kvctl explain: why a block is or is not a hit.
struct BlockExplanationInfo {
  enum class State : uint8_t { kCached = 0, kInFlight = 1, kEvicted = 2, kOtherNamespace = 3, kNeverStored = 4 };
  State state = State::kNeverStored;
  TierKind tier = TierKind::kHost;
  bool on_nvme = false, writing = false;
  std::string namespace_id, tenant, model;
  double seconds_ago = 0;
  std::string detail;
};

// kvctl blocks: one block.
struct BlockInfoEntry {
  BlockHash hash;
  std::string namespace_id, tenant, model;
  TierKind tier = TierKind::kHost;
  bool on_nvme = false;
  uint64_t bytes = 0;
  uint32_t hits = 0, refs = 0;
  double idle_s = 0;
};

struct EvictResult {
  uint64_t blocks = 0, bytes = 0, demoting = 0;
};

struct DrainResult {
  bool draining = false;
  uint64_t gpu_blocks_left = 0, gpu_blocks_pinned = 0, host_blocks_unspilled = 0;
  uint32_t spills_in_flight = 0;
};

struct VerifyResult {
  uint64_t checked = 0;
  uint64_t dropped = 0;
  double seconds = 0;
};

struct TierInfo {
  TierKind tier = TierKind::kHost;
  uint64_t page_bytes = 0;
  uint32_t capacity_pages = 0;
};

class Client {
 public:
  // Connects and says Hello. kUnavailable when no daemon answers at the socket.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // ---- blocking calls ----
  // Leases `count` writable pages (all or nothing).
  Result<std::vector<PageId>> Allocate(TierKind tier, uint32_t count);
  // Turns leased pages into blocks. With `retain`, the session keeps a reference to each.
  Result<std::vector<BlockResult>> Commit(TierKind tier, std::span<const CommitEntry> entries,
                                          bool retain = false);
  // Releases leased pages or references: one status per page, then one per hash.
  Result<std::vector<Status>> Release(TierKind tier, std::span<const PageId> pages,
                                      std::span<const BlockHash> hashes = {});
  // The longest cached prefix of a hash chain.
  Result<LookupResult> Lookup(std::span<const BlockHash> chain);
  // References cached blocks until Release; per block its page (or NOT_FOUND).
  Result<std::vector<BlockResult>> Acquire(std::span<const BlockHash> hashes);
  Result<DaemonStats> Stats(bool with_sessions = false);
  // Round trip with `payload_bytes` of payload each way.
  Status Ping(size_t payload_bytes = 0);
  // Scrubs the NVMe tier (control sessions): reads and verifies every block, drops the
  // ones that fail. Waits for the scrub (no timeout).
  Result<VerifyResult> Verify();
  // ---- operator calls (control sessions; Evict and Drain need an admin) ----
  // One entry per hash: why it is or is not a hit. namespace_id "" asks every namespace
  // the caller may see.
  Result<std::vector<BlockExplanationInfo>> Explain(std::span<const BlockHash> hashes,
                                                    const std::string& namespace_id = "");
  // The top blocks of a tier (nullopt: GPU and host) by hits, or by recency.
  Result<std::vector<BlockInfoEntry>> Blocks(std::optional<TierKind> tier, const std::string& namespace_id = "",
                                             bool by_recent = false, uint32_t limit = 20);
  Result<EvictResult> Evict(TierKind tier, uint64_t bytes);
  // Starts (start) or ends a drain; with `query` only reports its progress.
  Result<DrainResult> Drain(bool start = true, bool query = false);

  // ---- pipelined calls ----
  Result<Ticket> StartAllocate(TierKind tier, uint32_t count);
  Result<std::vector<PageId>> WaitAllocate(Ticket t);
  Result<Ticket> StartCommit(TierKind tier, std::span<const CommitEntry> entries, bool retain = false);
  Result<std::vector<BlockResult>> WaitCommit(Ticket t);
  Result<Ticket> StartRelease(TierKind tier, std::span<const PageId> pages,
                              std::span<const BlockHash> hashes = {});
  Result<std::vector<Status>> WaitRelease(Ticket t);
  Result<Ticket> StartLookup(std::span<const BlockHash> chain);
  Result<LookupResult> WaitLookup(Ticket t);
  Result<Ticket> StartAcquire(std::span<const BlockHash> hashes);
  Result<std::vector<BlockResult>> WaitAcquire(Ticket t);
  // Blocks until the response to one of `tickets` has arrived and returns that ticket; its
  // WaitX() then returns at once. For keeping a fixed number of requests in flight when
  // they complete out of order (NVMe fetches do).
  Result<Ticket> WaitAny(std::span<const Ticket> tickets);

  // ---- KV transfer helpers (offload-connector mode) ----
  // Store: leases host pages, gathers engine blocks engine_blocks[i] into them on the
  // engine's stream (all layers, one launch), waits for the copy, and commits them as
  // hashes[i] (parents[i], when given). Per-block results as Commit's.
  Result<std::vector<BlockResult>> StoreBlocks(const EngineKv& kv, std::span<const uint32_t> engine_blocks,
                                               std::span<const BlockHash> hashes,
                                               std::span<const BlockHash> parents = {});
  // Load: looks up the chain, acquires the cached prefix (NVMe blocks are promoted first),
  // scatters it into engine blocks engine_blocks[0..n), waits, releases. Returns n, the
  // number of leading blocks loaded. REQUIRES: engine_blocks.size() >= chain.size().
  Result<size_t> LoadBlocks(const EngineKv& kv, std::span<const BlockHash> chain,
                            std::span<const uint32_t> engine_blocks);

  // ---- memory ----
  // The bytes of a page this session may address (host tier), or an empty span when its
  // segment is not mapped here.
  std::span<uint8_t> PageBytes(TierKind tier, PageId page) const;
  // Tiers the daemon offers, from Welcome.
  const std::vector<TierInfo>& tiers() const;
  uint64_t page_bytes(TierKind tier) const;
  // Address of a page this session may address: host memory for the host tier, device
  // memory for the GPU tier (host memory when emulated); nullptr when not mapped here.
  void* PageAddress(TierKind tier, PageId page) const;
  // "cuda" or "host-emulated".
  std::string_view device_backend() const;

  uint64_t session_id() const;
  uint64_t daemon_epoch() const;
  const std::string& namespace_id() const;
  size_t hash_bytes() const;
  // The socket descriptor (for poll loops); owned by the client.
  int fd() const;

 private:
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier
