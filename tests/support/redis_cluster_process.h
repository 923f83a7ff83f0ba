#pragma once
// RedisClusterProcess: a real Redis Cluster (Debian's redis-server, created with
// `redis-cli --cluster create`) on loopback ports it picks, in a temp dir, for tests and
// benchmarks. Every wait is bounded; the destructor kills what it started.

#include <sys/types.h>

#include <string>
#include <vector>

#include "protocol/base/status.h"
#include "tests/support/ports.h"
#include "tests/support/test_util.h"

namespace kvtier::testing {

class RedisClusterProcess {
 public:
  struct Options {
    int masters = 3;
    int replicas_per_master = 1;  // 0: masters only
    std::string maxmemory = "256mb";
    std::string maxmemory_policy = "allkeys-lru";
    int node_timeout_ms = 1000;  // cluster-node-timeout: how soon a dead master fails over
    bool cluster = true;         // false: one standalone server (masters must be 1)
    bool unix_socket = false;    // also listen on a Unix socket (unix_socket_path)
    int cpu = -1;                // pin the servers to this CPU (-1: not pinned)
    std::string password;        // requirepass (the default user's) and masterauth; Cli uses it
  };
  explicit RedisClusterProcess(const Options& options);
  RedisClusterProcess() : RedisClusterProcess(Options{}) {}
  ~RedisClusterProcess();

  // Whether redis-server and redis-cli are installed (tests GTEST_SKIP otherwise).
  static bool Available();
  // Starts the servers, creates the cluster and waits until every node says
  // cluster_state:ok (at most 30 s). kInternal with the servers' log tail otherwise.
  Status Start();

  // "127.0.0.1:port" of every server, masters first (as created).
  std::vector<std::string> Addresses() const;
  // The first `n` addresses (seeds for a client).
  std::vector<std::string> Seeds(size_t n = 3) const;
  int port(size_t i) const { return ports_[i]; }
  // The Unix socket server i listens on (Options::unix_socket).
  std::string unix_socket_path(size_t i) const { return dir_.File("r" + std::to_string(ports_[i]) + "/redis.sock"); }
  size_t size() const { return ports_.size(); }
  pid_t pid(size_t i) const { return pids_[i]; }
  // kill -9 of server i (it stays dead); SIGSTOP / SIGCONT of server i.
  void Kill(size_t i);
  void Pause(size_t i);
  void Resume(size_t i);
  // Runs redis-cli with `args` against server i, authenticated when a password is set;
  // its stdout (stderr dropped).
  std::string Cli(size_t i, const std::string& args) const;
  // Waits until the cluster, asked at server i, is ok again (after a failover).
  bool WaitHealthy(size_t i, int timeout_ms = 60000) const;
  // Waits until server i (a master) has a replica that acknowledged everything it was sent
  // (replication is asynchronous: a master killed before that loses the rest); if server i
  // has become a replica meanwhile (a failover), until it has caught up with its master.
  bool WaitReplicated(size_t i, int timeout_ms = 30000) const;

 private:
  std::string Auth() const;  // redis-cli's arguments for the password, if any
  std::string RedisCli(int port, const std::string& args) const;

  Options options_;
  TempDir dir_;
  std::vector<int> ports_;
  std::vector<pid_t> pids_;
  std::vector<PortLease> leases_;  // held while the servers run
};

}  // namespace kvtier::testing
