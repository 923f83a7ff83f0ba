// kvtierd's probes against real daemons: /healthz and /readyz on the metrics port and
// `kvctl health`'s exit codes, through a slow NVMe index load, a drain, and a control loop
// stuck in a stalled NVMe submission (kvtierd-faulty's test faults).
#include <gtest/gtest.h>

#include <thread>

#include "tests/integration/engine_process.h"

namespace kvtier::testing {
namespace {

struct Probe {
  int code = 0;
  std::string body;
};

// GET base+path; code 0 when nothing answered within 8 s.
Probe Get(const std::string& base, const std::string& path) {
  CmdResult r = Sh("curl -s -m 8 -w '\\n%{http_code}' " + base + path);
  Probe p;
  const size_t nl = r.out.rfind('\n');
  if (nl == std::string::npos) return p;
  p.code = std::atoi(r.out.c_str() + nl + 1);
  p.body = r.out.substr(0, nl);
  while (!p.body.empty() && p.body.back() == '\n') p.body.pop_back();
  return p;
}

std::string Base(const DaemonProcess& d) {
  const std::string url = MetricsUrl(d);
  return url.substr(0, url.rfind("/metrics"));
}

int KvctlHealth(const DaemonProcess& d, const std::string& args = "") {
  return Sh(BinaryPath("kvctl") + " health --socket " + d.socket_path() + " " + args).code;
}

DaemonProcess::Options Faulty(const std::string& env) {
  DaemonProcess::Options o;
  o.kvtierd = BinaryPath("kvtierd-faulty");
  o.env = {env};
  o.nvme_capacity = "64MiB";
  o.nvme_yaml = "    durability: relaxed\n    write_policy: write_through\n";
  o.log_level = "info";
  return o;
}

TEST(Health, ReadyzIs503UntilTheNvmeIndexIsLoadedAnd200After) {
  DaemonProcess d(Faulty("KVTIER_INDEX_LOAD_DELAY_MS=4000"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string base = Base(d);
  ASSERT_FALSE(base.empty()) << d.Log();
  const Probe loading = Get(base, "/readyz");
  EXPECT_EQ(loading.code, 503) << loading.body;
  EXPECT_NE(loading.body.find("NVMe index is loading"), std::string::npos) << loading.body;
  EXPECT_EQ(Get(base, "/healthz").code, 200) << "loading is not being stuck";
  EXPECT_EQ(KvctlHealth(d), 3);
  EXPECT_TRUE(WaitUntil([&] { return Get(base, "/readyz").code == 200; }, std::chrono::seconds(15))) << d.Log();
  EXPECT_EQ(Get(base, "/readyz").body, "ready");
  // A query string (some probes add one) names the same resource; other paths are 404.
  EXPECT_EQ(Get(base, "/healthz?x").code, 200);
  EXPECT_EQ(Get(base, "/readyz?probe=kubelet").body, "ready");
  EXPECT_EQ(Get(base, "/healthzz").code, 404);
  EXPECT_EQ(KvctlHealth(d), 0);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(Health, ReadyzIs503DuringADrainAnd200WhenItEnds) {
  DaemonProcess::Options o;
  o.nvme_capacity = "64MiB";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string base = Base(d);
  ASSERT_TRUE(WaitUntil([&] { return Get(base, "/readyz").code == 200; })) << d.Log();
  ASSERT_EQ(Sh(BinaryPath("kvctl") + " drain --no-wait --socket " + d.socket_path()).code, 0);
  EXPECT_TRUE(WaitUntil([&] { return Get(base, "/readyz").code == 503; }));
  EXPECT_NE(Get(base, "/readyz").body.find("draining"), std::string::npos);
  EXPECT_EQ(Get(base, "/healthz").code, 200);
  EXPECT_EQ(KvctlHealth(d), 3);
  EXPECT_EQ(KvctlHealth(d, "--live"), 0) << "a drain is not a fault: a container's HEALTHCHECK passes";
  ASSERT_EQ(Sh(BinaryPath("kvctl") + " drain --resume --socket " + d.socket_path()).code, 0);
  EXPECT_TRUE(WaitUntil([&] { return Get(base, "/readyz").code == 200; }));
  EXPECT_EQ(KvctlHealth(d), 0);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(Health, HealthzIs503WhileTheControlLoopIsStuckAnd200After) {
  DaemonProcess::Options o = Faulty("KVTIER_IO_FAULTS=write:1:stall9000");
  o.metrics_yaml = "  stall_timeout: 1s\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string base = Base(d);
  ASSERT_TRUE(WaitUntil([&] { return Get(base, "/readyz").code == 200; })) << d.Log();
  EXPECT_EQ(Get(base, "/healthz").body, "ok");
  // A block written through to NVMe: its first write's submission stalls the control loop 9 s.
  std::thread engine([&] {
    ClientOptions co = EngineOptions(d.socket_path());
    co.timeout_ms = 30'000;
    auto c = Client::Connect(co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto pages = (*c)->Allocate(TierKind::kHost, 1);
    ASSERT_TRUE(pages.ok()) << pages.status().ToString();
    const std::vector<CommitEntry> entry = {{(*pages)[0], HashChain(41, 1)[0], BlockHash()}};
    auto r = (*c)->Commit(TierKind::kHost, entry);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
  });
  EXPECT_TRUE(WaitUntil([&] { return Get(base, "/healthz").code == 503; }, std::chrono::seconds(5))) << d.Log();
  const Probe stuck = Get(base, "/healthz");
  EXPECT_NE(stuck.body.find("has not run for"), std::string::npos) << stuck.body;
  EXPECT_EQ(Get(base, "/readyz").code, 503);
  EXPECT_EQ(KvctlHealth(d, "--timeout 1"), 1) << "the socket does not answer either";
  EXPECT_EQ(KvctlHealth(d, "--live --timeout 1"), 1);
  EXPECT_EQ(Get(base, "/metrics").code, 503) << "not rendered in time by a stuck control thread";
  engine.join();
  EXPECT_TRUE(WaitUntil([&] { return Get(base, "/healthz").code == 200; }, std::chrono::seconds(10))) << d.Log();
  EXPECT_EQ(Get(base, "/healthz").body, "ok");
  EXPECT_EQ(KvctlHealth(d), 0);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

}  // namespace
}  // namespace kvtier::testing

namespace kvtier::testing {
namespace {

// The standard process_* series (what a Kubernetes or node dashboard plots for any
// process), from /proc: they move with what the daemon holds.
TEST(Health, ProcessSeriesFollowTheProcess) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string url = MetricsUrl(d);
  const double fds = Metric(url, "process_open_fds");
  EXPECT_GT(fds, 3);
  EXPECT_GT(Metric(url, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(Metric(url, "process_virtual_memory_bytes"), Metric(url, "process_resident_memory_bytes"));
  EXPECT_GT(Metric(url, "process_max_fds"), fds);
  EXPECT_GE(Metric(url, "process_cpu_seconds_total"), 0);
  EXPECT_GT(Metric(url, "process_start_time_seconds"), 1.7e9);
  std::vector<std::unique_ptr<Client>> engines;
  for (int i = 0; i < 5; ++i) {
    auto c = Client::Connect(EngineOptions(d.socket_path(), "e" + std::to_string(i)));
    ASSERT_TRUE(c.ok());
    engines.push_back(std::move(*c));
  }
  EXPECT_GE(Metric(url, "process_open_fds"), fds + 5) << "a socket per engine";
  engines.clear();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

}  // namespace
}  // namespace kvtier::testing
