// kvtier_testing._bench: the C++ baselines of kvtier_testing.bench, the same store + load
// and page loops as its Python ones, run in C++ over the same kvtier.Client (its
// ClientHandle, python/client_handle.h), so the two differ only by the binding. A test-only
// extension: the shipped kvtier._kvtier carries no benchmark code.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <chrono>
#include <cstring>
#include <vector>

#include "python/client_handle.h"

namespace py = pybind11;
using namespace kvtier;

namespace {

// The loop's hashes: 16 bytes, `tag` in the last so the two loops and Python's never meet.
std::vector<BlockHash> Hashes(uint64_t seed, uint32_t round, uint32_t batch, uint8_t tag) {
  std::vector<BlockHash> hashes;
  for (uint32_t i = 0; i < batch; ++i) {
    std::array<uint8_t, 16> b{};
    const uint64_t v = seed * 1'000'003 + uint64_t{round} * batch + i;
    std::memcpy(b.data(), &v, 8);
    b[15] = tag;
    hashes.emplace_back(std::span<const uint8_t>(b.data(), b.size()));
  }
  return hashes;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// StoreBlocks of `batch` blocks of the KV-first `layers`, then LoadBlocks of them; -1 on
// any failure, else seconds.
double StoreLoadLoop(const ClientHandlePtr& h, const std::vector<uintptr_t>& layers, uint32_t num_blocks,
                     uint32_t batch, uint32_t rounds, uint64_t seed) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(h->mu);
  Client& c = *h->client;
  EngineKv kv;
  kv.layout = KvLayoutKind::kKvFirst;
  kv.num_blocks = num_blocks;
  for (uintptr_t p : layers) kv.layers.push_back(reinterpret_cast<void*>(p));
  std::vector<uint32_t> blocks(batch);
  for (uint32_t i = 0; i < batch; ++i) blocks[i] = i % num_blocks;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t r = 0; r < rounds; ++r) {
    const std::vector<BlockHash> hashes = Hashes(seed, r, batch, 0xc0);
    if (!c.StoreBlocks(kv, blocks, hashes).ok()) return -1;
    auto l = c.LoadBlocks(kv, hashes, blocks);
    if (!l.ok() || *l != batch) return -1;
  }
  return Seconds(t0);
}

// Lease `batch` host pages, copy `src` into each, commit; acquire them, copy each out to
// `dst`, release. -1 on any failure, else seconds.
double PageLoop(const ClientHandlePtr& h, uint32_t batch, uint32_t rounds, uint64_t seed, uintptr_t src, uintptr_t dst,
                uint64_t bytes) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(h->mu);
  Client& c = *h->client;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t r = 0; r < rounds; ++r) {
    const std::vector<BlockHash> hashes = Hashes(seed, r, batch, 0xc1);
    auto pages = c.Allocate(TierKind::kHost, batch);
    if (!pages.ok()) return -1;
    std::vector<CommitEntry> e;
    for (uint32_t i = 0; i < batch; ++i) {
      std::memcpy(c.PageBytes(TierKind::kHost, (*pages)[i]).data(), reinterpret_cast<const uint8_t*>(src) + i * bytes,
                  bytes);
      e.push_back({(*pages)[i], hashes[i], i ? hashes[i - 1] : BlockHash()});
    }
    if (!c.Commit(TierKind::kHost, e).ok()) return -1;
    auto got = c.Acquire(hashes);
    if (!got.ok()) return -1;
    for (uint32_t i = 0; i < batch; ++i) {
      if (!(*got)[i].status.ok()) return -1;
      std::memcpy(reinterpret_cast<uint8_t*>(dst) + i * bytes, c.PageBytes((*got)[i].tier, (*got)[i].page).data(),
                  bytes);
    }
    if (!c.Release(TierKind::kHost, {}, hashes).ok()) return -1;
  }
  return Seconds(t0);
}

}  // namespace

PYBIND11_MODULE(_bench, m) {
  py::module_::import("kvtier._kvtier");  // registers the Client type these take
  m.def("store_load_loop", &StoreLoadLoop, py::arg("client"), py::arg("layers"), py::arg("num_blocks"),
        py::arg("batch"), py::arg("rounds"), py::arg("seed"));
  m.def("page_loop", &PageLoop, py::arg("client"), py::arg("batch"), py::arg("rounds"), py::arg("seed"), py::arg("src"),
        py::arg("dst"), py::arg("bytes"));
}
