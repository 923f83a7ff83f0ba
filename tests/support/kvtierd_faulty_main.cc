// kvtierd-faulty: kvtierd with test faults, for tests only:
//   $KVTIER_IO_FAULTS ("op:nth:kind,...")  the NVMe IoEngine wrapped in a FaultInjectionIoEngine
//   $KVTIER_INDEX_LOAD_DELAY_MS           the NVMe index load starts this late (a slow index)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "daemon/daemon_main.h"
#include "tests/support/fault_injection_io_engine.h"

int main(int argc, char** argv) {
  const char* spec = std::getenv("KVTIER_IO_FAULTS");
  auto faults = kvtier::ParseIoFaults(spec ? spec : "");
  if (!faults.ok()) {
    std::fprintf(stderr, "kvtierd-faulty: KVTIER_IO_FAULTS: %s\n", faults.status().ToString().c_str());
    return 2;
  }
  kvtier::Daemon::TestHooks hooks;
  hooks.wrap_io = [f = *faults](std::unique_ptr<kvtier::IoEngine> inner) {
    return std::unique_ptr<kvtier::IoEngine>(new kvtier::FaultInjectionIoEngine(std::move(inner), f));
  };
  if (const char* delay = std::getenv("KVTIER_INDEX_LOAD_DELAY_MS")) {
    const long ms = std::strtol(delay, nullptr, 10);
    hooks.before_index_load = [ms] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  }
  return kvtier::DaemonMain(argc, argv, std::move(hooks));
}
