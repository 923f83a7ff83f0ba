// SIGHUP (systemctl reload kvtierd): the daemon keeps serving and applies what can change
// live — log_level, tenants and their quotas — names what waits for a restart, and a file
// that does not parse changes nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/integration/engine_process.h"

namespace kvtier::testing {
namespace {

void Rewrite(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  std::string text = all.str();
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in\n" << text;
  text.replace(at, from.size(), to);
  std::ofstream(path) << text;
}

TEST(Reload, SighupAppliesLogLevelAndQuotasNamesTheRestAndSurvivesABadFile) {
  DaemonProcess::Options o;  // 64 host pages of 1 MiB
  o.log_level = "info";
  o.extra_yaml = "security:\n  unknown_quota: {host: 0}\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Connect(EngineOptions(d.socket_path()));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto eight = (*c)->Allocate(TierKind::kHost, 8);
  ASSERT_TRUE(eight.ok()) << eight.status().ToString();
  ASSERT_TRUE((*c)->Release(TierKind::kHost, *eight, {}).ok());  // nothing held: the quota below is about new leases

  // A quota of 4 MiB for unknown tenants (this engine's), a bigger host pool, debug logs.
  Rewrite(d.config_path(), "unknown_quota: {host: 0}", "unknown_quota: {host: 4MiB}");
  Rewrite(d.config_path(), "log_level: info", "log_level: debug");
  Rewrite(d.config_path(), "capacity: 64MiB", "capacity: 128MiB");
  ASSERT_EQ(::kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitUntil([&] { return d.Log().find("SIGHUP: reloaded") != std::string::npos; })) << d.Log();
  const std::string log = d.Log();
  EXPECT_NE(log.find("changed, applied at the next restart: tiers"), std::string::npos) << log;
  auto refused = (*c)->Allocate(TierKind::kHost, 8);
  ASSERT_FALSE(refused.ok()) << "the reloaded quota applies to the session already attached";
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  EXPECT_TRUE((*c)->Allocate(TierKind::kHost, 4).ok());
  auto stats = StatsOf(d.socket_path());
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->tiers[0].capacity_pages, 64u) << "the pool's size is not reloaded";

