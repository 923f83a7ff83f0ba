#include "daemon/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "daemon/config_host.h"
#include "daemon/config_keys.h"
#include "daemon/events/kv_events.h"
#include "daemon/lower_tiers.h"
#include "tests/support/test_util.h"

namespace kvtier {
namespace {

TEST(Config, DefaultYamlParsesToTheDefaults) {
  auto c = ParseConfig(DefaultConfigYaml());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(*c == DaemonConfig{}) << "the printed defaults are not the config's defaults";
  EXPECT_EQ(c->host.capacity_bytes, 1ull << 30);
}

// Each key alone, set to the default the table prints for it, leaves the config at its
// defaults: no key's written default differs from its field's.
TEST(Config, EveryKeysPrintedDefaultIsItsFieldsDefault) {
  size_t checked = 0;
  for (const ConfigKey& k : ConfigKeys()) {
    std::string yaml, indent;
    std::string_view p = k.path;
    for (size_t dot; (dot = p.find('.')) != std::string_view::npos; p.remove_prefix(dot + 1)) {
      yaml += indent + std::string(p.substr(0, dot)) + ":\n";
      indent += "  ";
    }
    yaml += indent + std::string(p) + ": " + std::string(k.fallback) + "\n";
    auto c = ParseConfig(yaml);
    ASSERT_TRUE(c.ok()) << k.path << ": " << c.status().ToString();
    DaemonConfig expected;
    // An events section means events, unless it says otherwise (docs/operations.md).
    if (k.path.starts_with("events.") && k.path != "events.enabled") expected.events.enabled = true;
    EXPECT_TRUE(*c == expected) << k.path << ": " << k.fallback << " is not its field's default";
    ++checked;
  }
  EXPECT_EQ(checked, ConfigKeys().size());
  EXPECT_GE(checked, 72u);
}

TEST(Config, DefaultYamlHasACommentForEveryKey) {
  std::istringstream in(DefaultConfigYaml());
  std::string line, prev;
  int keys = 0;
  while (std::getline(in, line)) {
    const size_t first = line.find_first_not_of(' ');
    const bool is_value = first != std::string::npos && line[first] != '#' && line.find(": ") != std::string::npos;
    if (is_value) {
      ++keys;
      EXPECT_NE(prev.find('#'), std::string::npos) << "no comment above '" << line << "'";
    }
    prev = line;
  }
  EXPECT_GE(keys, 17);
}

TEST(Config, EmptyConfigIsTheDefault) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->host.capacity_bytes, 1ull << 30);
}

