// A build without the CUDA toolkit: the CUDA backend exists only as an error.
#include "kernels/device_backend.h"

namespace kvtier {

Result<std::unique_ptr<DeviceBackend>> OpenCudaDeviceBackend() {
  return Unimplemented("this kvtier was built without CUDA (no nvcc at configure time)");
}

}  // namespace kvtier
