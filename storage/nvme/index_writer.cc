#include "storage/nvme/index_writer.h"

#include "protocol/base/thread_name.h"

namespace kvtier {

IndexWriter::IndexWriter(BlockIndexStore* store)
    : store_(store), thread_([this] {
        NameThisThread("kvtier-idxwrite");
        Run();
      }) {}

IndexWriter::~IndexWriter() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void IndexWriter::Submit(std::vector<IndexMutation> batch, bool sync, std::function<void(Status)> done) {
  Enqueue(Job{std::move(batch), sync, false, std::move(done)});
}

void IndexWriter::Resume(std::function<void(Status)> done) { Enqueue(Job{{}, false, true, std::move(done)}); }

void IndexWriter::Enqueue(Job job) {
  {
    MutexLock lock(&mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void IndexWriter::Run() {
  for (;;) {
    std::deque<Job> jobs;
    {
      MutexLock lock(&mu_);
      cv_.wait(lock.native(), [this] {
        mu_.AssertHeld();
        return stop_ || !jobs_.empty();
      });
      if (jobs_.empty()) return;  // stop, with everything applied
      jobs.swap(jobs_);
    }
    std::vector<Job*> group;
    auto apply_group = [&] {
      if (group.empty()) return;
      Status st = failed_;
      if (st.ok()) {
        std::vector<IndexMutation> all;
        bool sync = false;
        for (Job* j : group) {
          sync |= j->sync;
          for (IndexMutation& m : j->batch) all.push_back(std::move(m));
        }
        st = store_->Apply(all, sync);
        if (!st.ok()) failed_ = st;
      }
      for (Job* j : group) {
        if (j->done) j->done(st);
      }
      group.clear();
    };
    for (Job& j : jobs) {
      if (!j.resume) {
        group.push_back(&j);
        continue;
      }
      apply_group();
      Status st = failed_.ok() ? Status::Ok() : store_->Resume();
      if (st.ok()) failed_ = Status::Ok();
      if (j.done) j.done(st);
    }
    apply_group();
  }
}

}  // namespace kvtier
