#pragma once
// Health: what kvtierd's probes are told — GET /healthz and /readyz on the metrics port
// (Kubernetes' liveness and readiness probes) and `kvctl health`.
//
//   /healthz  200 while the control loop has run within metrics.stall_timeout; 503 once
//             it has not (stuck: a liveness probe should restart the daemon).
//   /readyz   200 when kvtierd should get engines and a rolling update may move on; 503
//             before the first tick, while not live, during a drain, while the NVMe
//             index loads, and while NVMe index writes fail. The body says why.
//
// The control thread reports on each tick (Beat); the metrics thread reads (Live/Ready),
// so the probes are answered even while the control loop is stuck. Thread-safe.

#include <cstdint>
#include <mutex>
#include <string>

#include "protocol/base/clock.h"
#include "protocol/base/mutex.h"

namespace kvtier {

class Health {
 public:
  struct Answer {
    bool ok = false;
    std::string body;  // one line: "ok", "ready", or why not
  };

  Health(const Clock* clock, int64_t stall_timeout_ns) : clock_(clock), stall_timeout_ns_(stall_timeout_ns) {}

  // The control loop ran now; `not_ready` is why the daemon should not get engines now
  // ("" when it should).
  void Beat(std::string not_ready);
  Answer Live() const;
  Answer Ready() const;

 private:
  Answer LiveLocked() const KVTIER_REQUIRES(mu_);

  const Clock* clock_;
  const int64_t stall_timeout_ns_;
  mutable Mutex mu_;
  int64_t last_beat_ns_ KVTIER_GUARDED_BY(mu_) = -1;  // -1: no beat yet
  std::string not_ready_ KVTIER_GUARDED_BY(mu_) = "starting";
};

}  // namespace kvtier
