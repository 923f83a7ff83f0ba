#include "protocol/framing.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>

namespace kvtier {

FrameAssembler::FrameAssembler(size_t max_frame_bytes, size_t initial_capacity)
    : max_frame_bytes_(max_frame_bytes), initial_capacity_(initial_capacity) {
  buf_.resize(initial_capacity_);
}

void FrameAssembler::Compact() {
  if (begin_ == 0) return;
  const size_t n = end_ - begin_;
  if (n > 0) std::memmove(buf_.data(), buf_.data() + begin_, n);
  begin_ = 0;
  end_ = n;
}

std::span<uint8_t> FrameAssembler::WritableSpace(size_t min_bytes) {
  const size_t pending = end_ - begin_;
  if (pending == 0) {
    begin_ = end_ = 0;
    // Give back memory a single large frame made us take.
    if (buf_.size() > 4 * initial_capacity_) {
      std::vector<uint8_t>(initial_capacity_).swap(buf_);
    }
  }
  // Room needed: the rest of a partially received frame, or min_bytes.
  size_t need = min_bytes;
  if (pending >= kFramePrefixBytes) {
    uint32_t len;
    std::memcpy(&len, buf_.data() + begin_, sizeof(len));
    if (len <= max_frame_bytes_) {
      const size_t whole = kFramePrefixBytes + len;
      if (whole > pending && whole - pending > need) need = whole - pending;
    }
  }
  if (buf_.size() - end_ < need) {
    Compact();
    if (buf_.size() - end_ < need) buf_.resize(end_ + need);
  }
  return {buf_.data() + end_, buf_.size() - end_};
}

void FrameAssembler::Produced(size_t n) { end_ += n; }

Result<std::optional<FrameAssembler::Frame>> FrameAssembler::Next() {
  if (poisoned_) return InvalidArgument("connection is poisoned by an earlier bad frame");
  const size_t pending = end_ - begin_;
  if (pending < kFramePrefixBytes) return std::optional<Frame>();
  uint32_t len;
  std::memcpy(&len, buf_.data() + begin_, sizeof(len));  // little-endian hosts only
  if (len > max_frame_bytes_) {
    poisoned_ = true;
    return InvalidArgument("frame of " + std::to_string(len) + " bytes exceeds max_frame_bytes " +
                           std::to_string(max_frame_bytes_));
  }
  const size_t whole = kFramePrefixBytes + len;
  if (pending < whole) return std::optional<Frame>();
  if (reinterpret_cast<uintptr_t>(buf_.data() + begin_) % 8 != 0) Compact();
  Frame f{{buf_.data() + begin_, whole}};
  begin_ += whole;
  return std::optional<Frame>(f);
}

Result<size_t> SendSome(int fd, std::span<const uint8_t> bytes, std::span<const int> fds) {
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)];
  if (!fds.empty()) {
    if (fds.size() > kMaxFdsPerFrame) return InvalidArgument("too many descriptors for one frame");
    const size_t len = sizeof(int) * fds.size();
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(len);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(len);
    std::memcpy(CMSG_DATA(c), fds.data(), len);
  }
  for (;;) {
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN) return size_t{0};
    if (errno == EPIPE || errno == ECONNRESET) return Unavailable("peer closed the connection");
    return ErrnoStatus(errno, "sendmsg");
  }
}

Status SendFrame(int fd, std::span<const uint8_t> frame, std::span<const int> fds) {
  size_t off = 0;
  bool fds_sent = fds.empty();
  while (off < frame.size()) {
    KVTIER_ASSIGN_OR_RETURN(size_t n, SendSome(fd, frame.subspan(off), fds_sent ? std::span<const int>() : fds));
    if (n == 0) {
      // A non-blocking socket is full: wait for room.
      fd_set w;
      FD_ZERO(&w);
      FD_SET(fd, &w);
      if (::select(fd + 1, nullptr, &w, nullptr, nullptr) < 0 && errno != EINTR) {
        return ErrnoStatus(errno, "select");
      }
      continue;
    }
    fds_sent = true;
    off += n;
  }
  return Status::Ok();
}

Result<size_t> RecvSome(int fd, std::span<uint8_t> buf, std::deque<int>* fds) {
  iovec iov{buf.data(), buf.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  for (;;) {
    ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return Unavailable("no data");
    if (n < 0) {
      if (errno == ECONNRESET) return size_t{0};
      return ErrnoStatus(errno, "recvmsg");
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const int* p = reinterpret_cast<const int*>(CMSG_DATA(c));
        for (size_t i = 0; i < count; ++i) {
          int v;
          std::memcpy(&v, p + i, sizeof(int));
          if (fds) {
            fds->push_back(v);
          } else {
            ::close(v);
          }
        }
      }
    }
    return static_cast<size_t>(n);
  }
}

bool PeerHungUp(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace kvtier
