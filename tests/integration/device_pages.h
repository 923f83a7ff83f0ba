#pragma once
// Page and engine-KV bytes for tests that run on either GPU backend (TestGpuBackend()):
// host pages and host-emulated GPU pages are plain memory here; a CUDA GPU page is device
// memory, reached by copies through this process's own DeviceBackend. A test that writes
// or checks pages through these runs unchanged on tests/gpu/device.sh's cuda backend.
//
// CUDA and fork: this process's backend is opened on first use, so a test that forks
// engines must not touch GPU pages in the parent before the last fork.
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "engine/client.h"
#include "engine/tools/block_pattern.h"
#include "kernels/device_backend.h"
#include "tests/support/test_util.h"

namespace kvtier::testing {

// This process's backend of TestGpuBackend()'s kind; nullptr when it cannot be opened.
inline DeviceBackend* ProcessDevice() {
  static const std::unique_ptr<DeviceBackend> device = [] {
    auto d = OpenDeviceBackend(TestGpuBackend());
    return d.ok() ? std::move(*d) : nullptr;
  }();
  return device.get();
}

// Copies between host memory and `device` memory of ProcessDevice(), waiting for the copy.
inline Status CopyWithDevice(void* dst, const void* src, size_t bytes, CopyKind kind) {
  DeviceBackend* dev = ProcessDevice();
  if (dev == nullptr) return Unavailable("no " + TestGpuBackend() + " device in this process");
  KVTIER_RETURN_IF_ERROR(dev->Copy(dst, src, bytes, kind, nullptr));
  return dev->Synchronize(nullptr);
}

inline Status WritePage(const Client& c, TierKind tier, PageId page, std::span<const uint8_t> bytes) {
  if (auto host = c.PageBytes(tier, page); !host.empty()) {
    if (host.size() < bytes.size()) return Internal("page smaller than its bytes");
    std::memcpy(host.data(), bytes.data(), bytes.size());
    return Status::Ok();
  }
  void* p = c.PageAddress(tier, page);
  if (p == nullptr) return Internal("page not mapped");
  return CopyWithDevice(p, bytes.data(), bytes.size(), CopyKind::kHostToDevice);
}

inline Result<std::vector<uint8_t>> ReadPage(const Client& c, TierKind tier, PageId page, size_t bytes) {
  if (auto host = c.PageBytes(tier, page); !host.empty()) {
    if (host.size() < bytes) return Internal("page smaller than asked");
    return std::vector<uint8_t>(host.begin(), host.begin() + static_cast<ptrdiff_t>(bytes));
  }
  const void* p = c.PageAddress(tier, page);
  if (p == nullptr) return Internal("page not mapped");
  std::vector<uint8_t> out(bytes);
  KVTIER_RETURN_IF_ERROR(CopyWithDevice(out.data(), p, bytes, CopyKind::kDeviceToHost));
  return out;
}

// The block pattern of `h` (engine/tools/block_pattern.h) in a page's first `bytes`.
inline Status FillPage(const Client& c, TierKind tier, PageId page, const BlockHash& h, size_t bytes) {
  std::vector<uint8_t> b(bytes);
  FillBlockPattern(h, b);
  return WritePage(c, tier, page, b);
}
inline bool CheckPage(const Client& c, TierKind tier, PageId page, const BlockHash& h, size_t bytes) {
  auto b = ReadPage(c, tier, page, bytes);
  return b.ok() && CheckBlockPattern(h, *b);
}

// Device memory of ProcessDevice() for an engine's KV tensors, freed with the object.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(uint64_t bytes) {
    if (DeviceBackend* dev = ProcessDevice()) {
      // Whole VMM granules (2 MiB), so that CUDA allocates it as the daemon's pool.
      auto a = dev->AllocateShareable(0, (bytes + (2u << 20) - 1) & ~uint64_t{(2u << 20) - 1});
      if (a.ok()) alloc_ = *a;
    }
    bytes_ = bytes;
  }
  ~DeviceBuffer() {
    if (alloc_.ptr != nullptr) ProcessDevice()->Free(alloc_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  uint8_t* data() const { return alloc_.ptr; }
  Status Upload(std::span<const uint8_t> from) {
    if (alloc_.ptr == nullptr || from.size() > bytes_) return Internal("device buffer not allocated or too small");
    return CopyWithDevice(alloc_.ptr, from.data(), from.size(), CopyKind::kHostToDevice);
  }
  Result<std::vector<uint8_t>> Download() const {
    if (alloc_.ptr == nullptr) return Internal("device buffer not allocated");
    std::vector<uint8_t> out(bytes_);
    KVTIER_RETURN_IF_ERROR(CopyWithDevice(out.data(), alloc_.ptr, bytes_, CopyKind::kDeviceToHost));
    return out;
  }

 private:
  DeviceAllocation alloc_;
  uint64_t bytes_ = 0;
};

}  // namespace kvtier::testing
