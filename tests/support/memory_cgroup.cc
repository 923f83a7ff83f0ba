#include "tests/support/memory_cgroup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace kvtier::testing {
namespace {

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The path of this process's cgroup in the hierarchy whose /proc/self/cgroup line
// matches `controller` (v1) or is the unified one ("0::").
std::string OwnCgroup(bool v1) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    if (v1 ? controllers == "memory" : line.compare(0, 3, "0::") == 0) return line.substr(b + 1);
  }
  return "";
}

bool WriteFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

}  // namespace

Result<std::unique_ptr<MemoryCgroup>> MemoryCgroup::Make(const std::string& name) {
  std::string why;
  const std::string leaf = name + "-" + std::to_string(::getpid());
  if (Exists("/sys/fs/cgroup/memory/cgroup.procs")) {
    std::string own = OwnCgroup(/*v1=*/true);
    if (own == "/") own.clear();
    for (const std::string& parent : {"/sys/fs/cgroup/memory" + own, std::string("/sys/fs/cgroup/memory")}) {
      const std::string p = parent + "/" + leaf;
      if (::mkdir(p.c_str(), 0755) == 0) return std::unique_ptr<MemoryCgroup>(new MemoryCgroup(p, parent, 1));
      why = "mkdir " + p + ": " + std::strerror(errno);
    }
  } else if (Exists("/sys/fs/cgroup/cgroup.controllers")) {
    std::string own = OwnCgroup(/*v1=*/false);
    if (own == "/") own.clear();
    // A v2 cgroup with processes cannot enable controllers for children: try the root too.
    for (const std::string& parent : {"/sys/fs/cgroup" + own, std::string("/sys/fs/cgroup")}) {
      (void)WriteFile(parent + "/cgroup.subtree_control", "+memory");
      const std::string p = parent + "/" + leaf;
      if (::mkdir(p.c_str(), 0755) != 0) {
        why = "mkdir " + p + ": " + std::strerror(errno);
        continue;
      }
      if (Exists(p + "/memory.current")) return std::unique_ptr<MemoryCgroup>(new MemoryCgroup(p, parent, 2));
      ::rmdir(p.c_str());
      why = parent + " does not give its children the memory controller";
    }
  } else {
    why = "no memory cgroup hierarchy under /sys/fs/cgroup";
  }
  return Unavailable("no memory cgroup can be made here: " + why);
}

MemoryCgroup::~MemoryCgroup() {
  // Processes left inside go back to the parent; then the (empty) cgroup can go.
  std::ifstream in(path_ + "/cgroup.procs");
  for (std::string pid; std::getline(in, pid);) (void)WriteFile(parent_ + "/cgroup.procs", pid);
  for (int i = 0; i < 40 && ::rmdir(path_.c_str()) != 0 && errno == EBUSY; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool MemoryCgroup::Join(pid_t pid) const {
  return WriteFile(path_ + "/cgroup.procs", std::to_string(pid ? pid : ::getpid()));
}

uint64_t MemoryCgroup::Stat(const std::string& key) const {
  std::ifstream in(path_ + "/memory.stat");
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return 0;
}

uint64_t MemoryCgroup::ShmemBytes() const { return Stat(version_ == 1 ? "total_shmem" : "shmem"); }

uint64_t MemoryCgroup::UsageBytes() const {
  std::ifstream in(path_ + (version_ == 1 ? "/memory.usage_in_bytes" : "/memory.current"));
  uint64_t v = 0;
  in >> v;
  return v;
}

}  // namespace kvtier::testing
