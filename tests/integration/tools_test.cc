// kvtierd and kvctl as an operator runs them: flags, default config, errors, JSON.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/integration/engine_process.h"

namespace kvtier::testing {
namespace {

TEST(Kvtierd, VersionAndDefaultConfig) {
  CmdResult v = Sh(BinaryPath("kvtierd") + " --version");
  EXPECT_EQ(v.code, 0);
  EXPECT_NE(v.out.find("kvtierd 0."), std::string::npos);
  CmdResult d = Sh(BinaryPath("kvtierd") + " --print-default-config");
  EXPECT_EQ(d.code, 0);
  EXPECT_NE(d.out.find("capacity: 1GiB"), std::string::npos);
  // What it prints is a valid config for --check-config.
  TempDir dir;
  std::ofstream(dir.File("d.yaml")) << d.out;
  CmdResult c = Sh(BinaryPath("kvtierd") + " --check-config --config " + dir.File("d.yaml"));
  EXPECT_EQ(c.code, 0) << c.out;
}

// docs/operations.md's config reference is --print-default-config, key for key: every key
// with its default, and no key the daemon does not have.
TEST(Kvtierd, TheOperationsGuideDocumentsEveryConfigKeyWithItsDefault) {
  CmdResult d = Sh(BinaryPath("kvtierd") + " --print-default-config");
  ASSERT_EQ(d.code, 0);
  std::map<std::string, std::string> keys;            // dotted path -> default as printed
  std::vector<std::pair<size_t, std::string>> stack;  // (indent, section)
  std::istringstream in(d.out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos || line[indent] == '#') continue;
    const size_t colon = line.find(':', indent);
    if (colon == std::string::npos) continue;
    while (!stack.empty() && stack.back().first >= indent) stack.pop_back();
    const std::string key = line.substr(indent, colon - indent);
    const std::string value = colon + 1 < line.size() ? line.substr(line.find_first_not_of(' ', colon + 1)) : "";
    if (value.empty()) {
      stack.emplace_back(indent, key);
      continue;
    }
    std::string path;
    for (const auto& [i, s] : stack) path += s + ".";
    keys[path + key] = value;
  }
  ASSERT_GE(keys.size(), 30u);
  std::ifstream f(std::string(KVTIER_SOURCE_DIR) + "/docs/operations.md");
  std::stringstream doc;
  doc << f.rdbuf();
  const std::string text = doc.str();
  for (const auto& [k, v] : keys) {
    EXPECT_NE(text.find("| `" + k + "` | `" + v + "` |"), std::string::npos)
        << "docs/operations.md lacks the row for " << k << " (default " << v << ")";
  }
  // Rows for keys that no longer exist.
  std::istringstream rows(text);
  int documented = 0;
  while (std::getline(rows, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    const std::string k = line.substr(3, line.find('`', 3) - 3);
    if (k.find('.') == std::string::npos && k != "data_dir" && k != "log_level" && k != "node_name") continue;
    if (k.find(' ') != std::string::npos) continue;
    ++documented;
    EXPECT_TRUE(keys.count(k)) << "docs/operations.md documents '" << k << "', which kvtierd does not have";
  }
  EXPECT_EQ(documented, static_cast<int>(keys.size()));
}

TEST(Kvtierd, BadConfigIsRefusedAtStartNamingTheKey) {
  TempDir dir;
  std::ofstream(dir.File("bad.yaml")) << "tiers:\n  host:\n    capacity: 1GiB\n    hugepages: on\n";
  CmdResult r = Sh(BinaryPath("kvtierd") + " --config " + dir.File("bad.yaml"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("tiers.host.hugepages"), std::string::npos) << r.out;
  std::ofstream(dir.File("bad2.yaml")) << "metrics:\n  port: many\n";
  r = Sh(BinaryPath("kvtierd") + " --config " + dir.File("bad2.yaml"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("metrics.port"), std::string::npos) << r.out;
}

// Configs that parse but cannot work on this machine are refused before anything is
// created, at start and by --check-config alike, naming the key.
struct Refused {
  std::string yaml;
  std::string key;  // named in the message
  std::string why;  // a phrase of the message
};

// `yaml` is the whole config.
void ExpectWholeConfigRefused(const TempDir& dir, const std::string& yaml, const std::string& key,
                              const std::string& why) {
  std::ofstream(dir.File("c.yaml")) << yaml;
  for (const std::string flags : {"", "--check-config "}) {
    CmdResult c = Sh("timeout 20 " + BinaryPath("kvtierd") + " " + flags + "--config " + dir.File("c.yaml"));
    EXPECT_NE(c.code, 0) << flags << yaml << c.out;
    EXPECT_NE(c.code, 124) << "it started: " << yaml;
    EXPECT_NE(c.out.find(key), std::string::npos) << c.out;
    EXPECT_NE(c.out.find(why), std::string::npos) << c.out;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.File("var"))) << "a refused config created data_dir";
}

void ExpectRefusedAtStartAndByCheck(const TempDir& dir, const Refused& r) {
  ExpectWholeConfigRefused(
      dir,
      "socket: {path: " + dir.File("s.sock") + "}\ndata_dir: " + dir.File("var") + "\nmetrics: {port: -1}\n" + r.yaml,
      r.key, r.why);
}

TEST(Kvtierd, TheSameNvmeFileTwiceIsRefusedHoweverItIsSpelled) {
  TempDir dir;
  const std::string a = dir.File("slots0");
  ASSERT_EQ(::symlink(a.c_str(), dir.File("link").c_str()), 0);
  const std::string rel = std::filesystem::relative(a).string();  // the cwd's spelling
  for (const std::string& second : {a, dir.path() + "/./slots0", dir.File("link"), rel}) {
    ExpectRefusedAtStartAndByCheck(dir, {"tiers:\n  host: {capacity: 16MiB, page_bytes: 1MiB, segment_bytes: 16MiB}\n"
                                         "  nvme:\n    files: [{path: " +
                                             a + ", capacity: 16MiB}, {path: " + second + ", capacity: 16MiB}]\n",
                                         "tiers.nvme.files[1].path", "same file"});
  }
  std::ofstream(a) << "";  // an existing file, by inode
  ExpectRefusedAtStartAndByCheck(dir,
                                 {"tiers:\n  host: {capacity: 16MiB, page_bytes: 1MiB, segment_bytes: 16MiB}\n"
                                  "  nvme:\n    files: [{path: " +
                                      dir.File("link") + ", capacity: 16MiB}, {path: " + a + ", capacity: 16MiB}]\n",
                                  "tiers.nvme.files[1].path", "same file"});
}

TEST(Kvtierd, AnNvmeFileInADirectoryThatDoesNotExistIsRefused) {
  TempDir dir;
  ExpectRefusedAtStartAndByCheck(dir, {"tiers:\n  host: {capacity: 16MiB, page_bytes: 1MiB, segment_bytes: 16MiB}\n"
                                       "  nvme:\n    files: [{path: " +
                                           dir.File("no/such/dir/slots0") + ", capacity: 16MiB}]\n",
                                       "tiers.nvme.files[0].path", dir.File("no/such/dir")});
  EXPECT_FALSE(std::filesystem::exists(dir.File("no"))) << "the daemon created the missing directory";
}

// Each of these passed --check-config and then failed at start (or started on a config
// that could not do what it said): both refuse it now, naming the key.
TEST(Kvtierd, CheckConfigRunsEveryCheckStartRuns) {
  TempDir dir;
  std::ofstream(dir.File("a_file")) << "not a directory\n";
  const std::string host = "tiers:\n  host: {capacity: 16MiB, page_bytes: 1MiB, segment_bytes: 16MiB";
  const std::vector<Refused> refused = {
      {host + ", policy: random}\n", "tiers.host.policy", "is not lru, prefix-lru"},
      {host + ", enabled: false}\n", "tiers.host.enabled", "no tier is enabled"},
      {host + "}\n  nvme: {files: [{path: " + dir.File("slots0") + ", capacity: 16896KiB}]}\n",
       "tiers.nvme.files[0].capacity", "not a whole number of slots"},
      {host + "}\n  nvme: {files: [{path: " + dir.File("slots0") + ", capacity: 16MiB}], policy: clock}\n",
       "tiers.nvme.policy", "is not lru or arc"},
      {host + "}\nprotocol: {max_sessions: 8, admin_sessions: 8}\n", "protocol.admin_sessions", "below"},
      // A key given twice: YAML keeps the last one silently; kvtierd refuses.
      {"tiers:\n  host:\n    capacity: 64MiB\n    capacity: 128MiB\n", "tiers.host.capacity", "given twice"},
  };
  for (const Refused& r : refused) ExpectRefusedAtStartAndByCheck(dir, r);
  // Keys the helper writes itself.
  const std::string sock = "socket: {path: " + dir.File("s.sock");
  const std::string rest = "data_dir: " + dir.File("var") + "\n" + host + "}\n";
  ExpectWholeConfigRefused(dir, sock + ", group: no-such-group-kvtier}\nmetrics: {port: -1}\n" + rest, "socket.group",
                           "no group");
  ExpectWholeConfigRefused(dir, sock + "}\nmetrics: {listen: 999.1.1.1, port: 0}\n" + rest, "metrics.listen",
                           "not an IPv4 or IPv6 address");
  ExpectWholeConfigRefused(dir, sock + "}\nmetrics: {port: -1}\ndata_dir: " + dir.File("a_file") + "\n" + host + "}\n",
                           "data_dir", "is not a directory");
  // A socket path longer than a sockaddr_un holds.
  const std::string long_path = dir.path() + "/" + std::string(125 - dir.path().size() - 1, 's');
  ASSERT_EQ(long_path.size(), 125u);
  ExpectWholeConfigRefused(dir, "socket: {path: " + long_path + "}\nmetrics: {port: -1}\n" + rest, "socket.path",
                           "at most 107");
}

uint64_t MemTotalBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024;
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

TEST(Kvtierd, AHostPoolLargerThanMemoryIsRefusedUnlessOvercommitted) {
  const uint64_t total = MemTotalBytes();
  ASSERT_GT(total, 0u);
  // The next whole GiB above the machine's memory, in 1 GiB segments (sparse memfds).
  const uint64_t gib = (total >> 30) + 1;
  const std::string pool =
      "tiers:\n  host: {capacity: " + std::to_string(gib) + "GiB, segment_bytes: 1GiB, huge_pages: off";
  TempDir dir;
  ExpectRefusedAtStartAndByCheck(dir, {pool + "}\n", "tiers.host.capacity", "OOM"});
  // A host-emulated GPU pool lives in RAM too: the two together count.
  const uint64_t half = gib / 2 + 1;
  ExpectRefusedAtStartAndByCheck(dir, {"tiers:\n  host: {capacity: " + std::to_string(half) +
                                           "GiB, segment_bytes: 1GiB, huge_pages: off}\n"
                                           "  gpu: {enabled: true, backend: host-emulated, capacity: " +
                                           std::to_string(half) + "GiB, segment_bytes: 1GiB}\n",
                                       "tiers.host.capacity", "host-emulated"});
  // With the operator's say-so it starts (and warns).
  DaemonProcess::Options o;
  o.host_capacity = std::to_string(gib) + "GiB";
  o.segment_bytes = "1GiB";
  o.host_yaml = "    huge_pages: off\n    overcommit: true\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  EXPECT_NE(d.Log().find("more than is available"), std::string::npos) << d.Log();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// Two daemons given one ipc:// events path: ZMQ's bind would let the second take over the
// first's stream (its subscribers then read the second's). --check-config and the start of
// the second refuse it naming the key, and the first keeps publishing there. A TCP
// endpoint on every interface is said (a warning), not refused.
TEST(Kvtierd, EventEndpointsInUseAreRefusedAndAWildcardBindIsSaid) {
  TempDir dir;
  const std::string ipc = dir.File("events.ipc");
  DaemonProcess::Options o;
  o.extra_yaml = "events: {publish: 'ipc://" + ipc + "'}\n";
  DaemonProcess first(o);
  ASSERT_TRUE(first.Start().ok()) << first.Log();
  ExpectRefusedAtStartAndByCheck(
      dir, {"events: {publish: 'ipc://" + ipc + "'}\n", "events.publish", "another process publishes there"});
  // Switched off, the section binds nothing, so nothing is in use.
  std::ofstream(dir.File("off.yaml")) << "socket: {path: " << dir.File("s.sock") << "}\ndata_dir: " << dir.File("var")
                                      << "\nevents: {enabled: false, publish: 'ipc://" << ipc << "'}\n";
  CmdResult off = Sh(BinaryPath("kvtierd") + " --check-config --config " + dir.File("off.yaml"));
  EXPECT_EQ(off.code, 0) << off.out;
  std::ofstream(dir.File("wild.yaml")) << "socket: {path: " << dir.File("s.sock") << "}\ndata_dir: " << dir.File("var")
                                       << "\nevents: {publish: 'tcp://0.0.0.0:5590'}\n";
  CmdResult wild = Sh(BinaryPath("kvtierd") + " --check-config --config " + dir.File("wild.yaml"));
  EXPECT_EQ(wild.code, 0) << wild.out;
  EXPECT_NE(wild.out.find("events.publish 'tcp://0.0.0.0:5590' listens on every interface"), std::string::npos)
      << wild.out;
  // The first still listens on its path (the refused starts neither bound nor removed it).
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, ipc.data(), ipc.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
  ::close(fd);
  EXPECT_EQ(first.Stop(), 0) << first.Log();
}

TEST(Kvtierd, SecondDaemonOnTheSameSocketIsRefused) {
  DaemonProcess first;
  ASSERT_TRUE(first.Start().ok()) << first.Log();
  CmdResult r = Sh(BinaryPath("kvtierd") + " --config " + first.config_path());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("another kvtierd"), std::string::npos) << r.out;
  // The first one still serves.
  auto c = ControlClient::Connect(ControlOptions(first.socket_path()));
  EXPECT_TRUE(c.ok());
  EXPECT_EQ(first.Stop(), 0);
}

// An engine name is the peer's text: a control character in it (a terminal escape, a
// newline that would forge a log line) reaches kvtierd's log and kvctl's tables escaped.
TEST(Kvctl, APeersControlCharactersAreShownEscapedNeverRaw) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok()) << daemon.Log();
  auto c = Client::Connect(EngineOptions(daemon.socket_path(), "evil\x1b[2J\n<3>kvtierd: forged"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (const char* args : {" sessions", " top --iterations 1", " --json sessions"}) {
    CmdResult r = Sh(BinaryPath("kvctl") + args + " -s " + daemon.socket_path());
    ASSERT_EQ(r.code, 0) << args << r.out;
    const size_t at = r.out.find("evil");
    ASSERT_NE(at, std::string::npos) << args << r.out;
    const std::string shown = r.out.substr(at, 12);
    EXPECT_EQ(shown.find('\x1b'), std::string::npos) << args << ": the escape reached the terminal";
    EXPECT_NE(shown.find("x1b"), std::string::npos) << args << ": " << shown;
  }
  const std::string log = daemon.Log();
  EXPECT_EQ(log.find("\n<3>kvtierd: forged"), std::string::npos) << "a forged log line";
  EXPECT_NE(log.find("evil\\x1b[2J\\x0a<3>kvtierd: forged"), std::string::npos) << log;
  c->reset();
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

TEST(Kvctl, StatusJsonHasTheDocumentedFields) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok()) << daemon.Log();
  CmdResult r = Sh(BinaryPath("kvctl") + " status --json --socket " + daemon.socket_path());
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"version", "uptime_s", "metrics_url", "sessions", "tiers"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  ASSERT_EQ(j["tiers"].size(), 1u);
  const auto& host = j["tiers"][0];
  EXPECT_EQ(host["name"], "host");
  EXPECT_EQ(host["page_bytes"], 1 << 20);
  EXPECT_EQ(host["capacity_bytes"], 64 << 20);
  EXPECT_EQ(host["used_bytes"], 0);
  EXPECT_EQ(j["metrics_url"].get<std::string>().rfind("http://127.0.0.1:", 0), 0u);
  // used_bytes follows leases.
  auto c = Client::Connect(EngineOptions(daemon.socket_path()));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Allocate(TierKind::kHost, 3).ok());
  r = Sh(BinaryPath("kvctl") + " --json status -s " + daemon.socket_path());
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tiers"][0]["used_bytes"], 3 << 20);
  EXPECT_EQ(j["sessions"], 2);  // the engine and kvctl itself

