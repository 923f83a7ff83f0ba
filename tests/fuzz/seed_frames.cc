#include "tests/fuzz/seed_frames.h"

#include "protocol/base/block_key.h"
#include "protocol/base/layout.h"
#include "protocol/codec.h"

namespace kvtier::fuzz {
namespace {

using Builder = flatbuffers::FlatBufferBuilder;

ModelLayout FuzzLayout() {
  ModelLayout l;
  l.model_id = "fuzz";
  l.num_layers = 2;
  l.kv_heads = 2;
  l.head_dim = 64;
  l.dtype = DType::kBFloat16;
  l.tokens_per_block = 16;
  l.block_bytes = l.NaturalBlockBytes();  // 16 KiB
  return l;
}

template <class Fn>
std::vector<uint8_t> Frame(uint64_t id, fb::Op op, Fn body) {
  Builder b;
  auto o = body(b);
  b.FinishSizePrefixed(fb::CreateRequest(b, id, op, o.Union()));
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

std::vector<BlockHash> Chain(uint8_t seed, int n) {
  std::vector<BlockHash> v;
  for (int i = 0; i < n; ++i) {
    uint8_t bytes[16] = {seed, static_cast<uint8_t>(i), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    v.emplace_back(std::span<const uint8_t>(bytes, 16));
  }
  return v;
}

void Append(std::vector<uint8_t>& s, const std::vector<uint8_t>& f) { s.insert(s.end(), f.begin(), f.end()); }

}  // namespace

std::vector<uint8_t> EngineHelloFrame(uint64_t id) {
  return Frame(id, fb::Op::Hello, [](Builder& b) {
    auto layout = LayoutToWire(b, FuzzLayout());
    return fb::CreateHello(b, kProtocolMajor, 0, fb::Role::Engine, b.CreateString("fuzz-engine"), layout, 16);
  });
}

std::vector<std::pair<std::string, std::vector<uint8_t>>> SeedStreams() {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  const auto chain = Chain(7, 3);
  auto alloc = [](uint64_t id, uint32_t n) {
    return Frame(id, fb::Op::Allocate, [n](Builder& b) { return fb::CreateAllocate(b, fb::Tier::Host, n); });
  };
  auto commit = [&](uint64_t id) {
    return Frame(id, fb::Op::Commit, [&](Builder& b) {
      auto pages = b.CreateVector(std::vector<uint32_t>{0, 1, 2});
      std::vector<BlockHash> parents = {BlockHash(), chain[0], chain[1]};
      auto h = HashesToWire(b, chain);
      auto p = HashesToWire(b, parents);
      // Extra keys as vLLM's events carry them: [["salt"], nil, [["img", 3]]].
      auto extra = b.CreateVector(
          std::vector<uint8_t>{0x93, 0x91, 0xa4, 's', 'a', 'l', 't', 0xc0, 0x91, 0x92, 0xa3, 'i', 'm', 'g', 0x03});
      return fb::CreateCommit(b, fb::Tier::Host, pages, h, p, false, 0, 0, extra, b.CreateString("adapter"), 7);
    });
  };
  auto lookup = [&](uint64_t id) {
    return Frame(id, fb::Op::Lookup, [&](Builder& b) { return fb::CreateLookup(b, HashesToWire(b, chain)); });
  };
  auto acquire = [&](uint64_t id) {
    return Frame(id, fb::Op::Acquire, [&](Builder& b) { return fb::CreateAcquire(b, HashesToWire(b, chain)); });
  };
  auto release = [&](uint64_t id) {
    return Frame(id, fb::Op::Release,
                 [&](Builder& b) { return fb::CreateRelease(b, fb::Tier::Host, 0, HashesToWire(b, chain)); });
  };
  auto stats = [](uint64_t id) {
    return Frame(id, fb::Op::Stats, [](Builder& b) { return fb::CreateStats(b, true); });
  };
  auto ping = [](uint64_t id) {
    return Frame(id, fb::Op::Ping,
                 [](Builder& b) { return fb::CreatePing(b, b.CreateVector(std::vector<uint8_t>(32, 0x5a))); });
  };
  {
    std::vector<uint8_t> s;
    for (const auto& f : {EngineHelloFrame(1), alloc(2, 3), commit(3), lookup(4), acquire(5), release(6)}) Append(s, f);
    out.emplace_back("store-and-load", s);
  }
  {
    std::vector<uint8_t> s;
    for (const auto& f : {EngineHelloFrame(1), stats(2), ping(3), lookup(4)}) Append(s, f);
    out.emplace_back("stats-ping-miss", s);
  }
  {
    std::vector<uint8_t> s = Frame(1, fb::Op::Hello, [](Builder& b) {
      return fb::CreateHello(b, kProtocolMajor, 0, fb::Role::Control, b.CreateString("kvctl"));
    });
    Append(s, stats(2));
    Append(s, Frame(3, fb::Op::VerifyTier, [](Builder& b) { return fb::CreateVerifyTier(b); }));
    out.emplace_back("control", s);
  }
  {
    // The operator requests of kvctl: explain, blocks, evict, drain.
    std::vector<uint8_t> s = Frame(1, fb::Op::Hello, [](Builder& b) {
      return fb::CreateHello(b, kProtocolMajor, 0, fb::Role::Control, b.CreateString("kvctl"));
    });
    Append(s, Frame(2, fb::Op::Explain,
                    [&](Builder& b) { return fb::CreateExplain(b, HashesToWire(b, chain), b.CreateString("")); }));
    Append(s, Frame(3, fb::Op::Blocks, [](Builder& b) {
             return fb::CreateBlocks(b, fb::Tier::None, b.CreateString(""), fb::BlockOrder::Hits, 20);
           }));
    Append(s, Frame(4, fb::Op::Blocks, [](Builder& b) {
             return fb::CreateBlocks(b, fb::Tier::Host, b.CreateString("0123456789abcdef"), fb::BlockOrder::Recent, 5);
           }));
    Append(s, Frame(5, fb::Op::Evict, [](Builder& b) { return fb::CreateEvict(b, fb::Tier::Host, 1 << 20); }));
    Append(s, Frame(6, fb::Op::Drain, [](Builder& b) { return fb::CreateDrain(b, true, false); }));
    Append(s, Frame(7, fb::Op::Drain, [](Builder& b) { return fb::CreateDrain(b, true, true); }));
    Append(s, Frame(8, fb::Op::Drain, [](Builder& b) { return fb::CreateDrain(b, false, false); }));
    out.emplace_back("operator", s);
  }
  {
    std::vector<uint8_t> s;
    for (const auto& f : {EngineHelloFrame(1), alloc(2, 8), alloc(3, 100000), commit(4), commit(5), release(6)})
      Append(s, f);
    out.emplace_back("errors", s);
  }
  {
    // Agentic sessions: an engine's hints (a live session, one that ends, a bad TTL), a
    // keepalive, and a control session's hint of a namespace.
    auto hint = [&](uint64_t id, const char* session, int64_t ttl_ms, bool end) {
      return Frame(id, fb::Op::SessionHint, [&](Builder& b) {
        return fb::CreateSessionHint(b, b.CreateString(session), HashesToWire(b, chain), ttl_ms, end);
      });
    };
    std::vector<uint8_t> s;
    for (const auto& f : {EngineHelloFrame(1), alloc(2, 3), commit(3), hint(4, "agent-1", 30000, false),
                          hint(5, "agent-1", -1, true), hint(6, "agent-2", -5, false)}) {
      Append(s, f);
    }
    Append(s, Frame(7, fb::Op::Ping, [](Builder& b) {
             fb::PingBuilder p(b);
             p.add_no_reply(true);
             return p.Finish();
           }));
    Append(s, Frame(8, fb::Op::SessionHint, [&](Builder& b) {
             return fb::CreateSessionHint(b, b.CreateString("router"), HashesToWire(b, chain), 1000, false,
                                          b.CreateString("0123456789abcdef"));
           }));
    out.emplace_back("sessions", s);
  }
  out.emplace_back("hello-only", EngineHelloFrame(1));
  return out;
}

}  // namespace kvtier::fuzz
