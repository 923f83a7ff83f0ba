#include "daemon/health.h"

namespace kvtier {

void Health::Beat(std::string not_ready) {
  const int64_t now = clock_->NowNanos();
  MutexLock lock(&mu_);
  last_beat_ns_ = now;
  not_ready_ = std::move(not_ready);
}

Health::Answer Health::LiveLocked() const {
  if (last_beat_ns_ < 0) return {true, "ok (starting)"};
  const int64_t idle = clock_->NowNanos() - last_beat_ns_;
  if (idle > stall_timeout_ns_) {
    return {false, "the control loop has not run for " + std::to_string(idle / 1'000'000) + " ms (stall_timeout " +
                       std::to_string(stall_timeout_ns_ / 1'000'000) + " ms)"};
  }
  return {true, "ok"};
}

Health::Answer Health::Live() const {
  MutexLock lock(&mu_);
  return LiveLocked();
}

Health::Answer Health::Ready() const {
  MutexLock lock(&mu_);
  Answer live = LiveLocked();
  if (!live.ok) return live;
  if (last_beat_ns_ < 0) return {false, "starting"};
  if (!not_ready_.empty()) return {false, not_ready_};
  return {true, "ready"};
}

}  // namespace kvtier
