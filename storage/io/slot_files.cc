#include "storage/io/slot_files.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/stat.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <filesystem>

#include "protocol/base/logging.h"
#include "protocol/base/units.h"

namespace kvtier {
namespace {

// The file's direct-I/O offset alignment, or 4096 when the kernel does not say.
uint32_t DirectIoAlignment(int fd) {
  struct statx stx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN) &&
      stx.stx_dio_offset_align > 0) {
    return std::max<uint32_t>(stx.stx_dio_offset_align, 512);
  }
  return 4096;
}

// The identity stamp, at the start of the block past a file's last slot.
constexpr char kStampMagic[16] = {'K', 'V', 'T', 'I', 'E', 'R', '-', 'S', 'L', 'O', 'T', 'F', 'I', 'L', 'E', '1'};
struct StampHeader {
  char magic[16];
  uint8_t id[16];
  uint64_t slot_bytes;
  uint64_t slots;
  uint64_t digest;  // XXH3 of the fields above
};
static_assert(sizeof(StampHeader) == 56);

uint64_t StampDigest(const StampHeader& h) { return XXH3_64bits(&h, offsetof(StampHeader, digest)); }

std::string Hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : size(n) {
    if (::posix_memalign(&p, 4096, n) != 0) p = nullptr;
    if (p) std::memset(p, 0, n);
  }
  ~AlignedBuffer() { ::free(p); }
  void* p = nullptr;
  size_t size;
};

}  // namespace

// Reads the stamp past f's slots; writes a new one when there is none that describes
// these slots (a new file, a file recreated or resized, or one from before stamps).
Status SlotFiles::Stamp(File& f) {
  const uint32_t len = f.stamp_len;
  const off_t at = static_cast<off_t>(uint64_t{f.slots} * slot_bytes_);
  AlignedBuffer buf(len);
  if (!buf.p) return ResourceExhausted("no memory for a slot file stamp");
  auto* h = static_cast<StampHeader*>(buf.p);
  const ssize_t n = ::pread(f.fd, buf.p, len, at);
  if (n == static_cast<ssize_t>(len) && std::memcmp(h->magic, kStampMagic, sizeof(kStampMagic)) == 0 &&
      h->digest == StampDigest(*h) && h->slot_bytes == slot_bytes_ && h->slots == f.slots) {
    f.id = Hex(h->id, sizeof(h->id));
    return Status::Ok();
  }
  std::memset(buf.p, 0, len);
  std::memcpy(h->magic, kStampMagic, sizeof(kStampMagic));
  if (::getrandom(h->id, sizeof(h->id), 0) != static_cast<ssize_t>(sizeof(h->id))) {
    return ErrnoStatus(errno, "getrandom for " + f.path + "'s identity stamp");
  }
  h->slot_bytes = slot_bytes_;
  h->slots = f.slots;
  h->digest = StampDigest(*h);
  if (::pwrite(f.fd, buf.p, len, at) != static_cast<ssize_t>(len) || ::fdatasync(f.fd) != 0) {
    return ErrnoStatus(errno, "writing " + f.path + "'s identity stamp");
  }
  if (!f.created) KVTIER_LOG(INFO) << "nvme: " << f.path << " has no stamp for these slots; stamped it anew";
  f.id = Hex(h->id, sizeof(h->id));
  return Status::Ok();
}

Result<std::unique_ptr<SlotFiles>> SlotFiles::Open(const std::vector<SlotFileSpec>& specs, uint64_t slot_bytes) {
  if (specs.empty()) return InvalidArgument("the NVMe tier needs at least one slot file");
  if (slot_bytes == 0 || slot_bytes > (1ull << 31)) return InvalidArgument("bad slot size");
  std::unique_ptr<SlotFiles> s(new SlotFiles());
  s->slot_bytes_ = slot_bytes;
  Status st = s->OpenAll(specs);
  if (!st.ok()) {
    // Leave nothing behind: a file this Open created (0 bytes, or partly allocated) goes.
    for (const File& f : s->files_) {
      if (f.created) ::unlink(f.path.c_str());
    }
    return st;
  }
  return s;
}

