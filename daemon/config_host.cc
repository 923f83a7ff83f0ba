#include "daemon/config_host.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "daemon/events/kv_events.h"
#include "daemon/lower_tiers.h"
#include "protocol/base/units.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

std::optional<uint64_t> MeminfoKb(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::istringstream ss(line.substr(field.size() + 1));
    uint64_t kb = 0;
    if (ss >> kb) return kb;
  }
  return std::nullopt;
}

// A cgroup memory limit file's value ("max" or a number of bytes).
std::optional<uint64_t> ReadLimit(const fs::path& p) {
  std::ifstream in(p);
  std::string v;
  if (!(in >> v) || v == "max") return std::nullopt;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (*end != '\0' || n == 0 || n >= (1ull << 62)) return std::nullopt;  // v1's "unlimited" is near 2^63
  return n;
}

// The lowest memory limit on the way from this process's cgroup up to the root.
std::optional<std::pair<uint64_t, std::string>> CgroupLimit() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::optional<std::pair<uint64_t, std::string>> best;
  auto consider = [&](const fs::path& file) {
    if (auto v = ReadLimit(file); v && (!best || *v < best->first)) best = {{*v, file.string()}};
  };
  while (std::getline(in, line)) {
    // v2: "0::/path"; v1: "N:memory:/path".
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    fs::path rel = line.substr(b + 1);
    fs::path root;
    std::string file;
    if (controllers.empty()) {
      root = "/sys/fs/cgroup";
      file = "memory.max";
    } else if (controllers.find("memory") != std::string::npos) {
      root = "/sys/fs/cgroup/memory";
      file = "memory.limit_in_bytes";
    } else {
      continue;
    }
    for (fs::path p = rel;; p = p.parent_path()) {
      consider(root / p.relative_path() / file);
      if (p == p.parent_path() || p.empty()) break;
    }
  }
  return best;
}

// `p` with its symlinks followed, also a last one that dangles (a slot file not created
// yet behind a link), and `.`/`..` resolved.
fs::path Resolve(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  for (int hops = 0; hops < 40 && fs::is_symlink(p, ec); ++hops) {
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) break;
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  const fs::path c = fs::weakly_canonical(p, ec);
  return ec ? p.lexically_normal() : c;
}

// Same file: equal after resolving symlinks, or equal device and inode.
bool SameFile(const std::string& a, const std::string& b) {
  if (Resolve(a) == Resolve(b)) return true;
  struct stat sa {
  }, sb{};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

Result<gid_t> ResolveGroup(const std::string& name) {
  char* end = nullptr;
  const unsigned long n = std::strtoul(name.c_str(), &end, 10);
  if (!name.empty() && *end == '\0') return static_cast<gid_t>(n);
  std::vector<char> buf(16384);
  group g{};
  group* found = nullptr;
  const int rc = ::getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &found);
  if (rc != 0 || found == nullptr) {
    return InvalidArgument("config key 'socket.group': no group '" + name + "'" +
                           (rc ? std::string(": ") + std::strerror(rc) : ""));
  }
  return found->gr_gid;
}

HostMemory ReadHostMemory() {
  HostMemory m;
  // /proc/meminfo is hidden where /proc is mounted with subset=pid (systemd's
  // ProcSubset=pid, which the unit sets): then the kernel's sysinfo(2), which needs no
  // /proc. Its free + buffer RAM stands in for MemAvailable (lower: page cache is left out).
  struct sysinfo si {};
  const bool have_sysinfo = ::sysinfo(&si) == 0;
  if (auto kb = MeminfoKb("MemTotal")) {
    m.limit_bytes = *kb * 1024;
    m.limit_source = "MemTotal";
  } else if (have_sysinfo) {
    m.limit_bytes = uint64_t{si.totalram} * si.mem_unit;
    m.limit_source = "sysinfo(2) total RAM";
  }
  if (auto cg = CgroupLimit(); cg && (!m.limit_bytes || cg->first < *m.limit_bytes)) {
    m.limit_bytes = cg->first;
    m.limit_source = cg->second;
  }
  if (auto kb = MeminfoKb("MemAvailable")) {
    m.available_bytes = *kb * 1024;
  } else if (have_sysinfo) {
    m.available_bytes = (uint64_t{si.freeram} + si.bufferram) * si.mem_unit;
  }
  return m;
}

