#pragma once
// IoEngine: asynchronous file I/O for the NVMe tier, completed on the caller's thread.
//
// Enqueue() queues requests, Submit() hands them to the kernel (or worker threads), and
// Reap() returns finished ones; notify_fd() (an eventfd) becomes readable when there is
// something to reap, so the control thread waits on it in its event loop — nothing polls.
// A request completes whole or not at all: short reads and writes are continued and
// EINTR/EAGAIN are retried inside the engine, so a completion's result is the request's
// full length or a negative errno (-ENODATA for a read that hit the end of the file).
//
// Buffers may be registered (RegisterBuffer) so that reads and writes into them are
// zero-copy fixed-buffer I/O where the backend supports it; a request names the
// registered buffer holding it or -1.
//
// Implementations: UringIoEngine (liburing), ThreadIoEngine (pread/pwrite workers, the
// fallback when io_uring cannot be set up), and tests' FaultInjectionIoEngine.
// Not thread-safe: one owner thread calls every method.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/base/status.h"

namespace kvtier {

enum class IoOp : uint8_t { kRead, kWrite, kFdatasync };

struct IoRequest {
  IoOp op = IoOp::kRead;
  int fd = -1;
  uint64_t offset = 0;
  uint8_t* buf = nullptr;  // kRead/kWrite
  uint32_t len = 0;
  int buf_index = -1;  // registered buffer containing [buf, buf + len), or -1
  uint64_t tag = 0;    // returned with the completion
};

struct IoCompletion {
  uint64_t tag = 0;
  int32_t result = 0;  // == len (0 for fdatasync) on success, else -errno
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;

  // "io_uring", "threads", ...
  virtual std::string_view name() const = 0;
  // Registers [addr, addr + len) as buffer `index` (< max_buffers), replacing the old one.
  // A backend that gains nothing from registration accepts and ignores it. Registration
  // that fails for lack of locked memory leaves the buffer usable without it.
  virtual Status RegisterBuffer(uint32_t index, uint8_t* addr, size_t len) = 0;
  // Queues a request. kResourceExhausted when capacity() requests are queued or in flight.
  virtual Status Enqueue(const IoRequest& request) = 0;
  // Starts every queued request.
  virtual Status Submit() = 0;
  // Finished requests, in completion order. Never blocks.
  virtual std::vector<IoCompletion> Reap() = 0;
  // Readable when Reap() may return something; Reap() clears it.
  virtual int notify_fd() const = 0;
  // Requests queued or in flight.
  virtual size_t in_flight() const = 0;
  virtual size_t capacity() const = 0;
};

struct IoEngineOptions {
  // "auto": io_uring when it can be set up (sysctl kernel.io_uring_disabled, seccomp and
  // old kernels can prevent it), else "threads". Default: "auto".
  std::string backend = "auto";
  // Most requests in flight. Default: 256.
  uint32_t queue_depth = 256;
  // Registered buffer slots. Default: 256.
  uint32_t max_buffers = 256;
  // Worker threads of the threads backend. Default: 4.
  uint32_t threads = 4;
  bool operator==(const IoEngineOptions&) const = default;
};

// The backends OpenIoEngine knows, by name.
inline constexpr std::string_view kIoBackendNames[] = {"auto", "io_uring", "threads"};

// kInvalidArgument for an unknown backend; with "io_uring", kUnavailable when it cannot
// be set up. "auto" logs which one it chose and why.
Result<std::unique_ptr<IoEngine>> OpenIoEngine(const IoEngineOptions& options);

Result<std::unique_ptr<IoEngine>> OpenUringIoEngine(const IoEngineOptions& options);
Result<std::unique_ptr<IoEngine>> OpenThreadIoEngine(const IoEngineOptions& options);

}  // namespace kvtier
