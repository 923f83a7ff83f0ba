// libFuzzer target: what the remote tier reads from a Redis node it must not trust. The
// first byte picks the path:
//   0  a data connection's reply stream (RespReader, fed in chunks the next bytes say,
//      with a 4 KiB limit), each bulk handed to a sink that decodes it as a block value
//      (RemoteCodec::Decode, unkeyed and keyed) and each error line to ParseRedirect;
//   1  a CLUSTER SLOTS reply (hiredis' own reader builds it) through ParseSlots;
//   2  a block value alone through RemoteCodec::Decode.
// What must hold: no crash, no sanitizer report; the reader never keeps more than its
// limit plus one chunk unread, a value that decodes fits its destination, every slot
// range ParseSlots accepts lies within the 16384 slots and names host:port.
#include <hiredis/hiredis.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "storage/remote/redis_cluster.h"
#include "storage/remote/remote_tier.h"
#include "storage/remote/resp_reader.h"

using namespace kvtier;

namespace {

constexpr uint64_t kLimit = 4096;

const RemoteCodec& Keyed() {
  static const RemoteCodec c = *RemoteCodec::Keyed("fuzz-fleet-secret-0123456789abcdef");
  return c;
}

void DecodeValue(std::span<const uint8_t> v) {
  uint8_t dst[kLimit];
  for (const RemoteCodec* c : {static_cast<const RemoteCodec*>(nullptr), &Keyed()}) {
    const RemoteCodec unkeyed;
    const RemoteCodec& codec = c ? *c : unkeyed;
    for (uint32_t length : {0u, 16u, 1000u, static_cast<uint32_t>(kLimit)}) {
      auto m = codec.Decode("kvtier:0123", v, "fp", length, {dst, sizeof(dst)});
      if (m.ok() && (m->length != length || m->fingerprint != "fp")) std::abort();
    }
  }
}

void Stream(const uint8_t* data, size_t size) {
  RespReader reader(kLimit);
  if (!reader.ok()) return;
  RespReader::Sink sink = [](std::span<const uint8_t> v) -> Status {
    if (v.size() > kLimit) std::abort();  // refused from its length line, never handed over
    DecodeValue(v);
    return Status::Ok();
  };
  RespReader::Reply reply;
  size_t at = 0;
  while (at < size) {
    // A chunk: its length from the next byte (1..64), as a socket hands bytes over.
    const size_t chunk = 1 + data[at] % 64;
    ++at;
    const size_t n = std::min(chunk, size - at);
    if (!reader.Feed(reinterpret_cast<const char*>(data + at), n)) return;
    at += n;
    for (;;) {
      std::string error;
      const RespReader::Next next = reader.Read(&reply, &sink, &error);
      if (next == RespReader::Next::kMore) break;
      if (next != RespReader::Next::kReply) return;  // the connection would be closed
      if (reply.type == RespReader::kError) {
        bool ask = false;
        uint16_t slot = 0;
        std::string address;
        if (RedisCluster::ParseRedirect(reply.text, &ask, &slot, &address) &&
            (slot >= RedisCluster::kSlots || address.empty())) {
          std::abort();
        }
      }
      reply = RespReader::Reply{};
    }
  }
}

// Whether some array in the input declares more than `most` elements: hiredis 0.14 callocs
// a declared array before its elements arrive (virtual memory only, until they do, which
// libFuzzer's malloc limit counts anyway), so such inputs are hiredis' to answer for.
bool HugeArray(const uint8_t* data, size_t size, long most) {
  for (size_t i = 0; i < size; ++i) {
    if (data[i] != '*') continue;
    long n = 0;
    for (size_t j = i + 1; j < size && data[j] >= '0' && data[j] <= '9' && n <= most; ++j) n = n * 10 + (data[j] - '0');
    if (n > most) return true;
  }
  return false;
}

void Slots(const uint8_t* data, size_t size) {
  if (HugeArray(data, size, 65536)) return;
  redisReader* r = redisReaderCreate();
  if (r == nullptr) return;
  void* obj = nullptr;
  if (redisReaderFeed(r, reinterpret_cast<const char*>(data), size) == REDIS_OK &&
      redisReaderGetReply(r, &obj) == REDIS_OK && obj != nullptr) {
    auto ranges = RedisCluster::ParseSlots(*static_cast<redisReply*>(obj), "127.0.0.1:7000");
    if (ranges.ok()) {
      for (const auto& s : *ranges) {
        std::string host;
        int port = 0;
        if (s.first > s.last || s.last >= RedisCluster::kSlots || !RedisCluster::ParseAddress(s.master, &host, &port)) {
          std::abort();
        }
      }
    }
    freeReplyObject(obj);
  }
  redisReaderFree(r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  switch (data[0] % 3) {
    case 0:
      Stream(data + 1, size - 1);
      break;
    case 1:
      Slots(data + 1, size - 1);
      break;
    default:
      DecodeValue({data + 1, size - 1});
  }
  return 0;
}
