#pragma once
// KvEvents: what kvtierd tells cache-aware routers about the blocks it holds, in the form
// vLLM's KV event publisher uses (vllm/distributed/kv_events.py) and llm-d's KV-cache
// indexer (pkg/kvevents/engineadapter/vllm_adapter.go) and Dynamo's KV router
// (lib/kv-router/src/zmq_wire) decode:
//
//   ZMQ PUB multipart  [topic, sequence (8 bytes, big-endian), msgpack payload]
//   payload            [timestamp (float seconds), [event, ...], data_parallel_rank]
//
// Each event in one of two encodings (events.encoding):
//
//   tagged (default;   {"type": "BlockStored", "block_hashes": [hash, ...],
//   vLLM since PR       "parent_block_hash": hash or nil, "token_ids": [token, ...],
//   #42892)             "block_size": tokens, "lora_id": id or nil, "medium": medium,
//                       "lora_name": name or nil[, "extra_keys": [nil or [key, ...], ...]]
//                       [, "group_idx": index, "kv_cache_spec_kind": kind,
//                       "kv_cache_spec_sliding_window": tokens]}
//                      {"type": "BlockRemoved", "block_hashes": [...], "medium": medium
//                       [, "group_idx": index]}
//   positional         ["BlockStored", [hash, ...], parent or nil, [token, ...], block_size,
//   (older vLLM)        lora_id or nil, medium, lora_name or nil]
//                      ["BlockRemoved", [hash, ...], medium]
//
// The group fields are sent for a namespace whose engine named its KV cache group at Hello
// (Hello.event_group; a hybrid model has one namespace per group), each only when said,
// as vLLM 0.32's own BlockStored/BlockRemoved carry them; the positional form never has
// them (the older vLLM it serves has no such fields). block_size is the namespace's (the
// group's, Hello.event_block_tokens, where the engine said it).
//
// token_ids: none unless events.token_ids is on (every subscriber, every tenant's engines
// among them on a shared host, would read every tenant's prompts); then block_size tokens
// per hash, as the engine sent them with its Commit, or none (an engine that sent none; a
// block announced again on another tier, since kvtierd keeps no tokens). A BlockStored's
// blocks all have tokens or none do. extra_keys (what else vLLM hashed a block from: LoRA
// name, (multimodal id, offset) pairs, cache salt, prompt-embedding digests) likewise: only
// with events.token_ids (the cache salt isolates a tenant's prefixes; image ids identify its
// inputs), one entry per hash as the engine sent them with its Commit (Commit.extra_keys),
// tagged encoding only (the older vLLM of the positional one has no such field), and a
// BlockStored's blocks all have them or none do. lora_id and lora_name are always sent as
// the engine committed them (one adapter per BlockStored).
//
// A block hash is announced in the form of the engine that attached to its namespace
// (Hello.event_hashes): vLLM's, an unsigned 64-bit integer of its last 8 bytes read
// big-endian, as vLLM turns bytes hashes into integers; SGLang's, a signed 64-bit integer
// of its first 8 bytes (sglang.srt.mem_cache.utils.hash_str_to_int64 of the page's hex
// hash), so a router sees kvtierd's announcement of a page under the id SGLang's own
// events give it; or none, for namespaces whose pages are no prefix block a router indexes
// (SGLang's sidecar pools). A BlockStored's hashes are a chain
// (each the parent of the next), the first's parent given. Media: "GPU", "CPU_TIER1"
// (host) and "CPU_TIER2" (NVMe), which Dynamo maps to device, host-pinned and disk, and
// which llm-d takes as device tiers as they are (lowercased).
//
// Topics: events.topic with {engine}, {host}, {model} and {tenant} replaced,
// "kv@{engine}@{model}" by default, which llm-d reads as pod and model. {engine} is the
// routable id an engine declared at Hello ("10.0.0.5:8000"), or the host name for engines
// that declared none, and a topic's batches carry the data-parallel rank the engine
// declared with it (nil: none; two ranks behind one id share the topic name, each with
// its own batches); {model} the layout's model id up to its first '|' (the connectors
// append layout and rank facts after one). A namespace's blocks go to the topic of every
// engine that attached to it, since each of them can load them: a router then counts them
// for every engine on the node.
//
// Topics have owners and an end. A topic lives while an engine is attached through it and
// topic_linger after the last one detaches (an engine restarting within it finds its
// announcements as they were); then it leaves every namespace it was linked to and the
// publisher thread retracts what it announced (BlockRemoved, as after a restart), so a
// router stops sending requests for those blocks to an engine that is gone. A tenant holds
// at most max_topics_per_tenant topics (lingering ones count): past it a Hello is refused,
// so one tenant's sessions cannot make every commit fan out to thousands of topics. A
// routable id belongs to the tenant whose engine declared it first, for as long as a topic
// it named lives: another tenant's engine declaring it is refused (CacheManager attaches
// that engine without events), so nobody announces blocks as another engine. Of the buffer's queue_events and
// queue_bytes, a tenant's events take at most an equal share among the tenants with namespaces here; past it its events
// are dropped (and counted), not everyone's.
//
// One sequence numbers every message on the socket, so a
// subscriber to every topic sees consecutive numbers; one subscribed to a single topic
// sees them increase. Sequence numbers start at the daemon's start time in microseconds
// since the Unix epoch, so they keep increasing across restarts: a subscriber that sees
// a jump knows the publisher restarted (and asks the replay socket, which has the new
// run's messages only).
//
// kvtierd never sends AllBlocksCleared: a router applies it to everything it knows of the
// topic's worker, including what the engine itself published. Instead, with a state_path,
// the publisher thread keeps what it has announced (topic, medium, hashes; stored minus
// removed) in that file, rewritten at most every kStateInterval; at the next start,
// kRetractDelay after the sockets are bound (so subscribers have reconnected), it
// publishes BlockRemoved for all of it that the new run has not announced again — the
// host and GPU tiers did not survive the restart, and blocks on NVMe are announced again
// when they move. A kill -9 loses at most the last kStateInterval of changes to the file.
//
// Threads: Stored/Removed/AddNamespace are called on the control thread and only append
// to a batch under a mutex; the publisher thread takes the batches every flush_interval,
// encodes, numbers and sends them, keeps the last replay_batches messages for the replay
// socket and answers its requests ([identity, "", start sequence (8 bytes)] -> every kept
// message from that sequence on as [identity, "", sequence, payload], then sequence -1
// and an empty payload, as vLLM's replay socket does). Bounds: at most queue_events
// events of at most queue_bytes wait for the publisher thread (more are dropped and
// counted), the replay ring keeps at most replay_batches messages of at most replay_bytes,
// and a block's extra keys are at most StoredKeys::kMaxExtraKeyBytes; the PUB socket's
// send high-water mark bounds what waits for each subscriber, past which ZMQ drops that
// subscriber's messages (it can ask the replay socket for them): a subscriber that never
// reads never slows the daemon or grows it beyond that. Payloads are shared between the
// subscribers' queues and the replay ring, so each queued message costs a subscriber a
// ZMQ message descriptor (64 bytes), not its payload. Peers are capped: a connection to
// the PUB socket past max_subscribers, or to the replay socket past max_replay_peers, or a
// local user's past its max_peer_share_per_user of that cap (ipc:// endpoints; SO_PEERCRED;
// admins exempt), is shut down as soon as ZMQ reports it accepted (counted in refused). Memory per peer:
// send_hwm x 64 bytes (PUB) or (replay_batches + 1) x 64 bytes (replay), plus ZMQ's two
// 8 KiB batch buffers; the payloads are bounded by the ring and send_hwm messages.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "protocol/base/block_key.h"
#include "protocol/base/mutex.h"
#include "protocol/base/status.h"
#include "protocol/base/tier.h"

