#pragma once
// kvtier::Client: an engine's connection to kvtierd.
//
// One Client is one session: it says Hello with the engine's layout, maps the pool
// segments the daemon grants (host pages are then plain memory: PageBytes()), and issues
// requests. Operators' calls (stats, explain, blocks, evict, drain, verify) are on
// ControlClient (engine/control_client.h), a session of its own.
//
// Errors. Every call returns a Status or Result and the client never aborts the host
// process. A call fails as a whole with:
//   kUnavailable         no daemon at the socket, or the daemon closed the connection
//   kDeadlineExceeded    no response within ClientOptions::timeout_ms (the session is then
//                        unusable: connect again)
//   kInvalidArgument     a bad argument found before sending (wrong hash size, more
//                        entries than the daemon takes, an unknown ticket)
//   kFailedPrecondition  page handles from before a daemon restart (another epoch)
//   kPermissionDenied    the daemon refused this peer (security.tenants)
//   kInternal            the daemon sent something this client cannot read
// and per entry (BlockResult::status, Release's statuses) with the codes each call lists.
//
// Blocking calls (Lookup, Acquire, ...) send one request and wait for its response.
// Pipelined use: StartX() sends and returns a Ticket at once; WaitX(ticket) waits for that
// response. Any number may be in flight; they may be waited for in any order; each ticket
// is waited for once.
//
// Closing the client (or the process dying) ends the session: the daemon returns its
// leased pages to free and drops its references. So does kvtierd when the session sends
// nothing for protocol.heartbeat_ttl: the client keeps it alive with keepalive Pings from a
// thread of its own while its process runs, and a process that stopped (SIGSTOP) finds out
// through Alive(), FinishLoad and LoadBlocks, which fail a load whose session ended before
// its bytes were read. Pool mappings are not inherited by fork(): a forked child that
// touches a page faults.
//
// Thread-compatible: use one Client per thread, or serialize calls.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kernels/kv_layout.h"
#include "protocol/base/block_key.h"
#include "protocol/base/layout.h"
#include "protocol/base/status.h"
#include "protocol/base/tier.h"