  r = Sh(BinaryPath("kvctl") + " sessions --json --socket " + daemon.socket_path());
  ASSERT_EQ(r.code, 0);
  j = nlohmann::json::parse(r.out);
  bool found = false;
  for (const auto& s : j["sessions"]) {
    if (s["engine_name"] == "test-engine") {
      found = true;
      EXPECT_EQ(s["leased_pages"], 3);
      EXPECT_EQ(s["role"], "engine");
    }
  }
  EXPECT_TRUE(found) << r.out;
  r = Sh(BinaryPath("kvctl") + " tiers --socket " + daemon.socket_path());
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("leased 3"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("MISMATCH"), std::string::npos);
  c->reset();
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(Kvctl, NoDaemonIsAClearErrorAndNonZeroExit) {
  TempDir dir;
  CmdResult r = Sh(BinaryPath("kvctl") + " status --socket " + dir.File("none.sock"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("no kvtierd answers"), std::string::npos) << r.out;
  r = Sh(BinaryPath("kvctl") + " frobnicate");
  EXPECT_EQ(r.code, 2);
}

TEST(Kvctl, EmbeddedDefaultsAgreeFromTheSameDirectory) {
  // kvtierd with no config and kvctl with no flags, both from one working directory.
  TempDir dir;
  std::ofstream(dir.File("cfg.yaml")) << "metrics:\n  port: 0\n";  // the default port may be taken
  CmdResult started =
      Sh("cd " + dir.path() + " && (" + BinaryPath("kvtierd") + " --config cfg.yaml >d.log 2>&1 & echo $! > pid)");
  ASSERT_EQ(started.code, 0);
  CmdResult r{-1, ""};
  WaitUntil(
      [&] {
        r = Sh("cd " + dir.path() + " && " + BinaryPath("kvctl") + " status");
        return r.code == 0;
      },
      std::chrono::seconds(5), std::chrono::milliseconds(50));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("./var/kvtierd.sock"), std::string::npos) << r.out;
  Sh("kill $(cat " + dir.File("pid") + ")");
  WaitUntil([&] { return Sh("kill -0 $(cat " + dir.File("pid") + ")").code != 0; }, std::chrono::seconds(2));
}

TEST(Metrics, EndpointServesPrometheusText) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok()) << daemon.Log();
  auto c = Client::Connect(EngineOptions(daemon.socket_path()));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Lookup(HashChain(3, 2)).ok());
  auto stats = StatsOf(daemon.socket_path());
  ASSERT_TRUE(stats.ok());
  CmdResult r = Sh("curl -fsS " + stats->metrics_url);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* m :
       {"kvtier_tier_capacity_bytes{tier=\"host\"} 67108864", "kvtier_lookups_total 1", "kvtier_lookup_blocks_total 2",
        "kvtier_block_misses_total 2", "kvtier_sessions 1", "kvtier_rpc_duration_seconds_count{op=\"lookup\"} 1",
        "kvtier_tier_bytes{tier=\"host\",state=\"free\"}",
        "kvtier_tier_headroom_bytes{tier=\"host\"} 0"}) {  // no NVMe tier: the watermarks alone
    EXPECT_NE(r.out.find(m), std::string::npos) << m;
  }
  CmdResult h = Sh("curl -s -o /dev/null -w '%{http_code}' " + stats->metrics_url + "x");
  EXPECT_EQ(h.out, "404");
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(CApi, CProgramSharesBlocksThroughTheAbi) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok()) << daemon.Log();
  CmdResult r = Sh(std::string(KVTIER_TESTS_DIR) + "/kvtier_c_api_smoke " + daemon.socket_path());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("c api ok"), std::string::npos) << r.out;
  EXPECT_EQ(daemon.Stop(), 0);
}

