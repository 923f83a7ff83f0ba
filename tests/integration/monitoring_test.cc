// Monitoring as shipped: the alert rules pass promtool's checks and unit tests, the
// Grafana dashboard's expressions are valid PromQL and include the rules' expressions,
// a live kvtierd's metrics pass `promtool check metrics` and name every series the rules
// and the dashboard use, every kvtier_* series docs/operations.md names is exported by a
// kvtierd with every tier on, and a real Prometheus server scrapes kvtierd and answers the
// hit-ratio expression through its HTTP API.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "engine/tools/block_pattern.h"
#include "tests/integration/engine_process.h"
#include "tests/support/ports.h"

namespace kvtier::testing {
namespace {

using json = nlohmann::json;

const std::string kMonitoring = std::string(KVTIER_SOURCE_DIR) + "/docs/monitoring";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// (record name, expression) of every recording rule in alerts.yml.
std::vector<std::pair<std::string, std::string>> RecordingRules() {
  const std::string text = ReadFile(kMonitoring + "/alerts.yml");
  std::vector<std::pair<std::string, std::string>> out;
  const std::regex re(R"(- record: (\S+)\s*\n\s*expr: ([^\n]+))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
    out.emplace_back((*it)[1], (*it)[2]);
  }
  return out;
}

std::vector<std::string> DashboardExpressions() {
  const json d = json::parse(ReadFile(kMonitoring + "/grafana-kvtier.json"));
  std::vector<std::string> out;
  for (const auto& p : d["panels"]) {
    for (const auto& t : p["targets"]) out.push_back(t["expr"]);
  }
  return out;
}

// kvtier_* metric families an expression reads (histogram series mapped to the family).
std::set<std::string> MetricNames(const std::string& text) {
  std::set<std::string> out;
  const std::regex re(R"(\bkvtier_[a-z0-9_]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
    std::string n = it->str();
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s(suffix);
      if (n.size() > s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0) n.resize(n.size() - s.size());
    }
    out.insert(n);
  }
  return out;
}

TEST(AlertRules, PassPromtoolCheckAndTheirUnitTests) {
  CmdResult check = Sh("promtool check rules " + kMonitoring + "/alerts.yml");
  EXPECT_EQ(check.code, 0) << check.out;
  EXPECT_NE(check.out.find("SUCCESS"), std::string::npos) << check.out;
  CmdResult test = Sh("cd " + kMonitoring + " && promtool test rules alerts_test.yml");
  EXPECT_EQ(test.code, 0) << test.out;
  EXPECT_NE(test.out.find("SUCCESS"), std::string::npos) << test.out;
  // The alerts the operations guide promises are there.
  const std::string rules = ReadFile(kMonitoring + "/alerts.yml");
  for (const char* a : {"KvtierDown", "KvtierGpuTierFull", "KvtierThrashing", "KvtierChecksumFailures",
                        "KvtierIoErrors", "KvtierNvmeIndexNotWritable", "KvtierSlotFileLost"}) {
    EXPECT_NE(rules.find("alert: " + std::string(a)), std::string::npos) << a;
  }
}

TEST(GrafanaDashboard, UsesTheRulesExpressionsAndOnlyValidPromql) {
  const auto exprs = DashboardExpressions();
  ASSERT_GE(exprs.size(), 8u);
  const auto rules = RecordingRules();
  ASSERT_EQ(rules.size(), 3u);
  for (const auto& [name, expr] : rules) {
    EXPECT_NE(std::find(exprs.begin(), exprs.end(), expr), exprs.end()) << name << " is not on the dashboard";
  }
  // promtool parses every expression when they are recording rules of a rules file.
  TempDir dir;
  std::ofstream f(dir.File("dashboard_rules.yml"));
  f << "groups:\n  - name: dashboard\n    rules:\n";
  for (size_t i = 0; i < exprs.size(); ++i) {
    ASSERT_EQ(exprs[i].find('\''), std::string::npos);
    f << "      - record: dashboard:expr" << i << "\n        expr: '" << exprs[i] << "'\n";
  }
  f.close();
  CmdResult r = Sh("promtool check rules " + dir.File("dashboard_rules.yml"));
  EXPECT_EQ(r.code, 0) << r.out;
}

// A daemon with every tier, some traffic, and its scrape.
class LiveDaemon : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonProcess::Options o;
    o.nvme_capacity = "64MiB";
    o.gpu_capacity = "8MiB";
    o.gpu_segment_bytes = "4MiB";
    daemon_ = std::make_unique<DaemonProcess>(o);
    ASSERT_TRUE(daemon_->Start().ok()) << daemon_->Log();
    auto c = Client::Connect(EngineOptions(daemon_->socket_path()));
    ASSERT_TRUE(c.ok());
    engine_ = std::move(*c);
    // 3 blocks stored, then a lookup of 4: 3 hits of 4 blocks asked.
    const auto chain = HashChain(5, 4);
    auto pages = engine_->Allocate(TierKind::kHost, 3);
    ASSERT_TRUE(pages.ok());
    std::vector<CommitEntry> e;
    for (size_t i = 0; i < 3; ++i) e.push_back({(*pages)[i], chain[i], i ? chain[i - 1] : BlockHash()});
    ASSERT_TRUE(engine_->Commit(TierKind::kHost, e).ok());
    auto l = engine_->Lookup(chain);
    ASSERT_TRUE(l.ok());
    ASSERT_EQ(l->matched, 3u);
    auto s = StatsOf(daemon_->socket_path());
    ASSERT_TRUE(s.ok());
    metrics_url_ = s->metrics_url;
  }
  void TearDown() override {
    engine_.reset();
    if (daemon_) {
      EXPECT_EQ(daemon_->Stop(), 0);
    }
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> engine_;
  std::string metrics_url_;
};

