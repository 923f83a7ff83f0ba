#pragma once
// IndexWriter: applies NVMe index batches on a thread of its own, grouping whatever is
// queued into one store write (one WAL sync covers many blocks: group commit), and calls
// each batch's callback on that thread with the group's status. After a write fails,
// later batches fail with its status without reaching the store (RocksDB must not be
// written after a failed WAL write) until a Resume succeeds. Destruction applies what is
// queued, then joins.
//
// Thread-safe: Submit and Resume may be called from any thread.

#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "protocol/base/mutex.h"
#include "protocol/base/status.h"
#include "storage/nvme/block_index_store.h"

namespace kvtier {

class IndexWriter {
 public:
  // `store` outlives the writer.
  explicit IndexWriter(BlockIndexStore* store);
  ~IndexWriter();

  // `done` runs on the writer's thread; it must only post.
  void Submit(std::vector<IndexMutation> batch, bool sync, std::function<void(Status)> done);
  // Clears a failure (the store's Resume); done(OK) once writes go to the store again.
  void Resume(std::function<void(Status)> done);

 private:
  struct Job {
    std::vector<IndexMutation> batch;
    bool sync;
    bool resume;
    std::function<void(Status)> done;
  };
  void Enqueue(Job job);
  void Run();

  BlockIndexStore* store_;
  Mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_ KVTIER_GUARDED_BY(mu_);
  bool stop_ KVTIER_GUARDED_BY(mu_) = false;
  Status failed_;  // writer thread only
  std::thread thread_;
};

}  // namespace kvtier
