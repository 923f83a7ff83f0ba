// The rows of daemon/lower_tiers.h: each lower tier's config section and how it opens.
#include "daemon/lower_tiers.h"

#include <xxhash.h>

#include "daemon/config_host.h"
#include "storage/memory/memory_tier.h"
#include "storage/remote/redis_cluster.h"
#include "storage/remote/remote_tier.h"

namespace kvtier {
namespace {

using config::Boolean;
using config::Bytes;
using config::Choice;
using config::Duration;
using config::Integer;
using config::Scalar;

// --- remote: a Redis Cluster shared by the kvtierd nodes of a fleet ---------------------

const std::vector<ConfigKey>& RemoteKeys() {
  static const std::vector<ConfigKey> keys = {
      {"tiers.remote.nodes", "[]",
       "Seed nodes of a Redis Cluster (or one standalone Redis) shared by the kvtierd nodes of "
       "a fleet, as host:port; none means no remote tier. The rest of the cluster is found "
       "with CLUSTER SLOTS, e.g. [\"10.0.0.5:7000\", \"10.0.0.6:7000\"].",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         if (n.IsNull()) return Status::Ok();
         if (!n.IsSequence()) return ConfigKeyError(key, "expected a list of host:port");
         c->lower.Mutable<RemoteTierConfig>().tier.cluster.seeds.clear();
         for (size_t i = 0; i < n.size(); ++i) {
           const std::string at = key + "[" + std::to_string(i) + "]";
           KVTIER_ASSIGN_OR_RETURN(std::string s, Scalar(at, n[i]));
           std::string host;
           int port = 0;
           if (!RedisCluster::ParseAddress(s, &host, &port)) return ConfigKeyError(at, "'" + s + "' is not host:port");
           c->lower.Mutable<RemoteTierConfig>().tier.cluster.seeds.push_back(s);
         }
         return Status::Ok();
       }},
      {"tiers.remote.write_policy", "write_through",
       "write_through: every block committed to host is also put into the cluster in the "
       "background (other nodes reuse it at once); write_back: a block is put when it leaves "
       "host memory and the cluster does not hold it yet.",
       KVTIER_SECTION_SET(RemoteTierConfig, Choice(key, n, kWritePolicyNames), mover.write_policy)},
      {"tiers.remote.connect_timeout", "200ms", "Longest wait for a connection to a cluster node.",
       KVTIER_SECTION_SET(RemoteTierConfig, (Duration(key, n, 1'000'000, 60'000'000'000, false, "in [1ms, 60s]")),
                          tier.cluster.connect_timeout_ns)},
      {"tiers.remote.timeout", "1s",
       "Longest wait for a request's reply, from the call (time queued behind a slow node "
       "included); past it the request is a miss and the connection is opened again.",
       KVTIER_SECTION_SET(RemoteTierConfig, (Duration(key, n, 1'000'000, 60'000'000'000, false, "in [1ms, 60s]")),
                          tier.cluster.timeout_ns)},
      {"tiers.remote.connections_per_node", "2",
       "Connections to each master for block values (GET, SET), each with its own thread; "
       "lookups (EXISTS) have one more of their own.",
       KVTIER_SECTION_SET(RemoteTierConfig, (Integer<uint32_t>(key, n, 1, 64)), tier.cluster.connections_per_node)},
      {"tiers.remote.max_batch", "64", "Most requests a connection writes at once (pipelining).",
       KVTIER_SECTION_SET(RemoteTierConfig, (Integer<uint32_t>(key, n, 1, 4096)), tier.cluster.max_batch)},
      {"tiers.remote.breaker_failures", "3",
       "Failed batches in a row after which a node's circuit breaker opens: its requests are "
       "misses at once, without being sent.",
       KVTIER_SECTION_SET(RemoteTierConfig, (Integer<uint32_t>(key, n, 1, 1000)), tier.cluster.breaker_failures)},
      {"tiers.remote.breaker_open", "1s",
       "How long an open breaker stays open (doubling, up to 8x, while the node keeps failing); "
       "meanwhile the node is PINGed every 250 ms and the breaker closes when it answers.",
       KVTIER_SECTION_SET(RemoteTierConfig, (Duration(key, n, 1'000'000, 600'000'000'000, false, "in [1ms, 10min]")),
                          tier.cluster.breaker_open_ns)},
      {"tiers.remote.refresh_interval", "10s",
       "How often the slot map is read again (also at once after MOVED or a failing node).",
       KVTIER_SECTION_SET(RemoteTierConfig, (Duration(key, n, 100'000'000, 3600'000'000'000, false, "in [100ms, 1h]")),
                          tier.cluster.refresh_interval_ns)},
      {"tiers.remote.key_prefix", "\"kvtier:\"",
       "Prefix of every key kvtierd writes; the rest is 32 hex digits, a hash (keyed by the "
       "fleet secret, when one is set) of tenant, model fingerprint and block hash.",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         KVTIER_ASSIGN_OR_RETURN(c->lower.Mutable<RemoteTierConfig>().tier.key_prefix, Scalar(key, n));
         // A hash tag ({...}) would put every key in one slot: one node holds the whole tier.
         if (c->lower.Mutable<RemoteTierConfig>().tier.key_prefix.find_first_of("{}") != std::string::npos) {
           return ConfigKeyError(key, "'" + c->lower.Mutable<RemoteTierConfig>().tier.key_prefix +
                                          "' has a '{' or '}': a Redis Cluster hash tag would "
                                          "put every key in one slot, on one node");
         }
         return Status::Ok();
       }},
      {"tiers.remote.max_nodes", "64",
       "Most masters a slot map may name (a map naming more is not used); each master costs "
       "connections_per_node + 1 threads.",
       KVTIER_SECTION_SET(RemoteTierConfig, (Integer<uint32_t>(key, n, 1, 1024)), tier.cluster.max_nodes)},
      {"tiers.remote.username", "\"\"",
       "Redis ACL user kvtierd authenticates as (AUTH user password); empty: \"default\". Only "
       "with password_file.",
       KVTIER_SECTION_SET(RemoteTierConfig, (Scalar(key, n)), tier.cluster.username)},
      {"tiers.remote.password_file", "\"\"",
       "File holding the Redis password (one line; readable by kvtierd only, mode 0600 or "
       "0400); empty: no AUTH. The password never goes in this config.",
       KVTIER_SECTION_SET(RemoteTierConfig, (Scalar(key, n)), password_file)},
      {"tiers.remote.secret_file", "\"\"",
       "File holding the fleet secret (at least 32 bytes, the same on every kvtierd sharing "
       "the cluster; mode 0600 or 0400): key names and value tags are keyed by it, so nobody "
       "without it can read a tenant from a key or make a node serve a planted or moved value. "
       "Empty: unkeyed, with a warning at start.",
       KVTIER_SECTION_SET(RemoteTierConfig, (Scalar(key, n)), secret_file)},
      {"tiers.remote.max_puts_in_flight", "32",
       "Most puts at once; each pins its block's host page until the cluster answers.",
       KVTIER_SECTION_SET(RemoteTierConfig, (Integer<uint32_t>(key, n, 1, 4096)), mover.max_puts_in_flight)},
  };
  return keys;
}

bool RemoteEnabled(const DaemonConfig& c) { return c.lower.Get<RemoteTierConfig>().enabled(); }

// Its secrets: readable, kvtierd's alone, long enough — checked whenever they are named,
// even with no nodes (a section not in use is still validated).
Status CheckRemoteOnHost(const DaemonConfig& c, std::vector<std::string>* warnings) {
  const RemoteTierConfig& r = c.lower.Get<RemoteTierConfig>();
  if (!r.password_file.empty()) {
    KVTIER_RETURN_IF_ERROR(ReadSecretFile("tiers.remote.password_file", r.password_file).status());
  } else if (!r.tier.cluster.username.empty()) {
    return InvalidArgument("config key 'tiers.remote.username': set, but tiers.remote.password_file is not");
  }
  if (!r.secret_file.empty()) {
    KVTIER_ASSIGN_OR_RETURN(std::string secret, ReadSecretFile("tiers.remote.secret_file", r.secret_file));
    if (Status st = RemoteCodec::Keyed(secret).status(); !st.ok()) {
      return InvalidArgument("config key 'tiers.remote.secret_file': " + st.message());
    }
  }
  if (r.enabled() && c.node_name.empty() && warnings) {
    warnings->push_back(
        "node_name is not set: the remote tier keys blocks of users no tenant covers under this "
        "host's name ('" +
        NodeName(c) +
        "'), which hosts cloned from one image, or pods, may share (and so share those "
        "keys); set node_name, or kvtierd --node-name from the downward API's spec.nodeName");
  }
  if (r.enabled() && r.secret_file.empty() && warnings) {
    warnings->push_back(
        "tiers.remote.secret_file is not set: the remote tier's values are not authenticated and its key names "
        "are not keyed, so anyone who can reach the Redis cluster can plant or change KV that this node serves; "
        "set a fleet secret (docs/operations.md, Securing the remote tier)");
  }
  return Status::Ok();
}

Result<CacheManager::LowerTierSpec> OpenRemote(const LowerTierContext& ctx) {
  const RemoteTierConfig& rc = ctx.config.lower.Get<RemoteTierConfig>();
  RemoteTierOptions ro = rc.tier;
  // A value is a host page's block and its header; a reply announcing more is refused.
  ro.cluster.max_value_bytes = ctx.config.host.page_bytes + RemoteCodec::kMaxHeaderBytes;
  if (!rc.password_file.empty()) {
    KVTIER_ASSIGN_OR_RETURN(ro.cluster.password, ReadSecretFile("tiers.remote.password_file", rc.password_file));
    ctx.secret_read("tiers.remote.password_file", rc.password_file,
                    XXH3_64bits(ro.cluster.password.data(), ro.cluster.password.size()));
  }
  if (!rc.secret_file.empty()) {
    KVTIER_ASSIGN_OR_RETURN(ro.secret, ReadSecretFile("tiers.remote.secret_file", rc.secret_file));
    ctx.secret_read("tiers.remote.secret_file", rc.secret_file, XXH3_64bits(ro.secret.data(), ro.secret.size()));
  }
  // Latency of every cluster request, by operation, observed on the control thread.
  std::unordered_map<std::string, Histogram*> latency;
  for (const char* op : {"get", "set", "exists"}) {
    latency[op] = ctx.metrics->AddHistogram(
        "kvtier_remote_request_duration_seconds",
        "Time from a remote-tier request being queued to its reply (or failure), by Redis command.",
        RpcLatencyBuckets(), {{"op", op}});
  }
  auto observe = [latency](std::string_view op, double seconds, bool) {
    auto it = latency.find(std::string(op));
    if (it != latency.end()) it->second->Observe(seconds);
  };
  CacheManager::LowerTierSpec spec;
  KVTIER_ASSIGN_OR_RETURN(spec.tier, RemoteTier::Open(ro, ctx.post, observe));
  spec.options = rc.mover;
  spec.options.node_name = NodeName(ctx.config);
  return spec;
}

// --- memory: blocks in kvtierd's own unpinned memory ------------------------------------

struct MemoryTierConfig {
  MemoryTierOptions tier;         // capacity 0: no memory tier
  LowerTierMover::Options mover;  // write policy, puts in flight
  MemoryTierConfig() { mover.write_policy = WritePolicy::kWriteBack; }
  bool operator==(const MemoryTierConfig&) const = default;
};

const std::vector<ConfigKey>& MemoryKeys() {
  static const std::vector<ConfigKey> keys = {
      {"tiers.memory.capacity", "0",
       "Bytes of blocks kept below NVMe in kvtierd's own memory (plain, unpinned: not the "
       "host pool engines map, nor bounded by what may be locked), least recently used "
       "dropped first; lost when kvtierd stops. 0: no memory tier.",
       KVTIER_SECTION_SET(MemoryTierConfig, (Bytes(key, n, 0, uint64_t{1} << 50)), tier.capacity_bytes)},
      {"tiers.memory.write_policy", "write_back",
       "write_back: a block is put here when it leaves host memory; write_through: every "
       "block committed to host is also put here.",
       KVTIER_SECTION_SET(MemoryTierConfig, Choice(key, n, kWritePolicyNames), mover.write_policy)},
      {"tiers.memory.max_puts_in_flight", "32",
       "Most puts at once; each pins its block's host page until it is copied.",
       KVTIER_SECTION_SET(MemoryTierConfig, (Integer<uint32_t>(key, n, 1, 4096)), mover.max_puts_in_flight)},
  };
  return keys;
}

bool MemoryEnabled(const DaemonConfig& c) { return c.lower.Get<MemoryTierConfig>().tier.capacity_bytes > 0; }

Status CheckMemoryOnHost(const DaemonConfig&, std::vector<std::string>*) { return Status::Ok(); }

Result<CacheManager::LowerTierSpec> OpenMemory(const LowerTierContext& ctx) {
  const MemoryTierConfig& mc = ctx.config.lower.Get<MemoryTierConfig>();
  CacheManager::LowerTierSpec spec;
  KVTIER_ASSIGN_OR_RETURN(spec.tier, MemoryTier::Open(mc.tier, ctx.post));
  spec.options = mc.mover;
  spec.options.node_name = NodeName(ctx.config);
  return spec;
}

// In chain order: the memory tier (this process's RAM) is asked before a cluster.
constexpr LowerTierRow kRows[] = {
    {TierKind::kMemory, MemoryKeys, MemoryEnabled, CheckMemoryOnHost, OpenMemory},
    {TierKind::kRemote, RemoteKeys, RemoteEnabled, CheckRemoteOnHost, OpenRemote},
};

}  // namespace

std::span<const LowerTierRow> LowerTierRows() { return kRows; }

}  // namespace kvtier
