// CudaDeviceBackend: the CUDA runtime, linked statically, with the driver's VMM calls
// reached through cudaGetDriverEntryPointByVersion — never by linking libcuda, so kvtier
// starts on machines with the toolkit and no driver (the backend then reports
// kUnavailable and the daemon runs without a CUDA tier).
//
// Shareable allocations are VMM allocations (cuMemCreate) exported as POSIX fds; where the
// driver or device does not offer that (or KVTIER_CUDA_IPC=legacy says not to), cudaMalloc +
// cudaIpcGetMemHandle (a legacy handle
// maps the whole allocation, which is why a pool segment never holds two tenants' pages).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kernels/device_backend.h"
#include "kernels/kv_kernels.h"
#include "protocol/base/logging.h"
#include "protocol/base/mutex.h"

namespace kvtier {
namespace {

Status FromCuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  std::string m = std::string(what) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorMemoryAllocation) return ResourceExhausted(m);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) return Unavailable(m);
  if (e == cudaErrorInvalidValue) return InvalidArgument(m);
  return Internal(m);
}

Status FromCu(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return Status::Ok();
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return ResourceExhausted(std::string(what) + ": out of device memory");
  return Internal(std::string(what) + ": CUresult " + std::to_string(static_cast<int>(r)));
}

struct Driver {
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  bool ok() const {
    return create && release && export_handle && import_handle && reserve && address_free && map && unmap &&
           set_access && granularity;
  }
};

template <class F>
void Resolve(const char* name, F* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess) {
    *fn = reinterpret_cast<F>(p);
  }
}

class CudaDeviceBackend final : public DeviceBackend {
 public:
  ~CudaDeviceBackend() override {
    if (scratch_) cudaFree(scratch_);
  }