namespace kvtier {

enum class KvEventEncoding : uint8_t { kTagged, kPositional };
// The config's words for them (events.encoding).
inline constexpr std::pair<std::string_view, KvEventEncoding> kKvEventEncodingNames[] = {
    {"tagged", KvEventEncoding::kTagged}, {"positional", KvEventEncoding::kPositional}};
// How an engine is named in events: where routers reach it ("10.0.0.5:8000"; empty: this
// host), its data-parallel rank (-1: none) and its hash form.
struct EventSource {
  std::string_view routable_id;
  int dp_rank = -1;
  EventHashForm hashes = EventHashForm::kVllm;
  EventGroup group;  // the engine's KV cache group the namespace holds (index -1: none)
};

struct KvEventsOptions {
  // Bound. Empty: kDefaultPublishFile in the data directory (ResolveEventEndpoints). Not
  // vLLM's default (tcp://*:5557), which an engine on the same host binds.
  std::string publish;
  KvEventEncoding encoding = KvEventEncoding::kTagged;
  std::string replay;  // ROUTER endpoint; empty: no replay socket
  std::string topic = "kv@{engine}@{model}";
  std::string hostname;               // for {host}; empty: gethostname()
  uint32_t batch_size = 256;          // most block hashes in one message
  uint64_t message_bytes = 64 << 10;  // and most bytes of hashes, tokens and keys (a block may exceed it alone)
  int64_t flush_interval_ns = 50'000'000;
  uint32_t queue_events = 100'000;     // most events waiting for the publisher thread
  uint64_t queue_bytes = 64ull << 20;  // and their bytes (hashes, tokens, extra keys)
  uint32_t replay_batches = 10'000;
  uint64_t replay_bytes = 64ull << 20;  // the replay ring's payloads
  int send_hwm = 1'000;                 // ZMQ_SNDHWM: messages queued per subscriber
  uint32_t max_subscribers = 64;        // connections to the PUB socket
  uint32_t max_replay_peers = 8;        // connections to the replay socket
  // Of each cap, the share one local user (not an admin) may hold over an ipc:// endpoint:
  // a member of the socket's group cannot take every slot from the routers.
  double max_peer_share_per_user = 0.25;
  std::string state_path;  // what was announced, for the next start; empty: none
  // An ipc:// endpoint's socket file is made mode 0660, group ipc_gid (-1: the daemon's):
  // only the daemon's user and that group (the engine socket's) may subscribe.
  int64_t ipc_gid = -1;
  bool token_ids = false;                    // BlockStored carries the blocks' tokens and extra keys
  uint32_t max_topics_per_tenant = 64;       // topics a tenant's engines may hold (lingering ones count)
  int64_t topic_linger_ns = 30'000'000'000;  // a topic's life after its last engine detaches
  bool operator==(const KvEventsOptions&) const = default;
};
// What an engine hashed the blocks of one Commit from (Commit.token_ids, extra_keys,
// lora_name, lora_id), for their BlockStored events; never part of a block's identity.
struct StoredKeys {
  static constexpr size_t kMaxLoraName = 256;        // bytes: a longer name is refused at Commit
  static constexpr size_t kMaxExtraKeyBytes = 8192;  // a block's packed entry: more is refused at Commit
  std::span<const uint32_t> tokens;                  // empty, or the same number for each block
  std::span<const std::string> extra;                // empty, or one msgpack object (nil or an array) per block
  std::string_view lora_name;                        // empty: none
  uint32_t lora_id = 0;                              // 0: none
  // Block i's keys (its tokens when they are `tokens_per_block` each).
  StoredKeys Block(size_t i, size_t blocks) const;
};
// Commit.extra_keys (one msgpack array of an entry per block, each nil or an array) split
// into one msgpack object per block; kInvalidArgument, saying why, for anything else.
Result<std::vector<std::string>> SplitExtraKeys(std::span<const uint8_t> msgpack, size_t blocks);

// The default publish endpoint's file, in the data directory.
inline constexpr std::string_view kDefaultPublishFile = "kv-events.sock";
// `options` with an empty publish endpoint made ipc://DATA_DIR/kv-events.sock (absolute).
KvEventsOptions ResolveEventEndpoints(KvEventsOptions options, const std::string& data_dir);

// One event before encoding.
struct KvEvent {
  enum class Kind : uint8_t { kStored, kRemoved };
  Kind kind = Kind::kStored;
  std::vector<uint64_t> hashes;
  std::optional<uint64_t> parent;       // kStored: of hashes[0]
  uint32_t block_size = 0;              // kStored: tokens per block
  std::vector<uint32_t> token_ids;      // kStored: block_size per hash, or none
  std::vector<std::string> extra_keys;  // kStored: one msgpack object per hash, or none
  std::string lora_name;                // kStored: empty: none
  uint32_t lora_id = 0;                 // kStored: 0: none
  TierKind tier = TierKind::kHost;
  bool signed_hashes = false;  // hashes (and parent) are int64 bit patterns (SGLang's form)
  uint64_t bytes = 0;          // of its hashes, tokens, extra keys and LoRA name (a message's share)
  EventGroup group;            // the namespace's KV cache group (tagged encoding only)
};

// A block hash as announced in `form` (not kNone): the 64 bits to send.
uint64_t EventHash(const BlockHash& hash, EventHashForm form = EventHashForm::kVllm);
// The medium a tier is announced as ("GPU", "CPU_TIER1", "CPU_TIER2").
std::string_view EventMedium(TierKind tier);
// The msgpack payload of one message: [ts, [events...], dp_rank or nil].
std::string EncodeEventBatch(double timestamp, std::span<const KvEvent> events, KvEventEncoding encoding,
                             std::optional<uint32_t> dp_rank = std::nullopt);
// A replay request's start sequence: parts [identity, "", 8 bytes big-endian], as a
// ROUTER socket receives a DEALER's [“”, sequence]; nullopt for anything else.
std::optional<uint64_t> ParseReplayRequest(std::span<const std::string_view> parts);
// What a run announced, as the state file holds it (KvEvents' state_path): per (topic,
// data-parallel rank), whether hashes are signed, and the hashes per tier and KV cache
// group (EventGroup::index, -1: none), so that their removal names the group as their
// BlockStored did. Malformed entries are skipped (the file is advisory); the count of
// hashes read in *hashes.
using AnnouncedMedium = std::pair<TierKind, int32_t>;  // tier, group index
struct AnnouncedState {
  bool signed_hashes = false;
  std::map<AnnouncedMedium, std::unordered_set<uint64_t>> hashes;
};
using AnnouncedStates = std::map<std::pair<std::string, std::optional<uint32_t>>, AnnouncedState>;
AnnouncedStates ParseAnnouncedState(std::string_view text, size_t* hashes);
std::string EncodeAnnouncedState(const AnnouncedStates& states);
// events.topic with {engine}, {host}, {model} and {tenant} replaced.
std::string ExpandTopic(std::string_view pattern, std::string_view engine, std::string_view host,
                        std::string_view model, std::string_view tenant);

// What binding `options`' endpoints would meet on this host, checked before anything is
// bound (kvtierd --check-config and every start): kFailedPrecondition naming the key for
// an ipc path another process listens on (ZMQ's bind would take it over, and that
// process's subscribers would read this one's stream); a warning appended to `warnings`
// (when not null) for a TCP endpoint on every interface, which publishes every tenant's
// block hashes to whoever reaches the host.
Status CheckEventEndpoints(const KvEventsOptions& options, std::vector<std::string>* warnings);

class KvEvents {
 public:
  struct Counters {
    uint64_t events = 0;                         // events published
    uint64_t messages = 0;                       // messages (batches) published
    uint64_t dropped = 0;                        // events dropped because the queue was full
    uint64_t replays = 0;                        // replay requests answered
    uint64_t refused = 0;                        // peers shut down past max_subscribers / max_replay_peers
    uint64_t retracted = 0;                      // hashes of an earlier run removed at start
    uint64_t topics_removed = 0;                 // topics ended (topic_linger after the last engine)
    uint64_t topics_refused = 0;                 // Hellos refused: topic cap or another tenant's routable id
    uint32_t topics = 0;                         // topics now, lingering ones among them
    uint32_t subscribers = 0, replay_peers = 0;  // connected now
    uint64_t first_sequence = 0;                 // this run's first message's
  };
  static constexpr int64_t kStateInterval_ns = 5'000'000'000;
  static constexpr int64_t kRetractDelay_ns = 1'000'000'000;

