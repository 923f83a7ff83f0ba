#pragma once
// Block identity, shared by the wire protocol, the daemon and the index.
//
// A BlockHash is the engine's chained prefix hash (hash_i = H(hash_{i-1}, tokens_i)),
// opaque bytes of 16 or 32. A namespace is tenant x model fingerprint, encoded with
// length-prefixed fields so that no two (tenant, model) pairs share an encoding
// ("org_1" + "2345" != "org_12345" + ""). A block key is (namespace, hash).
// Value types; thread-compatible.

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace kvtier {

inline constexpr size_t kMaxHashBytes = 32;

// How an engine's own KV events name a block, so kvtierd's announcements of it match
// (daemon/events/kv_events.h): vLLM's (the hash's last 8 bytes, big-endian, unsigned),
// SGLang's (its first 8 bytes as a signed 64-bit integer), or not announced at all.
enum class EventHashForm : uint8_t { kVllm, kSglang, kNone };

// Which of the engine's KV cache groups a namespace holds, as vLLM's KV events name it
// (BlockStored.group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window; a hybrid
// model has one group per attention kind). index -1: not said (events carry no group).
struct EventGroup {
  int32_t index = -1;
  std::string_view kind;        // one of kEventSpecKinds, or empty (not said)
  uint32_t sliding_window = 0;  // tokens; 0: none
  uint32_t block_tokens = 0;    // the group's block size in events; 0: the layout's tokens_per_block
  bool operator==(const EventGroup&) const = default;
};
// vLLM's KVCacheSpecKind values (vllm/v1/kv_cache_interface.py): the kinds a group may be
// announced as. EventGroup::kind views one of these.
inline constexpr std::string_view kEventSpecKinds[] = {
    "full_attention",          "mla_attention",       "sliding_window",         "sliding_window_mla", "mamba",
    "chunked_local_attention", "sink_full_attention", "encoder_only_attention", "cross_attention",    "unknown"};
// The entry of kEventSpecKinds equal to `kind` (a view that outlives `kind`), or nullopt.
inline std::optional<std::string_view> EventSpecKind(std::string_view kind) {
  for (std::string_view k : kEventSpecKinds) {
    if (k == kind) return k;
  }
  return std::nullopt;
}

// Copies `n` bytes of a hash: the two sizes engines use as fixed-size copies (inlined
// moves, not a call per hash: a long chain is 8,192 of them), any other size as it is.
inline void CopyHashBytes(uint8_t* dst, const uint8_t* src, size_t n) {
  if (n == 16) {
    std::memcpy(dst, src, 16);
  } else if (n == 32) {
    std::memcpy(dst, src, 32);
  } else {
    std::memcpy(dst, src, n);
  }
}

class BlockHash {
 public:
  BlockHash() = default;
  // REQUIRES: bytes.size() <= kMaxHashBytes.
  explicit BlockHash(std::span<const uint8_t> bytes) : size_(static_cast<uint8_t>(bytes.size())) {
    CopyHashBytes(bytes_.data(), bytes.data(), bytes.size());
  }
  static bool ValidSize(size_t n) { return n == 16 || n == 32; }

  std::span<const uint8_t> bytes() const { return {bytes_.data(), size_}; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // True when every byte is zero (the "no parent" hash on the wire).
  bool IsZero() const;
  std::string Hex() const;

  friend bool operator==(const BlockHash& a, const BlockHash& b) {
    return a.size_ == b.size_ && std::memcmp(a.bytes_.data(), b.bytes_.data(), a.size_) == 0;
  }

 private:
  std::array<uint8_t, kMaxHashBytes> bytes_{};
  uint8_t size_ = 0;
};

// Seeded hashing for hash tables keyed by client-chosen bytes (the seed is random per
// process, so a client cannot aim collisions at one bucket).
uint64_t HashBytes(std::span<const uint8_t> bytes, uint64_t salt = 0);

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return HashBytes(h.bytes()); }
};

// Namespace encoding: varint(len(tenant)) tenant varint(len(model)) model.
std::string EncodeNamespace(std::string_view tenant, std::string_view model_fingerprint);

// Index key: namespace ‖ hash (the namespace is self-delimiting).
std::string EncodeBlockKey(std::string_view encoded_namespace, const BlockHash& hash);
// The inverse: false unless `key` is an encoded namespace followed by a 16- or 32-byte
// hash. Outputs may be null.
bool DecodeBlockKey(std::string_view key, std::string* tenant, std::string* model_fingerprint,
                    std::string* encoded_namespace, BlockHash* hash);

// Lower-case hex of bytes; HexDecode accepts either case. HexDecode returns false on odd
// length or a non-hex digit.
std::string HexEncode(std::span<const uint8_t> bytes);
std::string HexEncode(std::string_view bytes);
bool HexDecode(std::string_view hex, std::string* out);

}  // namespace kvtier