namespace kvtier {

using Ticket = uint64_t;

struct ClientOptions {
  // Empty: $KVTIER_SOCKET, else kvtierd's default ./var/kvtierd.sock.
  std::string socket_path;
  std::string engine_name = "engine";
  // Where a router sends this engine's requests ("host:port", llm-d's pod id); kvtierd
  // names it in the KV event topic of the engine's namespace (events.topic {engine}). One
  // another tenant's engine declared first leaves this engine's blocks unannounced on that
  // topic (still cached; kvtierd logs it). Empty: none.
  std::string routable_id;
  // The engine's data-parallel rank behind routable_id, carried by its KV event batches.
  // -1: none.
  int data_parallel_rank = -1;
  // How the engine's own KV events name a block: kvtierd announces this session's
  // blocks alike (kNone: not at all).
  EventHashForm event_hashes = EventHashForm::kVllm;
  // Which of the engine's KV cache groups this namespace holds (vLLM's group index and
  // spec kind; kind views kEventSpecKinds): kvtierd's KV events carry it. Default: none.
  EventGroup event_group;
  // The engine's model layout: the namespace its blocks live in. Required.
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
  // Host pages are mapped read-only except the ones this session holds leased: a page
  // turns read-only once committed (or released), and acquired blocks are never
  // writable, so a stray write into cached bytes faults instead of changing what other
  // engines read. (Within a tenant this guards against bugs, not against a hostile
  // engine, which could mprotect its own mapping back: tenants never share a segment.)
  bool protect_committed_pages = true;
};

// An engine's paged KV cache in its own (device) memory: one tensor per layer, in one of
// the two layouts of kernels/kv_layout.h, with the geometry of ClientOptions::layout.
struct EngineKv {
  KvLayoutKind layout = KvLayoutKind::kKvFirst;
  uint32_t num_blocks = 0;          // blocks in each layer's tensor
  std::vector<void*> layers;        // one tensor per layer
  void* stream = nullptr;           // the engine's CUDA stream (ignored when emulated)
  uint64_t block_stride_bytes = 0;  // kBlockFirst: bytes between blocks (0: dense, 2 x slab)
};

// A load StartLoad began: the leading blocks of its chain that kvtierd holds for it, their
// pages and engine blocks. Moved, never copied; ended by FinishLoad.
struct KvLoad {
  KvTransfer transfer;           // every layer; blocks and pages point into the vectors below
  std::vector<uint32_t> blocks;  // engine blocks of the loaded prefix
  std::vector<uint8_t*> pages;   // their page addresses
  std::vector<BlockHash> held;   // the references FinishLoad releases
  bool finished = false;
  // Leading blocks of the chain acquired (0: a miss).
  size_t loaded() const { return pages.size(); }
  KvLoad() = default;
  KvLoad(KvLoad&&) = default;
  KvLoad& operator=(KvLoad&&) = default;
  KvLoad(const KvLoad&) = delete;
  KvLoad& operator=(const KvLoad&) = delete;
};

struct BlockResult {
  Status status;                    // OK, or why this entry failed
  TierKind tier = TierKind::kHost;  // where the block can be read
  PageId page = 0;
  bool duplicate = false;  // Commit: the key existed already
};

struct LookupResult {
  size_t matched = 0;           // blocks 0..matched-1 are cached
  std::vector<TierKind> tiers;  // the tier of each matched block
};

struct CommitEntry {
  PageId page = 0;
  BlockHash hash;
  BlockHash parent;  // empty: no parent (first block of a sequence)
};

// What an engine hashed the blocks of a commit from, which kvtierd announces with their
// BlockStored events (routers index by them); never part of a block's identity.
struct CommitKeys {
  // Empty, or the layout's tokens_per_block tokens of each block in entry order.
  std::span<const uint32_t> token_ids;
  // Empty, or one msgpack array with an entry per block, nil or an array: vLLM's
  // BlockStored.extra_keys (LoRA name, (multimodal id, offset) pairs, cache salt, ...).
  std::span<const uint8_t> extra_keys;
  std::string_view lora_name;  // empty: none
  uint32_t lora_id = 0;        // 0: none
};

class SegmentMap;
class Connection;

class Client {
 public:
  // Connects and says Hello. kUnavailable when no daemon answers at the socket;
  // kInvalidArgument for a layout the daemon or this client refuses (bad geometry, a block
  // larger than a page, hash_bytes not 16 or 32); kPermissionDenied for a refused peer.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // ---- blocking calls ----
  // Leases `count` writable pages of `tier` (all or nothing). kResourceExhausted when the
  // tier cannot supply them (full of referenced or leased pages, or the tenant's quota)
  // — possibly after waiting for demotions; kUnavailable for GPU pages while the daemon is
  // draining; kInvalidArgument for a tier that is not enabled or a count over the tier.
  Result<std::vector<PageId>> Allocate(TierKind tier, uint32_t count);
  // Turns leased pages into blocks. With `retain`, the session keeps a reference to each.
  // Per entry: OK (duplicate when the key existed: the page was freed and the existing
  // copy kept), kFailedPrecondition (not a page this session leased), kUnavailable (the
  // block is being read from NVMe right now: retry). `keys` as CommitKeys says; tokens of
  // another count, or extra keys that are not an entry per block, are kInvalidArgument.
  Result<std::vector<BlockResult>> Commit(TierKind tier, std::span<const CommitEntry> entries, bool retain = false,
                                          const CommitKeys& keys = {});
  // Releases leased pages or references: one status per page, then one per hash; OK, or
  // kFailedPrecondition where the session held nothing.
  Result<std::vector<Status>> Release(TierKind tier, std::span<const PageId> pages,
                                      std::span<const BlockHash> hashes = {});
  // The longest cached prefix of a hash chain (in this session's namespace), with the tier
  // of each matched block (kNvme: it must be read back first, which Acquire does).
  Result<LookupResult> Lookup(std::span<const BlockHash> chain);
  // References cached blocks until Release; per block its page. Blocks on NVMe are read
  // into host pages first (the response waits for them). Per entry: OK, kNotFound (not
  // cached), kDataLoss (its NVMe copy failed its checksum: a miss), kResourceExhausted (no
  // host page freed up in time), kUnavailable (retry).
  Result<std::vector<BlockResult>> Acquire(std::span<const BlockHash> hashes);
  // Acquire of a hash chain's longest present prefix only (what Lookup would find, promoted
  // where it must be): one entry per block of that prefix, as Acquire's. A daemon older
  // than protocol minor 5 answers for every hash (kNotFound past the prefix).
  Result<std::vector<BlockResult>> AcquirePrefix(std::span<const BlockHash> chain);
  // Round trip with `payload_bytes` of payload each way.
  Status Ping(size_t payload_bytes = 0);
  // An agentic session's hint (protocol minor 8): session `session` (at most 256 bytes)
  // used the present prefix of `chain` in this session's namespace; it expects to be back
  // within `ttl_ms` (-1: its last TTL stands) and `end` says it has ended. kvtierd evicts a
  // live session's blocks after the tenant's others and an ended one's first. Returns the
  // blocks the hint named. `hit_tokens`: what the session's request loaded from kvtierd (the
  // session's listing sums them). kInvalidArgument for an empty or over-long id or a TTL
  // below -1; kResourceExhausted when the tenant holds sessions.max_per_tenant live
  // sessions; kUnimplemented from a daemon before minor 8.
  Result<uint32_t> Hint(std::string_view session, std::span<const BlockHash> chain, int64_t ttl_ms = -1,
                        bool end = false, uint64_t hit_tokens = 0);
  // Whether the session still lives, without a round trip (Connection::Alive): bytes read
  // through acquired pages are the acquired blocks' only if this is OK after the read (a
  // session kvtierd ended dropped its references, and the pages may be rewritten). Else
  // kAborted (kvtierd expired the session), kUnavailable (the connection is gone) or
  // kFailedPrecondition after Close().
  Status Alive();
  // Ends the session now: the daemon returns its leased pages and drops its references.
  // The pool mappings stay until the Client is destroyed, so memory views taken with
  // PageBytes do not fault (their bytes may be reused by the daemon). Every later call is
  // kFailedPrecondition. Idempotent.
  void Close();
  bool closed() const { return conn_ == nullptr; }