  // Binds the sockets (an endpoint in use or malformed is an error naming the key; an ipc
  // path in use as CheckEventEndpoints says) and starts the publisher thread.
  static Result<std::unique_ptr<KvEvents>> Open(const KvEventsOptions& options);
  // Publishes what is queued, then stops the thread.
  ~KvEvents();
  KvEvents(const KvEvents&) = delete;
  KvEvents& operator=(const KvEvents&) = delete;

  // A namespace events may name, attached by an engine of `tenant` that `source` names: the
  // topic it adds (or keeps alive) and the block size its BlockStored carry. The first
  // engine to attach sets the namespace's hash form, block size and group. Returns the
  // link to give RemoveNamespace when that engine detaches; 0 for form kNone (nothing is
  // added). kResourceExhausted past max_topics_per_tenant; kPermissionDenied for a
  // routable id another tenant's engine holds.
  Result<uint64_t> AddNamespace(std::string_view encoded_ns, std::string_view tenant, std::string_view model,
                                uint32_t tokens_per_block, const EventSource& source = {});
  // The engine of `link` detached: its topic lingers if it was the topic's last (0: none).
  void RemoveNamespace(uint64_t link);
  // A block became findable in `tier` (with its keys when known: its tokens when exactly
  // the namespace's block size, else none are sent) / stopped being findable there. Events
  // of a namespace never added are not published (their topic is unknown).
  void Stored(std::string_view encoded_ns, TierKind tier, const BlockHash& hash, const BlockHash& parent,
              const StoredKeys& keys = {}) {
    Add(encoded_ns, KvEvent::Kind::kStored, tier, hash, &parent, keys);
  }
  void Removed(std::string_view encoded_ns, TierKind tier, const BlockHash& hash) {
    Add(encoded_ns, KvEvent::Kind::kRemoved, tier, hash, nullptr, {});
  }

