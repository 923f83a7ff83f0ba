#pragma once
// RemoteTier: blocks in a shared Redis Cluster below the NVMe tier, so that every kvtierd
// of a fleet can reuse the prefixes any of them stored.
//
// Whoever can reach the cluster can read and write its keys, so what is stored there is
// sealed by RemoteCodec under the fleet secret (tiers.remote.secret_file), when one is set:
//   key   = key_prefix + hex(BLAKE2b-128 keyed by the secret, of the block key)
//   value = header ‖ block bytes, the header
//     magic "KVTR" | format version u16 (3) | header bytes u16 | payload bytes u32 |
//     flags u32 (bit 0: keyed) | tag 16 bytes | nonce 16 bytes | fingerprint: u8 length
//     + bytes | parent: u8 length + bytes
//   little-endian; tag = Poly1305 over the remote key, the header with its tag zeroed,
//   and the payload, under a one-time key = BLAKE2b-256 of the nonce keyed by the secret;
//   the nonce is random per value (a Poly1305 key tags one message only; Poly1305 is the
//   MAC because it is several times cheaper per byte than BLAKE2b, docs/benchmarks.md).
// The block key is the NVMe index's (namespace ‖ hash; the namespace is tenant x model
// fingerprint), so a key name says nothing of the tenant or the model to anyone without
// the secret, and a value planted, changed, or moved from one key to another (another
// tenant's, another layout's) never verifies. Without a secret the same format is used
// unkeyed (key names and tags by XXH3-128): that stops accidents (a value cut short, of
// another format, layout or key), not an adversary; kvtierd warns at start. A value that
// does not verify — or sealed with the other choice of secret — is a miss: counted in
// checksum_failures, deleted from the cluster, never served.
//
// Threads: every method runs on the owner's (control) thread and every callback is
// delivered there through `post`, never inside the call that takes it. Values are checked
// and copied into their destination on the cluster client's connection threads, and a
// put's header (its tag) is computed there too, so the owner's thread does neither.

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/base/post.h"
#include "protocol/base/status.h"
#include "storage/lower_tier.h"
#include "storage/remote/redis_cluster.h"

namespace kvtier {

struct RemoteTierOptions {
  RedisClusterOptions cluster;
  std::string key_prefix = "kvtier:";  // Default: "kvtier:"
  std::string secret;                  // the fleet secret (>= 32 bytes), or empty: unkeyed
  bool operator==(const RemoteTierOptions&) const = default;
};

// Cumulative, updated on the owner's thread. Latencies are sums for means: the daemon's
// histograms have the distribution.
struct RemoteCounters {
  uint64_t exists = 0, exists_found = 0;
  uint64_t fetches = 0, fetch_hits = 0, fetch_misses = 0, fetch_bytes = 0;
  uint64_t puts = 0, put_bytes = 0;  // stored
  uint64_t puts_failed = 0;          // refused (e.g. OOM) or not answered
  uint64_t deletes = 0;
  uint64_t errors = 0;             // requests that failed (node down, timeout, error reply)
  uint64_t checksum_failures = 0;  // values that did not verify: misses, deleted
  uint64_t fetch_ns = 0, put_ns = 0, exists_ns = 0;
};

// The keys and values of the remote tier, sealed under a secret or unkeyed (see above).
// Immutable; safe from any thread.
class RemoteCodec {
 public:
  static constexpr size_t kMinSecretBytes = 32;
  static constexpr size_t kNonceBytes = 16;
  using Nonce = std::array<uint8_t, kNonceBytes>;
  // The fixed part of a header, and the most a header can take (a value is at most this
  // plus its block's bytes).
  static constexpr size_t kFixedHeaderBytes = 48;
  static constexpr size_t kMaxHeaderBytes = kFixedHeaderBytes + 2 + 255 + 255;
  // Unkeyed.
  RemoteCodec();
  // kInvalidArgument when the secret is shorter than kMinSecretBytes.
  static Result<RemoteCodec> Keyed(std::string_view secret);
  bool keyed() const { return keyed_; }

