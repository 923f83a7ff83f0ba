// kvtierd-faulty: kvtierd whose NVMe IoEngine is wrapped in a FaultInjectionIoEngine driven
// by $KVTIER_IO_FAULTS ("op:nth:kind,..."). For tests only.
#include <cstdio>
#include <cstdlib>

#include "daemon/daemon_main.h"
#include "tests/support/fault_injection_io_engine.h"

int main(int argc, char** argv) {
  const char* spec = std::getenv("KVTIER_IO_FAULTS");
  auto faults = kvtier::ParseIoFaults(spec ? spec : "");
  if (!faults.ok()) {
    std::fprintf(stderr, "kvtierd-faulty: KVTIER_IO_FAULTS: %s\n", faults.status().ToString().c_str());
    return 2;
  }
  return kvtier::DaemonMain(argc, argv, [f = *faults](std::unique_ptr<kvtier::IoEngine> inner) {
    return std::unique_ptr<kvtier::IoEngine>(new kvtier::FaultInjectionIoEngine(std::move(inner), f));
  });
}
