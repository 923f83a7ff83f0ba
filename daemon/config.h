#pragma once
// kvtierd configuration: one YAML file (kvtierd --config FILE), or the embedded default.
//
// Every key is declared once, in config_keys.cc, with its default and a comment; the same
// table parses files, rejects unknown keys and bad values (naming the key), and prints
// `kvtierd --print-default-config`. Relative paths are relative to the daemon's working
// directory. Value type; thread-compatible.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <typeindex>
#include <vector>

#include "daemon/cache/cache_types.h"
#include "daemon/cache/nvme_mover.h"
#include "daemon/events/kv_events.h"
#include "daemon/server_options.h"
#include "kernels/kv_layout.h"
#include "protocol/base/defaults.h"
#include "protocol/base/logging.h"
#include "protocol/base/status.h"
#include "protocol/framing.h"
#include "storage/nvme/nvme_tier.h"
#include "storage/pool/segment_memory.h"

namespace kvtier {

// The NVMe tier: the tier's and its mover's own option structs, as the config sets them.
// The daemon adds what is not a key: the slot size (NvmeSlotBytes), spills in flight (at
// least io.queue_depth), the tenants' slot owners (NvmeOwnersOf, daemon/tenants.h).
struct NvmeTierConfig {
  NvmeTierOptions tier;      // tier.files: none means no NVMe tier
  NvmeMover::Options mover;  // write policy, prefetch, the quantized form
  IoEngineOptions io;        // backend and queue depth; the daemon sizes its buffers
  uint64_t index_cache_bytes = 16ull << 20;
  bool enabled() const { return !tier.files.empty(); }
  bool operator==(const NvmeTierConfig&) const = default;
};

// The config sections of the tiers below NVMe, each its lower-tier row's own struct
// (daemon/lower_tiers.cc), held by type: a tier added below NVMe brings its section
// without a field here. A section the config did not set reads as its defaults. Value
// type (copies share a section until one of them changes it); thread-compatible.
class LowerTierSections {
 public:
  template <class T>
  const T& Get() const {
    auto it = sections_.find(std::type_index(typeid(T)));
    if (it == sections_.end()) {
      static const T kDefault{};
      return kDefault;
    }
    return *static_cast<const T*>(it->second.value.get());
  }
  template <class T>
  T& Mutable() {
    Entry& e = sections_[std::type_index(typeid(T))];
    if (!e.value || e.value.use_count() > 1) {
      e.value = e.value ? std::make_shared<T>(*static_cast<const T*>(e.value.get())) : std::make_shared<T>();
      e.equal = [](const void* a, const void* b) { return *static_cast<const T*>(a) == *static_cast<const T*>(b); };
      e.is_default = [](const void* a) { return *static_cast<const T*>(a) == T{}; };
    }
    return *static_cast<T*>(e.value.get());
  }
  // Sections equal, a missing one equal to its defaults.
  bool operator==(const LowerTierSections& o) const {
    auto covered = [](const LowerTierSections& a, const LowerTierSections& b) {
      for (const auto& [type, e] : a.sections_) {
        auto it = b.sections_.find(type);
        if (it == b.sections_.end() ? !e.is_default(e.value.get()) : !e.equal(e.value.get(), it->second.value.get()))
          return false;
      }
      return true;
    };
    return covered(*this, o) && covered(o, *this);
  }

