// The wire form of KV events and the announced-state file: pure encoding and decoding
// (daemon/events/kv_events.h states the forms); the publisher is kv_events.cc.
#include <charconv>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "daemon/events/kv_events.h"

#define MSGPACK_NO_BOOST 1
#include <algorithm>
#include <msgpack.hpp>

namespace kvtier {

uint64_t EventHash(const BlockHash& hash, EventHashForm form) {
  auto b = hash.bytes();
  const size_t n = std::min<size_t>(b.size(), 8);
  const size_t from = form == EventHashForm::kSglang ? 0 : b.size() - n;
  uint64_t v = 0;
  for (size_t i = from; i < from + n; ++i) v = (v << 8) | b[i];
  return v;
}

std::string_view EventMedium(TierKind tier) { return TierRowOf(tier).event_medium; }

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackStr(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackHash(Packer& pk, uint64_t h, bool is_signed) {
  if (is_signed) {
    pk.pack_int64(static_cast<int64_t>(h));
  } else {
    pk.pack_uint64(h);
  }
}

void PackHashes(Packer& pk, const std::vector<uint64_t>& hashes, bool is_signed) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (uint64_t h : hashes) PackHash(pk, h, is_signed);
}

// One event, as a map keyed by field name (tagged) or an array in field order
// (positional); both name the same fields in the same order.
// `buf` is the buffer `pk` writes to: extra keys, already msgpack, are appended as they are.
void PackEvent(msgpack::sbuffer& buf, Packer& pk, const KvEvent& e, KvEventEncoding encoding) {
  const bool tagged = encoding == KvEventEncoding::kTagged;
  auto field = [&](std::string_view name) {
    if (tagged) PackStr(pk, name);
  };
  const bool stored = e.kind == KvEvent::Kind::kStored;
  // The group fields: tagged only, each when said.
  const bool group = tagged && e.group.index >= 0;
  const bool kind = tagged && stored && !e.group.kind.empty();
  const bool window = tagged && stored && e.group.sliding_window > 0;
  const bool extra = tagged && stored && !e.extra_keys.empty();
  const uint32_t n = (stored ? 8 : 3) + extra + group + kind + window;
  if (tagged) {
    pk.pack_map(n);
  } else {
    pk.pack_array(n);
  }
  field("type");
  PackStr(pk, stored ? "BlockStored" : "BlockRemoved");
  field("block_hashes");
  PackHashes(pk, e.hashes, e.signed_hashes);
  if (stored) {
    field("parent_block_hash");
    if (e.parent) {
      PackHash(pk, *e.parent, e.signed_hashes);
    } else {
      pk.pack_nil();
    }
    field("token_ids");
    pk.pack_array(static_cast<uint32_t>(e.token_ids.size()));
    for (uint32_t t : e.token_ids) pk.pack_uint32(t);
    field("block_size");
    pk.pack_uint32(e.block_size);
    field("lora_id");
    if (e.lora_id != 0) {
      pk.pack_uint32(e.lora_id);
    } else {
      pk.pack_nil();
    }
  }
  field("medium");
  PackStr(pk, EventMedium(e.tier));
  if (stored) {
    field("lora_name");
    if (!e.lora_name.empty()) {
      PackStr(pk, e.lora_name);
    } else {
      pk.pack_nil();
    }
  }
  if (extra) {  // each entry one msgpack object, as SplitExtraKeys checked and packed it
    field("extra_keys");
    pk.pack_array(static_cast<uint32_t>(e.extra_keys.size()));
    for (const std::string& k : e.extra_keys) buf.write(k.data(), k.size());
  }
  if (group) {
    field("group_idx");
    pk.pack_int32(e.group.index);
  }
  if (kind) {
    field("kv_cache_spec_kind");
    PackStr(pk, e.group.kind);
  }
  if (window) {
    field("kv_cache_spec_sliding_window");
    pk.pack_uint32(e.group.sliding_window);
  }
}

}  // namespace

StoredKeys StoredKeys::Block(size_t i, size_t blocks) const {
  StoredKeys k{.lora_name = lora_name, .lora_id = lora_id};
  if (blocks > 0 && !tokens.empty() && tokens.size() % blocks == 0) {
    const size_t per = tokens.size() / blocks;
    k.tokens = tokens.subspan(i * per, per);
  }
  if (extra.size() == blocks) k.extra = extra.subspan(i, 1);
  return k;
}

Result<std::vector<std::string>> SplitExtraKeys(std::span<const uint8_t> bytes, size_t blocks) {
  // Limits far above what vLLM's keys need (a LoRA name, a salt, digests and multimodal
  // ids with offsets per block), low enough that one Commit cannot make the daemon build
  // a large object tree.
  constexpr size_t kMaxKeysPerBlock = 64, kMaxKeyBytes = 4096, kMaxDepth = 4;
  constexpr size_t kMaxEntryBytes = StoredKeys::kMaxExtraKeyBytes;
  const msgpack::unpack_limit limit(std::max<size_t>(blocks, kMaxKeysPerBlock), 0, kMaxKeyBytes, kMaxKeyBytes, 0,
                                    kMaxDepth);
  msgpack::object_handle oh;
  size_t offset = 0;
  try {
    oh = msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), bytes.size(), offset, nullptr, nullptr, limit);
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("commit extra_keys: not one msgpack object within the limits (") + e.what() +
                           ")");
  }
  if (offset != bytes.size()) return InvalidArgument("commit extra_keys: bytes after its msgpack array");
  const msgpack::object& top = oh.get();
  if (top.type != msgpack::type::ARRAY || top.via.array.size != blocks) {
    return InvalidArgument("commit extra_keys must be a msgpack array of one entry per page (" +
                           std::to_string(blocks) + ")");
  }
  std::vector<std::string> out;
  out.reserve(blocks);
  for (uint32_t i = 0; i < top.via.array.size; ++i) {
    const msgpack::object& entry = top.via.array.ptr[i];
    if (entry.type != msgpack::type::NIL && entry.type != msgpack::type::ARRAY) {
      return InvalidArgument("commit extra_keys: entry " + std::to_string(i) + " is neither nil nor an array");
    }
    msgpack::sbuffer buf;
    msgpack::pack(buf, entry);
    if (buf.size() > kMaxEntryBytes) {
      // Each is kept with its block's BlockStored while it waits to be sent.
      return InvalidArgument("commit extra_keys: entry " + std::to_string(i) + " packs to " +
                             std::to_string(buf.size()) + " bytes (at most " + std::to_string(kMaxEntryBytes) +
                             " per block)");
    }
    out.emplace_back(buf.data(), buf.size());
  }
  return out;
}

