// libFuzzer target: the frame decoder — FrameAssembler over an arbitrary byte stream fed
// in arbitrary chunks, then VerifyRequestFrame / VerifyResponseFrame on every frame it
// yields, and a walk of whatever verifies. What must hold: no crash, no sanitizer report,
// every frame yielded is 8-byte aligned and within max_frame_bytes, and an oversized
// declaration poisons the assembler.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "protocol/codec.h"
#include "protocol/framing.h"

using namespace kvtier;

namespace {

// Touches every field a server would read, so the verifier's guarantees get exercised.
void Walk(const fb::Request& r) {
  volatile uint64_t sink = r.id();
  switch (r.op_type()) {
    case fb::Op::Hello:
      if (auto* h = r.op_as_Hello(); h && h->engine_name()) sink = sink + h->engine_name()->size();
      break;
    case fb::Op::Commit:
      if (auto* c = r.op_as_Commit()) {
        if (c->pages())
          for (uint32_t p : *c->pages()) sink = sink + p;
        if (c->hashes()) sink = sink + c->hashes()->size();
      }
      break;
    case fb::Op::Lookup:
      if (auto* l = r.op_as_Lookup(); l && l->hashes()) sink = sink + l->hashes()->size();
      break;
    default:
      break;
  }
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kMax = 64 * 1024;
  FrameAssembler a(kMax, 256);
  size_t off = 0;
  // The first byte picks the chunk size, so the fuzzer explores split frames too.
  const size_t chunk = size ? 1 + data[0] % 61 : 1;
  bool poisoned = false;
  while (off < size && !poisoned) {
    const size_t n = std::min(chunk, size - off);
    auto space = a.WritableSpace(n);
    std::memcpy(space.data(), data + off, n);
    a.Produced(n);
    off += n;
    for (;;) {
      auto f = a.Next();
      if (!f.ok()) {
        poisoned = true;
        if (a.Next().ok()) __builtin_trap();  // a poisoned assembler must stay poisoned
        break;
      }
      if (!f->has_value()) break;
      std::span<const uint8_t> frame = (*f)->frame;
      if (reinterpret_cast<uintptr_t>(frame.data()) % 8 != 0) __builtin_trap();
      if (frame.size() > kMax + kFramePrefixBytes) __builtin_trap();
      if (auto r = VerifyRequestFrame(frame); r.ok()) Walk(**r);
      (void)VerifyResponseFrame(frame);
    }
  }
  return 0;
}
