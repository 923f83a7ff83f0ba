// HostDeviceBackend: "device" memory is sealed memfd regions of host RAM, copies are
// memcpy, and the kernels are the CPU references — the GPU tier's code paths, run and
// tested where there is no GPU.
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "kernels/cpu_kernels.h"
#include "kernels/device_backend.h"

namespace kvtier {
namespace {

class HostDeviceBackend final : public DeviceBackend {
 public:
  std::string_view name() const override { return "host-emulated"; }
  int device_count() const override { return 1; }
  bool host_addressable() const override { return true; }

  Result<DeviceAllocation> AllocateShareable(int device, uint64_t bytes) override {
    if (device != 0) return InvalidArgument("host-emulated backend has one device");
    DeviceAllocation a;
    a.bytes = bytes;
    a.fd = ::memfd_create("kvtier-gpu-emulated", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (a.fd < 0) return ErrnoStatus(errno, "memfd_create");
    if (::ftruncate(a.fd, static_cast<off_t>(bytes)) != 0 ||
        ::fcntl(a.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      Status st = ErrnoStatus(errno, "sizing emulated device memory");
      ::close(a.fd);
      return st;
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
    if (p == MAP_FAILED) {
      Status st = ErrnoStatus(errno, "mmap of emulated device memory");
      ::close(a.fd);
      return st;
    }
    a.ptr = static_cast<uint8_t*>(p);
    return a;
  }

  void Free(DeviceAllocation& a) override {
    if (a.ptr) ::munmap(a.ptr, a.bytes);
    if (a.fd >= 0) ::close(a.fd);
    a = DeviceAllocation{};
  }

  Result<uint8_t*> Import(int, int fd, const uint8_t*, uint64_t bytes) override {
    if (fd < 0) return InvalidArgument("host-emulated import needs a descriptor");
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap of an emulated device allocation");
    return static_cast<uint8_t*>(p);
  }

  void Unimport(uint8_t* ptr, uint64_t bytes) override { ::munmap(ptr, bytes); }

  Status Copy(void* dst, const void* src, uint64_t bytes, CopyKind, DeviceStream) override {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status Gather(const KvTransfer& t, DeviceStream) override {
    KVTIER_RETURN_IF_ERROR(t.geometry.Validate());
    GatherCpu(t);
    return Status::Ok();
  }
  Status Scatter(const KvTransfer& t, DeviceStream) override {
    KVTIER_RETURN_IF_ERROR(t.geometry.Validate());
    ScatterCpu(t);
    return Status::Ok();
  }
  Status Quantize(const KvQuantize& q, DeviceStream) override {
    if (q.geometry.elem_bytes != 2) return InvalidArgument("quantize needs 2-byte elements");
    QuantizeCpu(q);
    return Status::Ok();
  }
  Status Dequantize(const KvQuantize& q, uint8_t* dst, DeviceStream) override {
    if (q.geometry.elem_bytes != 2) return InvalidArgument("dequantize needs 2-byte elements");
    DequantizeCpu(q, dst);
    return Status::Ok();
  }
  Status Synchronize(DeviceStream) override { return Status::Ok(); }
  Status RegisterHost(void*, uint64_t) override { return Status::Ok(); }
  void UnregisterHost(void*) override {}
  Result<DeviceStream> CreateStream(int) override { return DeviceStream{nullptr}; }
  void DestroyStream(DeviceStream) override {}
};

}  // namespace

Result<std::unique_ptr<DeviceBackend>> OpenHostDeviceBackend() {
  return std::unique_ptr<DeviceBackend>(new HostDeviceBackend());
}

}  // namespace kvtier
