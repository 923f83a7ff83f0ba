#pragma once
// RespReader: the replies of a Redis connection, one at a time, from the bytes read off its
// socket (hiredis' redisReader parses; this keeps what it builds small).
//
// A reply is reduced to what the remote tier acts on: its type, an integer, a status or
// error line, or a bulk string — which, at the top of a reply and with a sink given, goes
// to the sink straight from the reader's buffer, never copied. Nested elements (arrays are
// never expected on a data connection) are parsed and dropped.
//
// Untrusted input: a top-level bulk announcing more than max_bytes is refused from its
// length line, before its bytes are read (kOversized), and no reply may keep more than
// max_bytes (plus its framing) unread in the buffer, so the reader's memory is bounded by
// max_bytes plus one read. After kOversized or kError the stream is out of step: the
// connection must be closed (the reader is useless).
//
// Not thread-safe; one per connection.

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "protocol/base/status.h"

struct redisReader;

namespace kvtier {

class RespReader {
 public:
  // hiredis' reply types (REDIS_REPLY_*).
  enum Type : int { kString = 1, kArray = 2, kInteger = 3, kNil = 4, kStatus = 5, kError = 6 };
  struct Reply {
    int type = 0;
    long long integer = 0;
    std::string text;    // a status or error line; a bulk string when no sink took it
    Status sink_status;  // what the sink returned for a bulk string
  };
  using Sink = std::function<Status(std::span<const uint8_t>)>;
  enum class Next { kReply, kMore, kOversized, kError };

  explicit RespReader(uint64_t max_bytes);
  ~RespReader();
  RespReader(const RespReader&) = delete;
  RespReader& operator=(const RespReader&) = delete;
  // False when the reader could not be allocated.
  bool ok() const { return reader_ != nullptr; }

  // Appends bytes read from the socket; false when out of memory.
  bool Feed(const char* data, size_t n);
  // The next whole reply into *out (a top-level bulk string to `sink`, when given); kMore
  // when the buffer holds no whole reply yet (call again with the same *out after feeding
  // more: a reply's parts may be built across calls). *out starts as Reply{} for each
  // reply. kError with *error for a protocol error.
  Next Read(Reply* out, const Sink* sink, std::string* error);

 private:
  bool Oversized() const;

  redisReader* reader_ = nullptr;
  uint64_t max_bytes_;
};

}  // namespace kvtier
