#pragma once
// What a kvtier._kvtier.Client (Python) holds: the C++ engine client (its mappings live as
// long as this does) and the lock that serializes calls from Python threads. Shared with
// the test-only extension kvtier_testing._bench (tests/python/bench_module.cc), which
// takes a Client from Python as this type (pybind11 shares registered types between
// modules).
#include <memory>
#include <mutex>

#include "engine/client.h"

namespace kvtier {

struct ClientHandle {
  std::unique_ptr<Client> client;
  std::mutex mu;
};
using ClientHandlePtr = std::shared_ptr<ClientHandle>;

}  // namespace kvtier