std::string EncodeEventBatch(double timestamp, std::span<const KvEvent> events, KvEventEncoding encoding,
                             std::optional<uint32_t> dp_rank) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(3);
  pk.pack_double(timestamp);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) PackEvent(buf, pk, e, encoding);
  if (dp_rank) {
    pk.pack_uint32(*dp_rank);
  } else {
    pk.pack_nil();
  }
  return std::string(buf.data(), buf.size());
}

std::string ExpandTopic(std::string_view pattern, std::string_view engine, std::string_view host,
                        std::string_view model, std::string_view tenant) {
  std::string out;
  for (size_t i = 0; i < pattern.size();) {
    auto take = [&](std::string_view name, std::string_view value) {
      if (pattern.substr(i, name.size()) != name) return false;
      out.append(value);
      i += name.size();
      return true;
    };
    if (take("{engine}", engine) || take("{host}", host) || take("{model}", model) || take("{tenant}", tenant)) {
      continue;
    }
    out.push_back(pattern[i++]);
  }
  return out;
}

std::optional<uint64_t> ParseReplayRequest(std::span<const std::string_view> parts) {
  if (parts.size() != 3 || parts[2].size() != 8) return std::nullopt;
  uint64_t start = 0;
  for (char c : parts[2]) start = (start << 8) | static_cast<uint8_t>(c);
  return start;
}

namespace {

// "<tier index>" (no group) or "<tier index>:<group index>"; nullopt for anything else.
std::optional<AnnouncedMedium> ParseMedium(std::string_view text) {
  const size_t colon = text.find(':');
  const std::string_view tier = text.substr(0, colon);
  if (tier.size() != 1 || tier[0] < '0' || tier[0] >= '0' + kTierCount) return std::nullopt;
  int32_t group = -1;
  if (colon != std::string_view::npos) {
    const std::string_view g = text.substr(colon + 1);
    const auto [end, ec] = std::from_chars(g.data(), g.data() + g.size(), group);
    if (ec != std::errc() || end != g.data() + g.size() || group < 0) return std::nullopt;
  }
  return AnnouncedMedium{static_cast<TierKind>(tier[0] - '0'), group};
}

}  // namespace

// {"topics": [{"topic": name, "dp_rank": n or null, "signed": bool,
//              "media": {"<tier index>" or "<tier index>:<group index>": [hash, ...]}}]}
AnnouncedStates ParseAnnouncedState(std::string_view text, size_t* hashes) {
  AnnouncedStates out;
  *hashes = 0;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("topics") || !j["topics"].is_array()) return out;
  for (const auto& t : j["topics"]) {
    if (!t.is_object() || !t.contains("topic") || !t["topic"].is_string() || !t.contains("media") ||
        !t["media"].is_object()) {
      continue;
    }
    std::optional<uint32_t> rank;
    if (t.contains("dp_rank") && t["dp_rank"].is_number_unsigned() &&
        t["dp_rank"].get<uint64_t>() <= std::numeric_limits<uint32_t>::max()) {
      rank = t["dp_rank"].get<uint32_t>();
    }
    AnnouncedState& a = out[{t["topic"].get<std::string>(), rank}];
    if (t.contains("signed") && t["signed"].is_boolean()) a.signed_hashes = t["signed"].get<bool>();
    for (const auto& [medium, list] : t["media"].items()) {
      const std::optional<AnnouncedMedium> m = ParseMedium(medium);
      if (!m || !list.is_array()) continue;
      for (const auto& h : list) {
        if (!h.is_number_unsigned()) continue;
        a.hashes[*m].insert(h.get<uint64_t>());
        ++*hashes;
      }
    }
  }
  return out;
}

std::string EncodeAnnouncedState(const AnnouncedStates& states) {
  nlohmann::json topics = nlohmann::json::array();
  for (const auto& [key, a] : states) {
    nlohmann::json media = nlohmann::json::object();
    for (const auto& [medium, set] : a.hashes) {
      const auto [tier, group] = medium;
      const std::string key = std::to_string(TierIndex(tier)) + (group >= 0 ? ":" + std::to_string(group) : "");
      if (!set.empty()) media[key] = std::vector<uint64_t>(set.begin(), set.end());
    }
    if (media.empty()) continue;
    topics.push_back({{"topic", key.first},
                      {"dp_rank", key.second ? nlohmann::json(*key.second) : nlohmann::json()},
                      {"signed", a.signed_hashes},
                      {"media", media}});
  }
  // Topic names carry what engines declared: bytes that are not UTF-8 are replaced, never
  // a throw on the publisher thread.
  return nlohmann::json{{"topics", topics}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvtier
