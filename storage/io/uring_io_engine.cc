// UringIoEngine: IoEngine on liburing.
//
// One ring, sized to the queue depth, with an eventfd registered for completions. The
// host pool's segments are registered as fixed buffers (a sparse table updated per
// segment), so O_DIRECT reads and writes go between pool pages and the slot files with no
// copy and no per-I/O page pinning. In-flight requests never exceed the SQ size and the CQ
// is twice that, so the CQ cannot overflow; if the kernel reports overflow anyway it is
// flushed before reaping again.
#include <errno.h>
#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>

#include "protocol/base/logging.h"
#include "storage/io/io_engine.h"

namespace kvtier {
namespace {

class UringIoEngine final : public IoEngine {
 public:
  ~UringIoEngine() override {
    if (ring_ok_) io_uring_queue_exit(&ring_);
    if (event_fd_ >= 0) ::close(event_fd_);
  }

  static Result<std::unique_ptr<IoEngine>> Open(const IoEngineOptions& o) {
    std::unique_ptr<UringIoEngine> e(new UringIoEngine());
    e->depth_ = std::max<uint32_t>(o.queue_depth, 1);
    io_uring_params p{};
    p.flags = IORING_SETUP_CQSIZE | IORING_SETUP_CLAMP;
    p.cq_entries = 2 * e->depth_;
    int rc = io_uring_queue_init_params(e->depth_, &e->ring_, &p);
    if (rc < 0) return ErrnoStatus(-rc, "io_uring_queue_init").WithContext("io_uring unavailable");
    e->ring_ok_ = true;
    if (!(p.features & IORING_FEAT_NODROP)) {
      return Unavailable("io_uring without IORING_FEAT_NODROP (kernel too old)");
    }
    e->event_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (e->event_fd_ < 0) return ErrnoStatus(errno, "eventfd");
    rc = io_uring_register_eventfd(&e->ring_, e->event_fd_);
    if (rc < 0) return ErrnoStatus(-rc, "io_uring_register_eventfd");
    e->max_buffers_ = o.max_buffers;
    rc = io_uring_register_buffers_sparse(&e->ring_, o.max_buffers);
    if (rc < 0) {
      KVTIER_LOG(WARNING) << "io_uring: no sparse fixed buffers (" << std::strerror(-rc)
                          << "); reads and writes will not use registered buffers";
      e->max_buffers_ = 0;
    }
    e->registered_.assign(o.max_buffers, false);
    e->slots_.resize(e->depth_);
    for (uint32_t i = e->depth_; i > 0; --i) e->free_slots_.push_back(i - 1);
    return std::unique_ptr<IoEngine>(std::move(e));
  }

  std::string_view name() const override { return "io_uring"; }

  Status RegisterBuffer(uint32_t index, uint8_t* addr, size_t len) override {
    if (index >= registered_.size()) return InvalidArgument("buffer index out of range");
    registered_[index] = false;
    if (max_buffers_ == 0) return Status::Ok();
    iovec iov{addr, len};
    __u64 tag = 0;
    int rc = io_uring_register_buffers_update_tag(&ring_, index, &iov, &tag, 1);
    if (rc < 0) {
      if (!warned_register_) {
        KVTIER_LOG(WARNING) << "io_uring: cannot register a " << len << "-byte buffer (" << std::strerror(-rc)
                            << "; raise LimitMEMLOCK); using unregistered buffers";
        warned_register_ = true;
      }
      return Status::Ok();
    }
    registered_[index] = true;
    return Status::Ok();
  }

  Status Enqueue(const IoRequest& r) override {
    if (free_slots_.empty()) return ResourceExhausted("io_uring queue full");
    const uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = InFlight{r, 0, true};
    ++in_flight_;
    return Prepare(slot);
  }

  Status Submit() override {
    if (unsubmitted_ == 0) return Status::Ok();
    int rc;
    do rc = io_uring_submit(&ring_);
    while (rc == -EINTR);
    if (rc < 0 && rc != -EAGAIN && rc != -EBUSY) return ErrnoStatus(-rc, "io_uring_submit");
    if (rc > 0) unsubmitted_ -= std::min<uint32_t>(unsubmitted_, static_cast<uint32_t>(rc));
    return Status::Ok();
  }

  std::vector<IoCompletion> Reap() override {
    uint64_t ignored;
    (void)!::read(event_fd_, &ignored, sizeof(ignored));
    std::vector<IoCompletion> out;
    for (;;) {
      if (io_uring_cq_has_overflow(&ring_)) io_uring_get_events(&ring_);
      io_uring_cqe* cqes[64];
      const unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, 64);
      if (n == 0) break;
      for (unsigned i = 0; i < n; ++i)
        Complete(static_cast<uint32_t>(io_uring_cqe_get_data64(cqes[i])), cqes[i]->res, out);
      io_uring_cq_advance(&ring_, n);
    }
    if (unsubmitted_ > 0) (void)Submit();  // continuations of short or retried I/O
    return out;
  }

  int notify_fd() const override { return event_fd_; }
  size_t in_flight() const override { return in_flight_; }
  size_t capacity() const override { return depth_; }

 private:
  struct InFlight {
    IoRequest req;
    uint32_t done = 0;  // bytes transferred so far
    bool used = false;
  };

  UringIoEngine() = default;

  Status Prepare(uint32_t slot) {
    InFlight& f = slots_[slot];
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      KVTIER_RETURN_IF_ERROR(Submit());
      sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) return Unavailable("io_uring submission queue full");
    }
    const IoRequest& r = f.req;
    uint8_t* buf = r.buf + f.done;
    const uint32_t len = r.len - f.done;
    const uint64_t off = r.offset + f.done;
    const bool fixed =
        r.buf_index >= 0 && static_cast<size_t>(r.buf_index) < registered_.size() && registered_[r.buf_index];
    switch (r.op) {
      case IoOp::kRead:
        if (fixed)
          io_uring_prep_read_fixed(sqe, r.fd, buf, len, off, r.buf_index);
        else
          io_uring_prep_read(sqe, r.fd, buf, len, off);
        break;
      case IoOp::kWrite:
        if (fixed)
          io_uring_prep_write_fixed(sqe, r.fd, buf, len, off, r.buf_index);
        else
          io_uring_prep_write(sqe, r.fd, buf, len, off);
        break;
      case IoOp::kFdatasync:
        io_uring_prep_fsync(sqe, r.fd, IORING_FSYNC_DATASYNC);
        break;
    }
    io_uring_sqe_set_data64(sqe, slot);
    ++unsubmitted_;
    return Status::Ok();
  }

  void Finish(uint32_t slot, int32_t result, std::vector<IoCompletion>& out) {
    out.push_back(IoCompletion{slots_[slot].req.tag, result});
    slots_[slot].used = false;
    free_slots_.push_back(slot);
    --in_flight_;
  }

  void Complete(uint32_t slot, int res, std::vector<IoCompletion>& out) {
    InFlight& f = slots_[slot];
    if (res == -EINTR || res == -EAGAIN) {
      if (!Prepare(slot).ok()) Finish(slot, res, out);
      return;
    }
    if (res < 0) return Finish(slot, res, out);
    if (f.req.op == IoOp::kFdatasync) return Finish(slot, 0, out);
    if (res == 0) return Finish(slot, f.req.op == IoOp::kRead ? -ENODATA : -EIO, out);
    f.done += static_cast<uint32_t>(res);
    if (f.done >= f.req.len) return Finish(slot, static_cast<int32_t>(f.req.len), out);
    if (!Prepare(slot).ok()) Finish(slot, -EIO, out);  // continue the short transfer
  }

  io_uring ring_{};
  bool ring_ok_ = false;
  int event_fd_ = -1;
  uint32_t depth_ = 0;
  uint32_t max_buffers_ = 0;
  std::vector<bool> registered_;
  bool warned_register_ = false;
  std::vector<InFlight> slots_;
  std::vector<uint32_t> free_slots_;
  size_t in_flight_ = 0;
  uint32_t unsubmitted_ = 0;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> OpenUringIoEngine(const IoEngineOptions& options) {
  return UringIoEngine::Open(options);
}

}  // namespace kvtier