  // ---- pipelined calls ----
  // StartX sends the request (errors: those found before sending, or kUnavailable);
  // WaitX(t) returns what X would. A ticket not outstanding — never issued by this client,
  // or already waited for — is kInvalidArgument at once.
  Result<Ticket> StartAllocate(TierKind tier, uint32_t count);
  Result<std::vector<PageId>> WaitAllocate(Ticket t);
  Result<Ticket> StartCommit(TierKind tier, std::span<const CommitEntry> entries, bool retain = false,
                             const CommitKeys& keys = {});
  Result<std::vector<BlockResult>> WaitCommit(Ticket t);
  Result<Ticket> StartRelease(TierKind tier, std::span<const PageId> pages, std::span<const BlockHash> hashes = {});
  Result<std::vector<Status>> WaitRelease(Ticket t);
  Result<Ticket> StartLookup(std::span<const BlockHash> chain);
  // One Lookup per chain, sent together in one write (a scheduler step's lookups); a ticket
  // each for WaitLookup. A chain refused before sending (bad hashes, too large) fails the
  // call and nothing is sent.
  Result<std::vector<Ticket>> StartLookups(std::span<const std::vector<BlockHash>> chains);
  Result<LookupResult> WaitLookup(Ticket t);
  Result<Ticket> StartAcquire(std::span<const BlockHash> hashes, bool prefix = false);
  Result<std::vector<BlockResult>> WaitAcquire(Ticket t);
  // Sends a Release of references (hashes) whose reply is never waited for: it is read and
  // dropped with a later response. Errors: those found before sending.
  Status ReleaseUnwaited(std::span<const BlockHash> hashes);
  // Blocks until the response to one of `tickets` has arrived and returns that ticket; its
  // WaitX() then returns at once. For keeping a fixed number of requests in flight when
  // they complete out of order (NVMe fetches do).
  Result<Ticket> WaitAny(std::span<const Ticket> tickets);