  Status Init() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return Unavailable(std::string("no CUDA device: ") + cudaGetErrorString(e));
    if (n == 0) return Unavailable("no CUDA device");
    count_ = n;
    Resolve("cuMemCreate", &drv_.create);
    Resolve("cuMemRelease", &drv_.release);
    Resolve("cuMemExportToShareableHandle", &drv_.export_handle);
    Resolve("cuMemImportFromShareableHandle", &drv_.import_handle);
    Resolve("cuMemAddressReserve", &drv_.reserve);
    Resolve("cuMemAddressFree", &drv_.address_free);
    Resolve("cuMemMap", &drv_.map);
    Resolve("cuMemUnmap", &drv_.unmap);
    Resolve("cuMemSetAccess", &drv_.set_access);
    Resolve("cuMemGetAllocationGranularity", &drv_.granularity);
    if (!drv_.ok()) KVTIER_LOG(WARNING) << "cuda: VMM entry points missing; using legacy IPC handles";
    // The legacy path on a driver that has VMM too: how tests/gpu/device.sh runs the
    // GPU-tier tests on both paths, and a way round a VMM export an environment refuses.
    if (const char* ipc = std::getenv("KVTIER_CUDA_IPC"); ipc != nullptr && std::string_view(ipc) == "legacy") {
      legacy_only_ = true;
    }
    return Status::Ok();
  }

  std::string_view name() const override { return "cuda"; }
  int device_count() const override { return count_; }
  bool host_addressable() const override { return false; }

  Result<DeviceAllocation> AllocateShareable(int device, uint64_t bytes) override {
    KVTIER_RETURN_IF_ERROR(FromCuda(cudaSetDevice(device), "cudaSetDevice"));
    DeviceAllocation a;
    a.bytes = bytes;
    if (drv_.ok() && !legacy_only_) {
      auto vmm = AllocateVmm(device, bytes, &a);
      if (vmm.ok()) return a;
      KVTIER_LOG(WARNING) << "cuda: VMM allocation failed (" << vmm.ToString() << "); legacy IPC";
    }
    void* p = nullptr;
    KVTIER_RETURN_IF_ERROR(FromCuda(cudaMalloc(&p, bytes), "cudaMalloc"));
    cudaIpcMemHandle_t h;
    Status st = FromCuda(cudaIpcGetMemHandle(&h, p), "cudaIpcGetMemHandle");
    if (!st.ok()) {
      cudaFree(p);
      return st;
    }
    static_assert(sizeof(h) <= 64);
    std::memcpy(a.ipc_handle.data(), &h, sizeof(h));
    a.legacy_ipc = true;
    a.ptr = static_cast<uint8_t*>(p);
    return a;
  }

  void Free(DeviceAllocation& a) override {
    if (a.ptr == nullptr) return;
    if (a.legacy_ipc) {
      cudaFree(a.ptr);
    } else {
      drv_.unmap(reinterpret_cast<CUdeviceptr>(a.ptr), a.bytes);
      drv_.address_free(reinterpret_cast<CUdeviceptr>(a.ptr), a.bytes);
      drv_.release(static_cast<CUmemGenericAllocationHandle>(a.opaque));
      if (a.fd >= 0) ::close(a.fd);
    }
    a = DeviceAllocation{};
  }

  Result<uint8_t*> Import(int device, int fd, const uint8_t* ipc_handle, uint64_t bytes) override {
    KVTIER_RETURN_IF_ERROR(FromCuda(cudaSetDevice(device), "cudaSetDevice"));
    if (fd < 0) {
      cudaIpcMemHandle_t h;
      std::memcpy(&h, ipc_handle, sizeof(h));
      void* p = nullptr;
      KVTIER_RETURN_IF_ERROR(
          FromCuda(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle"));
      MutexLock lock(&mu_);
      imported_[p] = Imported{0, true};
      return static_cast<uint8_t*>(p);
    }
    if (!drv_.ok()) return Unimplemented("this driver cannot import VMM descriptors");
    CUmemGenericAllocationHandle h;
    KVTIER_RETURN_IF_ERROR(FromCu(drv_.import_handle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                                  "cuMemImportFromShareableHandle"));
    auto ptr = MapHandle(device, h, bytes);
    if (!ptr.ok()) {
      drv_.release(h);
      return ptr.status();
    }
    MutexLock lock(&mu_);
    imported_[*ptr] = Imported{h, false};
    return static_cast<uint8_t*>(*ptr);
  }

  void Unimport(uint8_t* ptr, uint64_t bytes) override {
    Imported imp;
    {
      MutexLock lock(&mu_);
      auto it = imported_.find(ptr);
      if (it == imported_.end()) return;
      imp = it->second;
      imported_.erase(it);
    }
    if (imp.legacy) {
      cudaIpcCloseMemHandle(ptr);
      return;
    }
    drv_.unmap(reinterpret_cast<CUdeviceptr>(ptr), bytes);
    drv_.address_free(reinterpret_cast<CUdeviceptr>(ptr), bytes);
    drv_.release(imp.handle);
  }

  Status Copy(void* dst, const void* src, uint64_t bytes, CopyKind kind, DeviceStream s) override {
    const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                               : cudaMemcpyDeviceToDevice;
    return FromCuda(cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(s)), "cudaMemcpyAsync");
  }

  Status Gather(const KvTransfer& t, DeviceStream s) override { return Move(t, s, true); }
  Status Scatter(const KvTransfer& t, DeviceStream s) override { return Move(t, s, false); }

  Status Quantize(const KvQuantize& q, DeviceStream s) override {
    if (q.geometry.elem_bytes != 2) return InvalidArgument("quantize needs 2-byte elements");
    return FromCuda(static_cast<cudaError_t>(cuda::LaunchQuantize(q, s)), "quantize kernel");
  }
  Status Dequantize(const KvQuantize& q, uint8_t* dst, DeviceStream s) override {
    if (q.geometry.elem_bytes != 2) return InvalidArgument("dequantize needs 2-byte elements");
    return FromCuda(static_cast<cudaError_t>(cuda::LaunchDequantize(q, dst, s)), "dequantize kernel");
  }
  Status Synchronize(DeviceStream s) override {
    return FromCuda(cudaStreamSynchronize(static_cast<cudaStream_t>(s)), "cudaStreamSynchronize");
  }
  Status RegisterHost(void* p, uint64_t bytes) override {
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e == cudaErrorHostMemoryAlreadyRegistered) return Status::Ok();
    return FromCuda(e, "cudaHostRegister");
  }
  void UnregisterHost(void* p) override { cudaHostUnregister(p); }
  Result<DeviceStream> CreateStream(int device) override {
    KVTIER_RETURN_IF_ERROR(FromCuda(cudaSetDevice(device), "cudaSetDevice"));
    cudaStream_t s;
    KVTIER_RETURN_IF_ERROR(FromCuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
    return DeviceStream{s};
  }
  void DestroyStream(DeviceStream s) override { cudaStreamDestroy(static_cast<cudaStream_t>(s)); }

 private:
  struct Imported {
    CUmemGenericAllocationHandle handle = 0;
    bool legacy = false;
  };

  Status AllocateVmm(int device, uint64_t bytes, DeviceAllocation* a) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    KVTIER_RETURN_IF_ERROR(FromCu(drv_.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity"));
    if (bytes % gran != 0) return InvalidArgument("allocation not a multiple of the VMM granularity");
    CUmemGenericAllocationHandle h;
    KVTIER_RETURN_IF_ERROR(FromCu(drv_.create(&h, bytes, &prop, 0), "cuMemCreate"));
    auto ptr = MapHandle(device, h, bytes);
    if (!ptr.ok()) {
      drv_.release(h);
      return ptr.status();
    }
    int fd = -1;
    Status st =
        FromCu(drv_.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "cuMemExportToShareableHandle");
    if (!st.ok()) {
      drv_.unmap(reinterpret_cast<CUdeviceptr>(*ptr), bytes);
      drv_.address_free(reinterpret_cast<CUdeviceptr>(*ptr), bytes);
      drv_.release(h);
      return st;
    }
    a->ptr = static_cast<uint8_t*>(*ptr);
    a->fd = fd;
    a->opaque = static_cast<uint64_t>(h);
    return Status::Ok();
  }

  Result<void*> MapHandle(int device, CUmemGenericAllocationHandle h, uint64_t bytes) {
    CUdeviceptr ptr = 0;
    KVTIER_RETURN_IF_ERROR(FromCu(drv_.reserve(&ptr, bytes, 0, 0, 0), "cuMemAddressReserve"));
    Status st = FromCu(drv_.map(ptr, bytes, 0, h, 0), "cuMemMap");
    if (st.ok()) {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = device;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      st = FromCu(drv_.set_access(ptr, bytes, &access, 1), "cuMemSetAccess");
      if (!st.ok()) drv_.unmap(ptr, bytes);
    }
    if (!st.ok()) {
      drv_.address_free(ptr, bytes);
      return st;
    }
    return reinterpret_cast<void*>(ptr);
  }

  // Gather/scatter: the block and page arrays go to device scratch memory first.
  Status Move(const KvTransfer& t, DeviceStream s, bool to_page) {
    KVTIER_RETURN_IF_ERROR(t.geometry.Validate());
    if (t.count == 0) return Status::Ok();
    const size_t need = t.count * (sizeof(uint32_t) + sizeof(uint8_t*)) + 16;
    if (need > scratch_bytes_) {
      if (scratch_) cudaFree(scratch_);
      scratch_ = nullptr;
      KVTIER_RETURN_IF_ERROR(FromCuda(cudaMalloc(&scratch_, need * 2), "cudaMalloc scratch"));
      scratch_bytes_ = need * 2;
    }
    staging_.resize(need);
    std::memcpy(staging_.data(), t.pages, t.count * sizeof(uint8_t*));
    std::memcpy(staging_.data() + t.count * sizeof(uint8_t*), t.blocks, t.count * sizeof(uint32_t));
    const cudaStream_t stream = static_cast<cudaStream_t>(s);
    KVTIER_RETURN_IF_ERROR(FromCuda(cudaMemcpyAsync(scratch_, staging_.data(), need, cudaMemcpyHostToDevice, stream),
                                    "copying kernel arguments"));
    auto* pages = reinterpret_cast<uint8_t* const*>(scratch_);
    auto* blocks = reinterpret_cast<const uint32_t*>(static_cast<uint8_t*>(scratch_) + t.count * sizeof(uint8_t*));
    const int e = to_page ? cuda::LaunchGather(t, blocks, pages, s) : cuda::LaunchScatter(t, blocks, pages, s);
    KVTIER_RETURN_IF_ERROR(FromCuda(static_cast<cudaError_t>(e), to_page ? "gather kernel" : "scatter kernel"));
    // The staging buffer is pageable: cudaMemcpyAsync from it has completed on return.
    return Status::Ok();
  }

  int count_ = 0;
  bool legacy_only_ = false;  // KVTIER_CUDA_IPC=legacy
  Driver drv_;
  Mutex mu_;
  std::unordered_map<void*, Imported> imported_ KVTIER_GUARDED_BY(mu_);  // what Import mapped
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::vector<uint8_t> staging_;
};

}  // namespace

Result<std::unique_ptr<DeviceBackend>> OpenCudaDeviceBackend() {
  auto b = std::make_unique<CudaDeviceBackend>();
  KVTIER_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<DeviceBackend>(std::move(b));
}

}  // namespace kvtier
