#pragma once
// DeviceBackend: the GPU as kvtier uses it — shareable allocations for the GPU tier's
// pool, import of another process's allocation, copies, and the KV kernels.
//
// Implementations:
//   CudaDeviceBackend   CUDA runtime (static) + driver entry points: VMM allocations
//                       exported as POSIX fds (cuMemCreate, cuMemExportToShareableHandle),
//                       legacy cudaIpcMemHandle where VMM is not available.
//   HostDeviceBackend   "host-emulated": device memory is a sealed memfd region, copies are
//                       memcpy, kernels are the CPU references, handles are fds. Every
//                       GPU-tier code path runs on it on machines without a GPU.
// A stream is an opaque pointer (a cudaStream_t for CUDA, ignored when emulated).
// Not thread-safe; one per thread of use.

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>

#include "kernels/kv_layout.h"
#include "protocol/base/status.h"

namespace kvtier {

using DeviceStream = void*;

struct DeviceAllocation {
  uint8_t* ptr = nullptr;  // device address (emulated: host address)
  uint64_t bytes = 0;
  int fd = -1;             // exported shareable descriptor, owned; -1 with a legacy handle
  std::array<uint8_t, 64> ipc_handle{};  // legacy cudaIpcMemHandle_t bytes
  bool legacy_ipc = false;
  uint64_t opaque = 0;     // backend private
};

enum class CopyKind : uint8_t { kHostToDevice, kDeviceToHost, kDeviceToDevice };

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // "cuda" | "host-emulated"
  virtual std::string_view name() const = 0;
  virtual int device_count() const = 0;
  // Whether device addresses are plain host memory (emulated): the daemon can then read
  // device pages itself.
  virtual bool host_addressable() const = 0;

  // Device memory on `device` that other processes can map: by `fd` (SCM_RIGHTS) or by
  // the legacy handle. kResourceExhausted when the device is full.
  virtual Result<DeviceAllocation> AllocateShareable(int device, uint64_t bytes) = 0;
  virtual void Free(DeviceAllocation& a) = 0;
  // Maps an allocation another process exported: by fd, or (fd < 0) by legacy handle.
  virtual Result<uint8_t*> Import(int device, int fd, const uint8_t* ipc_handle, uint64_t bytes) = 0;
  virtual void Unimport(uint8_t* ptr, uint64_t bytes) = 0;

  virtual Status Copy(void* dst, const void* src, uint64_t bytes, CopyKind kind, DeviceStream s) = 0;
  // All layers, all blocks of `t`, in one launch. Pages may be host memory registered with
  // RegisterHost (then the kernel writes it over the bus) or device memory.
  virtual Status Gather(const KvTransfer& t, DeviceStream s) = 0;
  virtual Status Scatter(const KvTransfer& t, DeviceStream s) = 0;
  virtual Status Quantize(const KvQuantize& q, DeviceStream s) = 0;
  virtual Status Dequantize(const KvQuantize& q, uint8_t* dst, DeviceStream s) = 0;
  virtual Status Synchronize(DeviceStream s) = 0;

  // Pins host memory and maps it for device access (cudaHostRegister). No-op emulated.
  virtual Status RegisterHost(void* p, uint64_t bytes) = 0;
  virtual void UnregisterHost(void* p) = 0;
  virtual Result<DeviceStream> CreateStream(int device) = 0;
  virtual void DestroyStream(DeviceStream s) = 0;
};

// "host-emulated" always works; "cuda" is kUnavailable without a driver and a device
// (cudaGetDeviceCount fails with no libcuda.so.1) and kUnimplemented in a build without
// CUDA; "auto" is cuda when that works, else kUnavailable.
Result<std::unique_ptr<DeviceBackend>> OpenDeviceBackend(std::string_view name);
Result<std::unique_ptr<DeviceBackend>> OpenHostDeviceBackend();
Result<std::unique_ptr<DeviceBackend>> OpenCudaDeviceBackend();

}  // namespace kvtier
