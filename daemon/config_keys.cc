// The config's keys: each key's path, default, comment and parser, written once. ParseConfig
// (config.cc) walks a document against this table; DefaultConfigYaml prints it.
#include "daemon/config_keys.h"

#include <set>
#include <span>

#include "daemon/lower_tiers.h"
#include "kernels/device_backend.h"
#include "protocol/base/units.h"
#include "storage/io/io_engine.h"
#include "storage/policy/eviction_policy.h"

namespace kvtier {

namespace config {

// "a", "a or b", "a, b or c" of a list of names.
std::string Alternatives(std::span<const std::string_view> names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

// One of the names a factory's owner exports (policies, backends).
Result<std::string> Word(const std::string& key, const YAML::Node& n, std::span<const std::string_view> names) {
  KVTIER_ASSIGN_OR_RETURN(std::string s, Scalar(key, n));
  for (std::string_view name : names) {
    if (s == name) return s;
  }
  return ConfigKeyError(key, "'" + s + "' is not " + Alternatives(names));
}

Result<std::string> Scalar(std::string_view path, const YAML::Node& n) {
  if (!n.IsScalar()) return ConfigKeyError(path, "expected a scalar value");
  return n.Scalar();
}

// A ZMQ endpoint kvtierd binds: tcp://HOST:PORT (PORT 1..65535, or * for any) or ipc://PATH.
Status CheckEndpoint(std::string_view path, const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0 && endpoint.size() > 6) return Status::Ok();
  if (endpoint.rfind("tcp://", 0) != 0)
    return ConfigKeyError(path, "'" + endpoint + "' is not tcp://HOST:PORT or ipc://PATH");
  const size_t colon = endpoint.rfind(':');
  const std::string port = colon > 5 ? endpoint.substr(colon + 1) : "";
  if (port == "*") return Status::Ok();
  char* end = nullptr;
  const long v = port.empty() ? -1 : std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || v < 1 || v > 65535) {
    return ConfigKeyError(path, "'" + endpoint + "' needs a port in 1..65535 (or *)");
  }
  return Status::Ok();
}

// A duration ("10s", "50ms") in [lo_ns, hi_ns], or 0 when `zero_ok`; `range` says the
// bounds in the error.
Result<int64_t> Duration(std::string_view path, const YAML::Node& n, int64_t lo_ns, int64_t hi_ns, bool zero_ok,
                         std::string_view range) {
  KVTIER_ASSIGN_OR_RETURN(std::string s, Scalar(path, n));
  auto d = ParseDurationNanos(s);
  if (!d.ok()) return ConfigKeyError(path, d.status().message());
  if (zero_ok && *d == 0) return *d;
  if (*d < lo_ns || *d > hi_ns) {
    return ConfigKeyError(path, "must be " + std::string(range));
  }
  return *d;
}

Result<uint64_t> Bytes(std::string_view path, const YAML::Node& n, uint64_t lo, uint64_t hi) {
  KVTIER_ASSIGN_OR_RETURN(std::string s, Scalar(path, n));
  auto v = ParseBytes(s);
  if (!v.ok()) return ConfigKeyError(path, v.status().message());
  if (*v < lo || *v > hi) {
    return ConfigKeyError(path,
                          FormatBytes(*v) + " is out of range [" + FormatBytes(lo) + ", " + FormatBytes(hi) + "]");
  }
  return *v;
}

Result<double> Real(std::string_view path, const YAML::Node& n) {
  KVTIER_ASSIGN_OR_RETURN(std::string s, Scalar(path, n));
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') return ConfigKeyError(path, "'" + s + "' is not a number");
  return v;
}

Result<double> Fraction(std::string_view path, const YAML::Node& n) {
  KVTIER_ASSIGN_OR_RETURN(double v, Real(path, n));
  if (!(v > 0.0 && v <= 1.0)) return ConfigKeyError(path, "must be in (0, 1]");
  return v;
}

Result<double> Number(std::string_view path, const YAML::Node& n, double lo, double hi) {
  KVTIER_ASSIGN_OR_RETURN(double v, Real(path, n));
  if (!(v >= lo && v <= hi)) {
    std::ostringstream range;
    range << "must be in [" << lo << ", " << hi << "]";
    return ConfigKeyError(path, range.str());
  }
  return v;
}

Result<bool> Boolean(std::string_view path, const YAML::Node& n) {
  KVTIER_ASSIGN_OR_RETURN(std::string s, Scalar(path, n));
  if (s == "true" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "no" || s == "off") return false;
  return ConfigKeyError(path, "'" + s + "' is not true or false");
}

// A list of uids or gids.
Result<std::vector<uint32_t>> IdList(const std::string& path, const YAML::Node& n) {
  std::vector<uint32_t> out;
  if (n.IsNull()) return out;
  if (!n.IsSequence()) return ConfigKeyError(path, "expected a list of numeric ids, e.g. [1000, 1001]");
  for (size_t i = 0; i < n.size(); ++i) {
    KVTIER_ASSIGN_OR_RETURN(uint32_t id,
                            (Integer<uint32_t>(path + "[" + std::to_string(i) + "]", n[i], 0, 0xfffffffeu)));
    out.push_back(id);
  }
  return out;
}

// {host: 1GiB, gpu: 0, nvme: 100GiB, remote: 50GiB}: a size per tier, keyed by the tier
// table's names.
Status TierBytesMap(const std::string& path, const YAML::Node& n, TierBytes* out) {
  std::vector<std::string_view> names;
  for (const TierRow& r : kTierTable) names.push_back(r.name);
  if (n.IsNull()) return Status::Ok();
  if (!n.IsMap()) return ConfigKeyError(path, "expected {TIER: SIZE, ...} with TIER " + Alternatives(names));
  for (const auto& kv : n) {
    const std::string tier = kv.first.Scalar();
    const std::optional<TierKind> kind = ParseTierKind(tier);
    if (!kind)
      return InvalidArgument("config key '" + path + "." + tier + "' is unknown (" + Alternatives(names) + ")");
    auto b = ParseBytes(kv.second.IsScalar() ? kv.second.Scalar() : std::string());
    if (!b.ok()) return ConfigKeyError(path + "." + tier, b.status().message());
    (*out)[TierIndex(*kind)] = *b;
  }
  return Status::Ok();
}

bool ValidTenantName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-' && ch != '.') return false;
  }
  return true;
}

