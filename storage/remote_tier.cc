#include "storage/remote_tier.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <cstring>

#include "protocol/base/block_key.h"
#include "storage/block_index_store.h"

namespace kvtier {
namespace {

constexpr char kMagic[4] = {'K', 'V', 'T', 'R'};
constexpr uint16_t kFormatVersion = 1;
constexpr size_t kFixedHeader = 24;     // magic, version, header bytes, payload bytes, flags, checksum
constexpr size_t kChecksumOffset = 16;  // u64

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

// The value's checksum: XXH3 of the header (checksum field as zeros), seeded with the
// payload's checksum under the key.
uint64_t ValueChecksum(std::string_view block_key, std::span<const uint8_t> header, std::span<const uint8_t> payload) {
  XXH3_state_t state;
  XXH3_64bits_reset_withSeed(&state, BlockChecksum(block_key, payload));
  XXH3_64bits_update(&state, header.data(), kChecksumOffset);
  static const uint8_t kZero[8] = {};
  XXH3_64bits_update(&state, kZero, sizeof(kZero));
  XXH3_64bits_update(&state, header.data() + kFixedHeader, header.size() - kFixedHeader);
  return XXH3_64bits_digest(&state);
}

}  // namespace

std::string RemoteKey(std::string_view prefix, std::string_view block_key) {
  std::string k(prefix);
  k += HexEncode(block_key);
  return k;
}

std::string EncodeRemoteHeader(std::string_view block_key, const RemoteBlockMeta& meta,
                               std::span<const uint8_t> payload) {
  std::string h(kMagic, sizeof(kMagic));
  PutU16(h, kFormatVersion);
  const size_t fp = std::min<size_t>(meta.fingerprint.size(), 255);
  const size_t parent = std::min<size_t>(meta.parent.size(), 255);
  PutU16(h, static_cast<uint16_t>(kFixedHeader + 2 + fp + parent));
  PutU32(h, static_cast<uint32_t>(payload.size()));
  PutU32(h, 0);  // flags
  h.append(8, '\0');
  h.push_back(static_cast<char>(fp));
  h.append(meta.fingerprint.data(), fp);
  h.push_back(static_cast<char>(parent));
  h.append(meta.parent.data(), parent);
  const uint64_t sum = ValueChecksum(block_key, {reinterpret_cast<const uint8_t*>(h.data()), h.size()}, payload);
  for (int i = 0; i < 8; ++i) h[kChecksumOffset + i] = static_cast<char>(sum >> (8 * i));
  return h;
}

Result<RemoteBlockMeta> DecodeRemoteValue(std::string_view block_key, std::span<const uint8_t> value,
                                          std::string_view fingerprint, uint32_t length, std::span<uint8_t> dst) {
  if (value.size() < kFixedHeader + 2 || std::memcmp(value.data(), kMagic, sizeof(kMagic)) != 0) {
    return DataLoss("not a kvtier block value");
  }
  const uint8_t* p = value.data();
  if (GetLe(p + 4, 2) != kFormatVersion) {
    return DataLoss("value format version " + std::to_string(GetLe(p + 4, 2)) + " is not 1");
  }
  const size_t header = GetLe(p + 6, 2);
  const uint64_t payload = GetLe(p + 8, 4);
  if (header < kFixedHeader + 2 || header > value.size() || value.size() - header != payload) {
    return DataLoss("value cut short or of the wrong length");
  }
  if (GetLe(p + 12, 4) != 0) return DataLoss("value has flags this kvtierd does not know");
  if (payload != length) {
    return DataLoss("value holds " + std::to_string(payload) + " bytes, the block has " + std::to_string(length));
  }
  RemoteBlockMeta meta;
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
  if (ValueChecksum(block_key, value.first(header), body) != GetLe(p + kChecksumOffset, 8)) {
    return DataLoss("value does not verify (checksum mismatch)");
  }
  std::memcpy(dst.data(), body.data(), body.size());
  return meta;
}

// ---- the tier ----------------------------------------------------------------------------

RemoteTier::RemoteTier(const RemoteTierOptions& options, Observer observe)
    : options_(options), observe_(std::move(observe)), self_(std::make_shared<RemoteTier*>(this)) {}

RemoteTier::~RemoteTier() {
  cluster_.reset();  // joins its threads
  self_.reset();
}

Result<std::unique_ptr<RemoteTier>> RemoteTier::Open(const RemoteTierOptions& options, Post post, Observer observe) {
  std::unique_ptr<RemoteTier> t(new RemoteTier(options, std::move(observe)));
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
      "redis cluster: " + std::to_string(masters.size()) + " masters (" + std::to_string(up) + " reachable), seeds ";
  for (size_t i = 0; i < options_.cluster.seeds.size(); ++i) s += (i ? "," : "") + options_.cluster.seeds[i];
  return s;
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
    cluster_->Exists(RemoteKey(options_.key_prefix, block_keys[i]), [this, pending, i](const RedisReply& r) {
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

void RemoteTier::Put(const std::string& block_key, RemoteBlockMeta meta, std::span<const uint8_t> data,
                     std::function<void(Status)> done) {
  RedisCluster::Value v;
  v.body = data;
  // The header (its checksum reads every byte) is made on the connection thread.
  v.prepare = [key = block_key, meta = std::move(meta)](RedisCluster::Value& value) {
    value.head = EncodeRemoteHeader(key, meta, value.body);
  };
  const size_t bytes = data.size();
  cluster_->Set(RemoteKey(options_.key_prefix, block_key), std::move(v),
                [this, bytes, done = std::move(done)](const RedisReply& r) {
                  ++counters_.puts;
                  counters_.put_ns += static_cast<uint64_t>(r.latency_ns);
                  Observe("set", r.latency_ns, r.status.ok());
                  if (r.status.ok()) {
                    counters_.put_bytes += bytes;
                  } else {
                    ++counters_.errors;
                  }
                  done(r.status);
                });
}

void RemoteTier::Delete(const std::string& block_key) {
  ++counters_.deletes;
  cluster_->Del(RemoteKey(options_.key_prefix, block_key), nullptr);
}

void RemoteTier::Fetch(const std::string& block_key, const std::string& fingerprint, uint32_t length,
                       std::span<uint8_t> dst, std::function<void(Status, RemoteBlockMeta)> done) {
  if (dst.size() < length) {
    PostSafe([done = std::move(done)] { done(InvalidArgument("fetch buffer smaller than the block"), {}); });
    return;
  }
  auto meta = std::make_shared<RemoteBlockMeta>();
  // On the connection thread: verify and copy straight from the reader's buffer.
  auto sink = [key = block_key, fingerprint, length, dst, meta](std::span<const uint8_t> value) -> Status {
    auto m = DecodeRemoteValue(key, value, fingerprint, length, dst);
    if (!m.ok()) return m.status();
    *meta = std::move(m).value();
    return Status::Ok();
  };
  const std::string remote_key = RemoteKey(options_.key_prefix, block_key);
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
                  done(r.status, r.status.ok() ? std::move(*meta) : RemoteBlockMeta{});
                });
}

}  // namespace kvtier
