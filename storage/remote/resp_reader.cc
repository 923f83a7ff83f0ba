#include "storage/remote/resp_reader.h"

#include <hiredis/hiredis.h>

namespace kvtier {

static_assert(RespReader::kString == REDIS_REPLY_STRING && RespReader::kArray == REDIS_REPLY_ARRAY &&
              RespReader::kInteger == REDIS_REPLY_INTEGER && RespReader::kNil == REDIS_REPLY_NIL &&
              RespReader::kStatus == REDIS_REPLY_STATUS && RespReader::kError == REDIS_REPLY_ERROR);

namespace {

// The reply being read, filled by the object functions below (which run inside
// redisReaderGetReply, on the thread that called Read).
struct Current {
  RespReader::Reply* reply = nullptr;
  const RespReader::Sink* sink = nullptr;
};
thread_local Current current;

// Every object is the one reply; elements of arrays leave it alone.
void* CreateString(const redisReadTask* task, char* str, size_t len) {
  RespReader::Reply* r = current.reply;
  if (task->parent == nullptr) {
    r->type = task->type;
    if (task->type == REDIS_REPLY_STRING && current.sink != nullptr && *current.sink) {
      r->sink_status = (*current.sink)({reinterpret_cast<const uint8_t*>(str), len});
    } else {
      r->text.assign(str, len);
    }
  }
  return r;
}

void* CreateArray(const redisReadTask* task, int) {
  if (task->parent == nullptr) current.reply->type = REDIS_REPLY_ARRAY;
  return current.reply;
}

void* CreateInteger(const redisReadTask* task, long long value) {
  if (task->parent == nullptr) {
    current.reply->type = REDIS_REPLY_INTEGER;
    current.reply->integer = value;
  }
  return current.reply;
}

void* CreateNil(const redisReadTask* task) {
  if (task->parent == nullptr) current.reply->type = REDIS_REPLY_NIL;
  return current.reply;
}

void FreeObject(void*) {}

redisReplyObjectFunctions kFunctions = {&CreateString, &CreateArray, &CreateInteger, &CreateNil, &FreeObject};

}  // namespace

RespReader::RespReader(uint64_t max_bytes) : max_bytes_(max_bytes) {
  reader_ = redisReaderCreateWithFunctions(&kFunctions);
  // Keep the buffer between replies (values are large and arrive all the time): Read
  // bounds it by max_bytes.
  if (reader_) reader_->maxbuf = 0;
}

RespReader::~RespReader() {
  if (reader_) redisReaderFree(reader_);
}

bool RespReader::Feed(const char* data, size_t n) { return redisReaderFeed(reader_, data, n) == REDIS_OK; }

bool RespReader::Oversized() const {
  const size_t unread = reader_->len - reader_->pos;
  // Whatever the reply, no more than a value (and its framing) is kept unread.
  if (unread > max_bytes_ + 64) return true;
  // A bulk string at the top whose length line has arrived: the reader consumed its '$'
  // and stopped before the line, or before the bytes it announces.
  if (reader_->ridx != 0 || reader_->rstack[0].type != REDIS_REPLY_STRING) return false;
  uint64_t n = 0;
  for (size_t i = reader_->pos; i < reader_->len; ++i) {
    const char c = reader_->buf[i];
    if (c < '0' || c > '9') return false;  // "\r" (or a nil's "-1"): the reader decides
    n = n * 10 + static_cast<uint64_t>(c - '0');
    if (n > max_bytes_) return true;
  }
  return false;
}

RespReader::Next RespReader::Read(Reply* out, const Sink* sink, std::string* error) {
  current = Current{out, sink};
  void* obj = nullptr;
  const int rc = redisReaderGetReply(reader_, &obj);
  current = Current{};
  if (rc != REDIS_OK) {
    *error = std::string("protocol error: ") + reader_->errstr;
    return Next::kError;
  }
  if (obj != nullptr) return Next::kReply;
  if (Oversized()) {
    *error = "a reply longer than " + std::to_string(max_bytes_) + " bytes";
    return Next::kOversized;
  }
  return Next::kMore;
}

}  // namespace kvtier