  // ---- KV transfer helpers (offload-connector mode) ----
  // Store: leases host pages, gathers engine blocks engine_blocks[i] into them on the
  // engine's stream (all layers, one launch), waits for the copy, and commits them as
  // hashes[i] (parents[i], when given; keys as Commit's). Per-block results as
  // Commit's; Allocate's errors.
  Result<std::vector<BlockResult>> StoreBlocks(const EngineKv& kv, std::span<const uint32_t> engine_blocks,
                                               std::span<const BlockHash> hashes,
                                               std::span<const BlockHash> parents = {}, const CommitKeys& keys = {});
  // Load: acquires the chain's cached prefix (AcquirePrefix: NVMe blocks are promoted
  // first), scatters it into engine blocks engine_blocks[0..n), waits, and releases it
  // without waiting for the reply: one round trip. Returns n, the number of leading
  // blocks loaded (0 on a miss). REQUIRES: engine_blocks.size() >= chain.size().
  Result<size_t> LoadBlocks(const EngineKv& kv, std::span<const BlockHash> chain,
                            std::span<const uint32_t> engine_blocks);
  // The same load in layers (an engine that waits for each layer before computing it):
  // StartLoad acquires the chain's cached prefix as LoadBlocks does (one round trip) and
  // holds it; ScatterLayers enqueues layers [first, last) of its `loaded()` blocks on
  // `stream` (the engine's, or a side stream) and waits for them when `wait`; FinishLoad
  // releases the prefix without waiting for the reply, after every scatter of it has
  // completed (the pages may be reused then). A load not finished holds its blocks until
  // the session ends. kInvalidArgument for layers out of range or a finished load.
  // FinishLoad (and so LoadBlocks) fails with kAborted when the session ended before it was
  // called (kvtierd expired it, stopped or crashed): the scattered bytes may be other
  // blocks' and the load must count as failed.
  Result<KvLoad> StartLoad(const EngineKv& kv, std::span<const BlockHash> chain,
                           std::span<const uint32_t> engine_blocks);
  Status ScatterLayers(const KvLoad& load, uint32_t first, uint32_t last, void* stream, bool wait);
  Status FinishLoad(KvLoad& load);

  // ---- memory ----
  // The bytes of a page this session may address (host tier; the GPU tier when it is
  // host-emulated), or an empty span when its segment is not mapped here. Lifetime: the
  // span stays valid while this session holds the page (leased, or acquired and not
  // released) and the Client lives. A page the session holds keeps its segment owned by
  // the session's tenant, so the daemon never renews that memory under it; after Release,
  // the segment may be renewed and re-granted, and the old span must not be used.
  std::span<uint8_t> PageBytes(TierKind tier, PageId page) const;
  // Whether this session may write the page's bytes now: a host page while it holds it
  // leased (or with protect_committed_pages off); a host-emulated GPU page always.
  bool PageWritable(TierKind tier, PageId page) const;
  // Tiers the daemon offers, from Welcome.
  const std::vector<TierInfo>& tiers() const;
  uint64_t page_bytes(TierKind tier) const;
  // Address of a page this session may address: host memory for the host tier, device
  // memory for the GPU tier (host memory when emulated); nullptr when not mapped here.
  // Same lifetime as PageBytes.
  void* PageAddress(TierKind tier, PageId page) const;
  // "cuda", "host-emulated", or "none" before the device is first needed.
  std::string_view device_backend() const;
  // Opens the device backend now (ClientOptions::device decides which) and returns its
  // name; kUnavailable for "cuda" without a device.
  Result<std::string_view> OpenDevice();

  uint64_t session_id() const;
  uint64_t daemon_epoch() const;
  const std::string& namespace_id() const;
  // The most pages or hashes one request may name (the daemon's
  // protocol.max_entries_per_request; 0: an older daemon that does not say). A request
  // over the daemon's frame limit fails with kInvalidArgument before it is sent.
  uint32_t max_entries_per_request() const;
  size_t hash_bytes() const;
  // The socket descriptor (for poll loops); owned by the client.
  int fd() const;

 private:
  Client(const ClientOptions& options, std::unique_ptr<SegmentMap> segments);
  Status CheckHashes(std::span<const BlockHash> hs) const;
  // token_ids of a commit of `blocks` blocks: none, or the layout's tokens_per_block each.
  Status CheckTokenIds(size_t blocks, std::span<const uint32_t> token_ids) const;
  // The connection, or kFailedPrecondition after Close().
  Result<Connection*> Conn() const;

  ClientOptions options_;
  std::unique_ptr<SegmentMap> segments_;
  // Leased pages named by a Commit or Release in flight: read-only once it succeeds.
  struct LeaseEnd {
    TierKind tier;
    std::vector<PageId> pages;
  };
  std::unordered_map<Ticket, LeaseEnd> lease_ends_;
  void EndLeases(Ticket t, const std::function<bool(size_t)>& ended);
  std::unique_ptr<Connection> conn_;
};

}  // namespace kvtier
