#include "storage/remote/remote_tier.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <sodium.h>
#include <xxhash.h>

#include <cstring>

#include "protocol/base/block_key.h"

namespace kvtier {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'T', 'R'};
constexpr uint16_t kFormatVersion = 3;
constexpr size_t kTagOffset = 16;
constexpr size_t kTagBytes = 16;
constexpr size_t kNonceOffset = kTagOffset + kTagBytes;
constexpr size_t kFixedHeader = RemoteCodec::kFixedHeaderBytes;  // magic ... nonce
static_assert(kNonceOffset + RemoteCodec::kNonceBytes == kFixedHeader);
static_assert(kTagBytes == crypto_onetimeauth_BYTES);
constexpr uint32_t kFlagKeyed = 1;

void PutU16(std::string& s, uint16_t v) {
  s.push_back(static_cast<char>(v));
  s.push_back(static_cast<char>(v >> 8));
}
void PutU32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t GetLe(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}
std::span<const uint8_t> Bytes(std::string_view s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

// A 32-byte key for `purpose`, derived from the secret.
std::array<uint8_t, 32> DeriveKey(std::span<const uint8_t, 64> master, std::string_view purpose) {
  std::array<uint8_t, 32> k;
  crypto_generichash(k.data(), k.size(), reinterpret_cast<const uint8_t*>(purpose.data()), purpose.size(),
                     master.data(), master.size());
  return k;
}

}  // namespace

RemoteCodec::RemoteCodec() = default;

Result<RemoteCodec> RemoteCodec::Keyed(std::string_view secret) {
  if (secret.size() < kMinSecretBytes) {
    return InvalidArgument("the remote tier's secret is " + std::to_string(secret.size()) + " bytes; at least " +
                           std::to_string(kMinSecretBytes) +
                           " are needed (e.g. head -c 48 /dev/urandom | base64 -w0: 64 printable bytes, which survive "
                           "the trailing newline being stripped)");
  }
  if (sodium_init() < 0) return Internal("libsodium could not be initialised");
  std::array<uint8_t, 64> master;
  crypto_generichash(master.data(), master.size(), reinterpret_cast<const uint8_t*>(secret.data()), secret.size(),
                     nullptr, 0);
  RemoteCodec c;
  c.keyed_ = true;
  c.mac_key_ = DeriveKey(master, "kvtier remote value tag v2");
  c.name_key_ = DeriveKey(master, "kvtier remote key name v2");
  sodium_memzero(master.data(), master.size());
  return c;
}

std::string RemoteCodec::Key(std::string_view prefix, std::string_view block_key) const {
  uint8_t name[16];
  if (keyed_) {
    crypto_generichash(name, sizeof(name), reinterpret_cast<const uint8_t*>(block_key.data()), block_key.size(),
                       name_key_.data(), name_key_.size());
  } else {
    const XXH128_hash_t h = XXH3_128bits(block_key.data(), block_key.size());
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    std::memcpy(name, c.digest, sizeof(name));
  }
  std::string k(prefix);
  k += HexEncode(std::string_view(reinterpret_cast<const char*>(name), sizeof(name)));
  return k;
}

void RemoteCodec::Tag(std::string_view remote_key, std::span<const uint8_t> header, std::span<const uint8_t> payload,
                      uint8_t out[16]) const {
  // Over: the key's length and bytes, the header with its tag as zeros, the payload.
  uint8_t len[4];
  for (int i = 0; i < 4; ++i) len[i] = static_cast<uint8_t>(remote_key.size() >> (8 * i));
  static const uint8_t kZero[kTagBytes] = {};
  const std::span<const uint8_t> parts[] = {
      {len, 4}, Bytes(remote_key), header.first(kTagOffset), {kZero, kTagBytes}, header.subspan(kNonceOffset), payload};
  if (keyed_) {
    // Poly1305 under a key of this value alone: BLAKE2b of the value's random nonce, keyed
    // by the secret's tag key (a Poly1305 key must never tag two messages).
    uint8_t one_time[crypto_onetimeauth_KEYBYTES];
    crypto_generichash(one_time, sizeof(one_time), header.data() + kNonceOffset, kNonceBytes, mac_key_.data(),
                       mac_key_.size());
    crypto_onetimeauth_state st;
    crypto_onetimeauth_init(&st, one_time);
    for (const auto& p : parts) crypto_onetimeauth_update(&st, p.data(), p.size());
    crypto_onetimeauth_final(&st, out);
    sodium_memzero(one_time, sizeof(one_time));
  } else {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    for (const auto& p : parts) XXH3_128bits_update(&st, p.data(), p.size());
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    std::memcpy(out, c.digest, kTagBytes);
  }
}

