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
// OpenDeviceBackend (below) picks one by name.
//
// Asynchrony. Copy, Gather, Scatter, Quantize and Dequantize are enqueued on stream `s`
// (a cudaStream_t as an opaque pointer; nullptr is the default stream) and may return
// before the work is done: the caller must not read the destination, nor change or free
// the source, until Synchronize(s) returned OK. A call's own error (bad geometry, a launch
// refused) is its return value; a fault while the work runs is reported by Synchronize.
// The host-emulated backend does the work before returning (Synchronize is then a no-op),
// so code that forgets Synchronize passes there and fails on a GPU: tests run both.
//
// Ownership. AllocateShareable returns memory and its exported descriptor (`fd`) owned by
// the DeviceAllocation until Free, which releases both. Import does not take `fd` (the
// caller may close it right after: the mapping keeps the memory) and returns an address
// valid until Unimport. RegisterHost pins memory the caller owns until UnregisterHost,
// which must come before that memory is unmapped. Streams from CreateStream are owned by
// the caller until DestroyStream.
//
// Handles. A legacy CUDA IPC handle is exactly kIpcHandleBytes (sizeof(cudaIpcMemHandle_t))
// of opaque bytes; an allocation with one has fd == -1 and legacy_ipc set.
//
// Threads: not thread-safe; use one backend per thread (the daemon's control thread, an
// engine's client).

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>

#include "kernels/kv_layout.h"
#include "protocol/base/status.h"

namespace kvtier {

using DeviceStream = void*;
inline constexpr size_t kIpcHandleBytes = 64;

struct DeviceAllocation {
  uint8_t* ptr = nullptr;  // device address (emulated: host address)
  uint64_t bytes = 0;
  int fd = -1;                                        // exported shareable descriptor, owned; -1 with a legacy handle
  std::array<uint8_t, kIpcHandleBytes> ipc_handle{};  // legacy cudaIpcMemHandle_t bytes
  bool legacy_ipc = false;
  uint64_t opaque = 0;  // backend private
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
  // the legacy handle. kResourceExhausted when the device is full; kInvalidArgument for a
  // device that does not exist.
  virtual Result<DeviceAllocation> AllocateShareable(int device, uint64_t bytes) = 0;
  // Releases the memory and closes its descriptor; `a` is reset. Safe on a reset one.
  virtual void Free(DeviceAllocation& a) = 0;
  // Maps `bytes` of an allocation another process exported: by `fd`, or (fd < 0) by the
  // kIpcHandleBytes at `ipc_handle`. kInvalidArgument when neither is given.
  virtual Result<uint8_t*> Import(int device, int fd, const uint8_t* ipc_handle, uint64_t bytes) = 0;
  // Unmaps an address Import returned (with its size).
  virtual void Unimport(uint8_t* ptr, uint64_t bytes) = 0;

  // Enqueues a copy of `bytes` on `s` (see Asynchrony above).
  virtual Status Copy(void* dst, const void* src, uint64_t bytes, CopyKind kind, DeviceStream s) = 0;
  // All layers, all blocks of `t`, in one launch, enqueued on `s`. Pages may be host
  // memory registered with RegisterHost (the kernel then writes it over the bus) or device
  // memory. kInvalidArgument for a geometry KvGeometry::Validate refuses.
  virtual Status Gather(const KvTransfer& t, DeviceStream s) = 0;
  virtual Status Scatter(const KvTransfer& t, DeviceStream s) = 0;
  // int8 / fp8 with one scale per (token, head), enqueued on `s`; 2-byte elements only
  // (kInvalidArgument otherwise).
  virtual Status Quantize(const KvQuantize& q, DeviceStream s) = 0;
  virtual Status Dequantize(const KvQuantize& q, uint8_t* dst, DeviceStream s) = 0;
  // Waits until everything enqueued on `s` is done; the first fault it hit, if any.
  virtual Status Synchronize(DeviceStream s) = 0;

  // Pins host memory and maps it for device access (cudaHostRegister). No-op emulated.
  virtual Status RegisterHost(void* p, uint64_t bytes) = 0;
  virtual void UnregisterHost(void* p) = 0;
  virtual Result<DeviceStream> CreateStream(int device) = 0;
  virtual void DestroyStream(DeviceStream s) = 0;
};

// What "auto" gives where no CUDA device is visible.
enum class WithoutDevice {
  kUnavailable,   // the error: the daemon then runs without a GPU tier
  kHostEmulated,  // host-emulated: an engine without a GPU keeps its KV in host memory
};
// The names OpenDeviceBackend knows.
inline constexpr std::string_view kDeviceBackendNames[] = {"auto", "cuda", "host-emulated"};
// By name: "host-emulated" always works; "cuda" is kUnavailable without a driver and a
// device (cudaGetDeviceCount fails with no libcuda.so.1) and kUnimplemented in a build
// without CUDA; "auto" is cuda when that works, else as `without` says. kInvalidArgument
// for any other name.
Result<std::unique_ptr<DeviceBackend>> OpenDeviceBackend(std::string_view name,
                                                         WithoutDevice without = WithoutDevice::kUnavailable);
Result<std::unique_ptr<DeviceBackend>> OpenHostDeviceBackend();
Result<std::unique_ptr<DeviceBackend>> OpenCudaDeviceBackend();

}  // namespace kvtier
