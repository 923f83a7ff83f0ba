#include "daemon/cache/block_workers.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "protocol/base/thread_name.h"

namespace kvtier {

Result<std::unique_ptr<BlockWorkers>> BlockWorkers::Open(std::string name, int threads, Post post, int nice) {
  if (threads < 1 || threads > 64) return InvalidArgument("block worker threads must be 1..64");
  std::unique_ptr<BlockWorkers> w(new BlockWorkers(std::move(post), nice));
  for (int i = 0; i < threads; ++i) {
    BlockWorkers* raw = w.get();
    w->threads_.emplace_back([raw, name](std::stop_token st) {
      NameThisThread(name);
      raw->Loop(st);
    });
  }
  return w;
}

BlockWorkers::~BlockWorkers() {
  for (auto& t : threads_) t.request_stop();
  cv_.notify_all();
  threads_.clear();  // joins
  self_.reset();
}

void BlockWorkers::Run(std::function<Status()> work, std::function<void(Status)> done) {
  ++pending_;
  {
    MutexLock l(&mu_);
    queue_.push_back(Job{std::move(work), std::move(done)});
  }
  cv_.notify_one();
}

void BlockWorkers::Loop(std::stop_token stop) {
  // Background work: when the control thread wants a CPU, it gets it first (Linux nice
  // values are per thread).
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), nice_);
  for (;;) {
    Job job;
    {
      MutexLock l(&mu_);
      if (!cv_.wait(l.native(), stop, [this] {
            mu_.AssertHeld();
            return !queue_.empty();
          }))
        return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    Status st = job.work();
    std::weak_ptr<BlockWorkers*> weak = self_;
    post_([weak, st = std::move(st), done = std::move(job.done)] {
      auto self = weak.lock();
      if (!self) return;
      --(*self)->pending_;
      if (done) done(st);
    });
  }
}

}  // namespace kvtier
