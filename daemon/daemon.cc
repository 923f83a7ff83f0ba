#include "daemon/daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include <xxhash.h>
#include <yaml-cpp/yaml.h>

#include <boost/asio/post.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "daemon/config_host.h"
#include "daemon/lower_tiers.h"
#include "protocol/base/clock.h"
#include "protocol/base/logging.h"
#include "protocol/base/units.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

// The free space the NVMe index needs on data_dir's file system to start.
constexpr uint64_t kMinIndexFreeBytes = 8ull << 20;

// What a start creates (data_dir, the lock file, index/), removed again when the start
// fails so a failed start leaves the machine as it found it. Slot files are SlotFiles's.
class UndoOnFailedStart {
 public:
  ~UndoOnFailedStart() {
    if (kept_) return;
    for (auto it = paths_.rbegin(); it != paths_.rend(); ++it) {
      std::error_code ec;
      fs::remove_all(*it, ec);
      if (ec) KVTIER_LOG(WARNING) << "after the failed start, could not remove " << *it << ": " << ec.message();
    }
  }
  // Records `path` if it does not exist yet (for a directory: its first missing ancestor).
  void WillCreate(const fs::path& path) {
    std::error_code ec;
    fs::path p = fs::absolute(path, ec).lexically_normal();
    if (ec || fs::exists(p, ec)) return;
    while (p.has_parent_path() && p.parent_path() != p && !fs::exists(p.parent_path(), ec)) p = p.parent_path();
    paths_.push_back(p);
  }
  void Keep() { kept_ = true; }

 private:
  std::vector<fs::path> paths_;
  bool kept_ = false;
};

// The top-level sections of two config texts whose YAML differs.
std::vector<std::string> ChangedSections(const std::string& before, const std::string& after) {
  std::vector<std::string> changed;
  try {
    const YAML::Node a = YAML::Load(before), b = YAML::Load(after);
    std::set<std::string> keys;
    for (const YAML::Node& n : {a, b}) {
      if (!n.IsMap()) continue;
      for (const auto& kv : n) keys.insert(kv.first.as<std::string>());
    }
    for (const std::string& k : keys) {
      const std::string x = a.IsMap() && a[k] ? YAML::Dump(a[k]) : "", y = b.IsMap() && b[k] ? YAML::Dump(b[k]) : "";
      if (x != y) changed.push_back(k);
    }
  } catch (const YAML::Exception&) {
    changed.push_back("(unreadable)");
  }
  return changed;
}

// Each configured tenant's limits by name, and everyone else's.
std::pair<std::unordered_map<std::string, TenantLimits>, TenantLimits> TenantLimitsOf(const SecurityConfig& security) {
  auto limits = [](const TierBytes& quota, const TierBytes& reserve) {
    TenantLimits l;
    l.quota_bytes = quota;
    l.reserve_bytes = reserve;
    return l;
  };
  std::unordered_map<std::string, TenantLimits> configured;
  for (const TenantConfig& t : security.tenants) {
    configured[t.name] = limits(t.quota, t.reserve);
    configured[t.name].kv_quantization = t.kv_quantization;
  }
  TenantLimits unknown = limits(security.unknown_quota, TierBytes{});
  unknown.kv_quantization = security.unknown_kv_quantization;
  return {std::move(configured), unknown};
}

}  // namespace

Daemon::Daemon(const DaemonConfig& config)
    : config_(config),
      signals_(io_, SIGTERM, SIGINT),
      reload_signal_(io_, SIGHUP),
      health_(SystemClock::Default(), config.metrics_stall_timeout_ns),
      tick_(io_) {}

