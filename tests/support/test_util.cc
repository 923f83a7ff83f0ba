#include "tests/support/test_util.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace kvtier::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/kvt.XXXXXX";
  char* p = ::mkdtemp(tmpl.data());
  path_ = p ? p : "/tmp";
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<uint8_t> SeededBytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

std::vector<BlockHash> HashChain(uint64_t seed, size_t n, size_t size) {
  std::vector<BlockHash> out;
  uint8_t prev[32] = {0};
  for (size_t i = 0; i < n; ++i) {
    uint8_t in[48];
    std::memcpy(in, prev, 32);
    uint64_t s = seed, idx = i;
    std::memcpy(in + 32, &s, 8);
    std::memcpy(in + 40, &idx, 8);
    XXH128_hash_t a = XXH3_128bits_withSeed(in, sizeof(in), 1);
    XXH128_hash_t b = XXH3_128bits_withSeed(in, sizeof(in), 2);
    uint8_t h[32];
    std::memcpy(h, &a, 16);
    std::memcpy(h + 16, &b, 16);
    std::memcpy(prev, h, 32);
    out.emplace_back(std::span<const uint8_t>(h, size));
  }
  return out;
}

ModelLayout TestLayout(const std::string& model, uint32_t tokens_per_block) {
  ModelLayout l;
  l.model_id = model;
  l.num_layers = 2;
  l.kv_heads = 2;
  l.head_dim = 64;
  l.dtype = DType::kBFloat16;
  l.tokens_per_block = tokens_per_block;
  l.block_bytes = l.NaturalBlockBytes();
  return l;
}

bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout,
               std::chrono::milliseconds interval) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(interval);
  }
}

uint64_t ProcStatusKb(pid_t pid, std::string_view field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  const std::string want = std::string(field) + ":";
  std::string key;
  while (in >> key) {
    if (key == want) {
      uint64_t v = 0;
      in >> v;
      return v;
    }
  }
  return 0;
}

std::string BinaryPath(const std::string& name) {
  const char* dir = std::getenv("KVTIER_BIN_DIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : KVTIER_BIN_DIR) + "/" + name;
}

std::string TestGpuBackend() {
  const char* b = std::getenv("KVTIER_TEST_GPU_BACKEND");
  return b != nullptr && *b != '\0' ? b : "host-emulated";
}

DaemonProcess::DaemonProcess() : DaemonProcess(Options{}) {}

DaemonProcess::DaemonProcess(const Options& options) : options_(options) {
  socket_ = dir_.File("kvtierd.sock");
  config_ = dir_.File("kvtierd.yaml");
  log_ = dir_.File("kvtierd.log");
  std::ofstream c(config_);
  c << "socket:\n  path: " << socket_ << "\n"
    << options_.socket_yaml << "data_dir: " << data_dir() << "\n"
    << "log_level: " << options_.log_level << "\n"
    << "metrics:\n  port: 0\n"
    << options_.metrics_yaml << "tiers:\n  host:\n"
    << "    capacity: " << options_.host_capacity << "\n"
    << "    page_bytes: " << options_.page_bytes << "\n"
    << "    segment_bytes: " << options_.segment_bytes << "\n"
    << options_.host_yaml;
  if (!options_.gpu_capacity.empty()) {
    c << "  gpu:\n    enabled: true\n    backend: "
      << (options_.gpu_backend.empty() ? TestGpuBackend() : options_.gpu_backend)
      << "\n    capacity: " << options_.gpu_capacity << "\n    segment_bytes: " << options_.gpu_segment_bytes << "\n";
  }
  if (!options_.nvme_capacity.empty()) {
    c << "  nvme:\n    files: [{path: " << slot_file() << ", capacity: " << options_.nvme_capacity
      << (options_.nvme_preallocate ? "" : ", preallocate: false") << "}]\n"
      << options_.nvme_yaml;
  }
  if (!options_.remote_nodes.empty()) {
    c << "  remote:\n    nodes: [";
    for (size_t i = 0; i < options_.remote_nodes.size(); ++i)
      c << (i ? ", " : "") << '"' << options_.remote_nodes[i] << '"';
    c << "]\n" << options_.remote_yaml;
  }
  c << options_.tiers_yaml << options_.extra_yaml;
}

namespace {

// In a forked child: makes new PID and mount namespaces and forks their first process,
// which returns (to exec the daemon) with a private /proc of the namespace mounted. This
// process stays outside as the namespace's parent, like `unshare -pf --mount-proc`: it
// passes SIGTERM and SIGINT on and exits with the daemon's status. Exits 126 (EPERM) when
// the namespaces cannot be made.
void EnterOwnPidNamespace() {
  if (::unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) ::_exit(126);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  const pid_t inner = ::fork();
  if (inner < 0) ::_exit(126);
  if (inner == 0) {
    ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
      ::_exit(126);
    }
    return;
  }
  for (;;) {
    siginfo_t info;
    if (::sigwaitinfo(&set, &info) < 0) continue;
    if (info.si_signo != SIGCHLD) {
      ::kill(inner, info.si_signo);
      continue;
    }
    int status = 0;
    if (::waitpid(inner, &status, WNOHANG) != inner) continue;
    if (WIFEXITED(status)) ::_exit(WEXITSTATUS(status));
    ::signal(WTERMSIG(status), SIG_DFL);
    ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
    ::raise(WTERMSIG(status));
    ::_exit(128 + WTERMSIG(status));
  }
}

// Makes getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD (77), ...) fail with ENOPROTOOPT, as on a
// kernel that has no such option, for this process and what it execs.
bool RefusePeerPidfd() {
  constexpr uint32_t kSoPeerPidfd = 77;
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_getsockopt, 0, 5),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[1])),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SOL_SOCKET, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[2])),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kSoPeerPidfd, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOPROTOOPT),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

}  // namespace

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) Kill();
}