TEST_F(LiveDaemon, MetricsPassPromtoolAndNameEverySeriesTheRulesAndDashboardUse) {
  CmdResult scrape = Sh("curl -fsS " + metrics_url_);
  ASSERT_EQ(scrape.code, 0) << scrape.out;
  TempDir dir;
  std::ofstream(dir.File("metrics.txt")) << scrape.out;
  CmdResult lint = Sh("promtool check metrics < " + dir.File("metrics.txt"));
  EXPECT_EQ(lint.code, 0) << lint.out;
  EXPECT_EQ(lint.out, "") << "promtool check metrics found problems";
  std::set<std::string> used = MetricNames(ReadFile(kMonitoring + "/alerts.yml"));
  for (const std::string& e : DashboardExpressions()) {
    for (const std::string& n : MetricNames(e)) used.insert(n);
  }
  EXPECT_GE(used.size(), 8u);
  for (const std::string& n : used) {
    EXPECT_NE(scrape.out.find("# TYPE " + n + " "), std::string::npos)
        << n << " is used but kvtierd does not export it";
  }
}

// A kvtierd with every tier on: a host-emulated GPU, NVMe, the memory tier, a remote tier
// whose cluster is not there, and KV events (`extra_yaml` adds to the events section).
DaemonProcess::Options EveryTierOn(const std::string& extra_yaml = "") {
  DaemonProcess::Options o;
  o.host_capacity = "8MiB";
  o.page_bytes = "64KiB";
  o.segment_bytes = "4MiB";
  o.gpu_capacity = "8MiB";
  o.nvme_capacity = "8MiB";
  o.remote_nodes = {"127.0.0.1:1"};
  o.tiers_yaml = "  memory:\n    capacity: 4MiB\n";
  o.extra_yaml = "events:\n  enabled: true\n" + extra_yaml;
  o.log_level = "notice";
  return o;
}