Daemon::~Daemon() {
  nvme_events_.reset();
  http_.reset();
  server_.reset();
  dispatcher_.reset();
  cache_.reset();  // joins the GPU copy thread
  events_.reset();
  if (copy_device_) copy_device_->DestroyStream(copy_stream_);
  copy_device_.reset();
  device_.reset();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Result<std::unique_ptr<NvmeTier>> Daemon::OpenNvme(TestHooks hooks) {
  const NvmeTierConfig& c = config_.nvme;
  IoEngineOptions io = c.io;
  io.max_buffers = static_cast<uint32_t>(config_.host.capacity_bytes / config_.host.segment_bytes);
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, OpenIoEngine(io));
  KVTIER_LOG(NOTICE) << "nvme: io backend " << engine->name();
  if (hooks.wrap_io) engine = hooks.wrap_io(std::move(engine));
  RocksDbIndexOptions ro;
  ro.path = config_.data_dir + "/index";
  ro.block_cache_bytes = c.index_cache_bytes;
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<BlockIndexStore> store, OpenRocksDbBlockIndexStore(ro));
  NvmeTierOptions o = c.tier;
  o.slot_bytes = NvmeSlotBytes(config_);
  NvmeOwners owners = NvmeOwnersOf(config_.security, config_.host.page_bytes, &nvme_owners_);
  boost::asio::io_context* io_ctx = &io_;
  return NvmeTier::Open(
      o, std::move(engine), std::move(store),
      [io_ctx](std::function<void()> fn) { boost::asio::post(*io_ctx, std::move(fn)); }, SystemClock::Default(),
      std::move(owners), std::move(hooks.before_index_load));
}

