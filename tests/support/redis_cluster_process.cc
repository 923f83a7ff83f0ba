#include "tests/support/redis_cluster_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

namespace kvtier::testing {
namespace {

// Runs `cmd` with /bin/sh; its stdout.
std::string Shell(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  ::pclose(f);
  return out;
}

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

}  // namespace

RedisClusterProcess::RedisClusterProcess(const Options& options) : options_(options) {}

RedisClusterProcess::~RedisClusterProcess() {
  for (pid_t p : pids_) {
    if (p <= 0) continue;
    ::kill(p, SIGCONT);
    ::kill(p, SIGKILL);
    ::waitpid(p, nullptr, 0);
  }
}

bool RedisClusterProcess::Available() {
  return ::access("/usr/bin/redis-server", X_OK) == 0 && ::access("/usr/bin/redis-cli", X_OK) == 0;
}

Status RedisClusterProcess::Start() {
  const int n = options_.cluster ? options_.masters * (1 + options_.replicas_per_master) : 1;
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < n; ++i) {
    // A port below the ephemeral range (its bus at port + 10000 too); one taken by another
    // process between the pick and redis-server's bind is seen as the server exiting, and
    // another is leased.
    std::string last_log;
    for (int attempt = 0;; ++attempt) {
      if (attempt == 3) return Internal("redis-server could not bind a port: " + last_log);
      KVTIER_ASSIGN_OR_RETURN(PortLease lease, PortLease::Take(rng, options_.cluster ? 10000 : 0));
      const int port = lease.port();
      const std::string dir = dir_.File("r" + std::to_string(port));
      ::mkdir(dir.c_str(), 0700);
      // Built before fork: the child only execs (no allocation after fork).
      std::vector<std::string> args = {"redis-server", "--port", std::to_string(port), "--bind", "127.0.0.1"};
      args.insert(args.end(), {"--dir", dir, "--save", "", "--appendonly", "no", "--daemonize", "no"});
      args.insert(args.end(), {"--maxmemory", options_.maxmemory, "--maxmemory-policy", options_.maxmemory_policy});
      if (options_.cluster) {
        // A cache: a replica takes over however stale it is (its data only has to verify,
        // never to be complete), even on a loaded machine.
        args.insert(args.end(),
                    {"--cluster-enabled", "yes", "--cluster-config-file", dir + "/nodes.conf", "--cluster-node-timeout",
                     std::to_string(options_.node_timeout_ms), "--cluster-replica-validity-factor", "0"});
      }
      if (!options_.password.empty()) {
        args.insert(args.end(), {"--requirepass", options_.password, "--masterauth", options_.password});
      }
      if (options_.unix_socket)
        args.insert(args.end(), {"--unixsocket", dir + "/redis.sock", "--unixsocketperm", "700"});
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      const std::string log = dir + "/log";
      const pid_t pid = ::fork();
      if (pid < 0) return ErrnoStatus(errno, "fork");
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
          ::dup2(fd, 1);
          ::dup2(fd, 2);
        }
        if (options_.cpu >= 0) {
          cpu_set_t set;
          CPU_ZERO(&set);
          CPU_SET(options_.cpu, &set);
          ::sched_setaffinity(0, sizeof(set), &set);
        }
        ::execv("/usr/bin/redis-server", argv.data());
        ::_exit(127);
      }
      bool exited = false;
      const bool answered = WaitUntil(
          [&] {
            if (::waitpid(pid, nullptr, WNOHANG) == pid) return exited = true;
            return RedisCli(port, "ping").find("PONG") != std::string::npos;
          },
          std::chrono::seconds(10), std::chrono::milliseconds(50));
      if (answered && !exited) {
        ports_.push_back(port);
        pids_.push_back(pid);
        leases_.push_back(std::move(lease));
        break;
      }
      last_log = Tail(log);
      if (!exited) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        return Internal("redis-server on port " + std::to_string(port) + " did not answer: " + last_log);
      }
    }
  }
  if (!options_.cluster) return Status::Ok();
  std::string nodes;
  for (const std::string& a : Addresses()) nodes += " " + a;
  const std::string out = Shell("/usr/bin/redis-cli" + Auth() + " --cluster create" + nodes + " --cluster-replicas " +
                                std::to_string(options_.replicas_per_master) + " --cluster-yes 2>&1");
  if (out.find("[OK] All 16384 slots covered") == std::string::npos) {
    return Internal("redis-cli --cluster create failed: " + out.substr(out.size() > 400 ? out.size() - 400 : 0));
  }
  for (size_t i = 0; i < ports_.size(); ++i) {
    if (!WaitHealthy(i)) return Internal("redis cluster node " + std::to_string(ports_[i]) + " is not ok");
  }
  return Status::Ok();
}

std::string RedisClusterProcess::Auth() const {
  return options_.password.empty() ? "" : " --no-auth-warning -a '" + options_.password + "'";
}

std::vector<std::string> RedisClusterProcess::Addresses() const {
  std::vector<std::string> out;
  for (int p : ports_) out.push_back("127.0.0.1:" + std::to_string(p));
  return out;
}

std::vector<std::string> RedisClusterProcess::Seeds(size_t n) const {
  auto a = Addresses();
  if (a.size() > n) a.resize(n);
  return a;
}

void RedisClusterProcess::Kill(size_t i) {
  if (pids_[i] <= 0) return;
  ::kill(pids_[i], SIGKILL);
  ::waitpid(pids_[i], nullptr, 0);
  pids_[i] = -1;
}

void RedisClusterProcess::Pause(size_t i) { ::kill(pids_[i], SIGSTOP); }
void RedisClusterProcess::Resume(size_t i) { ::kill(pids_[i], SIGCONT); }

std::string RedisClusterProcess::Cli(size_t i, const std::string& args) const { return RedisCli(ports_[i], args); }

std::string RedisClusterProcess::RedisCli(int port, const std::string& args) const {
  return Shell("timeout 10 /usr/bin/redis-cli" + Auth() + " -p " + std::to_string(port) + " " + args + " 2>/dev/null");
}

bool RedisClusterProcess::WaitHealthy(size_t i, int timeout_ms) const {
  return WaitUntil([&] { return Cli(i, "cluster info").find("cluster_state:ok") != std::string::npos; },
                   std::chrono::milliseconds(timeout_ms), std::chrono::milliseconds(100));
}

bool RedisClusterProcess::WaitReplicated(size_t i, int timeout_ms) const {
  return WaitUntil(
      [&] {
        const std::string info = Cli(i, "info replication");
        if (info.find("role:slave") != std::string::npos) {
          // A failover already happened (a loaded machine can miss node timeouts): this
          // node now replicates the shard's new master; caught up when its link is up and
          // its offset is its master's.
          const size_t mo = info.find("master_repl_offset:"), so = info.find("slave_repl_offset:");
          return info.find("master_link_status:up") != std::string::npos && mo != std::string::npos &&
                 so != std::string::npos && std::atoll(info.c_str() + so + 18) == std::atoll(info.c_str() + mo + 19);
        }
        const size_t m = info.find("master_repl_offset:");
        const size_t r = info.find("offset=", info.find("slave0:"));
        if (m == std::string::npos || r == std::string::npos || info.find("slave0:") == std::string::npos) return false;
        const long long master = std::atoll(info.c_str() + m + 19);
        const long long replica = std::atoll(info.c_str() + r + 7);
        return master > 0 && replica == master;
      },
      std::chrono::milliseconds(timeout_ms), std::chrono::milliseconds(100));
}

}  // namespace kvtier::testing