TEST(Config, UnknownKeysAreNamed) {
  auto c = ParseConfig("tiers:\n  host:\n    capasity: 1GiB\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("'tiers.host.capasity'"), std::string::npos) << c.status().message();
  auto top = ParseConfig("sockett:\n  path: x\n");
  ASSERT_FALSE(top.ok());
  EXPECT_NE(top.status().message().find("'sockett'"), std::string::npos);
}

TEST(Config, BadValuesNameTheKeyAndSayWhy) {
  struct Case {
    const char* yaml;
    const char* key;
  } cases[] = {
      {"tiers:\n  host:\n    capacity: lots\n", "tiers.host.capacity"},
      {"tiers:\n  host:\n    high_watermark: 1.5\n", "tiers.host.high_watermark"},
      {"tiers:\n  host:\n    low_watermark: 0.9\n", "tiers.host.low_watermark"},
      {"tiers:\n  host:\n    allocation_headroom: -1\n", "tiers.host.allocation_headroom"},
      {"tiers:\n  gpu:\n    allocation_headroom: lots\n", "tiers.gpu.allocation_headroom"},
      {"metrics:\n  port: 70000\n", "metrics.port"},
      {"log_level: loud\n", "log_level"},
      {"tiers:\n  host:\n    huge_pages: sometimes\n", "tiers.host.huge_pages"},
      {"tiers:\n  host:\n    capacity: 300MiB\n", "tiers.host.capacity"},  // not a multiple of 256 MiB
      {"tiers:\n  host:\n    page_bytes: 3000\n", "tiers.host.page_bytes"},
      {"protocol:\n  max_frame_bytes: [1, 2]\n", "protocol.max_frame_bytes"},
      {"socket: /tmp/x.sock\n", "socket"},
      {"socket:\n  path: \"@kvtier\"\n", "socket.path"},
      {"socket:\n  mode: \"0666\"\n", "socket.mode"},
      {"socket:\n  mode: \"0060\"\n", "socket.mode"},
      {"socket:\n  mode: rw\n", "socket.mode"},
      {"protocol:\n  heartbeat_ttl: 30\n", "protocol.heartbeat_ttl"},
      {"protocol:\n  heartbeat_ttl: 10ms\n", "protocol.heartbeat_ttl"},
      {"security:\n  allow_unknown: maybe\n", "security.allow_unknown"},
      {"security:\n  max_leased_share: 0\n", "security.max_leased_share"},
      {"security:\n  max_leased_share: half\n", "security.max_leased_share"},
      {"security:\n  admin_uids: [root]\n", "security.admin_uids[0]"},
      {"security:\n  tenants: [{name: \"a b\", uids: [1]}]\n", "security.tenants[0].name"},
      {"security:\n  tenants: [{name: a}]\n", "security.tenants[0]"},
      {"security:\n  tenants: [{name: a, uids: [1], colour: red}]\n", "security.tenants[0].colour"},
      {"security:\n  tenants: [{name: a, uids: [1], quota: {disk: 1GiB}}]\n", "security.tenants[0].quota.disk"},
      {"security:\n  tenants: [{name: a, uids: [1], quota: {host: lots}}]\n", "security.tenants[0].quota.host"},
      {"security:\n  tenants: [{name: a, uids: [1]}, {name: a, uids: [2]}]\n", "security.tenants[1].name"},
      {"security:\n  tenants: [{name: a, uids: [1]}, {name: b, uids: [1]}]\n", "security.tenants[1].uids"},
      {"security:\n  tenants: [{name: a, uids: [1], quota: {host: 1GiB}, reserve: {host: 2GiB}}]\n",
       "security.tenants[0].reserve.host"},
      // Reserves beyond the host tier's low watermark (0.75 of 1 GiB) could never be kept.
      {"security:\n  tenants: [{name: a, uids: [1], reserve: {host: 512MiB}}, {name: b, uids: [2], reserve: {host: "
       "512MiB}}]\n",
       "security.tenants"},
      {"security:\n  unknown_quota: {host: 1GiB, ssd: 1}\n", "security.unknown_quota.ssd"},
      // Limits the daemon could not keep are refused, not silently ignored: NVMe and remote
      // quotas of unknown tenants, remote reserves (the cluster evicts on its own), NVMe
      // reserves without an NVMe tier to hold them.
      {"security:\n  unknown_quota: {nvme: 1GiB}\n", "security.unknown_quota"},
      {"security:\n  unknown_quota: {remote: 1GiB}\n", "security.unknown_quota"},
      {"security:\n  tenants: [{name: a, uids: [1], reserve: {remote: 1GiB}}]\n", "reserve.remote"},
      {"security:\n  tenants: [{name: a, uids: [1], reserve: {nvme: 1GiB}}]\n", "nvme reserves"},
      {"security:\n  tenants: [{name: a, uids: [1], quota: {nvme: 1GiB}, reserve: {nvme: 2GiB}}]\n",
       "security.tenants[0].reserve.nvme"},
      {"tiers:\n  remote: {nodes: ['127.0.0.1']}\n", "tiers.remote.nodes[0]"},
      {"tiers:\n  remote: {nodes: ['127.0.0.1:6379'], write_policy: always}\n", "tiers.remote.write_policy"},
      {"tiers:\n  remote: {nodes: ['127.0.0.1:6379'], timeout: 0}\n", "tiers.remote.timeout"},
      {"tiers:\n  host: {enabled: false}\n  gpu: {enabled: true}\n  remote: {nodes: ['127.0.0.1:6379']}\n",
       "tiers.remote.nodes"},
      {"tiers:\n  nvme: {quantization: int4}\n", "tiers.nvme.quantization"},
      {"security:\n  tenants: [{name: a, uids: [1], kv_quantization: maybe}]\n", "security.tenants[0].kv_quantization"},
      {"security:\n  unknown_kv_quantization: 2\n", "security.unknown_kv_quantization"},
      {"tiers:\n  nvme:\n    files: [{path: /x, capacity: 1GiB, preallocate: sometimes}]\n",
       "tiers.nvme.files[0].preallocate"},
      {"events: {publish: 'localhost:5557'}\n", "events.publish"},
      {"events: {publish: 'tcp://127.0.0.1:5590', replay: 'tcp://127.0.0.1:5590'}\n", "events.replay"},
      {"events: {encoding: msgpack}\n", "events.encoding"},
      {"events: {flush_interval: 0}\n", "events.flush_interval"},
      {"events: {batch_size: 0}\n", "events.batch_size"},
      {"events: {topic: ''}\n", "events.topic"},
      {"events: {publish: 'tcp://127.0.0.1:99999'}\n", "events.publish"},
      {"events: {publish: 'tcp://127.0.0.1'}\n", "events.publish"},
      {"events: {replay: 'tcp://127.0.0.1:0x10'}\n", "events.replay"},
      // A section switched off is still checked: switching it on later must not be when
      // its mistakes show.
      {"events: {enabled: false, topic: ''}\n", "events.topic"},
      {"events: {enabled: false, publish: 'tcp://127.0.0.1:5590', replay: 'tcp://127.0.0.1:5590'}\n", "events.replay"},
      {"events: {enabled: false, publish: 'tcp://127.0.0.1:99999'}\n", "events.publish"},
      {"metrics:\n  stall_timeout: 10ms\n", "metrics.stall_timeout"},
      {"tiers: {remote: {nodes: ['127.0.0.1:1'], key_prefix: '{kv}:'}}\n", "tiers.remote.key_prefix"},
  };
  for (const Case& c : cases) {
    auto r = ParseConfig(c.yaml);
    ASSERT_FALSE(r.ok()) << c.yaml;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.key), std::string::npos)
        << "message '" << r.status().message() << "' does not name " << c.key;
  }
}