Result<std::unique_ptr<Daemon>> Daemon::Open(const DaemonConfig& config, TestHooks hooks) {
  UndoOnFailedStart undo;  // declared first: runs after the daemon (its lock, its index) is closed
  std::unique_ptr<Daemon> d(new Daemon(config));
  SetLogLevel(config.log_level);
  // What this machine can hold and which files the config names, before anything exists.
  std::vector<std::string> warnings;
  KVTIER_RETURN_IF_ERROR(CheckConfigOnHost(config, ReadHostMemory(), &warnings));
  for (const std::string& w : warnings) KVTIER_LOG(WARNING) << w;

  std::error_code ec;
  undo.WillCreate(config.data_dir);
  std::filesystem::create_directories(config.data_dir, ec);
  if (ec) return Internal("cannot create data_dir " + config.data_dir + ": " + ec.message());
  const std::string lock_path = config.data_dir + "/kvtierd.lock";
  undo.WillCreate(lock_path);
  d->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (d->lock_fd_ < 0) return ErrnoStatus(errno, "open " + lock_path);
  if (::flock(d->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return FailedPrecondition("another kvtierd holds " + lock_path + " (one daemon per data_dir)");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(d->lock_fd_, 0) != 0 || ::write(d->lock_fd_, pid.data(), pid.size()) < 0) {
    KVTIER_LOG(WARNING) << "cannot write pid to " << lock_path;
  }

  CacheManager::Options co;
  co.tiers[TierIndex(TierKind::kHost)] = config.host;
  co.max_entries_per_request = config.max_entries_per_request;
  co.max_leased_share = config.security.max_leased_share;
  co.sessions.max_ttl_ns = config.sessions.max_ttl_ns;
  co.sessions.max_per_tenant = config.sessions.max_per_tenant;
  co.sessions.protected_share = config.sessions.protected_share;
  std::tie(co.tenant_limits, co.unknown_limits) = TenantLimitsOf(config.security);
  {
    boost::asio::io_context* io_ctx = &d->io_;
    co.post = [io_ctx](std::function<void()> fn) { boost::asio::post(*io_ctx, std::move(fn)); };
  }
  d->tenants_ = std::make_unique<TenantResolver>(config.security, ::geteuid());
  if (config.gpu.enabled) {
    auto backend = OpenDeviceBackend(config.gpu_backend);
    if (backend.ok()) {
      d->device_ = std::move(backend).value();
      co.tiers[TierIndex(TierKind::kGpu)] = config.gpu;
      co.tiers[TierIndex(TierKind::kGpu)].page_bytes = config.host.page_bytes;  // a block moves between them
      co.device_backend = d->device_.get();
      co.gpu_device = config.gpu_device;
      KVTIER_ASSIGN_OR_RETURN(d->copy_device_, OpenDeviceBackend(d->device_->name()));
      KVTIER_ASSIGN_OR_RETURN(d->copy_stream_, d->copy_device_->CreateStream(config.gpu_device));
      co.gpu_copy = [b = d->copy_device_.get(), s = d->copy_stream_](void* dst, const uint8_t* src, uint64_t n) {
        KVTIER_RETURN_IF_ERROR(b->Copy(dst, src, n, CopyKind::kDeviceToHost, s));
        return b->Synchronize(s);
      };
      KVTIER_LOG(NOTICE) << "gpu tier: backend " << d->device_->name();
    } else if (config.gpu_backend == "auto") {
      KVTIER_LOG(NOTICE) << "gpu tier: " << backend.status().message() << "; running without one";
    } else {
      return backend.status().WithContext("tiers.gpu.backend " + config.gpu_backend);
    }
  }
  CacheManager::NvmeSpec nvme;
  if (config.nvme.enabled()) {
    nvme.options = config.nvme.mover;
    nvme.options.max_spills_in_flight = std::max<uint32_t>(1, config.nvme.io.queue_depth);
    const fs::space_info space = fs::space(config.data_dir, ec);
    if (!ec && space.available < kMinIndexFreeBytes) {
      return ResourceExhausted("data_dir " + config.data_dir + ": its file system is full (" +
                               FormatBytes(space.available) + " free; the NVMe index needs at least " +
                               FormatBytes(kMinIndexFreeBytes) + ")");
    }
    undo.WillCreate(config.data_dir + "/index");
    auto opened = d->OpenNvme(std::move(hooks));
    if (!opened.ok() && opened.status().code() == StatusCode::kResourceExhausted) {
      return opened.status().WithContext("data_dir " + config.data_dir + "'s file system is full");
    }
    KVTIER_ASSIGN_OR_RETURN(nvme.tier, std::move(opened));
  }
  std::vector<CacheManager::LowerTierSpec> lower;  // the chain below NVMe
  Daemon* raw = d.get();
  const LowerTierContext lower_context{
      config, [io_ctx = &d->io_](std::function<void()> fn) { boost::asio::post(*io_ctx, std::move(fn)); }, &d->metrics_,
      [raw](const std::string& key, const std::string& path, uint64_t digest) {
        raw->secrets_.push_back({key, path, digest});
      }};
  for (const LowerTierRow& row : LowerTierRows()) {
    if (!row.enabled(config)) continue;
    KVTIER_ASSIGN_OR_RETURN(CacheManager::LowerTierSpec spec, row.open(lower_context));
    lower.push_back(std::move(spec));
  }
  // The engine socket's group, resolved once: the events' ipc socket is that group's too.
  Server::Options so = config.server;
  if (!config.socket_group.empty()) {
    KVTIER_ASSIGN_OR_RETURN(so.socket_gid, ResolveGroup(config.socket_group));
  }
  if (config.events.enabled) {
    KvEventsOptions eo = ResolveEventEndpoints(config.events.options, config.data_dir);
    eo.state_path = config.data_dir + "/events-announced.json";
    if (!config.socket_group.empty()) eo.ipc_gid = so.socket_gid;
    KVTIER_ASSIGN_OR_RETURN(d->events_, KvEvents::Open(eo));
    co.events = d->events_.get();
  }
  KVTIER_ASSIGN_OR_RETURN(d->cache_, CacheManager::Open(co, std::move(nvme), SystemClock::Default(), std::move(lower)));

  KVTIER_ASSIGN_OR_RETURN(d->server_,
                          Server::Open(
                              d->io_, so, [tenants = d->tenants_.get()](uid_t uid) { return tenants->IsAdmin(uid); },
                              SystemClock::Default()));

  if (config.metrics_port >= 0) {
    KVTIER_ASSIGN_OR_RETURN(d->http_, MetricsHttpServer::Open(
                                          d->io_, config.metrics_listen, config.metrics_port,
                                          [raw] { return raw->metrics_.Render(); }, &d->health_));
    d->info_.metrics_url = d->http_->url();
  }

  std::random_device rd;
  d->info_.version = kVersion;
  d->info_.epoch = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  d->info_.started_ns = SystemClock::Default()->NowNanos();
  d->info_.max_frame_bytes = config.server.max_frame_bytes;
  d->info_.max_entries_per_request = config.max_entries_per_request;
  d->info_.gpu_device = config.gpu_device;
  d->info_.heartbeat_ttl_ms =
      static_cast<uint32_t>(std::min<int64_t>(config.server.heartbeat_ttl_ns / 1'000'000, UINT32_MAX));

  Server* server = d->server_.get();
  d->dispatcher_ = std::make_unique<Dispatcher>(
      d->cache_.get(), &d->info_, SystemClock::Default(), &d->metrics_,
      [server](const std::function<void(const SessionContext&)>& fn) { server->ForEachSession(fn); },
      d->tenants_.get());
  d->RegisterMetrics();
  undo.Keep();
  return d;
}

void Daemon::WatchNvme() {
  if (!nvme_events_ || stopping_) return;
  nvme_events_->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                           [this](const boost::system::error_code& ec) {
                             if (ec) return;
                             cache_->nvme()->OnIoReady();
                             WatchNvme();
                           });
}