  // The remote key of a block key.
  std::string Key(std::string_view prefix, std::string_view block_key) const;
  // The header of the value of `payload` stored under `remote_key`. Keyed, its nonce is
  // random unless `nonce` is given (only to make seed inputs reproducible: a nonce must not
  // seal two different values).
  std::string EncodeHeader(std::string_view remote_key, const LowerBlockMeta& meta, std::span<const uint8_t> payload,
                           const Nonce* nonce = nullptr) const;
  // Checks a whole value (header ‖ payload) read under `remote_key`: the format, the
  // expected layout `fingerprint` and `length`, the tag. On success copies the payload
  // into dst (REQUIRES: dst.size() >= length) and returns the value's meta; kDataLoss
  // (saying what is wrong) otherwise, with dst untouched.
  Result<LowerBlockMeta> Decode(std::string_view remote_key, std::span<const uint8_t> value,
                                std::string_view fingerprint, uint32_t length, std::span<uint8_t> dst) const;

 private:
  void Tag(std::string_view remote_key, std::span<const uint8_t> header, std::span<const uint8_t> payload,
           uint8_t out[16]) const;

  bool keyed_ = false;
  std::array<uint8_t, 32> mac_key_{};   // derived from the secret, for tags
  std::array<uint8_t, 32> name_key_{};  // derived from the secret, for key names
};

class RemoteTier final : public LowerTier {
 public:
  using Observer = std::function<void(std::string_view op, double seconds, bool ok)>;

  // kInvalidArgument for bad options; an unreachable cluster is not an error (see
  // RedisCluster::Open). `observe`, if set, hears every request's latency on the owner's
  // thread.
  static Result<std::unique_ptr<RemoteTier>> Open(const RemoteTierOptions& options, Post post,
                                                  Observer observe = nullptr);
  // Stops the cluster client; callbacks not yet delivered are dropped.
  ~RemoteTier() override;

  TierKind kind() const override { return TierKind::kRemote; }

  // Whether the cluster holds each key (block keys). Unreachable or failing: false (a miss).
  void Exists(std::vector<std::string> block_keys, std::function<void(std::vector<bool>)> done) override;
  // Stores `data` under `block_key`; `data` must stay unchanged until `done`.
  void Put(const std::string& block_key, LowerBlockMeta meta, std::span<const uint8_t> data,
           std::function<void(Status)> done) override;
  // Reads the block of `block_key` into dst[0, length), verified (see RemoteCodec::Decode);
  // `dst` must stay valid until `done`. kNotFound: not in the cluster; kDataLoss: did not
  // verify (counted, deleted); kUnavailable: the cluster could not answer.
  void Fetch(const std::string& block_key, const std::string& fingerprint, uint32_t length, std::span<uint8_t> dst,
             std::function<void(Status, LowerBlockMeta)> done) override;

  // Deletes the value of `block_key` (fire and forget: a failure leaves it to the
  // cluster's own eviction).
  void Delete(const std::string& block_key) override;

  // Whether any master can be asked now (a slot map is known, not every breaker is open).
  bool available() const override { return cluster_->Available(); }
  std::vector<RedisCluster::NodeState> Masters() const { return cluster_->Masters(); }
  // Whether values are sealed under a fleet secret.
  bool keyed() const { return codec_.keyed(); }
  const RemoteCodec& codec() const { return codec_; }
  const std::string& key_prefix() const { return options_.key_prefix; }
  const RemoteCounters& counters() const { return counters_; }
  const RedisClusterCounters& cluster_counters() const { return cluster_->counters(); }
  // "redis cluster, 3 masters, 2 up, values sealed with the fleet secret, seeds 127.0.0.1:7000"
  std::string Describe() const override;
  // The cluster's masters, and the figures RemoteCounters and RedisClusterCounters keep
  // (exported as kvtier_remote_*; the latency sums are not: the daemon's
  // kvtier_remote_request_duration_seconds has them).
  LowerTierReport Report() const override;

 private:
  RemoteTier(const RemoteTierOptions& options, Observer observe);
  // Runs `fn` on the owner's thread unless this tier is gone by then.
  void PostSafe(std::function<void()> fn);
  void Observe(std::string_view op, int64_t ns, bool ok);

  RemoteTierOptions options_;
  RemoteCodec codec_;
  Observer observe_;
  Post post_;
  std::shared_ptr<RemoteTier*> self_;  // expires with this object (see PostSafe)
  RemoteCounters counters_;
  std::unique_ptr<RedisCluster> cluster_;  // last: its threads stop first
};

}  // namespace kvtier