// The unit as shipped: hardened (systemd's own exposure score), valid, and its sysusers /
// tmpfiles companions accepted by the real tools.
TEST(SystemdUnit, ExposureIsAtMostTwoPointFiveAndVerifyIsClean) {
  const std::string unit = std::string(KVTIER_SOURCE_DIR) + "/systemd/kvtierd.service";
  CmdResult sec = Sh("systemd-analyze security --offline=true " + unit);
  ASSERT_EQ(sec.code, 0) << sec.out;
  const size_t at = sec.out.find("Overall exposure level for kvtierd.service: ");
  ASSERT_NE(at, std::string::npos) << sec.out;
  const double score = std::stod(sec.out.substr(at + std::strlen("Overall exposure level for kvtierd.service: ")));
  EXPECT_LE(score, 2.5) << sec.out;
  RecordProperty("exposure", std::to_string(score));
  // verify wants the ExecStart binary to exist: point it at the one just built.
  TempDir dir;
  CmdResult cp =
      Sh("sed 's#/usr/bin/kvtierd#" + BinaryPath("kvtierd") + "#' " + unit + " > " + dir.File("kvtierd.service"));
  ASSERT_EQ(cp.code, 0) << cp.out;
  CmdResult verify = Sh("systemd-analyze verify " + dir.File("kvtierd.service"));
  EXPECT_EQ(verify.code, 0) << verify.out;
  EXPECT_EQ(verify.out, "") << "systemd-analyze verify has complaints";
  // The things the daemon needs are still allowed.
  std::ifstream in(unit);
  std::stringstream text;
  text << in.rdbuf();
  for (const char* needed :
       {"io_uring_setup", "io_uring_enter", "io_uring_register", "char-nvidiactl", "char-nvidia-uvm", "Type=notify",
        "WatchdogSec=", "Restart=on-failure", "PrivateUsers=no"}) {
    EXPECT_NE(text.str().find(needed), std::string::npos) << needed;
  }
}