void Daemon::ScheduleTick() {
  if (stopping_) return;
  tick_.expires_after(std::chrono::milliseconds(100));
  tick_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    cache_->Tick();
    health_.Beat(NotReady());
    if (watchdog_usec_ > 0) {
      const auto now = std::chrono::steady_clock::now();
      if (now - watchdog_last_ >= std::chrono::microseconds(watchdog_usec_ / 2)) {
        sd_notify(0, "WATCHDOG=1");
        watchdog_last_ = now;
      }
    }
    ScheduleTick();
  });
}

std::string Daemon::NotReady() const {
  if (cache_->draining()) return "draining (kvctl drain): no new GPU leases";
  if (const NvmeTier* nvme = cache_->nvme()) {
    if (!nvme->ready()) return "the NVMe index is loading";
    if (!nvme->index_writable()) return "NVMe index writes are failing (a full or failing disk); retrying";
  }
  return "";
}

void Daemon::FinishInFlightIo() {
  NvmeTier* nvme = cache_->nvme();
  if (!nvme) return;
  // A scrub or index scan is not worth finishing (its client is gone): it stops at its
  // next entry. Spills and index writes already started are worth finishing: they are
  // what a warm restart finds. Bounded, so a hung device cannot hold the shutdown.
  nvme->CancelScans();
  io_.restart();  // the wait on the NVMe eventfd is still armed
  stopping_ = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (nvme->pending_operations() > 0 && std::chrono::steady_clock::now() < deadline) {
    io_.run_for(std::chrono::milliseconds(10));
  }
  stopping_ = true;
  if (nvme->pending_operations() > 0) {
    KVTIER_LOG(WARNING) << "shutdown: " << nvme->pending_operations() << " NVMe operations abandoned";
  }
  nvme_events_->cancel();
  io_.poll();
}

void Daemon::EnableReload(std::string config_path, std::string start_text) {
  config_path_ = std::move(config_path);
  start_text_ = std::move(start_text);
}

void Daemon::WatchReload() {
  reload_signal_.async_wait([this](const boost::system::error_code& ec, int) {
    if (ec) return;
    Reload();
    WatchReload();
  });
}

