#pragma once
// PostedLoop: the owner's (control) thread of a test of something that posts its callbacks
// (a lower tier, from its own threads or from its calls): they queue here, under a lock,
// and run in Pump on the test's thread.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>

#include "protocol/base/post.h"

namespace kvtier::testing {

class PostedLoop {
 public:
  // Callbacks posted here run in Pump. The loop outlives whatever posts to it.
  Post Poster() {
    return [this](std::function<void()> fn) {
      {
        std::lock_guard<std::mutex> l(mu_);
        q_.push_back(std::move(fn));
      }
      cv_.notify_one();
    };
  }
  // Runs posted work until `done` or `timeout`; done()'s last answer.
  bool Pump(const std::function<bool()>& done, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (done()) return true;
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> l(mu_);
        if (!cv_.wait_until(l, deadline, [this] { return !q_.empty(); })) return done();
        fn = std::move(q_.front());
        q_.pop_front();
      }
      fn();
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
};

}  // namespace kvtier::testing
