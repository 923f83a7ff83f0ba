// ThreadIoEngine: IoEngine on a pool of worker threads doing pread/pwrite/fdatasync. The
// fallback when io_uring cannot be set up; same contract (whole-or-error completions,
// eventfd notification). Registered buffers are accepted and ignored.
#include <errno.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "protocol/base/mutex.h"
#include "protocol/base/thread_name.h"
#include "storage/io/io_engine.h"

namespace kvtier {
namespace {

int32_t RunOne(const IoRequest& r) {
  if (r.op == IoOp::kFdatasync) {
    int rc;
    do rc = ::fdatasync(r.fd);
    while (rc != 0 && errno == EINTR);
    return rc == 0 ? 0 : -errno;
  }
  uint32_t done = 0;
  while (done < r.len) {
    ssize_t n = r.op == IoOp::kRead ? ::pread(r.fd, r.buf + done, r.len - done, static_cast<off_t>(r.offset + done))
                                    : ::pwrite(r.fd, r.buf + done, r.len - done, static_cast<off_t>(r.offset + done));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return -errno;
    }
    if (n == 0) return r.op == IoOp::kRead ? -ENODATA : -EIO;
    done += static_cast<uint32_t>(n);
  }
  return static_cast<int32_t>(r.len);
}

class ThreadIoEngine final : public IoEngine {
 public:
  explicit ThreadIoEngine(const IoEngineOptions& o) : depth_(std::max<uint32_t>(o.queue_depth, 1)) {}

  ~ThreadIoEngine() override {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    if (event_fd_ >= 0) ::close(event_fd_);
  }

  Status Start(uint32_t threads) {
    event_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (event_fd_ < 0) return ErrnoStatus(errno, "eventfd");
    for (uint32_t i = 0; i < std::max<uint32_t>(threads, 1); ++i)
      workers_.emplace_back([this] {
        NameThisThread("kvtier-io");
        Work();
      });
    return Status::Ok();
  }

  std::string_view name() const override { return "threads"; }
  Status RegisterBuffer(uint32_t, uint8_t*, size_t) override { return Status::Ok(); }

  Status Enqueue(const IoRequest& r) override {
    if (in_flight_ >= depth_) return ResourceExhausted("io queue full");
    staged_.push_back(r);
    ++in_flight_;
    return Status::Ok();
  }

  Status Submit() override {
    if (staged_.empty()) return Status::Ok();
    {
      MutexLock lock(&mu_);
      for (const IoRequest& r : staged_) queue_.push_back(r);
    }
    staged_.clear();
    cv_.notify_all();
    return Status::Ok();
  }

  std::vector<IoCompletion> Reap() override {
    uint64_t ignored;
    (void)!::read(event_fd_, &ignored, sizeof(ignored));
    std::vector<IoCompletion> out;
    {
      MutexLock lock(&mu_);
      out.swap(done_);
    }
    in_flight_ -= out.size();
    return out;
  }

  int notify_fd() const override { return event_fd_; }
  size_t in_flight() const override { return in_flight_; }
  size_t capacity() const override { return depth_; }

 private:
  void Work() {
    for (;;) {
      IoRequest r;
      {
        MutexLock lock(&mu_);
        cv_.wait(lock.native(), [this] {
          mu_.AssertHeld();
          return stop_ || !queue_.empty();
        });
        if (stop_) return;
        r = queue_.front();
        queue_.pop_front();
      }
      const int32_t res = RunOne(r);
      {
        MutexLock lock(&mu_);
        done_.push_back(IoCompletion{r.tag, res});
      }
      const uint64_t one = 1;
      (void)!::write(event_fd_, &one, sizeof(one));
    }
  }

  const uint32_t depth_;
  int event_fd_ = -1;
  std::vector<std::thread> workers_;
  std::vector<IoRequest> staged_;  // owner thread only
  size_t in_flight_ = 0;           // owner thread only
  Mutex mu_;
  std::condition_variable cv_;
  std::deque<IoRequest> queue_ KVTIER_GUARDED_BY(mu_);
  std::vector<IoCompletion> done_ KVTIER_GUARDED_BY(mu_);
  bool stop_ KVTIER_GUARDED_BY(mu_) = false;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> OpenThreadIoEngine(const IoEngineOptions& options) {
  auto e = std::make_unique<ThreadIoEngine>(options);
  KVTIER_RETURN_IF_ERROR(e->Start(options.threads));
  return std::unique_ptr<IoEngine>(std::move(e));
}

}  // namespace kvtier