  Counters counters() const;
  // The endpoints as bound (a port of 0 or * resolved).
  const std::string& publish_endpoint() const { return publish_endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }

 private:
  struct Sockets;
  // A tenant's topics (those it is charged for) and its events waiting now.
  struct TenantState {
    uint32_t topics = 0;
    uint32_t namespaces = 0;  // linked to a topic
    uint64_t queued = 0, queued_bytes = 0;
  };
  using TopicKey = std::pair<std::string, std::optional<uint32_t>>;  // name, dp rank
  struct Topic {
    TopicKey key;
    std::vector<KvEvent> pending;
    uint32_t links = 0;  // engines attached through it
    // Tenants charged for it, with their links; one at 0 stays charged while it lingers.
    std::map<std::string, uint32_t, std::less<>> tenants;
    std::vector<std::string> routable_ids;  // declared by its engines, held while it lives
    std::vector<std::string> namespaces;    // linked to it
    int64_t idle_since_ns = 0;              // when links fell to 0
  };
  // A namespace's hash form, block size, group, tenant and topics (one per engine identity
  // that attached to it).
  struct Announced {
    EventHashForm hashes = EventHashForm::kVllm;
    uint32_t block_size = 0;
    EventGroup group;
    std::string owner;              // its tenant
    TenantState* tenant = nullptr;  // tenants_[owner]
    std::vector<Topic*> topics;
  };
  struct Link {
    Topic* topic;
    std::string tenant;
  };
  explicit KvEvents(const KvEventsOptions& options);
  // REQUIRES: mu_ held. The topic's batch to append to (its first hash and keys of
  // `bytes`), or nullptr when full.
  KvEvent* Append(Topic& t, const Announced& ns, KvEvent::Kind kind, TierKind tier, uint64_t bytes)
      KVTIER_REQUIRES(mu_);
  void Add(std::string_view encoded_ns, KvEvent::Kind kind, TierKind tier, const BlockHash& hash,
           const BlockHash* parent, const StoredKeys& keys);
  // REQUIRES: mu_ held.
  void AddTo(Topic& t, const Announced& ns, KvEvent::Kind kind, TierKind tier, uint64_t hash,
             std::optional<uint64_t> parent, StoredKeys keys) KVTIER_REQUIRES(mu_);
  // REQUIRES: mu_ held. Ends the topics that lingered past topic_linger (unlinked, their
  // charges and routable ids released) and returns them for their retraction.
  std::vector<TopicKey> EndIdleTopics(int64_t now_ns) KVTIER_REQUIRES(mu_);
  // REQUIRES: mu_ held. Releases `tenant`'s charge for one topic.
  void Uncharge(const std::string& tenant) KVTIER_REQUIRES(mu_);
  // REQUIRES: mu_ held. Whether `tenant` may queue one more event of `bytes` (its fair
  // share of queue_events and of queue_bytes).
  bool Admit(TenantState* tenant, uint64_t bytes) KVTIER_REQUIRES(mu_);
  void Run();
  void PublishPending();
  // Publishes BlockRemoved for everything a topic announced in this run, and forgets it.
  void RetractTopic(const TopicKey& key);
  // Publishes `removed` (a BlockRemoved) on a topic, batch_size hashes a message.
  void PublishRemoved(const TopicKey& key, const KvEvent& removed, double timestamp);
  // Numbers and sends one message (and keeps it for the replay socket).
  void Publish(const std::string& topic, const std::string& payload);
  void ServeReplay();
  // Reads monitor events of one socket: counts its peers, shuts down those past `max`.
  void WatchPeers(bool replay);
  // The state file: what this run has announced; read at start into retractions.
  void LoadState();
  void SaveState();
  void Retract();

