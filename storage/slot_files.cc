#include "storage/slot_files.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/stat.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

}  // namespace

Result<std::unique_ptr<SlotFiles>> SlotFiles::Open(const std::vector<SlotFileSpec>& specs, uint64_t slot_bytes) {
  if (specs.empty()) return InvalidArgument("the NVMe tier needs at least one slot file");
  if (slot_bytes == 0 || slot_bytes > (1ull << 31)) return InvalidArgument("bad slot size");
  std::unique_ptr<SlotFiles> s(new SlotFiles());
  s->slot_bytes_ = slot_bytes;
  uint64_t total = 0;
  for (const SlotFileSpec& spec : specs) {
    File f;
    f.path = spec.path;
    f.fd = ::open(spec.path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
    if (f.fd < 0) {
      Status st = ErrnoStatus(errno, "open " + spec.path + " O_DIRECT");
      if (errno == ENOENT) st = NotFound(spec.path + ": its directory does not exist");
      if (errno == EINVAL) st = InvalidArgument(spec.path + ": this file system does not support O_DIRECT");
      return st;
    }
    s->files_.push_back(f);  // closed by the destructor from here on
    const uint32_t align = DirectIoAlignment(f.fd);
    s->block_bytes_ = std::max(s->block_bytes_, align);
    if (slot_bytes % align != 0) {
      return InvalidArgument("slot size " + std::to_string(slot_bytes) + " is not a multiple of " + spec.path +
                             "'s logical block size " + std::to_string(align));
    }
    const uint64_t slots = spec.capacity_bytes / slot_bytes;
    if (slots == 0) {
      return InvalidArgument(spec.path + ": capacity " + FormatBytes(spec.capacity_bytes) + " holds no slot of " +
                             FormatBytes(slot_bytes));
    }
    const uint64_t bytes = slots * slot_bytes;
    int rc = ::fallocate(f.fd, 0, 0, static_cast<off_t>(bytes));
    if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
      rc = ::posix_fallocate(f.fd, 0, static_cast<off_t>(bytes));
      if (rc != 0) errno = rc;
      rc = rc == 0 ? 0 : -1;
    }
    if (rc != 0) return ErrnoStatus(errno, "preallocating " + FormatBytes(bytes) + " for " + spec.path);
    s->files_.back().first_slot = static_cast<uint32_t>(total);
    s->files_.back().slots = static_cast<uint32_t>(slots);
    total += slots;
    if (total > 0xfffffff0ull) return InvalidArgument("too many NVMe slots");
  }
  s->total_slots_ = static_cast<uint32_t>(total);
  return s;
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

std::string SlotFiles::Describe() const {
  return std::to_string(files_.size()) + (files_.size() == 1 ? " file, " : " files, ") + std::to_string(total_slots_) +
         " slots of " + FormatBytes(slot_bytes_) + ", " + std::to_string(block_bytes_) + "-byte logical blocks";
}

std::string SlotFiles::GeometryKey() const {
  std::string g = "slot_bytes=" + std::to_string(slot_bytes_);
  for (const File& f : files_) {
    g += ";" + std::filesystem::absolute(f.path).lexically_normal().string() + ":" + std::to_string(f.slots);
  }
  return g;
}

}  // namespace kvtier
