#pragma once
// Helpers shared by kvtier's tests: temp directories, deterministic hashes, and
// DaemonProcess, a real kvtierd child process on a private socket.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/base/block_key.h"
#include "protocol/base/layout.h"
#include "protocol/base/status.h"

namespace kvtier::testing {

// The tests' one bounded wait: polls `done` every `interval` until it returns true or
// `timeout` has passed; returns whether it did. Every loop that waits for a daemon, a
// process or a file ends in bounded time this way.
bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout = std::chrono::seconds(10),
               std::chrono::milliseconds interval = std::chrono::milliseconds(10));

// A fresh directory under $TMPDIR (short, so socket paths fit), removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A chained hash of `size` bytes for block `i` of sequence `seed` (hash_i depends on
// hash_{i-1}, as an engine's prefix hash does).
std::vector<BlockHash> HashChain(uint64_t seed, size_t n, size_t size = 16);

// `n` pseudo-random bytes, the same for the same seed (xorshift32).
std::vector<uint8_t> SeededBytes(size_t n, uint32_t seed);

// The 8 bytes at `b` as a big-endian number (KV event hashes and sequence numbers).
inline uint64_t BigEndian(const uint8_t* b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | b[i];
  return v;
}

// A small layout whose natural block is `block_bytes` (default 64 KiB).
ModelLayout TestLayout(const std::string& model = "test-model", uint32_t tokens_per_block = 16);

// A "kB" field of /proc/PID/status ("RssAnon", "VmRSS", "Threads" (a count), ...); 0 when
// absent.
uint64_t ProcStatusKb(pid_t pid, std::string_view field);

// Built with ASan or TSan: a process's RSS is then the sanitizer's too (shadow memory, the
// quarantine of freed memory), so bounds on RSS are judged in the plain build only.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// A program of this build: in $KVTIER_BIN_DIR when set (a build carried to another
// machine), else in the build's bin/.
std::string BinaryPath(const std::string& name);
// The device backend GPU-tier tests run on: $KVTIER_TEST_GPU_BACKEND ("cuda" on a machine
// with a GPU, tests/gpu/device.sh), else "host-emulated". DaemonProcess configures its GPU
// tier with it.
std::string TestGpuBackend();

// kvtierd as a child process on a temp socket with its own data dir and an ephemeral
// metrics port. Extra YAML is appended to the generated config.
class DaemonProcess {
 public:
  struct Options {
    std::string host_capacity = "64MiB";
    std::string page_bytes = "1MiB";
    std::string segment_bytes = "16MiB";
    std::string extra_yaml;
    std::string host_yaml;     // more keys under tiers.host:, indented, e.g. "    overcommit: true\n"
    std::string socket_yaml;   // more keys under socket:, indented, e.g. "  group: 4000\n"
    std::string metrics_yaml;  // more keys under metrics:, indented, e.g. "  stall_timeout: 1s\n"
    std::string kvtierd;       // binary; empty: BinaryPath("kvtierd")
    std::string log_level = "debug";
    int cpu = -1;                  // pin kvtierd to this CPU (benchmarks); -1: no pinning
    std::vector<std::string> env;  // "NAME=value" added to the daemon's environment
    // An NVMe tier of this size in the temp dir ("" = none), with these extra keys.
    std::string nvme_capacity;
    std::string nvme_yaml;  // indented for tiers.nvme, e.g. "    durability: relaxed\n"
    std::string nvme_file;  // the slot file; empty: slots0 in the temp dir
    bool nvme_preallocate = true;
    std::string data_dir;  // empty: data in the temp dir
    // A remote tier on these Redis seed nodes (none = no remote tier), with these extra
    // keys (indented for tiers.remote, e.g. "    write_policy: write_back\n").
    std::vector<std::string> remote_nodes;
    std::string remote_yaml;
    // More sections under tiers:, indented, e.g. "  memory:\n    capacity: 8MiB\n".
    std::string tiers_yaml;
    // A GPU tier of this size ("" = none) on TestGpuBackend(), in segments of gpu_segment_bytes.
    std::string gpu_capacity;
    std::string gpu_segment_bytes = "4MiB";
    std::string gpu_backend;  // "" = TestGpuBackend()
    // Run kvtierd in a PID namespace (and mount namespace with its own /proc) of its own,
    // as a pod does: it then sees this process and its children as pid 0. Needs root;
    // Start() fails with kPermissionDenied where the namespaces cannot be made.
    bool own_pid_namespace = false;
    // A cgroup directory (e.g. MemoryCgroup::path()) kvtierd starts in; empty: this one's.
    std::string cgroup;
    // kvtierd as on a kernel before Linux 6.5: getsockopt(SO_PEERPIDFD) fails with
    // ENOPROTOOPT (a seccomp filter installed before exec).
    bool without_peer_pidfd = false;
    std::vector<std::string> args;  // more command-line arguments, after --config
  };
  DaemonProcess();
  explicit DaemonProcess(const Options& options);
  ~DaemonProcess();

  // Starts kvtierd and waits until its socket answers. kInternal with the daemon's log
  // tail when it exits or does not answer within 10 s.
  Status Start();
  // SIGTERM and wait; returns the exit status (0 = clean shutdown with consistent
  // accounting).
  int Stop();
  // SIGKILL and reap.
  void Kill();

  pid_t pid() const { return pid_; }
  const std::string& socket_path() const { return socket_; }
  const std::string& config_path() const { return config_; }
  const std::string& dir() const { return dir_.path(); }
  std::string Log() const;
  std::string slot_file() const { return options_.nvme_file.empty() ? dir_.File("slots0") : options_.nvme_file; }
  std::string data_dir() const { return options_.data_dir.empty() ? dir_.File("data") : options_.data_dir; }

 private:
  Options options_;
  TempDir dir_;
  std::string socket_;
  std::string config_;
  std::string log_;
  pid_t pid_ = -1;
};

}  // namespace kvtier::testing