Result<std::string> Path(std::string_view path, const YAML::Node& n) {
  KVTIER_ASSIGN_OR_RETURN(std::string s, Scalar(path, n));
  if (s.empty()) return ConfigKeyError(path, "must not be empty");
  return s;
}

}  // namespace config

namespace {

using config::Alternatives;
using config::Boolean;
using config::Bytes;
using config::CheckEndpoint;
using config::Choice;
using config::Duration;
using config::Fraction;
using config::IdList;
using config::Integer;
using config::Number;
using config::Path;
using config::Real;
using config::Scalar;
using config::TierBytesMap;
using config::ValidTenantName;
using config::ValueOf;
using config::Word;
using config::WordsOf;

}  // namespace

const std::vector<ConfigKey>& ConfigKeys() {
  static const std::vector<ConfigKey> keys = {
      {"socket.path", "./var/kvtierd.sock",
       "Unix socket that engines and kvctl connect to. Clients use this path by default.",
       KVTIER_CONFIG_SET(Path(key, n), server.socket_path)},
      {"socket.group", "\"\"",
       "Group that owns the socket (and the socket's directory when kvtierd creates it); "
       "engines of users in it may connect. A name or a number; empty: the daemon's group.",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         if (n.IsNull()) return Status::Ok();
         KVTIER_ASSIGN_OR_RETURN(c->socket_group, Scalar(key, n));
         return Status::Ok();
       }},
      {"socket.mode", "0660",
       "Permissions of the socket, in octal. Others never get access: the owner and the group "
       "are who may connect.",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         KVTIER_ASSIGN_OR_RETURN(std::string s, Scalar(key, n));
         char* end = nullptr;
         const unsigned long v = std::strtoul(s.c_str(), &end, 8);
         if (s.empty() || *end != '\0' || v > 0777)
           return ConfigKeyError(key, "'" + s + "' is not an octal mode like 0660");
         if (v & 0007) return ConfigKeyError(key, "'" + s + "' gives others access; use the group (socket.group)");
         if ((v & 0600) != 0600) return ConfigKeyError(key, "'" + s + "' does not let the daemon's user connect");
         c->server.socket_mode = static_cast<uint32_t>(v);
         return Status::Ok();
       }},
      {"data_dir", "./var", "State directory: lock file now; index and slot files with NVMe.",
       KVTIER_CONFIG_SET(Path(key, n), data_dir)},
      {"node_name", "\"\"",
       "This node's name in the fleet: users no tenant covers are 'uid=U@node_name' in the "
       "remote tier, so the same uid on two nodes never shares blocks. Empty: the host name, "
       "which in a pod is the pod's; set it to the node's (kvtierd --node-name, from the "
       "downward API's spec.nodeName) so a rollout keeps those keys; with the remote tier on, "
       "an empty node_name is warned about at start.",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         if (n.IsNull()) return Status::Ok();
         KVTIER_ASSIGN_OR_RETURN(std::string s, Scalar(key, n));
         if (s.empty()) return Status::Ok();  // the host name
         if (Status st = CheckNodeName(s); !st.ok()) return ConfigKeyError(key, st.message());
         c->node_name = std::move(s);
         return Status::Ok();
       }},
      {"log_level", "info", "error | warning | notice | info | debug (stderr, journald priorities).",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         KVTIER_ASSIGN_OR_RETURN(std::string s, Scalar(key, n));
         if (!ParseLogLevel(s, &c->log_level)) {
           return ConfigKeyError(key, "'" + s + "' is not one of error, warning, notice, info, debug");
         }
         return Status::Ok();
       }},
      {"protocol.max_frame_bytes", "1MiB",
       "Largest request frame accepted; a larger one is answered with an error and its "
       "connection closed.",
       KVTIER_CONFIG_SET((Bytes(key, n, 4096, 64ull << 20)), server.max_frame_bytes)},
      {"protocol.max_sessions", "1024", "Connections served at once; more are refused.",
       KVTIER_CONFIG_SET((Integer<uint32_t>(key, n, 1, 1 << 20)), server.max_sessions)},
      {"protocol.max_pending_output", "16MiB",
       "Responses buffered for a session that does not read them; above it the daemon stops "
       "reading that session's requests until it catches up.",
       KVTIER_CONFIG_SET((Bytes(key, n, 64 * 1024, 1ull << 32)), server.max_pending_output_bytes)},
      {"protocol.max_entries_per_request", "auto",
       "Most pages or hashes one request may name. auto: as many as the largest request "
       "(a Commit with 32-byte hashes, 68 bytes an entry) fits in protocol.max_frame_bytes "
       "(15,405 at 1 MiB); a number above that is refused.",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         c->max_entries_auto = n.IsScalar() && n.Scalar() == "auto";
         if (c->max_entries_auto) return Status::Ok();  // resolved once max_frame_bytes is known
         KVTIER_ASSIGN_OR_RETURN(c->max_entries_per_request, (Integer<uint32_t>(key, n, 1, 1 << 24)));
         return Status::Ok();
       }},
      {"protocol.heartbeat_ttl", "0",
       "A session that sends nothing for this long is expired: it is told why, its references "
       "are dropped and its leased pages quarantined until its process exits. Clients (protocol "
       "minor 7) send keepalives while their process runs, so this expires engines that stopped "
       "running (SIGSTOP, a frozen cgroup) and older clients; a load whose session expired under "
       "it fails. 0: never.",
       KVTIER_CONFIG_SET((Duration(key, n, 100'000'000, INT64_MAX, true, "0 or at least 100ms")),
                         server.heartbeat_ttl_ns)},
      {"protocol.hello_timeout", "10s",
       "A connection that has not sent Hello this long after connecting is answered with an "
       "error and closed (0: never).",
       KVTIER_CONFIG_SET((Duration(key, n, 100'000'000, INT64_MAX, true, "0 or at least 100ms")),
                         server.hello_timeout_ns)},
      {"protocol.max_sessions_per_uid", "256",
       "Connections one uid may hold at once (admins excepted); 0: no limit but max_sessions.",
       KVTIER_CONFIG_SET((Integer<uint32_t>(key, n, 0, 1 << 20)), server.max_sessions_per_uid)},
      {"protocol.admin_sessions", "8",
       "Of max_sessions, how many only admins (root, the daemon's uid, security.admin_uids) "
       "may take, so kvctl always gets in.",
       KVTIER_CONFIG_SET((Integer<uint32_t>(key, n, 0, 1 << 20)), server.admin_sessions)},
      {"security.allow_unknown", "true",
       "A peer whose uid and groups match no tenant in security.tenants: true gives it a "
       "tenant of its own (uid=U, with security.unknown_quota); false refuses it at Hello.",
       KVTIER_CONFIG_SET(Boolean(key, n), security.allow_unknown)},
      {"security.admin_uids", "[]",
       "uids allowed admin operations (verify, evict, drain, other sessions' details), "
       "besides root and the daemon's own uid.",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         KVTIER_ASSIGN_OR_RETURN(c->security.admin_uids, IdList(key, n));
         return Status::Ok();
       }},
      {"security.max_leased_share", "0.5",
       "The most of a tier's pages one tenant's sessions together may hold leased (allocated, "
       "not yet committed; pages of its sessions that ended while their process lives count "
       "too) at once, so one user cannot take a whole tier by opening sessions (one that "
       "arrived first included); a tenant with a quota on the tier is bounded by its quota "
       "instead. 1: no cap.",
       KVTIER_CONFIG_SET(Fraction(key, n), security.max_leased_share)},
      {"security.unknown_quota", "{host: 0, gpu: 0}",
       "Most each unknown tenant may hold per tier (0: no limit); host and GPU only (NVMe and remote "
       "limits are for configured tenants).",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         return TierBytesMap(key, n, &c->security.unknown_quota);
       }},
      {"security.unknown_kv_quantization", "false",
       "Whether unknown tenants' blocks may be stored quantized where a tier quantizes "
       "(tiers.nvme.quantization); configured tenants say so themselves (kv_quantization).",
       KVTIER_CONFIG_SET(Boolean(key, n), security.unknown_kv_quantization)},
      {"security.tenants", "[]",
       "Tenants by peer identity. Blocks are shared only within a tenant (and model). E.g. "
       "[{name: org_a, uids: [1000], gids: [2000], quota: {host: 8GiB, gpu: 20GiB, nvme: 100GiB, "
       "remote: 50GiB}, reserve: {host: 2GiB, nvme: 20GiB}}]: quota is the most the tenant may hold "
       "per tier (remote: what this kvtierd keeps in the cluster for it, oldest deleted first); "
       "reserve is what other tenants can never push it below (host, GPU, NVMe); kv_quantization: "
       "true lets its blocks be stored quantized where a tier quantizes (lossy; default false).",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         if (n.IsNull()) return Status::Ok();
         if (!n.IsSequence()) return ConfigKeyError(key, "expected a list of {name, uids, gids, quota, reserve}");
         c->security.tenants.clear();
         for (size_t i = 0; i < n.size(); ++i) {
           const std::string at = key + "[" + std::to_string(i) + "]";
           if (!n[i].IsMap()) return ConfigKeyError(at, "expected {name: ..., uids: [...], gids: [...]}");
           TenantConfig t;
           for (const auto& kv : n[i]) {
             const std::string sub = kv.first.Scalar();
             if (sub == "name") {
               KVTIER_ASSIGN_OR_RETURN(t.name, Scalar(at + ".name", kv.second));
               if (!ValidTenantName(t.name))
                 return ConfigKeyError(at + ".name", "'" + t.name + "' must be 1-64 of [A-Za-z0-9_.-]");
             } else if (sub == "uids") {
               KVTIER_ASSIGN_OR_RETURN(t.uids, IdList(at + ".uids", kv.second));
             } else if (sub == "gids") {
               KVTIER_ASSIGN_OR_RETURN(t.gids, IdList(at + ".gids", kv.second));
             } else if (sub == "quota") {
               KVTIER_RETURN_IF_ERROR(TierBytesMap(at + ".quota", kv.second, &t.quota));
             } else if (sub == "reserve") {
               KVTIER_RETURN_IF_ERROR(TierBytesMap(at + ".reserve", kv.second, &t.reserve));
             } else if (sub == "kv_quantization") {
               KVTIER_ASSIGN_OR_RETURN(t.kv_quantization, Boolean(at + ".kv_quantization", kv.second));
             } else {
               return InvalidArgument("config key '" + at + "." + sub + "' is unknown");
             }
           }
           if (t.name.empty()) return ConfigKeyError(at, "needs a name");
           if (t.uids.empty() && t.gids.empty()) return ConfigKeyError(at, "needs uids or gids: who the tenant is");
           c->security.tenants.push_back(std::move(t));
         }
         return Status::Ok();
       }},
      {"sessions.max_ttl", "1h",
       "Agentic sessions' hints (SessionHint, vLLM's kv_transfer_params.kvtier): a longer TTL a "
       "session asks for is clamped to this; a session silent past its TTL loses its protection.",
       KVTIER_CONFIG_SET((Duration(key, n, 1'000'000'000, INT64_MAX, false, "at least 1s")), sessions.max_ttl_ns)},
      {"sessions.max_per_tenant", "4096",
       "Sessions one tenant's hints may hold at once; a new session takes the place of the one "
       "that ended or lapsed first, and is refused (ResourceExhausted, counted) where all are live.",
       KVTIER_CONFIG_SET((Integer<uint32_t>(key, n, 1, 1 << 24)), sessions.max_per_tenant)},
      {"sessions.protected_share", "0.5",
       "The most of each pool tier (GPU, host) one tenant's live sessions may protect, as a "
       "fraction of its pages: protection beyond it is not given (and counted), so hints never "
       "pin a tier; protected blocks are still evicted, last, when nothing else can be.",
       KVTIER_CONFIG_SET(Fraction(key, n), sessions.protected_share)},
      {"metrics.listen", "127.0.0.1", "Address of the Prometheus endpoint (GET /metrics).",
       KVTIER_CONFIG_SET(Path(key, n), metrics_listen)},
      {"metrics.port", "9490",
       "TCP port of the Prometheus endpoint; 0 picks a free port "
       "(kvctl status shows it), -1 turns the endpoint off.",
       KVTIER_CONFIG_SET((Integer<int>(key, n, -1, 65535)), metrics_port)},
      {"metrics.stall_timeout", "10s",
       "/healthz on the metrics port answers 503 once the control loop has not run for this "
       "long (a liveness probe then restarts kvtierd).",
       KVTIER_CONFIG_SET((Duration(key, n, 500'000'000, 3'600'000'000'000, false, "500ms..1h")),
                         metrics_stall_timeout_ns)},
      {"tiers.host.enabled", "true", "The pinned host-RAM tier (a memfd pool shared with engines).",
       KVTIER_CONFIG_SET(Boolean(key, n), host.enabled)},
      {"tiers.host.capacity", "1GiB", "Size of the host pool; a multiple of segment_bytes.",
       KVTIER_CONFIG_SET((Bytes(key, n, 4096, 1ull << 44)), host.capacity_bytes)},
      {"tiers.host.page_bytes", "2MiB",
       "Size of one page (one KV block); a multiple of 4 KiB that divides segment_bytes.",
       KVTIER_CONFIG_SET((Bytes(key, n, 4096, 1ull << 30)), host.page_bytes)},
      {"tiers.host.segment_bytes", "256MiB",
       "Size of one shared-memory segment. A segment holds one tenant's pages at a time and "
       "is mapped whole by that tenant's engines.",
       KVTIER_CONFIG_SET((Bytes(key, n, 4096, 1ull << 40)), host.segment_bytes)},
      {"tiers.host.huge_pages", "auto",
       "auto: 2 MiB hugetlb pages when enough are free, else 4 KiB pages; on: hugetlb or fail "
       "at start; off: 4 KiB pages.",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         KVTIER_ASSIGN_OR_RETURN(std::string s, Scalar(key, n));
         if (s == "auto")
           c->host.huge_pages = HugePages::kAuto;
         else if (s == "on" || s == "true")
           c->host.huge_pages = HugePages::kOn;
         else if (s == "off" || s == "false")
           c->host.huge_pages = HugePages::kOff;
         else
           return ConfigKeyError(key, "'" + s + "' is not auto, on or off");
         return Status::Ok();
       }},
      {"tiers.host.high_watermark", "0.85",
       "Above this fraction of capacity in use, cached blocks are evicted (the usual "
       "cpu_offload_threshold).",
       KVTIER_CONFIG_SET(Fraction(key, n), host.high_watermark)},
      {"tiers.host.low_watermark", "0.75", "Eviction stops at this fraction of capacity in use.",
       KVTIER_CONFIG_SET(Fraction(key, n), host.low_watermark)},
      {"tiers.host.allocation_headroom", "2",
       "With an NVMe tier: keep free, or already on their way to NVMe, the host pages engines "
       "allocate in this many spill round trips at the recent allocation rate, evicting below the "
       "high watermark when that needs more (at most half the tier), so that an Allocate "
       "seldom waits for a spill. 0: the watermarks alone.",
       KVTIER_CONFIG_SET(Number(key, n, 0, 64), host.allocation_headroom)},
      {"tiers.host.overcommit", "false",
       "Start even when the host pool (plus a host-emulated GPU pool) is larger than the "
       "machine's memory (MemTotal, or the cgroup's memory limit when lower); without it such "
       "a config is refused, since the pool would be OOM-killed once it fills. Without it "
       "kvtierd also touches the whole pool at start, so its memory is charged to kvtierd's "
       "cgroup; with it pages are charged to the process that writes them first (an engine).",
       KVTIER_CONFIG_SET(Boolean(key, n), host.overcommit)},
      {"tiers.host.policy", "adaptive",
       "Eviction policy of cached blocks: lru, prefix-lru, arc, prefix-arc, prefix-lirs, adaptive "
       "(the best measured; docs/benchmarks.md).",
       KVTIER_CONFIG_SET(Word(key, n, EvictionPolicyNames()), host.policy)},
      {"tiers.gpu.enabled", "false",
       "A GPU tier: daemon-owned HBM pages engines lease and share (managed-pool mode); "
       "cached GPU blocks are demoted to host pages above the high watermark.",
       KVTIER_CONFIG_SET(Boolean(key, n), gpu.enabled)},
      {"tiers.gpu.backend", "auto",
       "auto: CUDA when a GPU is visible, else no GPU tier; cuda: fail at start without one; "
       "host-emulated: device memory emulated in host RAM (tests, development).",
       KVTIER_CONFIG_SET(Word(key, n, kDeviceBackendNames), gpu_backend)},
      {"tiers.gpu.device", "0", "CUDA device of the GPU tier.",
       KVTIER_CONFIG_SET((Integer<int>(key, n, 0, 1023)), gpu_device)},
      {"tiers.gpu.capacity", "1GiB", "Size of the GPU pool; a multiple of segment_bytes.",
       KVTIER_CONFIG_SET((Bytes(key, n, 4096, 1ull << 44)), gpu.capacity_bytes)},
      {"tiers.gpu.segment_bytes", "256MiB",
       "Size of one exported allocation. One never holds two tenants' pages (a legacy IPC "
       "handle maps the whole allocation).",
       KVTIER_CONFIG_SET((Bytes(key, n, 4096, 1ull << 40)), gpu.segment_bytes)},
      {"tiers.gpu.high_watermark", "0.90", "Above this fraction in use, cached GPU blocks move to host.",
       KVTIER_CONFIG_SET(Fraction(key, n), gpu.high_watermark)},
      {"tiers.gpu.low_watermark", "0.80", "Demotion stops at this fraction in use.",
       KVTIER_CONFIG_SET(Fraction(key, n), gpu.low_watermark)},
      {"tiers.gpu.allocation_headroom", "2",
       "As tiers.host.allocation_headroom, for GPU pages and their copies down to host: keep free "
       "the GPU pages engines lease in this many demotion round trips at the recent rate. 0: the "
       "watermarks alone.",
       KVTIER_CONFIG_SET(Number(key, n, 0, 64), gpu.allocation_headroom)},
      {"tiers.gpu.policy", "adaptive", "Eviction policy of cached GPU blocks (as tiers.host.policy).",
       KVTIER_CONFIG_SET(Word(key, n, EvictionPolicyNames()), gpu.policy)},
      {"tiers.nvme.files", "[]",
       "NVMe slot files; none means no NVMe tier. Each is preallocated to its capacity (unless "
       "preallocate: false, which leaves it sparse: spills may then meet a full file system) and "
       "cut into slots of tiers.host.page_bytes, e.g. "
       "[{path: /var/lib/kvtier/slots0, capacity: 200GiB}].",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         if (n.IsNull()) return Status::Ok();
         if (!n.IsSequence()) return ConfigKeyError(key, "expected a list of {path, capacity}");
         c->nvme.tier.files.clear();
         for (size_t i = 0; i < n.size(); ++i) {
           const std::string at = key + "[" + std::to_string(i) + "]";
           if (!n[i].IsMap()) return ConfigKeyError(at, "expected {path: ..., capacity: ...}");
           SlotFileSpec f;
           for (const auto& kv : n[i]) {
             const std::string sub = kv.first.Scalar();
             if (sub == "path") {
               KVTIER_ASSIGN_OR_RETURN(f.path, Path(at + ".path", kv.second));
             } else if (sub == "capacity") {
               KVTIER_ASSIGN_OR_RETURN(f.capacity_bytes, Bytes(at + ".capacity", kv.second, 4096, 1ull << 50));
             } else if (sub == "preallocate") {
               KVTIER_ASSIGN_OR_RETURN(f.preallocate, Boolean(at + ".preallocate", kv.second));
             } else {
               return InvalidArgument("config key '" + at + "." + sub + "' is unknown");
             }
           }
           if (f.path.empty() || f.capacity_bytes == 0) return ConfigKeyError(at, "needs both path and capacity");
           c->nvme.tier.files.push_back(std::move(f));
         }
         return Status::Ok();
       }},
      {"tiers.nvme.io_backend", "auto",
       "auto: io_uring when it can be set up (kernel.io_uring_disabled and seccomp can prevent "
       "it), else threads; io_uring: fail at start without it; threads: pread/pwrite workers.",
       KVTIER_CONFIG_SET(Word(key, n, kIoBackendNames), nvme.io.backend)},
      {"tiers.nvme.queue_depth", "256", "Most NVMe reads and writes in flight.",
       KVTIER_CONFIG_SET((Integer<uint32_t>(key, n, 1, 4096)), nvme.io.queue_depth)},
      {"tiers.nvme.durability", "strict",
       "strict: a spilled block counts only once its bytes are fdatasync'ed and its index "
       "entry synced (one sync covers many blocks); relaxed: neither (a crash may lose recent "
       "entries, never serve wrong bytes).",
       KVTIER_CONFIG_SET(Choice(key, n, kDurabilityNames), nvme.tier.durability)},
      {"tiers.nvme.write_policy", "write_back",
       "write_back: a block is spilled when it is demoted from the host tier; write_through: "
       "every committed block is also spilled in the background, so a restart keeps it.",
       KVTIER_CONFIG_SET(Choice(key, n, kWritePolicyNames), nvme.mover.write_policy)},
      {"tiers.nvme.prefetch", "false",
       "Lookup starts reading NVMe hits into free host pages, so the Acquire that follows "
       "waits less.",
       KVTIER_CONFIG_SET(Boolean(key, n), nvme.mover.prefetch)},
      {"tiers.nvme.load_hold", "2s",
       "How long the NVMe index records a Lookup read are kept for the Acquire that loads what "
       "it found (an engine's scheduler looks up, its worker then loads), so the load reads the "
       "index once per block. A hint only: a block evicted meanwhile is a miss. 0: not kept.",
       KVTIER_CONFIG_SET((Duration(key, n, 1'000'000, 60'000'000'000, true, "0 or 1ms..1m")), nvme.mover.load_hold_ns)},
      {"tiers.nvme.high_watermark", "0.95", "Above this fraction of slots in use the coldest NVMe blocks are dropped.",
       KVTIER_CONFIG_SET(Fraction(key, n), nvme.tier.high_watermark)},
      {"tiers.nvme.low_watermark", "0.90", "Dropping stops at this fraction of slots in use.",
       KVTIER_CONFIG_SET(Fraction(key, n), nvme.tier.low_watermark)},
      {"tiers.nvme.policy", "lru",
       "Eviction policy of NVMe blocks: lru or arc (no prefix order: "
       "the NVMe index does not track parents).",
       KVTIER_CONFIG_SET(Word(key, n, kNvmePolicyNames), nvme.tier.policy)},
      {"tiers.nvme.index_cache", "16MiB", "RAM for the RocksDB block index's cache (its files live in data_dir/index).",
       KVTIER_CONFIG_SET((Bytes(key, n, 1 << 20, 1ull << 40)), nvme.index_cache_bytes)},
      {"tiers.nvme.verify_rate", "0",
       "Most bytes per second kvctl verify reads (a size per second, e.g. 200MiB), so a scrub "
       "of a large tier leaves the disk to fetches and spills; 0: as fast as the disk goes.",
       KVTIER_CONFIG_SET((Bytes(key, n, 0, 1ull << 50)), nvme.tier.verify_bytes_per_s)},
      {"tiers.nvme.quantization", "none",
       "int8 or fp8: blocks of tenants that opted in (security.tenants[].kv_quantization) are "
       "stored on NVMe quantized, one scale per token and head, and dequantized when read back "
       "(lossy: QuantErrorBound); slots are then sized for them (33/64 of a host page), so the "
       "same NVMe holds about twice the blocks, and blocks of other tenants, or of layouts the "
       "kernels cannot quantize (not 2-byte floats, head_dim < 128), do not go to NVMe. none: "
       "full width.",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         KVTIER_ASSIGN_OR_RETURN(std::string s, Word(key, n, WordsOf(kQuantKindNames, "none")));
         c->nvme.mover.quantization.reset();
         if (s != "none") c->nvme.mover.quantization = ValueOf(s, kQuantKindNames);
         return Status::Ok();
       }},
  };
  static const std::vector<ConfigKey> events_keys = {
      {"events.enabled", "false",
       "Publish KV events (BlockStored, BlockRemoved: vLLM's KV event wire form, which "
       "llm-d's indexer and Dynamo's router read) on a ZMQ PUB socket. An events section in "
       "the config turns them on unless it says enabled: false.",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         KVTIER_ASSIGN_OR_RETURN(c->events.enabled, Boolean(key, n));
         c->events.enabled_given = true;
         return Status::Ok();
       }},
      {"events.publish", "\"\"",
       "Endpoint the PUB socket binds (tcp://HOST:PORT, ipc://PATH). Empty (the default): "
       "ipc://DATA_DIR/kv-events.sock, mode 0660 in the socket's group, so only the daemon's "
       "user and the engines' group read the events; name a TCP address to publish to routers "
       "elsewhere (every local user can then subscribe). Not 5557, where vLLM publishes.",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         if (n.IsNull()) return Status::Ok();
         KVTIER_ASSIGN_OR_RETURN(c->events.options.publish, Scalar(key, n));
         return c->events.options.publish.empty() ? Status::Ok() : CheckEndpoint(key, c->events.options.publish);
       }},
      {"events.encoding", "tagged",
       "tagged: each event a map with its type (vLLM since PR #42892, what its current "
       "decoders read); positional: each event an array led by its type (older vLLM and the "
       "routers of that time).",
       KVTIER_CONFIG_SET(Choice(key, n, kKvEventEncodingNames), events.options.encoding)},
      {"events.replay", "\"\"",
       "Endpoint of a ROUTER socket that resends kept messages from a sequence number on "
       "(vLLM's replay socket); empty: none.",
       [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status {
         if (n.IsNull()) return Status::Ok();
         KVTIER_ASSIGN_OR_RETURN(c->events.options.replay, Scalar(key, n));
         return c->events.options.replay.empty() ? Status::Ok() : CheckEndpoint(key, c->events.options.replay);
       }},
      {"events.topic", "kv@{engine}@{model}",
       "Topic of a namespace's messages for each engine attached to it; {engine} (the routable "
       "id the engine declared, else the host name), {host}, {model} (the model id up to its "
       "first '|') and {tenant} are replaced. "
       "Tenants of one model share a topic unless it names {tenant}.",
       KVTIER_CONFIG_SET(Scalar(key, n), events.options.topic)},
      {"events.flush_interval", "50ms", "How often gathered events are sent (a message per topic).",
       KVTIER_CONFIG_SET((Duration(key, n, 1'000'000, 10'000'000'000, false, "in [1ms, 10s]")),
                         events.options.flush_interval_ns)},
      {"events.batch_size", "256", "Most block hashes in one message.",
       KVTIER_CONFIG_SET((Integer<uint32_t>(key, n, 1, 1 << 16)), events.options.batch_size)},
      {"events.message_bytes", "64KiB",
       "Most bytes of block hashes, tokens and extra keys in one message (one block's may exceed it alone): "
       "what a subscriber that stops reading holds is at most events.send_hwm such messages.",
       KVTIER_CONFIG_SET((Bytes(key, n, 4096, 64ull << 20)), events.options.message_bytes)},
      {"events.buffer_events", "100000",
       "Most events waiting to be sent; past it events are dropped and counted "
       "(kvtier_events_dropped_total).",
       KVTIER_CONFIG_SET((Integer<uint32_t>(key, n, 1, 1 << 26)), events.options.queue_events)},
      {"events.buffer_bytes", "64MiB",
       "Most bytes of events waiting to be sent (their hashes, and with events.token_ids their tokens and "
       "extra keys); past it events are dropped and counted as past events.buffer_events. Each tenant's take "
       "at most an equal share of both.",
       KVTIER_CONFIG_SET((Bytes(key, n, 64 * 1024, 1ull << 34)), events.options.queue_bytes)},
      {"events.replay_messages", "10000", "Messages kept for the replay socket.",
       KVTIER_CONFIG_SET((Integer<uint32_t>(key, n, 0, 1 << 22)), events.options.replay_batches)},
      {"events.replay_bytes", "64MiB",
       "Most bytes of messages kept for the replay socket; past it (or events.replay_messages) the oldest "
       "kept message is forgotten.",
       KVTIER_CONFIG_SET((Bytes(key, n, 64 * 1024, 1ull << 34)), events.options.replay_bytes)},
      {"events.send_hwm", "1000",
       "Messages queued for each subscriber (ZMQ_SNDHWM; 64 bytes each, payloads are shared); "
       "a subscriber that falls further behind misses messages (the replay socket has them), "
       "it never slows the daemon.",
       KVTIER_CONFIG_SET((Integer<int>(key, n, 1, 1 << 24)), events.options.send_hwm)},
      {"events.max_subscribers", "64",
       "Most connections to the PUB socket; one past it is shut down when accepted (counted "
       "in kvtier_events_peers_refused_total).",
       KVTIER_CONFIG_SET((Integer<uint32_t>(key, n, 1, 65536)), events.options.max_subscribers)},
      {"events.max_replay_peers", "8", "Most connections to the replay socket; one past it is shut down when accepted.",
       KVTIER_CONFIG_SET((Integer<uint32_t>(key, n, 1, 65536)), events.options.max_replay_peers)},
      {"events.max_peer_share_per_user", "0.25",
       "Of events.max_subscribers and of events.max_replay_peers, the share one local user may "
       "hold over an ipc:// endpoint (by the connection's uid; root and kvtierd's user are not "
       "capped): one past it is shut down when accepted, so a member of the socket's group "
       "cannot take every slot from the routers. 1: no cap but the totals.",
       KVTIER_CONFIG_SET(Fraction(key, n), events.options.max_peer_share_per_user)},
      {"events.token_ids", "false",
       "BlockStored carries each block's token ids and extra keys (vLLM's: LoRA name, image ids, "
       "cache salt), as the engine committed them. Off by default: every subscriber (on a shared "
       "host, every tenant's engines) would read every tenant's prompts and cache salts. Routers "
       "that index by tokens (Dynamo's) need it on.",
       KVTIER_CONFIG_SET(Boolean(key, n), events.options.token_ids)},
      {"events.max_topics_per_tenant", "64",
       "Most topics one tenant's engines hold (a topic per routable id, data-parallel rank and "
       "model; lingering ones count); a Hello past it is refused (ResourceExhausted).",
       KVTIER_CONFIG_SET((Integer<uint32_t>(key, n, 1, 1 << 20)), events.options.max_topics_per_tenant)},
      {"events.topic_linger", "30s",
       "How long a topic lives after its last engine detaches (an engine restarting within it "
       "keeps its announcements); then what it announced is removed (BlockRemoved) and it ends.",
       KVTIER_CONFIG_SET((Duration(key, n, 0, 86'400'000'000'000, true, "in [0, 24h]")),
                         events.options.topic_linger_ns)},
  };
  static const std::vector<ConfigKey> all = [] {
    std::vector<ConfigKey> out = keys;
    for (const LowerTierRow& row : LowerTierRows()) {
      for (const ConfigKey& k : row.keys()) out.push_back(k);
    }
    out.insert(out.end(), events_keys.begin(), events_keys.end());
    return out;
  }();
  return all;
}

}  // namespace kvtier
