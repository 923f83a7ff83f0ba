#pragma once
// BlockWorkers: a few threads that do the CPU work of moving blocks between tiers — the
// quantization of a block on its way down to a quantized cold tier, its dequantization on
// the way back up, the copy of a GPU block into a host page — so the control thread never
// does it (a 2 MiB block costs about a millisecond of CPU to quantize).
//
// Run() queues `work`; one of the threads runs it, and `done` then runs with its status on
// the owner's thread through `post`, never inside Run(). Jobs start in the order they were
// queued (they may finish out of it with more than one thread). The caller keeps whatever
// `work` touches alive and unchanged until `done`.
//
// The threads run at a lower priority (nice 5) than the control thread, so a burst of
// copies takes little CPU from what answers requests (nice 10 starved them when other
// processes loaded the machine; nice 0 doubled Lookup p99 during demotion bursts).
//
// Threads: Run and the accessors on the owner's (control) thread. The destructor asks the
// threads to stop after their current job, joins them, and drops queued jobs and
// completions not yet delivered.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "protocol/base/mutex.h"
#include "protocol/base/post.h"
#include "protocol/base/status.h"

namespace kvtier {

class BlockWorkers {
 public:
  // kInvalidArgument for threads outside [1, 64].
  // `name`: the threads' (NameThisThread). `nice`: their nice value (kNice for work nothing
  // waits on).
  static Result<std::unique_ptr<BlockWorkers>> Open(std::string name, int threads, Post post, int nice = kNice);
  ~BlockWorkers();
  BlockWorkers(const BlockWorkers&) = delete;
  BlockWorkers& operator=(const BlockWorkers&) = delete;

  void Run(std::function<Status()> work, std::function<void(Status)> done);
  // Jobs queued or running.
  size_t pending() const { return pending_; }
  // The threads' nice value: below the control thread, which serves requests.
  static constexpr int kNice = 5;

 private:
  struct Job {
    std::function<Status()> work;
    std::function<void(Status)> done;
  };
  BlockWorkers(Post post, int nice)
      : post_(std::move(post)), nice_(nice), self_(std::make_shared<BlockWorkers*>(this)) {}
  void Loop(std::stop_token stop);

  Post post_;
  int nice_;
  std::shared_ptr<BlockWorkers*> self_;  // expires with this object: late completions are dropped
  Mutex mu_;
  std::condition_variable_any cv_;
  std::deque<Job> queue_ KVTIER_GUARDED_BY(mu_);
  size_t pending_ = 0;  // owner's thread only
  std::vector<std::jthread> threads_;
};

}  // namespace kvtier