std::string RemoteCodec::EncodeHeader(std::string_view remote_key, const LowerBlockMeta& meta,
                                      std::span<const uint8_t> payload, const Nonce* nonce) const {
  std::string h(kMagic, sizeof(kMagic));
  PutU16(h, kFormatVersion);
  const size_t fp = std::min<size_t>(meta.fingerprint.size(), 255);
  const size_t parent = std::min<size_t>(meta.parent.size(), 255);
  PutU16(h, static_cast<uint16_t>(kFixedHeader + 2 + fp + parent));
  PutU32(h, static_cast<uint32_t>(payload.size()));
  PutU32(h, keyed_ ? kFlagKeyed : 0);
  h.append(kTagBytes, '\0');
  if (!keyed_) {
    h.append(kNonceBytes, '\0');  // unused: an unkeyed tag needs none
  } else if (nonce != nullptr) {
    h.append(reinterpret_cast<const char*>(nonce->data()), nonce->size());
  } else {
    Nonce fresh;
    randombytes_buf(fresh.data(), fresh.size());
    h.append(reinterpret_cast<const char*>(fresh.data()), fresh.size());
  }
  h.push_back(static_cast<char>(fp));
  h.append(meta.fingerprint.data(), fp);
  h.push_back(static_cast<char>(parent));
  h.append(meta.parent.data(), parent);
  uint8_t tag[kTagBytes];
  Tag(remote_key, Bytes(h), payload, tag);
  std::memcpy(h.data() + kTagOffset, tag, kTagBytes);
  return h;
}

Result<LowerBlockMeta> RemoteCodec::Decode(std::string_view remote_key, std::span<const uint8_t> value,
                                           std::string_view fingerprint, uint32_t length,
                                           std::span<uint8_t> dst) const {
  if (value.size() < kFixedHeader + 2 || std::memcmp(value.data(), kMagic, sizeof(kMagic)) != 0) {
    return DataLoss("not a kvtier block value");
  }
  const uint8_t* p = value.data();
  if (GetLe(p + 4, 2) != kFormatVersion) {
    return DataLoss("value format version " + std::to_string(GetLe(p + 4, 2)) + " is not " +
                    std::to_string(kFormatVersion));
  }
  const size_t header = GetLe(p + 6, 2);
  const uint64_t payload = GetLe(p + 8, 4);
  if (header < kFixedHeader + 2 || header > value.size() || value.size() - header != payload) {
    return DataLoss("value cut short or of the wrong length");
  }
  const uint64_t flags = GetLe(p + 12, 4);
  if (flags & ~uint64_t{kFlagKeyed}) return DataLoss("value has flags this kvtierd does not know");
  if (((flags & kFlagKeyed) != 0) != keyed_) {
    return DataLoss(keyed_ ? "value is not sealed with the fleet secret"
                           : "value is sealed with a secret and this kvtierd has none (tiers.remote.secret_file)");
  }
  if (payload != length) {
    return DataLoss("value holds " + std::to_string(payload) + " bytes, the block has " + std::to_string(length));
  }
  LowerBlockMeta meta;
  meta.length = static_cast<uint32_t>(payload);
  size_t at = kFixedHeader;
  const size_t fp = p[at++];
  if (at + fp + 1 > header) return DataLoss("value header is malformed");
  meta.fingerprint.assign(reinterpret_cast<const char*>(p + at), fp);
  at += fp;
  const size_t parent = p[at++];
  if (at + parent != header) return DataLoss("value header is malformed");
  meta.parent.assign(reinterpret_cast<const char*>(p + at), parent);
  if (meta.fingerprint != fingerprint) return DataLoss("value was written for another layout");
  const auto body = value.subspan(header);
  uint8_t tag[kTagBytes];
  Tag(remote_key, value.first(header), body, tag);
  const bool good =
      keyed_ ? sodium_memcmp(tag, p + kTagOffset, kTagBytes) == 0 : std::memcmp(tag, p + kTagOffset, kTagBytes) == 0;
  if (!good)
    return DataLoss(keyed_ ? "value does not authenticate (tag mismatch)"
                           : "value does not verify (checksum mismatch)");
  std::memcpy(dst.data(), body.data(), body.size());
  return meta;
}