// The unit sets ProcSubset=pid, which hides /proc/meminfo: the memory check reads the
// kernel's sysinfo(2) there, so a pool larger than the machine is still refused.
TEST(SystemdUnit, APoolLargerThanMemoryIsRefusedUnderTheUnitsProcSubset) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a /proc needs root";
  const std::string unit = std::string(KVTIER_SOURCE_DIR) + "/systemd/kvtierd.service";
  ASSERT_EQ(Sh("grep -qx 'ProcSubset=pid' " + unit).code, 0) << "the unit no longer sets ProcSubset=pid";
  const uint64_t gib = (MemTotalBytes() >> 30) * 4 + 4;
  TempDir dir;
  std::ofstream(dir.File("big.yaml")) << "socket: {path: " << dir.File("s.sock") << "}\ndata_dir: " << dir.File("var")
                                      << "\nmetrics: {port: -1}\ntiers:\n  host: {capacity: " << gib
                                      << "GiB, segment_bytes: 1GiB, huge_pages: auto}\n";
  CmdResult r =
      Sh("unshare -m --propagation private sh -c 'mount -t proc -o subset=pid proc /proc || exit 90; "
         "test -e /proc/meminfo && exit 91; exec " +
         BinaryPath("kvtierd") + " --check-config --config " + dir.File("big.yaml") + "' 2>&1");
  if (r.code == 90) GTEST_SKIP() << "this kernel cannot mount /proc with subset=pid: " << r.out;
  ASSERT_NE(r.code, 91) << "/proc with subset=pid still shows /proc/meminfo";
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("tiers.host.capacity"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sysinfo(2)"), std::string::npos) << r.out;
}

TEST(SystemdUnit, SysusersAndTmpfilesAreAccepted) {
  const std::string src = std::string(KVTIER_SOURCE_DIR) + "/systemd/";
  CmdResult users = Sh("systemd-sysusers --dry-run " + src + "kvtier.sysusers");
  EXPECT_EQ(users.code, 0) << users.out;
  EXPECT_NE(users.out.find("kvtier"), std::string::npos) << users.out;
  if (::geteuid() != 0) GTEST_SKIP() << "creating the directories needs root";
  TempDir root;
  ASSERT_EQ(Sh("mkdir -p " + root.File("etc")).code, 0);
  CmdResult made = Sh("systemd-sysusers --root=" + root.path() + " " + src +
                      "kvtier.sysusers && "
                      "systemd-tmpfiles --root=" +
                      root.path() + " --create " + src + "kvtier.tmpfiles");
  ASSERT_EQ(made.code, 0) << made.out;
  struct stat st;
  ASSERT_EQ(::stat(root.File("run/kvtier").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);
  ASSERT_EQ(::stat(root.File("var/lib/kvtier").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);
  EXPECT_NE(st.st_uid, 0u) << "owned by the kvtier user";
}

}  // namespace
}  // namespace kvtier::testing