  // A file that does not parse: an error in the log, the daemon serves on unchanged.
  Rewrite(d.config_path(), "unknown_quota: {host: 4MiB}", "unknown_quota: {host: lots}");
  ASSERT_EQ(::kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitUntil([&] { return d.Log().find("not reloaded, nothing changed") != std::string::npos; })) << d.Log();
  EXPECT_NE(d.Log().find("security.unknown_quota"), std::string::npos) << d.Log();
  EXPECT_FALSE((*c)->Allocate(TierKind::kHost, 1).ok()) << "the 4 MiB quota still holds";
  EXPECT_TRUE(StatsOf(d.socket_path()).ok());
  c->reset();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// security.max_leased_share is a tenant's limit like its quotas: a reload applies it to the
// next allocation of a session already attached (it used to wait, unsaid, for a restart).
TEST(Reload, TheLeaseShareIsReloadedForSessionsAlreadyAttached) {
  DaemonProcess::Options o;  // 64 host pages of 1 MiB: a share of 0.25 is 16 of them
  o.extra_yaml = "security:\n  max_leased_share: 0.25\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = Client::Connect(EngineOptions(d.socket_path()));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto refused = (*c)->Allocate(TierKind::kHost, 24);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("security.max_leased_share"), std::string::npos)
      << refused.status().ToString();
  Rewrite(d.config_path(), "max_leased_share: 0.25", "max_leased_share: 0.5");
  ASSERT_EQ(::kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitUntil([&] { return d.Log().find("SIGHUP: reloaded") != std::string::npos; })) << d.Log();
  auto taken = (*c)->Allocate(TierKind::kHost, 24);
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  auto over = (*c)->Allocate(TierKind::kHost, 9);
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << "32 of 64 is the new share's cap";
  c->reset();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// The config path a directory (a ConfigMap mounted without subPath): --check-config and
// the start refuse it naming the path, leaving nothing behind in the working directory;
// a running daemon whose file becomes a directory keeps serving on a SIGHUP.
TEST(Reload, AConfigPathThatIsADirectoryIsRefusedAtCheckStartAndReload) {
  TempDir dir;
  const std::string as_dir = dir.File("kvtierd.yaml");
  ASSERT_EQ(::mkdir(as_dir.c_str(), 0755), 0);
  for (const char* check : {"--check-config ", ""}) {
    CmdResult r = Sh("cd " + dir.path() + " && timeout 20 " + BinaryPath("kvtierd") + " " + check + "--config " +
                     as_dir + " 2>&1");
    EXPECT_EQ(r.code, 2) << check << r.out;
    EXPECT_NE(r.out.find(as_dir + " is not a regular file but a directory"), std::string::npos) << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.File("var"))) << "a start on the embedded default left its data_dir";

  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ASSERT_EQ(::rename(d.config_path().c_str(), (d.config_path() + ".away").c_str()), 0);
  ASSERT_EQ(::mkdir(d.config_path().c_str(), 0755), 0);
  ASSERT_EQ(::kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitUntil([&] { return d.Log().find("not reloaded, nothing changed") != std::string::npos; })) << d.Log();
  EXPECT_NE(d.Log().find("not a regular file"), std::string::npos) << d.Log();
  EXPECT_TRUE(StatsOf(d.socket_path()).ok());
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// The remote tier's secret and password live in files of their own, read at start: a
// reload that finds one changed says it waits for a restart (it used to be silent).
TEST(Reload, AChangedSecretFileIsNamedAsWaitingForARestart) {
  TempDir dir;
  auto secret = [&](const std::string& name, const std::string& text) {
    const std::string path = dir.File(name);
    std::ofstream(path) << text;
    ::chmod(path.c_str(), 0600);
    return path;
  };
  DaemonProcess::Options o;
  o.log_level = "info";
  o.remote_nodes = {"127.0.0.1:1"};  // nobody there: the tier misses, the daemon serves
  o.remote_yaml = "    secret_file: " + secret("fleet.secret", std::string(44, 'a')) + "\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ASSERT_EQ(::kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitUntil([&] { return d.Log().find("SIGHUP: reloaded") != std::string::npos; })) << d.Log();
  EXPECT_EQ(d.Log().find("secret_file (its file's contents)"), std::string::npos) << "nothing changed yet";
  secret("fleet.secret", std::string(44, 'b'));
  ASSERT_EQ(::kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitUntil([&] { return d.Log().find("secret_file (its file's contents)") != std::string::npos; }))
      << d.Log();
  EXPECT_NE(d.Log().find("applied at the next restart: tiers.remote.secret_file (its file's contents)"),
            std::string::npos)
      << d.Log();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// SIGHUP's default action ends a process: kvtierd catches it from its first instruction
// and replays it once its reload handler is in place, so signals sent while it starts
// (systemctl reload racing a restart) are a reload, never a death.
TEST(Reload, SighupsWhileItStartsAreReloadsNotDeaths) {
  TempDir dir;
  DaemonProcess::Options o;
  o.log_level = "info";
  DaemonProcess probe(o);  // for its config file
  const std::string config = probe.config_path();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int log = ::open(dir.File("log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
    const std::string bin = BinaryPath("kvtierd");
    ::execl(bin.c_str(), bin.c_str(), "--config", config.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // From kvtierd's first instructions (main catches SIGHUP: bit 0 of SigCgt; before main
  // the dynamic loader runs, where nothing of ours can) and for 300 ms, a SIGHUP a
  // millisecond.
  auto holds_sighup = [&] {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("SigCgt:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) & 1) != 0;
    }
    return false;
  };
  ASSERT_TRUE(WaitUntil(holds_sighup, std::chrono::seconds(10), std::chrono::milliseconds(0)));
  int sent = 0;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
       std::chrono::steady_clock::now() < until; ++sent) {
    if (::kill(pid, SIGHUP) != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto read_log = [&] {
    std::ifstream in(dir.File("log"));
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, WNOHANG), 0)
      << "kvtierd died of a SIGHUP at start (" << sent << " sent): status " << status << "\n"
      << read_log();
  EXPECT_TRUE(WaitUntil([&] { return read_log().find("SIGHUP: reloaded") != std::string::npos; })) << read_log();
  ::kill(pid, SIGTERM);
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << read_log();
}

}  // namespace
}  // namespace kvtier::testing