// ---- the tier ----------------------------------------------------------------------------

RemoteTier::RemoteTier(const RemoteTierOptions& options, Observer observe)
    : options_(options), observe_(std::move(observe)), self_(std::make_shared<RemoteTier*>(this)) {
  options_.secret.clear();  // kept only as derived keys, in codec_
}

RemoteTier::~RemoteTier() {
  cluster_.reset();  // joins its threads
  self_.reset();
}

Result<std::unique_ptr<RemoteTier>> RemoteTier::Open(const RemoteTierOptions& options, Post post, Observer observe) {
  RemoteCodec codec;
  if (!options.secret.empty()) {
    KVTIER_ASSIGN_OR_RETURN(codec, RemoteCodec::Keyed(options.secret));
  }
  std::unique_ptr<RemoteTier> t(new RemoteTier(options, std::move(observe)));
  t->codec_ = codec;
  t->post_ = std::move(post);
  std::weak_ptr<RemoteTier*> weak = t->self_;
  Post outer = t->post_;
  // Completions reach the owner's thread only while this tier lives.
  auto guarded = [weak, outer](std::function<void()> fn) {
    outer([weak, fn = std::move(fn)] {
      if (weak.lock()) fn();
    });
  };
  KVTIER_ASSIGN_OR_RETURN(t->cluster_, RedisCluster::Open(options.cluster, guarded));
  return t;
}

void RemoteTier::PostSafe(std::function<void()> fn) {
  std::weak_ptr<RemoteTier*> weak = self_;
  post_([weak, fn = std::move(fn)] {
    if (weak.lock()) fn();
  });
}

void RemoteTier::Observe(std::string_view op, int64_t ns, bool ok) {
  if (observe_) observe_(op, static_cast<double>(ns) * 1e-9, ok);
}

std::string RemoteTier::Describe() const {
  const auto masters = cluster_->Masters();
  size_t up = 0;
  for (const auto& m : masters) up += m.breaker_open ? 0 : 1;
  std::string s =
      "redis cluster, " + std::to_string(masters.size()) + " masters, " + std::to_string(up) + " up, values " +
      (codec_.keyed() ? "sealed with the fleet secret" : "NOT authenticated (no tiers.remote.secret_file)") +
      ", seeds ";
  for (size_t i = 0; i < options_.cluster.seeds.size(); ++i) s += (i ? "," : "") + options_.cluster.seeds[i];
  return s;
}