TEST(Config, ValuesParse) {
  auto c = ParseConfig(
      "socket:\n  path: /run/kvtier/kvtierd.sock\n"
      "tiers:\n  host:\n    capacity: 4GiB\n    page_bytes: 1MiB\n    huge_pages: off\n"
      "metrics:\n  port: 0\n"
      "log_level: debug\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.socket_path, "/run/kvtier/kvtierd.sock");
  EXPECT_EQ(c->host.capacity_bytes, 4ull << 30);
  EXPECT_EQ(c->host.page_bytes, 1ull << 20);
  EXPECT_EQ(c->host.huge_pages, HugePages::kOff);
  EXPECT_EQ(c->metrics_port, 0);
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
  auto sparse = ParseConfig(
      "tiers:\n  nvme:\n    files: [{path: /a, capacity: 1GiB}, {path: /b, capacity: 1GiB, preallocate: false}]\n");
  ASSERT_TRUE(sparse.ok()) << sparse.status().ToString();
  ASSERT_EQ(sparse->nvme.tier.files.size(), 2u);
  EXPECT_TRUE(sparse->nvme.tier.files[0].preallocate);
  EXPECT_FALSE(sparse->nvme.tier.files[1].preallocate);
}

TEST(Config, SecurityKeysParse) {
  auto c = ParseConfig(
      "socket:\n  group: kvtier\n  mode: \"0600\"\n"
      "protocol:\n  heartbeat_ttl: 1500ms\n"
      "tiers:\n  nvme: {files: [{path: /tmp/x, capacity: 8GiB}], quantization: fp8}\n"
      "  remote: {nodes: ['10.0.0.5:7000', '[::1]:7001'], write_policy: write_back, timeout: 250ms}\n"
      "security:\n  allow_unknown: false\n  admin_uids: [1000, 1001]\n"
      "  unknown_quota: {host: 64MiB}\n"
      "  tenants:\n"
      "    - {name: org_a, uids: [2000, 2001], quota: {host: 256MiB, gpu: 1GiB, nvme: 4GiB, remote: 8GiB},\n"
      "       reserve: {host: 64MiB, nvme: 1GiB}, kv_quantization: true}\n"
      "    - {name: org-b.prod, gids: [3000]}\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->socket_group, "kvtier");
  EXPECT_EQ(c->server.socket_mode, 0600u);
  EXPECT_EQ(c->server.heartbeat_ttl_ns, 1'500'000'000);
  EXPECT_FALSE(c->security.allow_unknown);
  EXPECT_EQ(c->security.admin_uids, (std::vector<uint32_t>{1000, 1001}));
  EXPECT_EQ(c->security.unknown_quota[TierIndex(TierKind::kHost)], 64ull << 20);
  ASSERT_EQ(c->security.tenants.size(), 2u);
  const TenantConfig& a = c->security.tenants[0];
  EXPECT_EQ(a.name, "org_a");
  EXPECT_EQ(a.uids, (std::vector<uint32_t>{2000, 2001}));
  EXPECT_EQ(a.quota[TierIndex(TierKind::kHost)], 256ull << 20);
  EXPECT_EQ(a.quota[TierIndex(TierKind::kGpu)], 1ull << 30);
  EXPECT_EQ(a.quota[TierIndex(TierKind::kNvme)], 4ull << 30);
  EXPECT_EQ(a.quota[TierIndex(TierKind::kRemote)], 8ull << 30);
  EXPECT_EQ(a.reserve[TierIndex(TierKind::kHost)], 64ull << 20);
  EXPECT_EQ(a.reserve[TierIndex(TierKind::kNvme)], 1ull << 30);
  EXPECT_EQ(c->security.tenants[1].gids, (std::vector<uint32_t>{3000}));
  EXPECT_EQ(c->lower.Get<RemoteTierConfig>().tier.cluster.seeds,
            (std::vector<std::string>{"10.0.0.5:7000", "[::1]:7001"}));
  EXPECT_TRUE(a.kv_quantization);
  EXPECT_FALSE(c->security.tenants[1].kv_quantization) << "tenants are not quantized unless they opt in";
  EXPECT_FALSE(c->security.unknown_kv_quantization);
  EXPECT_EQ(c->nvme.mover.quantization, QuantKind::kFp8E4M3);
  // A quantized tier's slots: 33/64 of a page, in 4 KiB.
  EXPECT_EQ(NvmeSlotBytes(*c), 33ull << 15);  // 2 MiB pages -> 1056 KiB
  DaemonConfig full;
  EXPECT_EQ(NvmeSlotBytes(full), full.host.page_bytes);
  EXPECT_EQ(c->lower.Get<RemoteTierConfig>().mover.write_policy, WritePolicy::kWriteBack);
  EXPECT_EQ(c->lower.Get<RemoteTierConfig>().tier.cluster.timeout_ns, 250'000'000);
  EXPECT_TRUE(c->lower.Get<RemoteTierConfig>().enabled());
  EXPECT_FALSE(DaemonConfig{}.lower.Get<RemoteTierConfig>().enabled());
  // The defaults: anyone may connect, as their own tenant; no TTL.
  DaemonConfig d;
  EXPECT_TRUE(d.security.allow_unknown);
  EXPECT_EQ(d.server.socket_mode, 0660u);
  EXPECT_EQ(d.server.heartbeat_ttl_ns, 0);
}

// Events are off by default; an events section turns them on unless it says otherwise.
TEST(Config, AnEventsSectionMeansEvents) {
  EXPECT_FALSE(ParseConfig("")->events.enabled);
  auto on = ParseConfig("events: {publish: 'tcp://127.0.0.1:6000', topic: 'kv@{host}@{model}-{tenant}'}\n");
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  EXPECT_TRUE(on->events.enabled);
  EXPECT_EQ(on->events.options.publish, "tcp://127.0.0.1:6000");
  EXPECT_EQ(on->events.options.topic, "kv@{host}@{model}-{tenant}");
  auto off = ParseConfig("events: {enabled: false, publish: 'tcp://127.0.0.1:6000'}\n");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->events.enabled);
  EXPECT_FALSE(ParseConfig(DefaultConfigYaml())->events.enabled);
}

TEST(Config, InvalidYamlIsAnError) {
  auto c = ParseConfig("tiers: [unclosed\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("YAML"), std::string::npos);
}

TEST(Config, MissingFileNamesThePath) {
  auto c = ReadConfigFile("/nonexistent/kvtierd.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/nonexistent/kvtierd.yaml"), std::string::npos);
}

// A ConfigMap mounted without subPath makes the config path a directory: refused by name,
// never read as empty (which would be the embedded defaults).
TEST(Config, AConfigPathThatIsNotARegularFileIsRefused) {
  auto c = ReadConfigFile("/tmp");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("/tmp is not a regular file but a directory"), std::string::npos)
      << c.status().ToString();
  EXPECT_FALSE(ReadConfigFile("/dev/null").ok());
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

TEST(ConfigOnHost, APoolOverTheMemoryLimitIsRefusedNamingTheLimitUnlessOvercommitted) {
  DaemonConfig c;
  c.host.capacity_bytes = 2ull << 30;
  HostMemory m;
  m.limit_bytes = 1ull << 30;
  m.limit_source = "/sys/fs/cgroup/kvtier.slice/memory.max";
  m.available_bytes = 512ull << 20;
  std::vector<std::string> warnings;
  Status st = CheckConfigOnHost(c, m, &warnings);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tiers.host.capacity"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("memory.max"), std::string::npos) << st.message();
  c.host.overcommit = true;
  EXPECT_TRUE(CheckConfigOnHost(c, m, &warnings).ok());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("available"), std::string::npos);
  // Within both: no error, no warning.
  c.host.overcommit = false;
  c.host.capacity_bytes = 256ull << 20;
  warnings.clear();
  EXPECT_TRUE(CheckConfigOnHost(c, m, &warnings).ok());
  EXPECT_TRUE(warnings.empty());
  // Unknown memory (no /proc): nothing to compare against.
  c.host.capacity_bytes = 1ull << 44;
  EXPECT_TRUE(CheckConfigOnHost(c, HostMemory{}, nullptr).ok());
}

// The remote tier's secrets: files kvtierd alone may read, a secret long enough; no secret
// is a warning naming the risk, and so is no node_name (the host name stands in).
TEST(ConfigOnHost, RemoteSecretFilesAreCheckedAndTheirAbsenceWarned) {
  testing::TempDir dir;
  auto file = [&](const std::string& name, const std::string& text, mode_t mode) {
    std::ofstream(dir.File(name)) << text;
    ::chmod(dir.File(name).c_str(), mode);
    return dir.File(name);
  };
  DaemonConfig c;
  c.lower.Mutable<RemoteTierConfig>().tier.cluster.seeds = {"127.0.0.1:1"};
  std::vector<std::string> warnings;
  ASSERT_TRUE(CheckConfigOnHost(c, HostMemory{}, &warnings).ok());
  ASSERT_EQ(warnings.size(), 2u);
  // The host name stands in for node_name: clones of one image share it.
  EXPECT_NE(warnings[0].find("node_name is not set"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find(NodeName(c)), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("tiers.remote.secret_file is not set"), std::string::npos) << warnings[1];
  c.node_name = "node-7";
  warnings.clear();
  ASSERT_TRUE(CheckConfigOnHost(c, HostMemory{}, &warnings).ok());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("tiers.remote.secret_file is not set"), std::string::npos) << warnings[0];
  auto refused = [&](const std::string& key) {
    Status st = CheckConfigOnHost(c, HostMemory{}, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(key), std::string::npos) << st.message();
    return st.message();
  };
  c.lower.Mutable<RemoteTierConfig>().secret_file = file("open", std::string(40, 's'), 0644);
  EXPECT_NE(refused("tiers.remote.secret_file").find("chmod 600"), std::string::npos);
  c.lower.Mutable<RemoteTierConfig>().secret_file = file("short", "0123456789", 0600);
  EXPECT_NE(refused("tiers.remote.secret_file").find("at least 32"), std::string::npos);
  c.lower.Mutable<RemoteTierConfig>().secret_file = dir.File("missing");
  refused("tiers.remote.secret_file");
  c.lower.Mutable<RemoteTierConfig>().secret_file = file("good", std::string(40, 's') + "\n", 0400);
  warnings.clear();
  EXPECT_TRUE(CheckConfigOnHost(c, HostMemory{}, &warnings).ok());
  EXPECT_TRUE(warnings.empty());
  c.lower.Mutable<RemoteTierConfig>().tier.cluster.username = "kvtierd";
  refused("tiers.remote.username");
  c.lower.Mutable<RemoteTierConfig>().password_file = file("pw", "", 0600);
  EXPECT_NE(refused("tiers.remote.password_file").find("empty"), std::string::npos);
  c.lower.Mutable<RemoteTierConfig>().password_file = file("pw2", "hunter2\n", 0600);
  EXPECT_TRUE(CheckConfigOnHost(c, HostMemory{}, nullptr).ok());
  auto pw = ReadSecretFile("k", c.lower.Mutable<RemoteTierConfig>().password_file);
  ASSERT_TRUE(pw.ok());
  EXPECT_EQ(*pw, "hunter2");
  // Another user's file is not kvtierd's secret, whatever its mode.
  if (::geteuid() == 0) {
    const std::string theirs = file("theirs", std::string(40, 's'), 0600);
    ASSERT_EQ(::chown(theirs.c_str(), 41005, 41005), 0);
    c.lower.Mutable<RemoteTierConfig>().secret_file = theirs;
    EXPECT_NE(refused("tiers.remote.secret_file").find("belongs to uid 41005"), std::string::npos);
  }
  // A remote section with no nodes is validated too.
  c.lower.Mutable<RemoteTierConfig>().tier.cluster.seeds.clear();
  c.lower.Mutable<RemoteTierConfig>().secret_file = dir.File("missing");
  refused("tiers.remote.secret_file");
}

// Events on: an ipc path another publisher holds is refused naming the key, a TCP bind on
// every interface is a warning naming it; events off: neither is looked at (nothing binds).
TEST(ConfigOnHost, EventEndpointsInUseAreRefusedAndWildcardsWarned) {
  testing::TempDir dir;
  KvEventsOptions held;
  held.publish = "ipc://" + dir.File("held.sock");
  auto holder = KvEvents::Open(held);
  ASSERT_TRUE(holder.ok()) << holder.status().ToString();
  DaemonConfig c;
  c.events.enabled = true;
  c.events.options.publish = "ipc://" + dir.File("free.sock");
  c.events.options.replay = held.publish;
  std::vector<std::string> warnings;
  Status st = CheckConfigOnHost(c, HostMemory{}, &warnings);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("events.replay"), std::string::npos) << st.message();
  c.events.enabled = false;
  EXPECT_TRUE(CheckConfigOnHost(c, HostMemory{}, &warnings).ok());
  c.events.enabled = true;
  c.events.options.replay = "";
  c.security.allow_unknown = false;  // one tenant, none unknown: only the wildcards warn
  c.security.tenants = {TenantConfig{.name = "only", .uids = {1000}}};
  for (const std::string wildcard : {"tcp://*:5590", "tcp://0.0.0.0:5590", "tcp://[::]:5590"}) {
    c.events.options.publish = wildcard;
    warnings.clear();
    ASSERT_TRUE(CheckConfigOnHost(c, HostMemory{}, &warnings).ok());
    ASSERT_EQ(warnings.size(), 1u) << wildcard;
    EXPECT_NE(warnings[0].find("events.publish '" + wildcard + "' listens on every interface"), std::string::npos)
        << warnings[0];
  }
  c.events.options.publish = "tcp://127.0.0.1:5590";
  warnings.clear();
  EXPECT_TRUE(CheckConfigOnHost(c, HostMemory{}, &warnings).ok());
  EXPECT_TRUE(warnings.empty());
  // Several tenants (unknown users are tenants of their own): any TCP endpoint warns, the
  // default (an ipc socket in data_dir, the socket group's) does not.
  c.security.allow_unknown = true;
  ASSERT_TRUE(CheckConfigOnHost(c, HostMemory{}, &warnings).ok());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("several tenants"), std::string::npos) << warnings[0];
  c.events.options.publish = "";
  c.data_dir = dir.path();
  warnings.clear();
  EXPECT_TRUE(CheckConfigOnHost(c, HostMemory{}, &warnings).ok());
  EXPECT_TRUE(warnings.empty()) << warnings[0];
}

TEST(ConfigOnHost, ReadsAMemoryLimitOnThisMachine) {
  const HostMemory m = ReadHostMemory();
  ASSERT_TRUE(m.limit_bytes.has_value());
  EXPECT_GT(*m.limit_bytes, 0u);
  EXPECT_FALSE(m.limit_source.empty());
}

}  // namespace
}  // namespace kvtier
