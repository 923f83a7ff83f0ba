// The IoEngine selector: io_uring when it can be set up, the threads backend otherwise (as
// Seastar picks its reactor backend at run time).
#include "storage/io/io_engine.h"

#include "protocol/base/logging.h"

namespace kvtier {

Result<std::unique_ptr<IoEngine>> OpenIoEngine(const IoEngineOptions& options) {
  if (options.backend == "io_uring") return OpenUringIoEngine(options);
  if (options.backend == "threads") return OpenThreadIoEngine(options);
  if (options.backend != "auto") {
    return InvalidArgument("io_backend '" + options.backend + "' is not auto, io_uring or threads");
  }
  auto uring = OpenUringIoEngine(options);
  if (uring.ok()) return uring;
  KVTIER_LOG(WARNING) << "io_backend auto: " << uring.status().ToString()
                      << "; falling back to the threads backend (pread/pwrite workers)";
  return OpenThreadIoEngine(options);
}

}  // namespace kvtier