LowerTierReport RemoteTier::Report() const {
  LowerTierReport r;
  const RemoteCounters& c = counters_;
  const RedisClusterCounters& cc = cluster_->counters();
  auto n = [](uint64_t v) { return static_cast<double>(v); };
  auto a = [](const std::atomic<uint64_t>& v) { return static_cast<double>(v.load(std::memory_order_relaxed)); };
  const char* nodes_help =
      "Masters of the remote tier's Redis Cluster, by state (open: its circuit breaker is open, its requests are "
      "misses without being sent).";
  for (const auto& m : cluster_->Masters()) {
    r.nodes.push_back({m.address, !m.breaker_open, m.failures});
  }
  double up = 0;
  for (const TierNode& node : r.nodes) up += node.up ? 1 : 0;
  r.checksum_failures = c.checksum_failures;
  r.authenticated = codec_.keyed();
  const char* moved = "Block bytes moved between tiers, by path.";
  const char* fetch_help = "Remote blocks read into host pages, by result (miss: the key was gone).";
  r.figures = {
      {"nodes_up", up, false, "kvtier_remote_nodes", nodes_help, {"state", "up"}},
      {"nodes_open", n(r.nodes.size()) - up, false, "kvtier_remote_nodes", nodes_help, {"state", "open"}},
      {"lookups", n(c.exists), true, "kvtier_remote_lookups_total",
       "Block keys looked for in the remote tier (EXISTS)."},
      {"lookup_hits", n(c.exists_found), true, "kvtier_remote_lookup_hits_total",
       "Block keys the remote tier held when looked for."},
      {"fetches", n(c.fetches), true, "", ""},
      {"fetch_hits", n(c.fetch_hits), true, "kvtier_remote_fetches_total", fetch_help, {"result", "hit"}},
      {"fetch_misses", n(c.fetch_misses), true, "kvtier_remote_fetches_total", fetch_help, {"result", "miss"}},
      {"fetch_bytes", n(c.fetch_bytes), true, "kvtier_bytes_moved_total", moved, {"path", "remote_to_host"}},
      {"put_bytes", n(c.put_bytes), true, "kvtier_bytes_moved_total", moved, {"path", "host_to_remote"}},
      {"puts", n(c.puts), true, "", ""},
      {"puts_failed", n(c.puts_failed), true, "", ""},
      {"errors", n(c.errors), true, "kvtier_remote_errors_total",
       "Remote-tier requests that failed (node down or its breaker open, timeout, error reply); each is a miss or a "
       "put not made."},
      {"checksum_failures", n(c.checksum_failures), true, "kvtier_remote_checksum_failures_total",
       "Remote values that did not verify (overwritten, cut short, foreign); each was a miss and was deleted from "
       "the cluster."},
      {"breaker_rejections", a(cc.breaker_rejections), true, "kvtier_remote_breaker_rejections_total",
       "Remote-tier requests failed at once because their node's circuit breaker was open."},
      {"timeouts", a(cc.timeouts), true, "kvtier_remote_timeouts_total",
       "Batches of remote-tier requests whose replies were late."},
      {"redirects", a(cc.redirects), true, "kvtier_remote_redirects_total", "MOVED and ASK replies followed."},
      {"slot_map_refreshes", a(cc.refreshes), true, "kvtier_remote_slot_map_refreshes_total",
       "Cluster slot maps read (CLUSTER SLOTS)."},
      {"authenticated", codec_.keyed() ? 1.0 : 0.0, false, "kvtier_remote_authenticated",
       "1: the remote tier's values and key names are keyed by a fleet secret (tiers.remote.secret_file); 0: anyone "
       "who can reach the cluster can plant values this node serves."},
      {"oversized_replies", a(cc.oversized), true, "kvtier_remote_oversized_replies_total",
       "Cluster replies refused for their length (longer than any block's value); each was a miss."},
      {"nodes_dropped", a(cc.nodes_dropped), true, "kvtier_remote_nodes_dropped_total",
       "Cluster nodes dropped with their connections because a new slot map did not name them."},
      {"slot_maps_refused", a(cc.maps_refused), true, "kvtier_remote_slot_maps_refused_total",
       "Slot maps not used because they named more masters than tiers.remote.max_nodes."},
      {"exists_seconds", n(c.exists_ns) * 1e-9, true, "", ""},
      {"fetch_seconds", n(c.fetch_ns) * 1e-9, true, "", ""},
      {"put_seconds", n(c.put_ns) * 1e-9, true, "", ""},
  };
  return r;
}

