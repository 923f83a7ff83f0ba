#pragma once
// Codec: the one place FlatBuffers meets kvtier types. Verifies inbound frames, converts
// enums and layouts, and views flat hash vectors. Stateless; thread-safe.
//
// Every inbound frame goes through VerifyRequestFrame / VerifyResponseFrame before any
// field is read; the returned pointer aliases the frame bytes and lives as long as they do.

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "kvtier_generated.h"  // generated from protocol/kvtier.fbs at build time
#include "protocol/base/block_key.h"
#include "protocol/base/block_state.h"
#include "protocol/base/layout.h"
#include "protocol/base/status.h"
#include "protocol/base/tier.h"

namespace kvtier {

inline constexpr uint16_t kProtocolMajor = 1;
// Minor versions add optional fields an older peer ignores. 1: Commit.token_ids,
// Hello.routable_id and Hello.data_parallel_rank. 2: Hello.event_hashes. 3: Hello.pid,
// SessionInfo.engine_pid and SessionInfo.watched. 4: Hello.event_group, event_spec_kind,
// event_sliding_window and event_block_tokens. 5: Acquire.prefix. 6: Commit.extra_keys,
// lora_name and lora_id. 7: Welcome.heartbeat_ttl_ms, Ping.no_reply. 8: SessionHint.
inline constexpr uint16_t kProtocolMinor = 8;

// Verifier limits: far above anything a valid frame needs, low enough to bound work.
inline constexpr uint32_t kVerifierMaxDepth = 16;
inline constexpr uint32_t kVerifierMaxTables = 1 << 16;

// `frame` is a whole size-prefixed frame (prefix included), 8-byte aligned.
// kInvalidArgument when the prefix disagrees with the length or the Verifier rejects it.
Result<const fb::Request*> VerifyRequestFrame(std::span<const uint8_t> frame);
Result<const fb::Response*> VerifyResponseFrame(std::span<const uint8_t> frame);

inline fb::Status ToWire(StatusCode c) { return static_cast<fb::Status>(c); }
// Unknown wire values (a newer peer) become kInternal.
inline StatusCode FromWire(fb::Status s) {
  const int v = static_cast<int>(s);
  return v < 0 || v > kMaxStatusCode ? StatusCode::kInternal : static_cast<StatusCode>(v);
}
// A per-entry status: OK, or the code with its name as message. Inline: a reply to a
// long chain carries one per block, nearly all OK.
inline Status StatusFromWire(fb::Status s) {
  const StatusCode c = FromWire(s);
  return c == StatusCode::kOk ? Status::Ok() : Status(c, std::string(StatusCodeName(c)));
}
Status StatusFromResponse(const fb::Response& r);

// Tiers: enum Tier in kvtier.fbs has TierKind's numbers, plus None.
inline fb::Tier TierToWire(TierKind t) { return static_cast<fb::Tier>(static_cast<uint8_t>(t)); }
inline fb::Tier TierToWire(std::optional<TierKind> t) { return t ? TierToWire(*t) : fb::Tier::None; }
// nullopt for None and for values only a newer peer knows.
inline std::optional<TierKind> TierFromWire(fb::Tier t) { return TierFromNumber(static_cast<uint8_t>(t)); }

// Block states (kvctl explain): enum BlockState has BlockState's numbers.
inline fb::EventHashes EventHashesToWire(EventHashForm f) { return static_cast<fb::EventHashes>(f); }
// Unknown wire values (a newer peer) are an error: announcing blocks under the wrong ids
// would mislead a router.
inline std::optional<EventHashForm> EventHashesFromWire(fb::EventHashes f) {
  const int v = static_cast<int>(f);
  if (v > static_cast<int>(EventHashForm::kNone)) return std::nullopt;
  return static_cast<EventHashForm>(v);
}

inline fb::BlockState BlockStateToWire(BlockState s) { return static_cast<fb::BlockState>(s); }
// A value only a newer peer knows reads as kNeverStored.
BlockState BlockStateFromWire(fb::BlockState s);

ModelLayout LayoutFromWire(const fb::Layout& l);
flatbuffers::Offset<fb::Layout> LayoutToWire(flatbuffers::FlatBufferBuilder& b, const ModelLayout& l);

// A read-only view of n hashes stored back to back in a [ubyte] vector.
class HashList {
 public:
  HashList() = default;
  // kInvalidArgument when the vector length is not a multiple of hash_bytes.
  static Result<HashList> Parse(const flatbuffers::Vector<uint8_t>* v, size_t hash_bytes);

  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  BlockHash operator[](size_t i) const { return BlockHash(bytes(i)); }
  std::span<const uint8_t> bytes(size_t i) const { return {data_ + i * hash_bytes_, hash_bytes_}; }

 private:
  const uint8_t* data_ = nullptr;
  size_t count_ = 0;
  size_t hash_bytes_ = 0;
};

// Appends hashes as one flat [ubyte] vector.
flatbuffers::Offset<flatbuffers::Vector<uint8_t>> HashesToWire(flatbuffers::FlatBufferBuilder& b,
                                                               std::span<const BlockHash> hashes);

}  // namespace kvtier
