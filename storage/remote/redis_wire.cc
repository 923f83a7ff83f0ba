// The Redis wire facts RedisCluster routes by: key slots, addresses, redirects and slot
// maps. Pure functions of their input (fuzzed by tests/fuzz/redis_reply_fuzzer.cc); the
// client's state lives in redis_cluster.cc.
#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>

#include "storage/remote/redis_cluster.h"

namespace kvtier {
namespace {

// CRC16-XMODEM (polynomial 0x1021, initial 0), the checksum Redis Cluster slots keys by.
constexpr std::array<uint16_t, 256> MakeCrc16Table() {
  std::array<uint16_t, 256> t{};
  for (int i = 0; i < 256; ++i) {
    uint16_t crc = static_cast<uint16_t>(i << 8);
    for (int b = 0; b < 8; ++b) crc = static_cast<uint16_t>(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    t[i] = crc;
  }
  return t;
}
constexpr std::array<uint16_t, 256> kCrc16Table = MakeCrc16Table();

uint16_t Crc16(std::string_view s) {
  uint16_t crc = 0;
  for (unsigned char c : s) crc = static_cast<uint16_t>((crc << 8) ^ kCrc16Table[((crc >> 8) ^ c) & 0xff]);
  return crc;
}

}  // namespace

uint16_t RedisCluster::KeySlot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return Crc16(key) & (kSlots - 1);
}

bool RedisCluster::ParseRedirect(std::string_view e, bool* ask, uint16_t* slot, std::string* address) {
  std::string_view rest;
  if (e.substr(0, 6) == "MOVED ") {
    *ask = false;
    rest = e.substr(6);
  } else if (e.substr(0, 4) == "ASK ") {
    *ask = true;
    rest = e.substr(4);
  } else {
    return false;
  }
  const size_t sp = rest.find(' ');
  if (sp == std::string_view::npos || sp == 0) return false;
  uint32_t s = 0;
  for (char c : rest.substr(0, sp)) {
    if (c < '0' || c > '9') return false;
    s = s * 10 + static_cast<uint32_t>(c - '0');
    if (s >= kSlots) return false;
  }
  *slot = static_cast<uint16_t>(s);
  *address = std::string(rest.substr(sp + 1));
  return !address->empty();
}

bool RedisCluster::ParseAddress(std::string_view address, std::string* host, int* port) {
  std::string_view h, p;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find("]:");
    if (close == std::string_view::npos) return false;
    h = address.substr(1, close - 1);
    p = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) return false;
    h = address.substr(0, colon);
    p = address.substr(colon + 1);
  }
  if (h.empty() || p.empty() || p.size() > 5) return false;
  int v = 0;
  for (char c : p) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v <= 0 || v > 65535) return false;
  *host = std::string(h);
  *port = v;
  return true;
}

Result<std::vector<RedisCluster::SlotRange>> RedisCluster::ParseSlots(const redisReply& reply,
                                                                      const std::string& address) {
  std::string host;
  int port = 0;
  if (!ParseAddress(address, &host, &port)) return InvalidArgument("'" + address + "' is not host:port");
  std::vector<SlotRange> ranges;
  if (reply.type == REDIS_REPLY_ERROR) {
    const std::string_view e(reply.str, reply.len);
    if (e.find("cluster support disabled") == std::string_view::npos) return InvalidArgument(std::string(e));
    ranges.push_back({0, kSlots - 1, address});  // one standalone server holds everything
    return ranges;
  }
  if (reply.type != REDIS_REPLY_ARRAY) return InvalidArgument("unexpected CLUSTER SLOTS reply");
  for (size_t i = 0; i < reply.elements; ++i) {
    const redisReply* e = reply.element[i];
    const bool shaped = e->type == REDIS_REPLY_ARRAY && e->elements >= 3 &&
                        e->element[0]->type == REDIS_REPLY_INTEGER && e->element[1]->type == REDIS_REPLY_INTEGER &&
                        e->element[2]->type == REDIS_REPLY_ARRAY && e->element[2]->elements >= 2 &&
                        e->element[2]->element[0]->type == REDIS_REPLY_STRING &&
                        e->element[2]->element[1]->type == REDIS_REPLY_INTEGER;
    if (!shaped) return InvalidArgument("malformed CLUSTER SLOTS reply");
    const long long lo = e->element[0]->integer, hi = e->element[1]->integer;
    const long long p = e->element[2]->element[1]->integer;
    if (lo < 0 || hi < lo || hi >= kSlots || p <= 0 || p > 65535) {
      return InvalidArgument("CLUSTER SLOTS reply with a slot or port out of range");
    }
    std::string ip(e->element[2]->element[0]->str, e->element[2]->element[0]->len);
    if (ip.empty() || ip == "?") ip = host;  // "the node you asked"
    // A name or an address: letters, digits, '.', '-', '_', and the ':' of IPv6 (with the
    // '%' of a zone); anything else (brackets, spaces, control bytes) names no node.
    const bool plain = std::all_of(ip.begin(), ip.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
             c == '_' || c == ':' || c == '%';
    });
    const bool v6 = ip.find(':') != std::string::npos;
    std::string master = (v6 ? "[" + ip + "]" : ip) + ":" + std::to_string(p);
    std::string h;
    int pt = 0;
    if (!plain || ip.size() > 255 || !ParseAddress(master, &h, &pt)) {
      return InvalidArgument("CLUSTER SLOTS names a node that is not host:port");
    }
    ranges.push_back({static_cast<uint32_t>(lo), static_cast<uint32_t>(hi), std::move(master)});
  }
  if (ranges.empty()) return InvalidArgument("CLUSTER SLOTS names no master");
  return ranges;
}

}  // namespace kvtier
