// libFuzzer target: the request dispatcher behind the frame decoder — a byte stream is cut
// into frames as the server cuts them and served by a real Dispatcher over a real
// CacheManager (a small memfd host tier), as one session. What must hold: no crash, no
// sanitizer report, one response per frame (none to a valid keepalive Ping, whose no_reply
// asks for none) and every response a valid frame, and after
// the session ends the cache manager's accounting is exact (CheckInvariants).
//
// Each input gets a fresh CacheManager (about 0.1 ms), so a crash reproduces from its
// input alone. The first input byte's low bit says whether a canned engine Hello goes first, so the
// fuzzer reaches the operations behind Hello without having to build one.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "daemon/cache/cache_manager.h"
#include "daemon/dispatcher.h"
#include "daemon/metrics.h"
#include "daemon/tenants.h"
#include "protocol/base/clock.h"
#include "protocol/base/logging.h"
#include "protocol/codec.h"
#include "protocol/framing.h"
#include "protocol/op_table.h"
#include "tests/fuzz/seed_frames.h"

using namespace kvtier;

namespace {

class CheckingSink final : public ReplySink {
 public:
  void Send(std::span<const uint8_t> frame, std::span<const int> fds) override {
    (void)fds;  // owned by the segment memory; a server would dup them
    // Responses are built aligned; copy as a client's assembler would hand them over.
    std::vector<uint64_t> aligned((frame.size() + 7) / 8);
    std::memcpy(aligned.data(), frame.data(), frame.size());
    auto r = VerifyResponseFrame({reinterpret_cast<const uint8_t*>(aligned.data()), frame.size()});
    if (!r.ok()) __builtin_trap();
    if (trace) {
      std::fprintf(stderr, "  -> %s %s\n", std::string(StatusCodeName(FromWire((*r)->status()))).c_str(),
                   (*r)->message() ? (*r)->message()->c_str() : "");
    }
    ++responses;
  }
  size_t responses = 0;
  bool trace = std::getenv("KVTIER_FUZZ_TRACE") != nullptr;  // triage: print each exchange
};

struct World {
  World() {
    SetLogLevel(LogLevel::kError);
    CacheManager::Options o;
    TierOptions& h = o.tiers[TierIndex(TierKind::kHost)];
    h.enabled = true;
    h.page_bytes = 64 << 10;
    h.segment_bytes = 256 << 10;
    h.capacity_bytes = 1 << 20;  // 16 pages
    h.huge_pages = HugePages::kOff;
    o.max_entries_per_request = 1024;
    cache = std::move(CacheManager::Open(o)).value();
    info.version = "fuzz";
    info.epoch = 42;
    tenants = std::make_unique<TenantResolver>(SecurityConfig{}, ::geteuid());
    dispatcher = std::make_unique<Dispatcher>(
        cache.get(), &info, SystemClock::Default(), &metrics, [](const auto&) {}, tenants.get());
  }
  std::unique_ptr<CacheManager> cache;
  DaemonInfo info;
  MetricsRegistry metrics;
  std::unique_ptr<TenantResolver> tenants;
  std::unique_ptr<Dispatcher> dispatcher;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A fresh daemon state per input, so every crash reproduces from its input alone.
  auto world = std::make_unique<World>();
  World* w = world.get();
  static const std::vector<uint8_t> hello = fuzz::EngineHelloFrame();
  SessionContext ctx(1);
  ctx.uid = ::getuid();
  ctx.gid = ::getgid();
  CheckingSink sink;
  FrameAssembler a(64 * 1024, 4096);
  auto feed = [&](const uint8_t* p, size_t n) {
    auto space = a.WritableSpace(n);
    std::memcpy(space.data(), p, n);
    a.Produced(n);
  };
  if (size > 0 && (data[0] & 1)) feed(hello.data(), hello.size());
  if (size > 1) feed(data + 1, size - 1);
  size_t frames = 0;
  while (!ctx.close_after_reply) {
    auto f = a.Next();
    if (!f.ok()) {
      w->dispatcher->RejectFrame(ctx, f.status(), "oversized", sink);
      ++frames;
      break;
    }
    if (!f->has_value()) break;
    if (sink.trace) {
      auto r = VerifyRequestFrame((*f)->frame);
      std::fprintf(stderr, "request %s\n", r.ok() ? std::string(OpName((*r)->op_type())).c_str() : "(malformed)");
    }
    // A verified keepalive (Ping with no_reply) is answered with nothing.
    auto req = VerifyRequestFrame((*f)->frame);
    const bool keepalive = req.ok() && (*req)->op_type() == fb::Op::Ping && (*req)->op_as_Ping()->no_reply();
    w->dispatcher->HandleFrame(ctx, (*f)->frame, sink);
    frames += !keepalive;
  }
  if (sink.responses != frames) __builtin_trap();  // exactly one response per frame that asks
  (void)w->dispatcher->SessionClosed(ctx, false);
  if (!w->cache->CheckInvariants().ok()) __builtin_trap();
  return 0;
}
