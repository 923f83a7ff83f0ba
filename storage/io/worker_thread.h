#pragma once
// WorkerThread: one thread that runs long background jobs in order (the NVMe tier's index
// load, scrub and top-N scan), owned by the object whose state the jobs read.
//
// The owner's destructor (or Stop()) asks the running job to stop through its
// std::stop_token, drops the jobs not started, and joins the thread, so a job may hold raw
// pointers to its owner's members for as long as it runs: they outlive it. A job that is
// asked to stop should return at its next step; Sleep() waits in a way Stop() interrupts.
//
// Submit, Stop and pending() are thread-safe; jobs run on the worker thread.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>

#include "protocol/base/mutex.h"

namespace kvtier {

class WorkerThread {
 public:
  using Job = std::function<void(std::stop_token)>;

  // `name`: the thread's (NameThisThread).
  explicit WorkerThread(std::string name);
  ~WorkerThread();  // Stop()
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  // Queues `job`; it runs after those queued before it. After Stop() jobs are dropped.
  void Submit(Job job);
  // Asks the running job to stop, drops queued ones and joins the thread. Idempotent.
  void Stop();
  // Asks the running job to stop and drops the queued ones, without joining: the thread
  // stays and runs later submissions. pending() reaches 0 once the running job returns.
  void Cancel();
  // Jobs queued or running.
  size_t pending() const { return pending_.load(std::memory_order_acquire); }

  // Waits `d`, or less when stop is requested on `token`; false when it was.
  static bool Sleep(std::stop_token token, std::chrono::nanoseconds d);

 private:
  void Run(std::stop_token token);

  Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<Job> jobs_ KVTIER_GUARDED_BY(mu_);
  std::stop_source job_stop_ KVTIER_GUARDED_BY(mu_);  // the running job's; replaced by Cancel()
  bool stopped_ KVTIER_GUARDED_BY(mu_) = false;
  std::atomic<size_t> pending_{0};
  std::jthread thread_;  // last: started once the members above exist
};

}  // namespace kvtier
