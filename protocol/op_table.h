#pragma once
// The protocol's operations, one row each: the name logs, metrics labels and docs use,
// who may send it, and the reply it is answered with. The dispatcher's access rules, the
// metric labels and docs/protocol.md all come from this table.
//
// Checked against kvtier.fbs at compile time: one row per member of `union Op`, in the
// schema's order, each paired with the member of `union Reply` at the same position. A new
// op appended to the schema without its row here does not build.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kvtier_generated.h"  // generated from protocol/kvtier.fbs at build time

namespace kvtier {

// Who may send an operation.
enum class OpAccess : uint8_t {
  kOpen,     // anyone, before Hello too (Hello, Ping)
  kSession,  // any session after Hello, engine or control (Stats)
  kEngine,   // engine sessions (they have a layout and a namespace)
  kControl,  // control sessions (kvctl); answers about the caller's own tenant
  kAdmin,    // control sessions of an admin peer: changes the cache or reads every block
};

struct OpSpec {
  fb::Op op;
  std::string_view name;  // lower case: the `op` label of the RPC metrics, kvctl's words
  OpAccess access;
  fb::Reply reply;
};

inline constexpr std::array kOpTable = {
    OpSpec{fb::Op::Hello, "hello", OpAccess::kOpen, fb::Reply::Welcome},
    OpSpec{fb::Op::Allocate, "allocate", OpAccess::kEngine, fb::Reply::AllocateReply},
    OpSpec{fb::Op::Commit, "commit", OpAccess::kEngine, fb::Reply::CommitReply},
    OpSpec{fb::Op::Release, "release", OpAccess::kEngine, fb::Reply::ReleaseReply},
    OpSpec{fb::Op::Lookup, "lookup", OpAccess::kEngine, fb::Reply::LookupReply},
    OpSpec{fb::Op::Acquire, "acquire", OpAccess::kEngine, fb::Reply::AcquireReply},
    OpSpec{fb::Op::Stats, "stats", OpAccess::kSession, fb::Reply::StatsReply},
    OpSpec{fb::Op::Ping, "ping", OpAccess::kOpen, fb::Reply::Pong},
    OpSpec{fb::Op::VerifyTier, "verify", OpAccess::kAdmin, fb::Reply::VerifyTierReply},
    OpSpec{fb::Op::Explain, "explain", OpAccess::kControl, fb::Reply::ExplainReply},
    OpSpec{fb::Op::Blocks, "blocks", OpAccess::kControl, fb::Reply::BlocksReply},
    OpSpec{fb::Op::Evict, "evict", OpAccess::kAdmin, fb::Reply::EvictReply},
    OpSpec{fb::Op::Drain, "drain", OpAccess::kAdmin, fb::Reply::DrainReply},
    OpSpec{fb::Op::SessionHint, "session_hint", OpAccess::kSession, fb::Reply::SessionHintReply},
};

inline constexpr size_t kOpCount = kOpTable.size();

namespace internal {
constexpr bool OpTableMatchesSchema() {
  if (static_cast<size_t>(fb::Op::MAX) != kOpCount || static_cast<size_t>(fb::Reply::MAX) != kOpCount) return false;
  for (size_t i = 0; i < kOpCount; ++i) {
    if (static_cast<size_t>(kOpTable[i].op) != i + 1 || static_cast<size_t>(kOpTable[i].reply) != i + 1) return false;
  }
  return true;
}
}  // namespace internal
static_assert(internal::OpTableMatchesSchema(),
              "kOpTable must have one row per member of kvtier.fbs's union Op, in its order, each with the Reply "
              "member at the same position");

// The row of `op`; nullptr for NONE and for ops only a newer peer knows.
constexpr const OpSpec* FindOp(fb::Op op) {
  const auto i = static_cast<size_t>(op);
  return i >= 1 && i <= kOpCount ? &kOpTable[i - 1] : nullptr;
}

// The name of a request op ("lookup", "acquire", ...); "unknown" for ops not in the table.
constexpr std::string_view OpName(fb::Op op) {
  const OpSpec* s = FindOp(op);
  return s ? s->name : std::string_view("unknown");
}

}  // namespace kvtier
