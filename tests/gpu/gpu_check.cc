// kvtier-gpu-check: what tests/gpu/run.sh runs on a machine with a GPU.
//   1. kernels vs the CPU reference on fresh random data: gather/scatter bit-exact for both
//      layouts and 1- and 2-byte elements, int8/fp8 quantization within QuantErrorBound;
//   2. a two-process CUDA IPC test: this process (the daemon's role) allocates a shareable
//      allocation through CudaDeviceBackend and passes its fd (SCM_RIGHTS) or legacy
//      handle to engine A (this program exec'd), which maps it and writes; engine B maps
//      it and reads the same bytes;
//   3. bandwidth, each against its baseline in the same run: gather/scatter between device
//      layouts and device pages vs cudaMemcpy device-to-device of the same bytes; gather
//      into pinned host pages (D2H) and scatter from them (H2D) vs cudaMemcpy; both layouts;
//   4. int8 / fp8 quantization of device pages vs cudaMemcpy D2D of each page.
// Prints a markdown table; --json FILE writes the figures as one JSON object too. Exit 0
// when every check passes, 77 without a GPU.
#include <cuda_runtime.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_kernels.h"
#include "kernels/device_backend.h"

namespace kvtier {
namespace {

int failures = 0;
#define CHECK_OK(expr)                                                                               \
  do {                                                                                               \
    Status s_ = (expr);                                                                              \
    if (!s_.ok()) {                                                                                  \
      std::fprintf(stderr, "FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #expr, s_.ToString().c_str()); \
      ++failures;                                                                                    \
      return;                                                                                        \
    }                                                                                                \
  } while (0)
#define EXPECT(cond, ...)                                       \
  do {                                                          \
    if (!(cond)) {                                              \
      std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                        \
      std::fprintf(stderr, "\n");                               \
      ++failures;                                               \
    }                                                           \
  } while (0)

std::vector<uint8_t> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 4) {
    const uint32_t r = rng();
    std::memcpy(v.data() + i, &r, std::min<size_t>(4, n - i));
  }
  return v;
}

void CheckKernels(DeviceBackend& dev, DeviceStream s) {
  for (KvLayoutKind kind : {KvLayoutKind::kKvFirst, KvLayoutKind::kBlockFirst}) {
    for (uint32_t elem : {1u, 2u}) {
      KvGeometry g{kind, 32, 64, 16, 8, 128, elem};
      const uint32_t count = 24;
      std::vector<uint32_t> blocks(count);
      std::mt19937 rng(elem * 10 + static_cast<int>(kind));
      for (auto& b : blocks) b = rng() % g.num_blocks;
      std::sort(blocks.begin(), blocks.end());
      blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
      KvTransfer d, r;
      d.geometry = r.geometry = g;
      std::vector<void*> dlayers;
      std::vector<std::vector<uint8_t>> hlayers;
      for (uint32_t l = 0; l < g.num_layers; ++l) {
        hlayers.push_back(Random(g.LayerTensorBytes(), 1000 + l));
        void* p;
        if (cudaMalloc(&p, g.LayerTensorBytes()) != cudaSuccess) return (void)++failures;
        cudaMemcpy(p, hlayers[l].data(), g.LayerTensorBytes(), cudaMemcpyHostToDevice);
        dlayers.push_back(p);
        d.layers[l] = static_cast<uint8_t*>(p);
        r.layers[l] = hlayers[l].data();
      }
      uint8_t* dpages;
      cudaMalloc(reinterpret_cast<void**>(&dpages), blocks.size() * g.BlockBytes());
      std::vector<uint8_t*> dp, rp;
      std::vector<std::vector<uint8_t>> rbuf(blocks.size(), std::vector<uint8_t>(g.BlockBytes()));
      for (size_t i = 0; i < blocks.size(); ++i) {
        dp.push_back(dpages + i * g.BlockBytes());
        rp.push_back(rbuf[i].data());
      }
      d.blocks = r.blocks = blocks.data();
      d.pages = dp.data();
      r.pages = rp.data();
      d.count = r.count = static_cast<uint32_t>(blocks.size());
      CHECK_OK(dev.Gather(d, s));
      CHECK_OK(dev.Synchronize(s));
      GatherCpu(r);
      std::vector<uint8_t> got(blocks.size() * g.BlockBytes());
      cudaMemcpy(got.data(), dpages, got.size(), cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < blocks.size(); ++i) {
        EXPECT(std::memcmp(got.data() + i * g.BlockBytes(), rbuf[i].data(), g.BlockBytes()) == 0,
               "gather differs from the CPU reference (layout %d, elem %u, page %zu)", static_cast<int>(kind), elem, i);
      }
      // Scatter fresh pages back and compare whole tensors with the CPU reference.
      auto fresh = Random(got.size(), 77);
      cudaMemcpy(dpages, fresh.data(), fresh.size(), cudaMemcpyHostToDevice);
      for (size_t i = 0; i < blocks.size(); ++i)
        std::memcpy(rbuf[i].data(), fresh.data() + i * g.BlockBytes(), g.BlockBytes());
      CHECK_OK(dev.Scatter(d, s));
      CHECK_OK(dev.Synchronize(s));
      ScatterCpu(r);
      for (uint32_t l = 0; l < g.num_layers; ++l) {
        std::vector<uint8_t> back(g.LayerTensorBytes());
        cudaMemcpy(back.data(), dlayers[l], back.size(), cudaMemcpyDeviceToHost);
        EXPECT(back == hlayers[l], "scatter differs from the CPU reference (layout %d, elem %u, layer %u)",
               static_cast<int>(kind), elem, l);
      }
      for (void* p : dlayers) cudaFree(p);
      cudaFree(dpages);
    }
  }
  for (QuantKind qk : {QuantKind::kInt8, QuantKind::kFp8E4M3}) {
    KvGeometry g{KvLayoutKind::kKvFirst, 4, 1, 16, 8, 128, 2};
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0, 3);
    std::vector<uint8_t> page(g.BlockBytes());
    for (size_t i = 0; i < page.size() / 2; ++i) {
      const uint16_t h = FloatToBf16(nd(rng));
      std::memcpy(page.data() + 2 * i, &h, 2);
    }
    uint8_t *dsrc, *dcodes, *dout;
    float* dscales;
    cudaMalloc(reinterpret_cast<void**>(&dsrc), page.size());
    cudaMalloc(reinterpret_cast<void**>(&dout), page.size());
    cudaMalloc(reinterpret_cast<void**>(&dcodes), page.size() / 2);
    cudaMalloc(reinterpret_cast<void**>(&dscales), QuantRows(g) * sizeof(float));
    cudaMemcpy(dsrc, page.data(), page.size(), cudaMemcpyHostToDevice);
    KvQuantize q{g, FloatKind::kBf16, qk, dsrc, dcodes, dscales};
    CHECK_OK(dev.Quantize(q, s));
    CHECK_OK(dev.Dequantize(q, dout, s));
    CHECK_OK(dev.Synchronize(s));
    std::vector<uint8_t> out(page.size());
    cudaMemcpy(out.data(), dout, out.size(), cudaMemcpyDeviceToHost);
    const uint32_t d = g.head_dim;
    for (uint64_t row = 0; row < QuantRows(g); ++row) {
      double m = 0;
      for (uint32_t i = 0; i < d; ++i) {
        uint16_t h;
        std::memcpy(&h, page.data() + 2 * (row * d + i), 2);
        m = std::max(m, std::fabs(double{Bf16ToFloat(h)}));
      }
      for (uint32_t i = 0; i < d; ++i) {
        uint16_t a, b;
        std::memcpy(&a, page.data() + 2 * (row * d + i), 2);
        std::memcpy(&b, out.data() + 2 * (row * d + i), 2);
        const double x = Bf16ToFloat(a), y = Bf16ToFloat(b);
        const double bound = QuantErrorBound(qk, x, m) + std::fabs(x) / 256;
        if (std::fabs(x - y) > bound) {
          EXPECT(false, "quantization error %g > bound %g (%s)", std::fabs(x - y), bound,
                 qk == QuantKind::kInt8 ? "int8" : "fp8");
          row = QuantRows(g);
          break;
        }
      }
    }
    cudaFree(dsrc);
    cudaFree(dout);
    cudaFree(dcodes);
    cudaFree(dscales);
  }
}

// Sends or receives one fd over a Unix socket.
bool SendFd(int sock, int fd) {
  char byte = 'f';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  return ::sendmsg(sock, &msg, 0) == 1;
}
int RecvFd(int sock) {
  char byte;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  if (::recvmsg(sock, &msg, 0) != 1) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

// An engine process (`kvtier-gpu-check --ipc-engine w|r SOCK BYTES`, exec'd: CUDA cannot
// be used in a child forked after its parent initialized it): reads the legacy flag and
// handle from SOCK, then the descriptor unless legacy, imports the allocation, and writes
// (A) or reads and checks (B) the pattern.
int Engine(int sock, uint64_t bytes, bool writer) {
  std::array<uint8_t, 1 + kIpcHandleBytes> head;
  if (::read(sock, head.data(), head.size()) != static_cast<ssize_t>(head.size())) return 9;
  const bool legacy = head[0] != 0;
  auto dev = OpenCudaDeviceBackend();
  if (!dev.ok()) return 10;
  const int fd = legacy ? -1 : RecvFd(sock);
  auto p = (*dev)->Import(0, fd, head.data() + 1, bytes);
  if (!p.ok()) {
    std::fprintf(stderr, "engine import: %s\n", p.status().ToString().c_str());
    return 11;
  }
  std::vector<uint8_t> pattern = Random(bytes, 4242);
  if (writer) {
    if (cudaMemcpy(*p, pattern.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) return 12;
    cudaDeviceSynchronize();
  } else {
    std::vector<uint8_t> got(bytes);
    if (cudaMemcpy(got.data(), *p, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return 13;
    if (got != pattern) return 14;
  }
  (*dev)->Unimport(*p, bytes);
  return 0;
}

bool CheckIpc(DeviceBackend& dev, std::string* how) {
  const uint64_t bytes = 64ull << 20;
  auto a = dev.AllocateShareable(0, bytes);
  if (!a.ok()) {
    std::fprintf(stderr, "FAIL allocate shareable: %s\n", a.status().ToString().c_str());
    return false;
  }
  *how = a->legacy_ipc ? "legacy cudaIpcMemHandle" : "VMM POSIX fd over SCM_RIGHTS";
  bool ok = true;
  for (bool writer : {true, false}) {
    int sv[2];
    ::socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(sv[0]);
      const std::string sock = std::to_string(sv[1]), size = std::to_string(bytes);
      ::execl("/proc/self/exe", "kvtier-gpu-check", "--ipc-engine", writer ? "w" : "r", sock.c_str(), size.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(sv[1]);
    std::array<uint8_t, 1 + kIpcHandleBytes> head{};
    head[0] = a->legacy_ipc ? 1 : 0;
    std::memcpy(head.data() + 1, a->ipc_handle.data(), kIpcHandleBytes);
    if (::write(sv[0], head.data(), head.size()) != static_cast<ssize_t>(head.size()) ||
        (!a->legacy_ipc && !SendFd(sv[0], a->fd))) {
      std::fprintf(stderr, "FAIL sending the allocation to engine %s\n", writer ? "A" : "B");
      ok = false;
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(sv[0]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "FAIL IPC engine %s exited %d\n", writer ? "A (writer)" : "B (reader)",
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      ok = false;
    }
  }
  dev.Free(*a);
  return ok;
}

double TimeMs(const std::function<void()>& fn, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  fn();  // warm
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) fn();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms / reps;
}

struct Bw {
  std::string name;
  double ours_gbs, base_gbs;
};

// Llama-3-8B shaped blocks: 32 layers, 8 KV heads, dim 128, bf16, 16 tokens = 2 MiB.
std::vector<Bw> Bandwidth(DeviceBackend& dev, KvLayoutKind kind) {
  KvGeometry g{kind, 32, 2048, 16, 8, 128, 2};
  const char* layout = kind == KvLayoutKind::kKvFirst ? "kv-first" : "block-first";
  const uint32_t count = 512;  // 1 GiB moved per call
  std::vector<void*> layers;
  KvTransfer t;
  t.geometry = g;
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    void* p;
    cudaMalloc(&p, g.LayerTensorBytes());
    cudaMemset(p, 1, g.LayerTensorBytes());
    layers.push_back(p);
    t.layers[l] = static_cast<uint8_t*>(p);
  }
  const uint64_t bytes = uint64_t{count} * g.BlockBytes();
  std::vector<uint32_t> blocks(count);
  for (uint32_t i = 0; i < count; ++i) blocks[i] = (i * 7) % g.num_blocks;
  uint8_t *dpages, *dsrc;
  cudaMalloc(reinterpret_cast<void**>(&dpages), bytes);
  cudaMalloc(reinterpret_cast<void**>(&dsrc), bytes);
  uint8_t* hpages = nullptr;
  cudaHostAlloc(reinterpret_cast<void**>(&hpages), bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  std::vector<uint8_t*> dp(count), hp(count);
  for (uint32_t i = 0; i < count; ++i) {
    dp[i] = dpages + uint64_t{i} * g.BlockBytes();
    hp[i] = hpages + uint64_t{i} * g.BlockBytes();
  }
  t.blocks = blocks.data();
  t.count = count;
  auto s = dev.CreateStream(0);
  DeviceStream st = *s;
  cudaStream_t cs = static_cast<cudaStream_t>(st);
  auto gb = [&](double ms) { return bytes / (ms * 1e-3) / 1e9; };
  auto name = [&](const char* what) { return std::string(what) + " (" + layout + ")"; };
  std::vector<Bw> out;
  // Device layout <-> device pages, against cudaMemcpy D2D of the same bytes.
  const double d2d = TimeMs([&] { cudaMemcpyAsync(dpages, dsrc, bytes, cudaMemcpyDeviceToDevice, cs); }, 10);
  t.pages = dp.data();
  const double gather_d = TimeMs([&] { (void)dev.Gather(t, st); }, 10);
  const double scatter_d = TimeMs([&] { (void)dev.Scatter(t, st); }, 10);
  out.push_back({name("gather to device pages vs D2D memcpy"), gb(gather_d), gb(d2d)});
  out.push_back({name("scatter from device pages vs D2D memcpy"), gb(scatter_d), gb(d2d)});
  // Device layout <-> pinned host pages, against cudaMemcpy D2H / H2D.
  const double d2h = TimeMs([&] { cudaMemcpyAsync(hpages, dsrc, bytes, cudaMemcpyDeviceToHost, cs); }, 5);
  const double h2d = TimeMs([&] { cudaMemcpyAsync(dsrc, hpages, bytes, cudaMemcpyHostToDevice, cs); }, 5);
  t.pages = hp.data();
  const double gather_h = TimeMs([&] { (void)dev.Gather(t, st); }, 5);
  const double scatter_h = TimeMs([&] { (void)dev.Scatter(t, st); }, 5);
  out.push_back({name("gather to pinned host (D2H) vs cudaMemcpy D2H"), gb(gather_h), gb(d2h)});
  out.push_back({name("scatter from pinned host (H2D) vs cudaMemcpy H2D"), gb(scatter_h), gb(h2d)});
  if (kind == KvLayoutKind::kKvFirst) {
    // Quantizing pages on the device (one launch a 2 MiB page, as the cold tiers do)
    // against a D2D copy of each page, counting the page's bytes.
    KvGeometry pg{KvLayoutKind::kKvFirst, 32, 1, 16, 8, 128, 2};
    uint8_t* codes;
    float* scales;
    cudaMalloc(reinterpret_cast<void**>(&codes), pg.BlockBytes() / 2);
    cudaMalloc(reinterpret_cast<void**>(&scales), QuantRows(pg) * sizeof(float));
    const double page_d2d = TimeMs(
        [&] {
          for (uint32_t i = 0; i < count; ++i)
            cudaMemcpyAsync(dp[(i + 1) % count], dp[i], pg.BlockBytes(), cudaMemcpyDeviceToDevice, cs);
        },
        3);
    for (QuantKind qk : {QuantKind::kInt8, QuantKind::kFp8E4M3}) {
      const double q = TimeMs(
          [&] {
            for (uint32_t i = 0; i < count; ++i) {
              KvQuantize kq{pg, FloatKind::kBf16, qk, dp[i], codes, scales};
              (void)dev.Quantize(kq, st);
            }
          },
          3);
      out.push_back({std::string(qk == QuantKind::kInt8 ? "int8" : "fp8") + " quantize of device pages vs D2D memcpy",
                     gb(q), gb(page_d2d)});
    }
    cudaFree(codes);
    cudaFree(scales);
  }
  for (void* p : layers) cudaFree(p);
  cudaFree(dpages);
  cudaFree(dsrc);
  cudaFreeHost(hpages);
  dev.DestroyStream(st);
  return out;
}

// "gather to device pages vs D2D memcpy (kv-first)" -> "gather_to_device_pages_kv_first":
// what was measured and its layout, without the baseline.
std::string Key(const std::string& name) {
  const size_t vs = name.find(" vs ");
  const size_t layout = name.find('(', vs == std::string::npos ? 0 : vs);
  const std::string text = name.substr(0, vs) + (layout == std::string::npos ? "" : name.substr(layout));
  std::string k;
  for (char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      k += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!k.empty() && k.back() != '_') {
      k += '_';
    }
  }
  while (!k.empty() && k.back() == '_') k.pop_back();
  return k;
}

}  // namespace
}  // namespace kvtier

// kvtier-gpu-check [--json FILE]: the table on stdout, the same figures as JSON in FILE.
int main(int argc, char** argv) {
  using namespace kvtier;
  if (argc == 5 && std::string(argv[1]) == "--ipc-engine") {
    return Engine(std::atoi(argv[3]), std::strtoull(argv[4], nullptr, 10), std::string(argv[2]) == "w");
  }
  const char* json_path = argc > 2 && std::string(argv[1]) == "--json" ? argv[2] : nullptr;
  auto dev = OpenCudaDeviceBackend();
  if (!dev.ok()) {
    std::fprintf(stderr, "kvtier-gpu-check: %s\n", dev.status().ToString().c_str());
    return 77;  // skipped: no GPU
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  int driver = 0;
  cudaDriverGetVersion(&driver);
  auto s = (*dev)->CreateStream(0);
  CheckKernels(**dev, *s);
  const int kernel_failures = failures;
  std::string how;
  const bool ipc = CheckIpc(**dev, &how);
  std::vector<Bw> bw;
  for (KvLayoutKind kind : {KvLayoutKind::kKvFirst, KvLayoutKind::kBlockFirst}) {
    auto b = Bandwidth(**dev, kind);
    bw.insert(bw.end(), b.begin(), b.end());
  }
  std::printf("device: %s (sm_%d%d), CUDA driver API %d\n", prop.name, prop.major, prop.minor, driver);
  std::printf("kernels vs CPU reference: %s\n",
              kernel_failures == 0 ? "bit-exact copies, quantization within bound" : "FAILED");
  std::printf("two-process IPC (%s): %s\n\n", how.c_str(), ipc ? "engine B read engine A's bytes" : "FAILED");
  std::printf(
      "| transfer (1 GiB of 2 MiB llama3-8b blocks) | kvtier GB/s | baseline GB/s | ratio |\n|---|---|---|---|\n");
  for (const Bw& b : bw)
    std::printf("| %s | %.1f | %.1f | %.2f |\n", b.name.c_str(), b.ours_gbs, b.base_gbs, b.ours_gbs / b.base_gbs);
  if (json_path != nullptr) {
    FILE* f = std::fopen(json_path, "w");
    if (f == nullptr) return 2;
    std::fprintf(f, "{\"device\": \"%s\", \"cuda_driver\": %d, \"kernels_ok\": %s, \"ipc_ok\": %s, \"ipc\": \"%s\"",
                 prop.name, driver, kernel_failures == 0 ? "true" : "false", ipc ? "true" : "false", how.c_str());
    for (const Bw& b : bw)
      std::fprintf(f, ", \"%s_ratio\": %.3f, \"%s_gbs\": %.1f", Key(b.name).c_str(), b.ours_gbs / b.base_gbs,
                   Key(b.name).c_str(), b.ours_gbs);
    std::fprintf(f, "}\n");
    std::fclose(f);
  }
  return failures == 0 && ipc ? 0 : 1;
}
