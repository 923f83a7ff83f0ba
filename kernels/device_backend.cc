// The DeviceBackend selector: one meaning of "auto" for the daemon and the client.
#include "kernels/device_backend.h"

#include <string>

namespace kvtier {

Result<std::unique_ptr<DeviceBackend>> OpenDeviceBackend(std::string_view name, WithoutDevice without) {
  if (name == "host-emulated") return OpenHostDeviceBackend();
  if (name == "cuda") return OpenCudaDeviceBackend();
  if (name != "auto") {
    return InvalidArgument("device backend '" + std::string(name) + "' is not auto, cuda or host-emulated");
  }
  auto cuda = OpenCudaDeviceBackend();
  if (cuda.ok() || without == WithoutDevice::kUnavailable) return cuda;
  return OpenHostDeviceBackend();
}

}  // namespace kvtier