Result<std::string> ReadSecretFile(const std::string& key, const std::string& path) {
  const std::string what = "config key '" + key + "': '" + path + "'";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return InvalidArgument(what + " cannot be read: " + std::string(strerror(errno)));
  struct stat st {};
  std::string out;
  Status status = Status::Ok();
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = InvalidArgument(what + " is not a regular file");
  } else if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    status = InvalidArgument(what + " belongs to uid " + std::to_string(st.st_uid) +
                             "; a secret belongs to kvtierd's user (uid " + std::to_string(::geteuid()) +
                             ") or root: chown it");
  } else if (st.st_mode & 077) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    status = InvalidArgument(what + " may be read by group or others (mode " + mode +
                             "); a secret belongs to kvtierd alone: chmod 600 it");
  } else if (st.st_size > (1 << 20)) {
    status = InvalidArgument(what + " is larger than 1 MiB: not a secret");
  } else {
    out.resize(static_cast<size_t>(st.st_size));
    size_t at = 0;
    while (at < out.size()) {
      const ssize_t n = ::read(fd, out.data() + at, out.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      at += static_cast<size_t>(n);
    }
    out.resize(at);
    if (!out.empty() && out.back() == '\n') out.pop_back();
    if (!out.empty() && out.back() == '\r') out.pop_back();
    if (out.empty()) status = InvalidArgument(what + " is empty");
  }
  ::close(fd);
  if (!status.ok()) return status;
  return out;
}

Status CheckConfigOnHost(const DaemonConfig& c, const HostMemory& memory, std::vector<std::string>* warnings) {
  if (!c.socket_group.empty()) KVTIER_RETURN_IF_ERROR(ResolveGroup(c.socket_group).status());
  {
    std::error_code ec;
    if (fs::exists(c.data_dir, ec) && !fs::is_directory(c.data_dir, ec)) {
      return InvalidArgument("config key 'data_dir': '" + c.data_dir + "' exists and is not a directory");
    }
  }
  // Memory: the host pool, and a GPU pool emulated in host RAM.
  uint64_t pool = c.host.enabled ? c.host.capacity_bytes : 0;
  const bool gpu_in_ram = c.gpu.enabled && c.gpu_backend == "host-emulated";
  if (gpu_in_ram) pool += c.gpu.capacity_bytes;
  const std::string what =
      gpu_in_ram ? "tiers.host.capacity + tiers.gpu.capacity (host-emulated)" : "tiers.host.capacity";
  if (memory.limit_bytes && pool > *memory.limit_bytes && !c.host.overcommit) {
    return InvalidArgument("config key 'tiers.host.capacity': " + what + " is " + FormatBytes(pool) +
                           ", more than this machine's memory (" + FormatBytes(*memory.limit_bytes) + ", " +
                           memory.limit_source +
                           "); a pool that large is killed by the OOM killer once it fills. Lower it, or set "
                           "tiers.host.overcommit: true if the memory will be there");
  }
  if (warnings && memory.available_bytes && pool > *memory.available_bytes) {
    warnings->push_back(what + " is " + FormatBytes(pool) + ", more than is available now (" +
                        FormatBytes(*memory.available_bytes) +
                        " MemAvailable): the pool fills only as blocks "
                        "arrive, but other processes may have to give memory back by then");
  }
  for (const LowerTierRow& row : LowerTierRows()) KVTIER_RETURN_IF_ERROR(row.check_on_host(c, warnings));
  // Event endpoints another process holds, or that publish to every interface.
  if (c.events.enabled) {
    const KvEventsOptions events = ResolveEventEndpoints(c.events.options, c.data_dir);
    KVTIER_RETURN_IF_ERROR(CheckEventEndpoints(events, warnings));
    // Several tenants on this host: a TCP endpoint (loopback too) lets every local user
    // read their block hashes and tokens.
    if (warnings && events.publish.rfind("tcp://", 0) == 0 &&
        (c.security.allow_unknown || c.security.tenants.size() > 1)) {
      warnings->push_back("events.publish '" + events.publish +
                          "' is TCP and this host has several tenants: every local user can subscribe and read "
                          "their block hashes and tokens (the default, an ipc:// socket in data_dir, admits only "
                          "the daemon's user and the socket group)");
    }
  }
  // NVMe files: each once, in a directory that exists.
  const auto& files = c.nvme.tier.files;
  std::error_code ec;
  const fs::path data_dir = fs::absolute(c.data_dir, ec).lexically_normal();
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string key = "config key 'tiers.nvme.files[" + std::to_string(i) + "].path'";
    for (size_t j = 0; j < i; ++j) {
      if (SameFile(files[i].path, files[j].path)) {
        return InvalidArgument(key + ": '" + files[i].path + "' is the same file as tiers.nvme.files[" +
                               std::to_string(j) + "] ('" + files[j].path +
                               "'); the two entries' slots would overwrite each other");
      }
    }
    fs::path dir = fs::absolute(files[i].path, ec).lexically_normal().parent_path();
    if (dir != data_dir && !fs::is_directory(dir, ec)) {
      return InvalidArgument(key + ": directory '" + dir.string() + "' of '" + files[i].path +
                             "' does not exist (kvtierd creates slot files, not directories)");
    }
  }
  return Status::Ok();
}

}  // namespace kvtier