  KvEventsOptions options_;
  std::string host_;
  std::string publish_endpoint_, replay_endpoint_;
  std::unique_ptr<Sockets> sockets_;  // used by the publisher thread only (after Open)

  mutable Mutex mu_;
  std::condition_variable wake_;
  bool stop_ KVTIER_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Topic>> topics_ KVTIER_GUARDED_BY(mu_);
  // Looked up by string_view on every event: no string built per event.
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, Announced, NameHash, std::equal_to<>> by_namespace_ KVTIER_GUARDED_BY(mu_);
  std::map<TopicKey, Topic*> by_name_ KVTIER_GUARDED_BY(mu_);
  std::map<std::string, TenantState, std::less<>> tenants_ KVTIER_GUARDED_BY(mu_);
  // Routable id -> the tenant holding it and the live topics that hold it.
  std::map<std::string, std::pair<std::string, uint32_t>, std::less<>> routable_ KVTIER_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, Link> links_ KVTIER_GUARDED_BY(mu_);
  uint64_t next_link_ KVTIER_GUARDED_BY(mu_) = 1;
  std::vector<Topic*> order_ KVTIER_GUARDED_BY(mu_);  // topics with pending events, first-come
  uint64_t queued_ KVTIER_GUARDED_BY(mu_) = 0;        // events pending
  uint64_t queued_bytes_ KVTIER_GUARDED_BY(mu_) = 0;  // their hashes, tokens and keys

  std::atomic<uint64_t> events_{0}, messages_{0}, dropped_{0}, replays_{0}, refused_{0}, retracted_{0},
      topics_removed_{0}, topics_refused_{0};
  std::atomic<uint32_t> topic_count_{0};
  std::atomic<uint32_t> subscribers_{0}, replay_peers_{0};
  uint64_t first_seq_ = 0;
  uint64_t next_seq_ = 0;  // publisher thread
  // Publisher thread: what this run announced, and what an earlier run did (retracted
  // kRetractDelay after the start).
  AnnouncedStates announced_, earlier_;
  bool state_dirty_ = false;
  std::thread thread_;
};

}  // namespace kvtier