// docs/operations.md names only series a kvtierd exports: one with every tier on (a
// host-emulated GPU, NVMe with a tenant's quota, the memory tier, a remote tier whose
// cluster is not there) and KV events; `kvtier_<tier>_` stands for each lower tier.
TEST(OperationsGuide, EverySeriesItNamesIsExported) {
  DaemonProcess d(EveryTierOn("security:\n  tenants:\n    - name: a\n      uids: [" + std::to_string(::getuid()) +
                              "]\n      quota: {nvme: 4MiB}\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string url = MetricsUrl(d);
  ASSERT_FALSE(url.empty()) << d.Log();
  CmdResult scrape = Sh("curl -fsS " + url);
  ASSERT_EQ(scrape.code, 0) << scrape.out;
  std::set<std::string> named;
  const std::string guide = ReadFile(std::string(KVTIER_SOURCE_DIR) + "/docs/operations.md");
  const std::regex re(R"(kvtier_(<tier>_)?[a-z][a-z0-9_]*)");
  for (auto it = std::sregex_iterator(guide.begin(), guide.end(), re); it != std::sregex_iterator(); ++it) {
    std::string n = it->str();
    if (n.back() == '_') continue;  // a prefix, e.g. kvtier_remote_*
    if (const size_t at = n.find("<tier>_"); at != std::string::npos) {
      for (const char* tier : {"memory_", "remote_"}) named.insert(n.substr(0, at) + tier + n.substr(at + 7));
    } else {
      named.insert(n);
    }
  }
  EXPECT_GE(named.size(), 50u);
  for (const std::string& n : named) {
    EXPECT_NE(scrape.out.find("# TYPE " + n + " "), std::string::npos)
        << "docs/operations.md names " << n << ", which kvtierd does not export";
  }
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// Every thread of a running kvtierd with every tier on has a name, and docs/architecture.md's
// Threads table lists it (threads of the libraries kvtierd uses by their prefix): an
// operator reading `top -H` or a perf profile can tell what each one is.
TEST(Architecture, EveryThreadOfARunningKvtierdIsNamedInTheThreadsTable) {
  DaemonProcess d(EveryTierOn());
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ASSERT_FALSE(MetricsUrl(d).empty()) << d.Log();  // the metrics server is up
  const std::string doc = ReadFile(std::string(KVTIER_SOURCE_DIR) + "/docs/architecture.md");
  const size_t from = doc.find("## Threads");
  ASSERT_NE(from, std::string::npos) << "docs/architecture.md has no Threads section";
  const std::string table = doc.substr(from, doc.find("\n## ", from + 1) - from);
  std::set<std::string> ours;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(d.pid()) + "/task")) {
    std::string name = ReadFile(task.path().string() + "/comm");
    while (!name.empty() && name.back() == '\n') name.pop_back();
    // A library's threads are listed by the prefix they share (rocksdb:low, ZMQbg/IO/0).
    std::string listed = name;
    for (const char* prefix : {"rocksdb:", "ZMQbg/", "iou-"}) {
      if (name.rfind(prefix, 0) == 0) listed = prefix;
    }
    EXPECT_NE(table.find("`" + listed), std::string::npos)
        << "kvtierd runs a thread named '" << name << "' that docs/architecture.md's Threads table does not list";
    if (name.rfind("kvtier", 0) == 0) ours.insert(name);
  }
  EXPECT_GE(ours.size(), 8u) << "too few of kvtierd's own threads seen for the check to mean anything";
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// The value of an instant query through Prometheus's HTTP API ("" while there is none).
std::string Query(uint16_t port, const std::string& expr) {
  CmdResult r = Sh("curl -fsS -G http://127.0.0.1:" + std::to_string(port) +
                   "/api/v1/query --data-urlencode 'query=" + expr + "'");
  if (r.code != 0) return "";
  json j = json::parse(r.out, nullptr, false);
  if (j.is_discarded() || j["status"] != "success" || j["data"]["result"].empty()) return "";
  return j["data"]["result"][0]["value"][1];
}

TEST_F(LiveDaemon, ARealPrometheusScrapesItAndAnswersTheHitRatio) {
  if (Sh("command -v prometheus").code != 0) GTEST_SKIP() << "prometheus is not installed (scripts/deps.sh)";
  const std::string target = metrics_url_.substr(std::string("http://").size(), metrics_url_.rfind('/') - 7);
  TempDir dir;
  std::ofstream(dir.File("prometheus.yml"))
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "rule_files:\n  - " << kMonitoring << "/alerts.yml\n"
      << "scrape_configs:\n  - job_name: kvtier\n    static_configs:\n      - targets: ['" << target << "']\n";
  std::mt19937 rng(std::random_device{}());
  auto lease = PortLease::Take(rng);  // held until Prometheus stops
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  const uint16_t port = lease->port();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string cfg = "--config.file=" + dir.File("prometheus.yml");
    const std::string tsdb = "--storage.tsdb.path=" + dir.File("tsdb");
    const std::string listen = "--web.listen-address=127.0.0.1:" + std::to_string(port);
    const std::string log = dir.File("prometheus.log");
    FILE* f = std::fopen(log.c_str(), "w");
    if (f) {
      ::dup2(fileno(f), STDOUT_FILENO);
      ::dup2(fileno(f), STDERR_FILENO);
    }
    ::execlp("prometheus", "prometheus", cfg.c_str(), tsdb.c_str(), listen.c_str(), nullptr);
    ::_exit(127);
  }
  // The hit-ratio expression of the metrics' help text: 3 hits of 4 blocks looked up.
  const std::string ratio = "sum(kvtier_block_hits_total) / sum(kvtier_lookup_blocks_total)";
  std::string value, up, used;
  WaitUntil(
      [&] {
        value = Query(port, ratio);
        up = Query(port, "up{job=\"kvtier\"}");
        used = Query(port, "kvtier:tier_used_ratio{tier=\"host\"}");  // a recording rule of alerts.yml
        return !value.empty() && !used.empty();
      },
      std::chrono::seconds(30), std::chrono::milliseconds(100));
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
  EXPECT_EQ(up, "1") << ReadFile(dir.File("prometheus.log"));
  EXPECT_EQ(value, "0.75") << ReadFile(dir.File("prometheus.log"));
  EXPECT_FALSE(used.empty()) << "the rules were not evaluated";
  EXPECT_GT(std::stod(used.empty() ? "0" : used), 0.0);
}

}  // namespace
}  // namespace kvtier::testing
