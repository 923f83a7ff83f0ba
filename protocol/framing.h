#pragma once
// Framing: size-prefixed FlatBuffer frames on a Unix stream socket, with file
// descriptors passed as SCM_RIGHTS.
//
// A frame is a 4-byte little-endian payload length followed by the payload (exactly what
// flatbuffers::FlatBufferBuilder::FinishSizePrefixed produces). Descriptors ride on the
// first byte of the frame that names them; a reader keeps received descriptors in a FIFO
// and hands a frame the number it declares, in stream order.
//
// FrameAssembler is thread-compatible (one per connection); the functions are thread-safe.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include "protocol/base/status.h"

namespace kvtier {

inline constexpr size_t kFramePrefixBytes = 4;
// The daemon's default protocol.max_frame_bytes (a client reads frames up to 64 MiB).
inline constexpr uint32_t kDefaultMaxFrameBytes = 1u << 20;
// The most bytes one entry adds to a request: a Commit of a page (4) with a 32-byte hash
// and a 32-byte parent; plus what a request carries besides its entries.
inline constexpr uint32_t kMaxRequestBytesPerEntry = 4 + 32 + 32;
inline constexpr uint32_t kRequestOverheadBytes = 1024;
// The most entries whose largest request still fits a frame of `max_frame_bytes`: the
// one limit is derived from the other, so every permitted request can be sent.
constexpr uint32_t MaxEntriesForFrame(uint32_t max_frame_bytes) {
  return max_frame_bytes > kRequestOverheadBytes ? (max_frame_bytes - kRequestOverheadBytes) / kMaxRequestBytesPerEntry
                                                 : 0;
}
// The daemon's default protocol.max_entries_per_request ("auto": what the default frame
// holds, 15,405).
inline constexpr uint32_t kDefaultMaxEntriesPerRequest = MaxEntriesForFrame(kDefaultMaxFrameBytes);
// The most descriptors one frame may carry (a kernel SCM_MAX_FD is 253).
inline constexpr size_t kMaxFdsPerFrame = 64;

// Extracts whole frames from a byte stream.
//
//   auto space = a.WritableSpace();          // read(2) into it
//   a.Produced(n);
//   for (;;) {
//     auto f = a.Next();                      // Result<std::optional<Frame>>
//     if (!f.ok()) { /* oversized: close */ }
//     if (!f->has_value()) break;             // need more bytes
//     Use((*f)->frame);                       // prefix + payload
//   }
//
// A frame whose declared payload exceeds max_frame_bytes is an error (kInvalidArgument);
// after it the assembler is poisoned: the connection must be closed. Frames returned by
// Next() start 8-byte aligned in memory (so FlatBuffers reads are aligned even when a
// client sends odd sizes) and stay valid until the next WritableSpace() call.
class FrameAssembler {
 public:
  explicit FrameAssembler(size_t max_frame_bytes, size_t initial_capacity = 64 * 1024);

  // Free space at the end of the buffer, at least `min_bytes` long (grows the buffer;
  // shrinks it back when idle and oversized). Compacts consumed bytes.
  std::span<uint8_t> WritableSpace(size_t min_bytes = 4096);
  // Marks `n` bytes of the last WritableSpace() as filled.
  void Produced(size_t n);

  struct Frame {
    std::span<const uint8_t> frame;  // prefix + payload
  };
  // The next complete frame, std::nullopt if more bytes are needed, or an error for an
  // oversized declared length.
  Result<std::optional<Frame>> Next();

  // Bytes received that do not form a whole frame yet (a truncated frame at EOF).
  size_t PendingBytes() const { return end_ - begin_; }
  size_t capacity() const { return buf_.size(); }

 private:
  void Compact();

  size_t max_frame_bytes_;
  size_t initial_capacity_;
  std::vector<uint8_t> buf_;  // allocated 8-byte aligned by operator new
  size_t begin_ = 0;          // first unconsumed byte
  size_t end_ = 0;            // one past the last received byte
  bool poisoned_ = false;
};

// Writes as much of `bytes` as the socket takes without blocking (the socket must be
// O_NONBLOCK, or the call blocks). `fds` are attached to the first byte written, so pass
// them only with a frame's first chunk. Returns bytes written; a full socket (EAGAIN) is 0,
// not an error. EPIPE/ECONNRESET are kUnavailable ("peer closed the connection"); any other
// errno is converted by ErrnoStatus. MSG_NOSIGNAL: never raises SIGPIPE.
Result<size_t> SendSome(int fd, std::span<const uint8_t> bytes, std::span<const int> fds);

// Blocking send of one whole frame with its descriptors (client side). Retries EINTR and
// partial writes.
Status SendFrame(int fd, std::span<const uint8_t> frame, std::span<const int> fds);

// Reads what is available into `buf`, appending received descriptors (O_CLOEXEC) to
// `fds`. Returns 0 at EOF. Blocks unless the socket is non-blocking; EAGAIN (nothing to
// read on a non-blocking socket, or its SO_RCVTIMEO ran out) gives kUnavailable.
Result<size_t> RecvSome(int fd, std::span<uint8_t> buf, std::deque<int>* fds);

// Whether every holder of the other end of the connected socket `fd` has closed it (or shut
// it down for writing): POLLRDHUP, seen with data still unread. Never blocks.
bool PeerHungUp(int fd);

}  // namespace kvtier