void Daemon::Reload() {
  if (config_path_.empty()) {
    KVTIER_LOG(WARNING) << "SIGHUP: running on the embedded default config; nothing to reload";
    return;
  }
  // Read once: what is applied and what is compared with the start are the same text.
  auto read = ReadConfigFile(config_path_);
  const std::string text = read.ok() ? *read : std::string();
  auto next = read.ok() ? ParseConfig(text) : Result<DaemonConfig>(read.status());
  if (!next.ok()) {
    KVTIER_LOG(ERROR) << "SIGHUP: " << config_path_ << " not reloaded, nothing changed: " << next.status().message();
    return;
  }
  SetLogLevel(next->log_level);
  *tenants_ = TenantResolver(next->security, ::geteuid());  // the dispatcher and server hold it
  auto [configured, unknown] = TenantLimitsOf(next->security);
  cache_->SetTenantLimits(std::move(configured), unknown, next->security.max_leased_share);
  // What else differs from the file read at start waits for a restart: named by its
  // top-level section. (config_ stays the config the daemon started with.)
  std::vector<std::string> later;
  for (const std::string& key : ChangedSections(start_text_, text)) {
    if (key != "log_level" && key != "security") later.push_back(key);
  }
  const bool nvme_limits = next->security.tenants.size() != config_.security.tenants.size() ||
                           !std::equal(next->security.tenants.begin(), next->security.tenants.end(),
                                       config_.security.tenants.begin(), [](const auto& a, const auto& b) {
                                         const int n = TierIndex(TierKind::kNvme);
                                         return a.quota[n] == b.quota[n] && a.reserve[n] == b.reserve[n];
                                       });
  // Secrets live in files of their own: a changed one is read at the next start only.
  for (const SecretFile& f : secrets_) {
    auto now = ReadSecretFile(f.key, f.path);
    if (!now.ok() || XXH3_64bits(now->data(), now->size()) != f.digest)
      later.push_back(f.key + " (its file's contents)");
  }
  std::string msg = "SIGHUP: reloaded " + config_path_ + ": log_level and tenants applied";
  if (nvme_limits) msg += "; tenants' NVMe quotas and reserves apply at the next restart";
  if (!later.empty()) {
    msg += "; changed, applied at the next restart:";
    for (const std::string& k : later) msg += " " + k;
  }
  KVTIER_LOG(NOTICE) << msg;
}

void Daemon::RequestStop() {
  boost::asio::post(io_, [this] { io_.stop(); });
}

Status Daemon::Run() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    KVTIER_LOG(NOTICE) << "signal " << sig << ": shutting down";
    io_.stop();
  });
  WatchReload();
  server_->Start(dispatcher_.get());
  if (http_) http_->Start();
  if (NvmeTier* nvme = cache_->nvme()) {
    nvme_events_ = std::make_unique<boost::asio::posix::stream_descriptor>(io_, ::dup(nvme->notify_fd()));
    WatchNvme();
  }
  ScheduleTick();
  KVTIER_LOG(NOTICE) << "kvtierd " << kVersion << " serving on " << config_.server.socket_path
                     << (http_ ? ", metrics at " + http_->url() : std::string(", no metrics endpoint"));
  if (sd_watchdog_enabled(0, &watchdog_usec_) <= 0) watchdog_usec_ = 0;
  watchdog_last_ = std::chrono::steady_clock::now();
  sd_notify(0, "READY=1");
  health_.Beat(NotReady());
  io_.run();
  sd_notify(0, "STOPPING=1");
  stopping_ = true;
  tick_.cancel();
  if (http_) http_->Stop();
  server_->Stop();
  FinishInFlightIo();
  Status inv = cache_->CheckInvariants();
  if (!inv.ok()) KVTIER_LOG(ERROR) << "accounting at shutdown: " << inv.ToString();
  KVTIER_LOG(NOTICE) << "kvtierd stopped";
  return inv;
}

}  // namespace kvtier