 private:
  struct Entry {
    std::shared_ptr<void> value;
    bool (*equal)(const void*, const void*) = nullptr;
    bool (*is_default)(const void*) = nullptr;
  };
  std::map<std::type_index, Entry> sections_;
};

// One configured tenant: the peers it covers (by uid, or by any of their groups) and its
// share of each tier. quota: the most it may hold (enforced when it asks for pages or
// spills); reserve: what other tenants' pressure can never take from it.
struct TenantConfig {
  std::string name;
  std::vector<uint32_t> uids;
  std::vector<uint32_t> gids;
  TierBytes quota{};  // by TierIndex; keyed by the tier table's names in the config
  TierBytes reserve{};
  bool kv_quantization = false;  // its blocks may be stored quantized in the tiers that quantize
  bool operator==(const TenantConfig&) const = default;
};

struct SecurityConfig {
  std::vector<TenantConfig> tenants;
  // A peer no tenant covers: its own tenant "uid=U" (true) or refused (false).
  bool allow_unknown = true;
  TierBytes unknown_quota{};  // per unknown tenant (pool tiers only)
  // Besides root and the daemon's own uid.
  std::vector<uint32_t> admin_uids;
  // The most of a tier's pages one session may hold leased at once (1: no cap).
  double max_leased_share = 0.5;
  bool unknown_kv_quantization = false;  // kv_quantization for unknown tenants
  bool operator==(const SecurityConfig&) const = default;
};

struct EventsConfig {
  bool enabled = false;
  bool enabled_given = false;  // events.enabled was in the config
  KvEventsOptions options;
  // Equal configs whether or not events.enabled was written out.
  bool operator==(const EventsConfig& o) const { return enabled == o.enabled && options == o.options; }
};

// Agentic sessions' hints (sessions.*): as CacheManager::Options::Sessions.
struct SessionsConfig {
  int64_t max_ttl_ns = 3'600'000'000'000;
  uint32_t max_per_tenant = 4096;
  double protected_share = 0.5;
  bool operator==(const SessionsConfig&) const = default;
};

struct DaemonConfig {
  // The socket and its sessions: path, mode, limits (socket.*, protocol.*).
  ServerOptions server;
  SessionsConfig sessions;
  std::string socket_group;  // empty: the daemon's group (resolved into server.socket_gid)
  std::string data_dir = "./var";
  // This node's name in a fleet (names unknown tenants in the remote tier: "uid=U@name").
  // Empty: the host name. A DNS-style name: letters, digits, '.', '-', '_'.
  std::string node_name;
  LogLevel log_level = LogLevel::kInfo;

  uint32_t max_entries_per_request = kDefaultMaxEntriesPerRequest;
  bool max_entries_auto = true;  // derived from server.max_frame_bytes (MaxEntriesForFrame)

  std::string metrics_listen = "127.0.0.1";
  int metrics_port = 9490;                            // 0: any free port; -1: no metrics endpoint
  int64_t metrics_stall_timeout_ns = 10'000'000'000;  // /healthz: 503 past this

  // The host tier, on by default.
  TierOptions host = [] {
    TierOptions h;
    h.enabled = true;
    h.allocation_headroom = 2;
    return h;
  }();
  // The GPU tier: off by default; its page_bytes is the host tier's.
  TierOptions gpu = [] {
    TierOptions g;
    g.high_watermark = 0.90;
    g.low_watermark = 0.80;
    g.allocation_headroom = 2;
    return g;
  }();
  std::string gpu_backend = "auto";
  int gpu_device = 0;
  NvmeTierConfig nvme;
  LowerTierSections lower;  // tiers.remote (RemoteTierConfig), tiers.memory, ...
  SecurityConfig security;
  EventsConfig events;
  bool operator==(const DaemonConfig&) const = default;
};

// Parses YAML text. Unknown keys, wrong types and out-of-range values are
// kInvalidArgument with a message naming the key, e.g.
//   "config key 'tiers.host.capasity' is unknown".
Result<DaemonConfig> ParseConfig(std::string_view yaml_text);
// The text of a config file. kNotFound when it cannot be opened; kInvalidArgument when it
// is not a regular file (a directory: a ConfigMap mounted without subPath is one) or
// larger than 16 MiB; errors name the path.
Result<std::string> ReadConfigFile(const std::string& path);
// The embedded default config as YAML: every key, its default value and a comment.
// ParseConfig(DefaultConfigYaml()) yields DaemonConfig{}.
std::string DefaultConfigYaml();

// The longest Unix socket path plus its terminating NUL (sizeof(sockaddr_un::sun_path)).
inline constexpr size_t kMaxSocketPathBytes = 108;

// The error for a bad value of config key `path` (dotted, e.g. tiers.host.capacity):
// kInvalidArgument naming the key and saying why.
Status ConfigKeyError(std::string_view path, const std::string& why);

// node_name's rule: 1 to 253 letters, digits, '.', '-' or '_' (a DNS name, a Kubernetes
// node name); kInvalidArgument saying why not.
Status CheckNodeName(std::string_view name);
// The name this node goes by: config.node_name, else the host name.
std::string NodeName(const DaemonConfig& config);

// The NVMe tier's slot size: a host page, or for a quantized tier 33/64 of one (a block of
// 2-byte floats quantized with head_dim >= 128: half its bytes in codes, 4 bytes of scale
// per head_dim), rounded up to 4 KiB so any device's direct I/O takes it.
uint64_t NvmeSlotBytes(const DaemonConfig& config);

// Cross-field checks (low < high watermark, sizes that divide, names that exist); called by
// ParseConfig. What only the machine can say (memory, files, groups) is
// CheckConfigOnHost's (config_host.h).
Status ValidateConfig(const DaemonConfig& config);

}  // namespace kvtier