Status DaemonProcess::Start() {
  const std::string bin = options_.kvtierd.empty() ? BinaryPath("kvtierd") : options_.kvtierd;
  pid_ = ::fork();
  if (pid_ < 0) return ErrnoStatus(errno, "fork");
  if (pid_ == 0) {
    int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    for (const std::string& e : options_.env) ::putenv(const_cast<char*>(e.c_str()));
    if (options_.cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(options_.cpu, &set);
      ::sched_setaffinity(0, sizeof(set), &set);
    }
    if (!options_.cgroup.empty()) {
      const std::string procs = options_.cgroup + "/cgroup.procs", me = std::to_string(::getpid());
      const int cg = ::open(procs.c_str(), O_WRONLY | O_CLOEXEC);
      if (cg < 0 || ::write(cg, me.data(), me.size()) != static_cast<ssize_t>(me.size())) ::_exit(125);
      ::close(cg);
    }
    if (options_.own_pid_namespace) EnterOwnPidNamespace();  // returns in the namespace's pid 1
    if (options_.without_peer_pidfd && !RefusePeerPidfd()) ::_exit(124);
    std::vector<char*> argv = {const_cast<char*>(bin.c_str()), const_cast<char*>("--config"), config_.data()};
    for (std::string& a : options_.args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  bool exited = false, up = false;
  int exit_status = 0;
  WaitUntil(
      [&] {
        if (::waitpid(pid_, &exit_status, WNOHANG) == pid_) return exited = true;
        int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
        up = ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
        ::close(s);
        return up;
      },
      std::chrono::seconds(10), std::chrono::milliseconds(20));
  if (exited) {
    pid_ = -1;
    if (options_.own_pid_namespace && WIFEXITED(exit_status) && WEXITSTATUS(exit_status) == 126) {
      return PermissionDenied("cannot make a PID namespace for kvtierd (needs root)");
    }
    return Internal("kvtierd exited during start: " + Log());
  }
  if (up) return Status::Ok();
  return Internal("kvtierd did not answer within 10 s: " + Log());
}

int DaemonProcess::Stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void DaemonProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

std::string DaemonProcess::Log() const {
  std::ifstream in(log_);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > 4000 ? s.substr(s.size() - 4000) : s;
}

}  // namespace kvtier::testing
