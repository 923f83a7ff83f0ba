#pragma once
// Daemon: kvtierd assembled from its parts — config, cache manager, dispatcher, Unix
// socket server, metrics endpoint — on one io_context run by the calling thread (the
// control thread); the metrics endpoint answers from a thread of its own. main.cc only parses flags and calls Open()
// and Run().
//
// Not thread-safe, except RequestStop(), which any thread may call.

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/cache/cache_manager.h"
#include "daemon/config.h"
#include "daemon/dispatcher.h"
#include "daemon/health.h"
#include "daemon/metrics.h"
#include "daemon/metrics_http.h"
#include "daemon/server.h"
#include "kvtier_version.h"  // generated: kVersion from project(VERSION)

namespace kvtier {

class Daemon {
 public:
  // Wraps the NVMe tier's IoEngine before use (tests inject faults this way); identity
  // by default.
  using IoEngineWrapper = std::function<std::unique_ptr<IoEngine>(std::unique_ptr<IoEngine>)>;
  // What tests change in a real daemon (kvtierd-faulty): the NVMe IoEngine's wrapper, and
  // a hook run on the scan thread before the NVMe index load (NvmeTierOptions::before_load).
  struct TestHooks {
    IoEngineWrapper wrap_io;
    std::function<void()> before_index_load;
  };

  // Creates the data directory, takes its lock (one daemon per data_dir), builds the
  // pools, opens the NVMe tier and its index, and binds the socket and metrics port.
  // Errors name what failed.
  static Result<std::unique_ptr<Daemon>> Open(const DaemonConfig& config, TestHooks hooks = {});
  ~Daemon();

  // Serves until SIGTERM/SIGINT or RequestStop(); then closes every session and removes
  // the socket. Tells systemd READY=1 and STOPPING=1 when run under it. SIGHUP reloads
  // the config file (EnableReload): log_level and the tenants (security.*: who is which
  // tenant, quotas, reserves) take effect; other changed keys are named in the log and
  // wait for a restart; a file that does not parse changes nothing.
  Status Run();
  // The file SIGHUP reloads (empty: the embedded default, nothing to reload) and the text
  // the daemon was started with, which a reload compares against.
  void EnableReload(std::string config_path, std::string start_text);
  void RequestStop();

  const DaemonInfo& info() const { return info_; }

 private:
  explicit Daemon(const DaemonConfig& config);
  Result<std::unique_ptr<NvmeTier>> OpenNvme(TestHooks hooks);
  void RegisterMetrics();
  void RegisterLowerTierMetrics();
  void WatchNvme();
  void WatchReload();
  void Reload();
  void ScheduleTick();
  // Why the daemon should not get engines now (Health::Beat), or "".
  std::string NotReady() const;
  // After the loop stops: stops scans, lets spills, fetches and index writes in flight
  // finish (bounded). Not `kvctl drain` (CacheManager::SetDrain), which runs while serving.
  void FinishInFlightIo();

  DaemonConfig config_;
  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  boost::asio::signal_set reload_signal_;  // SIGHUP
  std::string config_path_;
  std::string start_text_;  // config_path_'s text when reloads were enabled
  // The secret files read at start: a reload says when one's contents changed.
  struct SecretFile {
    std::string key, path;
    uint64_t digest;
  };
  std::vector<SecretFile> secrets_;
  int lock_fd_ = -1;
  DaemonInfo info_;
  MetricsRegistry metrics_;
  Health health_;  // before http_, which reads it
  std::unique_ptr<TenantResolver> tenants_;
  std::unique_ptr<DeviceBackend> device_;  // before cache_: the GPU pool's memory lives in it
  // A backend of the GPU copy thread's own (one backend per thread), and its stream:
  // GPU->host demotion copies run there, not on the control thread.
  std::unique_ptr<DeviceBackend> copy_device_;
  DeviceStream copy_stream_ = nullptr;
  std::unique_ptr<KvEvents> events_;  // before cache_, which reports to it
  std::unique_ptr<CacheManager> cache_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<MetricsHttpServer> http_;
  std::unique_ptr<boost::asio::posix::stream_descriptor> nvme_events_;
  // Tenants with NVMe limits, by their owner id in the NVMe tier (index 0: everyone else).
  std::vector<std::string> nvme_owners_;
  boost::asio::steady_timer tick_;
  bool stopping_ = false;
  // systemd's watchdog (WatchdogSec=): pinged from the control loop's tick at half the
  // interval, so a control thread stuck for longer gets the daemon restarted. 0: off.
  uint64_t watchdog_usec_ = 0;
  std::chrono::steady_clock::time_point watchdog_last_;
};

}  // namespace kvtier
