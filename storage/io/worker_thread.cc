#include "storage/io/worker_thread.h"

#include "protocol/base/thread_name.h"

namespace kvtier {

WorkerThread::WorkerThread(std::string name)
    : thread_([this, name = std::move(name)](std::stop_token t) {
        NameThisThread(name);
        Run(std::move(t));
      }) {}

WorkerThread::~WorkerThread() { Stop(); }

void WorkerThread::Submit(Job job) {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    jobs_.push_back(std::move(job));
    pending_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_one();
}

void WorkerThread::Cancel() {
  MutexLock lock(&mu_);
  job_stop_.request_stop();
  job_stop_ = std::stop_source();
  pending_.fetch_sub(jobs_.size(), std::memory_order_acq_rel);
  jobs_.clear();
}

void WorkerThread::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    job_stop_.request_stop();
    pending_.fetch_sub(jobs_.size(), std::memory_order_acq_rel);
    jobs_.clear();
  }
  thread_.request_stop();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void WorkerThread::Run(std::stop_token token) {
  for (;;) {
    Job job;
    std::stop_token job_token;
    {
      MutexLock lock(&mu_);
      if (!cv_.wait(lock.native(), token, [this] {
            mu_.AssertHeld();
            return !jobs_.empty();
          }))
        return;  // stopped
      job = std::move(jobs_.front());
      jobs_.pop_front();
      job_token = job_stop_.get_token();
    }
    job(job_token);
    job = nullptr;  // what it captured goes before pending() says it is done
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

bool WorkerThread::Sleep(std::stop_token token, std::chrono::nanoseconds d) {
  Mutex mu;
  std::condition_variable_any cv;
  MutexLock lock(&mu);
  return !cv.wait_for(lock.native(), token, d, [] { return false; }) && !token.stop_requested();
}

}  // namespace kvtier
