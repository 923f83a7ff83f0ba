#pragma once
// DeviceSegmentMemory: the GPU tier's pool segments as shareable device allocations of a
// DeviceBackend — with CUDA, VMM allocations exported as POSIX fds (or legacy IPC
// handles); host-emulated, sealed memfds. Renew frees a segment's allocation and makes a
// new one, so a segment changes tenant with fresh memory (a legacy IPC handle maps the
// whole allocation: segments are what keep tenants apart).
// Owned by the control thread; not thread-safe.

#include <memory>
#include <vector>

#include "kernels/device_backend.h"
#include "storage/pool/segment_memory.h"

namespace kvtier {

class DeviceSegmentMemory final : public SegmentMemory {
 public:
  // `backend` outlives this object.
  static Result<std::unique_ptr<DeviceSegmentMemory>> Open(DeviceBackend* backend, int device, uint64_t segment_bytes,
                                                           uint32_t segments);
  ~DeviceSegmentMemory() override;

  uint32_t segment_count() const override { return static_cast<uint32_t>(segments_.size()); }
  uint64_t segment_bytes() const override { return segment_bytes_; }
  int ShareFd(uint32_t segment) const override { return segments_[segment].fd; }
  uint8_t* HostAddress(uint32_t segment) const override {
    return backend_->host_addressable() ? segments_[segment].ptr : nullptr;
  }
  Status Renew(uint32_t segment) override;
  std::string Describe() const override;
  Status CopyToHost(uint32_t segment, uint64_t offset, void* dst, uint64_t bytes) override;
  std::span<const uint8_t> IpcHandle(uint32_t segment) const override {
    const DeviceAllocation& a = segments_[segment];
    return a.legacy_ipc ? std::span<const uint8_t>(a.ipc_handle.data(), a.ipc_handle.size())
                        : std::span<const uint8_t>();
  }
  std::string_view backend() const override { return backend_->name(); }
  // The device address of a segment.
  uint8_t* DeviceAddress(uint32_t segment) const override { return segments_[segment].ptr; }
  int device() const { return device_; }

 private:
  DeviceSegmentMemory(DeviceBackend* b, int device, uint64_t bytes)
      : backend_(b), device_(device), segment_bytes_(bytes) {}

  DeviceBackend* backend_;
  int device_;
  uint64_t segment_bytes_;
  std::vector<DeviceAllocation> segments_;
  DeviceStream stream_ = nullptr;
};

}  // namespace kvtier
