#pragma once
// ControlLoop: the daemon's event loop, for tests that drive a CacheManager over a real
// NvmeTier on the test's thread. Movers and tiers post their completions to Poster(); Pump
// runs them, the NVMe tier's I/O completions and the manager's Tick until a condition holds.

#include <poll.h>

#include <chrono>
#include <deque>
#include <functional>

#include "daemon/cache/cache_manager.h"
#include "protocol/base/mutex.h"

namespace kvtier::testing {

class ControlLoop {
 public:
  using Post = std::function<void(std::function<void()>)>;

  // Callbacks posted here run in Pump, on the test's thread. The loop outlives them.
  Post Poster() {
    return [this](std::function<void()> fn) {
      MutexLock lock(&mu_);
      posted_.push_back(std::move(fn));
    };
  }

  // Until done() (true) or 10 s (done()'s last answer): posted callbacks, each after
  // before_each() (a fake clock's step, say), then I/O completions and a Tick.
  template <class Pred>
  bool Pump(CacheManager& cm, Pred done, const std::function<void()>& before_each = {}) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      while (std::function<void()> fn = Next()) {
        if (before_each) before_each();
        fn();
      }
      if (done()) return true;
      pollfd p{cm.nvme()->notify_fd(), POLLIN, 0};
      if (::poll(&p, 1, 2) > 0) cm.nvme()->OnIoReady();
      cm.Tick();
    }
    return done();
  }

 private:
  std::function<void()> Next() {
    MutexLock lock(&mu_);
    if (posted_.empty()) return nullptr;
    std::function<void()> fn = std::move(posted_.front());
    posted_.pop_front();
    return fn;
  }

  Mutex mu_;
  std::deque<std::function<void()>> posted_ KVTIER_GUARDED_BY(mu_);
};

}  // namespace kvtier::testing