Status SlotFiles::OpenAll(const std::vector<SlotFileSpec>& specs) {
  uint64_t total = 0;
  for (const SlotFileSpec& spec : specs) {
    File f;
    f.path = spec.path;
    f.fd = ::open(spec.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    f.created = f.fd >= 0;
    if (f.fd < 0 && errno == EEXIST) f.fd = ::open(spec.path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    if (f.fd < 0) {
      Status st = ErrnoStatus(errno, "open " + spec.path + " O_DIRECT");
      if (errno == ENOENT) st = NotFound(spec.path + ": its directory does not exist");
      if (errno == EINVAL) st = InvalidArgument(spec.path + ": this file system does not support O_DIRECT");
      return st;
    }
    files_.push_back(f);  // closed by the destructor from here on
    File& file = files_.back();
    if (::flock(file.fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) {
        return FailedPrecondition(spec.path + " is in use by another kvtierd (it holds the file's lock)");
      }
      return ErrnoStatus(errno, "flock " + spec.path);
    }
    struct stat sb {};
    if (::fstat(file.fd, &sb) != 0) return ErrnoStatus(errno, "fstat " + spec.path);
    file.dev = sb.st_dev;
    file.ino = sb.st_ino;
    const uint32_t align = DirectIoAlignment(file.fd);
    block_bytes_ = std::max(block_bytes_, align);
    file.stamp_len = std::max<uint32_t>(4096, align);
    stamp_len_ = std::max(stamp_len_, file.stamp_len);
    if (slot_bytes_ % align != 0) {
      return InvalidArgument("slot size " + std::to_string(slot_bytes_) + " is not a multiple of " + spec.path +
                             "'s logical block size " + std::to_string(align));
    }
    const uint64_t slots = spec.capacity_bytes / slot_bytes_;
    if (slots == 0) {
      return InvalidArgument(spec.path + ": capacity " + FormatBytes(spec.capacity_bytes) + " holds no slot of " +
                             FormatBytes(slot_bytes_));
    }
    const uint64_t bytes = slots * slot_bytes_ + file.stamp_len;
    if (!spec.preallocate) {
      if (static_cast<uint64_t>(sb.st_size) < bytes && ::ftruncate(file.fd, static_cast<off_t>(bytes)) != 0) {
        return ErrnoStatus(errno, "sizing " + spec.path + " to " + FormatBytes(bytes));
      }
    }
    int rc = spec.preallocate ? ::fallocate(file.fd, 0, 0, static_cast<off_t>(bytes)) : 0;
    if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
      rc = ::posix_fallocate(file.fd, 0, static_cast<off_t>(bytes));
      if (rc != 0) errno = rc;
      rc = rc == 0 ? 0 : -1;
    }
    if (rc != 0) {
      Status st = ErrnoStatus(errno, "preallocating " + FormatBytes(bytes) + " for " + spec.path);
      if (errno == ENOSPC) {
        st = ResourceExhausted("preallocating " + FormatBytes(bytes) + " for " + spec.path +
                               ": the file system is full (No space left on device)");
      }
      return st;
    }
    file.first_slot = static_cast<uint32_t>(total);
    file.slots = static_cast<uint32_t>(slots);
    total += slots;
    if (total > 0xfffffff0ull) return InvalidArgument("too many NVMe slots");
    KVTIER_RETURN_IF_ERROR(Stamp(file));
  }
  total_slots_ = static_cast<uint32_t>(total);
  return Status::Ok();
}

SlotFiles::~SlotFiles() {
  for (const File& f : files_) {
    if (f.fd >= 0) ::close(f.fd);
  }
}

SlotFiles::Location SlotFiles::Locate(uint32_t slot) const {
  for (const File& f : files_) {
    if (slot < f.first_slot + f.slots) {
      return Location{f.fd, static_cast<uint64_t>(slot - f.first_slot) * slot_bytes_};
    }
  }
  KVTIER_CHECK(false) << "slot " << slot << " out of range";
  return {};
}

size_t SlotFiles::FileOf(uint32_t slot) const {
  for (size_t i = 0; i < files_.size(); ++i) {
    if (slot < files_[i].first_slot + files_[i].slots) return i;
  }
  KVTIER_CHECK(false) << "slot " << slot << " out of range";
  return 0;
}

std::string SlotFiles::Describe() const {
  return std::to_string(files_.size()) + (files_.size() == 1 ? " file, " : " files, ") + std::to_string(total_slots_) +
         " slots of " + FormatBytes(slot_bytes_) + ", " + std::to_string(block_bytes_) + "-byte logical blocks";
}

std::string SlotFiles::GeometryKey() const {
  std::string g = "slot_bytes=" + std::to_string(slot_bytes_);
  for (const File& f : files_) {
    g += ";" + std::filesystem::absolute(f.path).lexically_normal().string() + ":" + std::to_string(f.slots) + "@" +
         f.id;
  }
  return g;
}

std::vector<SlotFiles::FileHealth> SlotFiles::Check() const {
  std::vector<FileHealth> out;
  for (size_t i = 0; i < files_.size(); ++i) {
    const File& f = files_[i];
    struct stat sb {};
    if (::fstat(f.fd, &sb) != 0) {
      out.push_back({i, std::string("fstat failed: ") + std::strerror(errno)});
    } else if (sb.st_nlink == 0) {
      out.push_back({i, "deleted"});
    } else if (static_cast<uint64_t>(sb.st_size) < uint64_t{f.slots} * slot_bytes_ + f.stamp_len) {
      out.push_back({i, "truncated to " + FormatBytes(static_cast<uint64_t>(sb.st_size))});
    } else if (struct stat pb{}; ::stat(f.path.c_str(), &pb) != 0 || pb.st_dev != f.dev || pb.st_ino != f.ino) {
      out.push_back({i, "replaced: its path names another file now"});
    }
  }
  return out;
}

}  // namespace kvtier