void RemoteTier::Exists(std::vector<std::string> block_keys, std::function<void(std::vector<bool>)> done) {
  if (block_keys.empty() || !cluster_->Available()) {
    // Nothing to ask, or nobody to ask: every key is a miss, without a request each.
    PostSafe([n = block_keys.size(), done = std::move(done)] { done(std::vector<bool>(n, false)); });
    return;
  }
  struct Pending {
    std::vector<bool> found;
    size_t left;
    std::function<void(std::vector<bool>)> done;
  };
  auto pending = std::make_shared<Pending>(
      Pending{std::vector<bool>(block_keys.size(), false), block_keys.size(), std::move(done)});
  for (size_t i = 0; i < block_keys.size(); ++i) {
    cluster_->Exists(codec_.Key(options_.key_prefix, block_keys[i]), [this, pending, i](const RedisReply& r) {
      ++counters_.exists;
      counters_.exists_ns += static_cast<uint64_t>(r.latency_ns);
      Observe("exists", r.latency_ns, r.status.ok());
      if (!r.status.ok()) ++counters_.errors;
      if (r.status.ok() && r.integer > 0) {
        pending->found[i] = true;
        ++counters_.exists_found;
      }
      if (--pending->left == 0) pending->done(std::move(pending->found));
    });
  }
}

void RemoteTier::Put(const std::string& block_key, LowerBlockMeta meta, std::span<const uint8_t> data,
                     std::function<void(Status)> done) {
  RedisCluster::Value v;
  v.body = data;
  std::string remote_key = codec_.Key(options_.key_prefix, block_key);
  // The header (its tag reads every byte) is made on the connection thread.
  v.prepare = [this, key = remote_key, meta = std::move(meta)](RedisCluster::Value& value) {
    value.head = codec_.EncodeHeader(key, meta, value.body);
  };
  const size_t bytes = data.size();
  cluster_->Set(std::move(remote_key), std::move(v), [this, bytes, done = std::move(done)](const RedisReply& r) {
    counters_.put_ns += static_cast<uint64_t>(r.latency_ns);
    Observe("set", r.latency_ns, r.status.ok());
    if (r.status.ok()) {
      ++counters_.puts;
      counters_.put_bytes += bytes;
    } else {
      ++counters_.puts_failed;
      ++counters_.errors;
    }
    done(r.status);
  });
}

void RemoteTier::Delete(const std::string& block_key) {
  ++counters_.deletes;
  cluster_->Del(codec_.Key(options_.key_prefix, block_key), nullptr);
}

void RemoteTier::Fetch(const std::string& block_key, const std::string& fingerprint, uint32_t length,
                       std::span<uint8_t> dst, std::function<void(Status, LowerBlockMeta)> done) {
  if (dst.size() < length) {
    PostSafe([done = std::move(done)] { done(InvalidArgument("fetch buffer smaller than the block"), {}); });
    return;
  }
  auto meta = std::make_shared<LowerBlockMeta>();
  const std::string remote_key = codec_.Key(options_.key_prefix, block_key);
  // On the connection thread: verify and copy straight from the reader's buffer.
  auto sink = [this, remote_key, fingerprint, length, dst, meta](std::span<const uint8_t> value) -> Status {
    auto m = codec_.Decode(remote_key, value, fingerprint, length, dst);
    if (!m.ok()) return m.status();
    *meta = std::move(m).value();
    return Status::Ok();
  };
  cluster_->Get(remote_key, std::move(sink),
                [this, remote_key, meta, length, done = std::move(done)](const RedisReply& r) {
                  ++counters_.fetches;
                  counters_.fetch_ns += static_cast<uint64_t>(r.latency_ns);
                  const StatusCode code = r.status.code();
                  Observe("get", r.latency_ns, r.status.ok() || code == StatusCode::kNotFound);
                  if (r.status.ok()) {
                    ++counters_.fetch_hits;
                    counters_.fetch_bytes += length;
                  } else if (code == StatusCode::kNotFound) {
                    ++counters_.fetch_misses;
                  } else if (code == StatusCode::kDataLoss) {
                    // Never served; and gone, so nobody reads it again.
                    ++counters_.checksum_failures;
                    cluster_->Del(remote_key, nullptr);
                  } else {
                    ++counters_.errors;
                  }
                  done(r.status, r.status.ok() ? std::move(*meta) : LowerBlockMeta{});
                });
}

}  // namespace kvtier
