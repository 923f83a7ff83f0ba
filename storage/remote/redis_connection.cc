// RedisCluster::Connection: one connection's thread — it writes a batch of requests as one
// pipeline, reads the replies against the request's deadline, and finishes each request
// (a value verified and copied by its sink, a redirect, an error) on this thread.
#include <errno.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "protocol/base/logging.h"
#include "storage/remote/redis_cluster_internal.h"

namespace kvtier {
namespace {

using redis_internal::NowNs;
using redis_internal::ToTimeval;

void AppendCount(std::string& s, char kind, size_t n) {
  s += kind;
  s += std::to_string(n);
  s += "\r\n";
}

void AppendBulk(std::string& s, std::string_view a) {
  AppendCount(s, '$', a.size());
  s.append(a);
  s += "\r\n";
}

// Error replies that say the cluster (not this node) cannot serve now.
bool ClusterRefusal(std::string_view e) {
  for (std::string_view p : {"CLUSTERDOWN", "TRYAGAIN", "LOADING", "MASTERDOWN"}) {
    if (e.substr(0, p.size()) == p) return true;
  }
  return false;
}

}  // namespace

// ---- a connection's thread -------------------------------------------------------------

void RedisCluster::Connection::Run(std::stop_token st) {
  const uint32_t max_batch = std::max<uint32_t>(1, owner_->options_.max_batch);
  while (!st.stop_requested()) {
    std::vector<Request> batch;
    {
      MutexLock l(&mu_);
      if (!cv_.wait(l.native(), st, [this] {
            mu_.AssertHeld();
            return !queue_.empty();
          }))
        break;
      const size_t n = std::min<size_t>(queue_.size(), max_batch);
      batch.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    std::vector<std::function<void()>> out;
    out.reserve(batch.size());
    Serve(batch, out);
    owner_->Deliver(std::move(out));
  }
  Close();
  // Dropped from the slot map (not the cluster being destroyed): what was queued fails.
  std::deque<Request> left;
  {
    MutexLock l(&mu_);
    stopped_ = true;
    left.swap(queue_);
  }
  for (Request& r : left) owner_->FailRequest(r, Unavailable("redis " + node_->address + ": node left the slot map"));
}

const std::string& RedisCluster::Connection::NodeAddress() const { return node_->address; }

bool RedisCluster::Connection::Connect(std::string* error) {
  ctx_ = static_cast<redisContext*>(owner_->OpenContext(node_->host, node_->port, error));
  if (ctx_ == nullptr) return false;
  reader_ = std::make_unique<RespReader>(owner_->max_value_bytes_);
  if (!reader_->ok()) {
    *error = "out of memory";
    Close();
    return false;
  }
  owner_->counters_.connects.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void RedisCluster::Connection::Close() {
  reader_.reset();
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
}

bool RedisCluster::Connection::Write(std::vector<Request>& batch, size_t from, std::string* error) {
  // The RESP framing of every request, then one writev loop over framing and values.
  std::vector<std::string> frames(batch.size() - from);
  std::vector<iovec> iov;
  iov.reserve(frames.size() * 3);
  static const char kAsking[] = "*1\r\n$6\r\nASKING\r\n";
  static const char kCrLf[] = "\r\n";
  size_t total = 0;
  auto add = [&](const void* p, size_t n) {
    if (n == 0) return;
    iov.push_back(iovec{const_cast<void*>(p), n});
    total += n;
  };
  for (size_t i = from; i < batch.size(); ++i) {
    Request& r = batch[i];
    std::string& f = frames[i - from];
    if (r.asking) add(kAsking, sizeof(kAsking) - 1);
    switch (r.kind) {
      case Request::Kind::kGet:
        f = "*2\r\n$3\r\nGET\r\n";
        AppendBulk(f, r.key);
        add(f.data(), f.size());
        break;
      case Request::Kind::kExists:
        f = "*2\r\n$6\r\nEXISTS\r\n";
        AppendBulk(f, r.key);
        add(f.data(), f.size());
        break;
      case Request::Kind::kDel:
        f = "*2\r\n$3\r\nDEL\r\n";
        AppendBulk(f, r.key);
        add(f.data(), f.size());
        break;
      case Request::Kind::kSet:
        if (!r.prepared && r.value.prepare) r.value.prepare(r.value);
        r.prepared = true;
        f = "*3\r\n$3\r\nSET\r\n";
        AppendBulk(f, r.key);
        AppendCount(f, '$', r.value.head.size() + r.value.body.size());
        add(f.data(), f.size());
        add(r.value.head.data(), r.value.head.size());
        add(r.value.body.data(), r.value.body.size());
        add(kCrLf, 2);
        break;
    }
  }
  size_t at = 0;  // first iovec not fully written
  while (at < iov.size()) {
    const int n = static_cast<int>(std::min<size_t>(iov.size() - at, IOV_MAX));
    const ssize_t w = ::writev(ctx_->fd, iov.data() + at, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      *error = errno == EAGAIN || errno == EWOULDBLOCK ? "write timed out" : std::string("write: ") + strerror(errno);
      return false;
    }
    size_t left = static_cast<size_t>(w);
    while (at < iov.size() && left >= iov[at].iov_len) left -= iov[at++].iov_len;
    if (left > 0) {
      iov[at].iov_base = static_cast<char*>(iov[at].iov_base) + left;
      iov[at].iov_len -= left;
    }
  }
  owner_->counters_.bytes_sent.fetch_add(total, std::memory_order_relaxed);
  return true;
}

bool RedisCluster::Connection::Read(int64_t deadline_ns, const RespReader::Sink* sink, std::string* error,
                                    bool* timed_out, bool* oversized) {
  slot_ = RespReader::Reply{};
  for (;;) {
    switch (reader_->Read(&slot_, sink, error)) {
      case RespReader::Next::kReply:
        return true;
      case RespReader::Next::kOversized:
        *oversized = true;
        return false;
      case RespReader::Next::kError:
        return false;
      case RespReader::Next::kMore:
        break;
    }
    const int64_t left = deadline_ns - NowNs();
    if (left <= 0) {
      *timed_out = true;
      *error = "no reply within the timeout";
      return false;
    }
    pollfd p{ctx_->fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, left / 1'000'000)));
    if (ready < 0 && errno != EINTR) {
      *error = std::string("poll: ") + strerror(errno);
      return false;
    }
    if (ready <= 0) continue;  // deadline checked above
    const ssize_t n = ::read(ctx_->fd, buf_.data(), buf_.size());
    if (n == 0) {
      *error = "connection closed by the server";
      return false;
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      *error = std::string("read: ") + strerror(errno);
      return false;
    }
    owner_->counters_.bytes_received.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    if (!reader_->Feed(buf_.data(), static_cast<size_t>(n))) {
      *error = "out of memory";
      return false;
    }
  }
}

void RedisCluster::Connection::Fail(Request& r, const Status& st, std::vector<std::function<void()>>& out) {
  RedisReply rep;
  rep.status = st;
  rep.latency_ns = NowNs() - r.start_ns;
  owner_->counters_.requests.fetch_add(1, std::memory_order_relaxed);
  owner_->counters_.failures.fetch_add(1, std::memory_order_relaxed);
  if (r.done) out.push_back([done = std::move(r.done), rep] { done(rep); });
}

void RedisCluster::Connection::Finish(Request& r, std::vector<std::function<void()>>& out) {
  RedisReply rep;
  switch (slot_.type) {
    case REDIS_REPLY_ERROR: {
      bool ask = false;
      uint16_t slot = 0;
      std::string address;
      if (ParseRedirect(slot_.text, &ask, &slot, &address)) {
        owner_->Redirect(std::move(r), slot, address, ask);
        return;
      }
      if (r.kind == Request::Kind::kGet && slot_.text.rfind("WRONGTYPE", 0) == 0) {
        // Another Redis type at a value's key: not a value (the caller's miss and delete).
        rep.status = DataLoss("redis " + node_->address + ": " + slot_.text);
        break;
      }
      const std::string text = "redis " + node_->address + ": " + slot_.text;
      owner_->LogError(slot_.text.substr(0, slot_.text.find(' ')), text);
      if (ClusterRefusal(slot_.text)) {
        rep.status = Unavailable(text);
      } else if (slot_.text.rfind("OOM", 0) == 0) {
        rep.status = ResourceExhausted(text);
      } else {
        rep.status = Internal(text);
      }
      break;
    }
    case REDIS_REPLY_NIL:
      if (r.kind == Request::Kind::kGet) rep.status = NotFound("no such key");
      break;
    case REDIS_REPLY_STRING:
      if (r.kind == Request::Kind::kGet) rep.status = slot_.sink_status;
      break;
    case REDIS_REPLY_INTEGER:
      rep.integer = slot_.integer;
      break;
    case REDIS_REPLY_STATUS:
      break;
  }
  // Only the reply each command has is taken as its answer: a GET answered with anything
  // but a bulk or nil (a status, an integer, an array) is no value — a miss, as a value
  // that does not verify is, never a hit with nothing checked.
  const bool expected =
      slot_.type == REDIS_REPLY_ERROR ||
      (r.kind == Request::Kind::kGet   ? slot_.type == REDIS_REPLY_STRING || slot_.type == REDIS_REPLY_NIL
       : r.kind == Request::Kind::kSet ? slot_.type == REDIS_REPLY_STATUS
                                       : slot_.type == REDIS_REPLY_INTEGER);
  if (!expected) {
    const std::string text =
        "redis " + node_->address + ": reply of type " + std::to_string(slot_.type) + " to " + r.command();
    owner_->LogError("unexpected-reply", text);
    rep.status = r.kind == Request::Kind::kGet ? DataLoss(text) : Internal(text);
    rep.integer = 0;
  }
  rep.latency_ns = NowNs() - r.start_ns;
  owner_->counters_.requests.fetch_add(1, std::memory_order_relaxed);
  if (!rep.status.ok() && rep.status.code() != StatusCode::kNotFound && rep.status.code() != StatusCode::kDataLoss) {
    owner_->counters_.failures.fetch_add(1, std::memory_order_relaxed);
  }
  if (r.done) out.push_back([done = std::move(r.done), rep = std::move(rep)] { done(rep); });
}

void RedisCluster::Connection::Serve(std::vector<Request>& batch, std::vector<std::function<void()>>& out) {
  // A request whose deadline passed while it waited (behind a slow node) is not sent.
  size_t live = 0;
  const int64_t now = NowNs();
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].deadline_ns <= now) {
      owner_->counters_.timeouts.fetch_add(1, std::memory_order_relaxed);
      Fail(batch[i], Unavailable("redis " + node_->address + ": not sent within the timeout (the node is slow)"), out);
    } else if (live++ != i) {
      batch[live - 1] = std::move(batch[i]);
    }
  }
  batch.resize(live);
  size_t from = 0;
  // A connection the server closed while it was idle fails its next batch; the rest of
  // that batch is tried once more on a new connection (every command here is idempotent).
  for (int attempt = 0; attempt < 2 && from < batch.size(); ++attempt) {
    std::string error;
    const bool reused = ctx_ != nullptr;
    if (!ctx_ && !Connect(&error)) {
      owner_->LogError("connect", "redis " + node_->address + ": cannot connect: " + error);
      node_->Failure(NowNs());
      for (size_t i = from; i < batch.size(); ++i) {
        Fail(batch[i], Unavailable("redis " + node_->address + ": cannot connect: " + error), out);
      }
      return;
    }
    bool timed_out = false, oversized = false;
    bool ok = Write(batch, from, &error);
    const size_t written_from = from;
    for (; ok && from < batch.size(); ++from) {
      Request& r = batch[from];
      if (r.asking && !(ok = Read(r.deadline_ns, nullptr, &error, &timed_out, &oversized))) break;  // ASKING's +OK
      ok = Read(r.deadline_ns, r.sink ? &r.sink : nullptr, &error, &timed_out, &oversized);
      if (!ok) break;
      Finish(r, out);
    }
    if (ok) {
      node_->Success();
      return;
    }
    Close();
    if (oversized) {
      // The node answered, with something no block is: a miss (the caller deletes it), not
      // a node failure. The rest of the batch goes again on a new connection.
      owner_->counters_.oversized.fetch_add(1, std::memory_order_relaxed);
      owner_->LogError("oversized", "redis " + node_->address + ": " + error + " refused");
      Request& r = batch[from];
      Fail(r, r.kind == Request::Kind::kGet ? DataLoss("redis " + node_->address + ": " + error) : Unavailable(error),
           out);
      MutexLock l(&mu_);
      for (size_t i = batch.size(); i > from + 1; --i) queue_.push_front(std::move(batch[i - 1]));
      return;
    }
    if (timed_out) {
      owner_->counters_.timeouts.fetch_add(1, std::memory_order_relaxed);
      owner_->LogError("timeout", "redis " + node_->address + ": " + error);
    }
    // Retry only what a stale idle connection lost: nothing of this batch was answered.
    if (reused && !timed_out && from == written_from && attempt == 0) continue;
    if (!timed_out) owner_->LogError("io", "redis " + node_->address + ": " + error);
    node_->Failure(NowNs());
    for (; from < batch.size(); ++from) Fail(batch[from], Unavailable("redis " + node_->address + ": " + error), out);
  }
}

}  // namespace kvtier
