#pragma once
// SlotFiles: the NVMe tier's backing files, cut into fixed-size slots.
//
// Each file is created if missing (its directory must exist), preallocated with fallocate to its capacity (so a
// spill never fails for lack of space the filesystem promised) and opened O_DIRECT. The
// logical block size is read at open (statx STATX_DIOALIGN, else 4096) and slot size and
// offsets must be multiples of it. Slots are numbered across files in order.
// Immutable after Open; thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "protocol/base/status.h"

namespace kvtier {

struct SlotFileSpec {
  std::string path;
  uint64_t capacity_bytes = 0;
};

class SlotFiles {
 public:
  // kInvalidArgument when slot_bytes is not a multiple of a file's logical block size or a
  // file holds no slot; kResourceExhausted when preallocation fails for lack of space.
  static Result<std::unique_ptr<SlotFiles>> Open(const std::vector<SlotFileSpec>& files, uint64_t slot_bytes);
  ~SlotFiles();

  struct Location {
    int fd;
    uint64_t offset;
  };
  // REQUIRES: slot < slot_count().
  Location Locate(uint32_t slot) const;

  uint32_t slot_count() const { return total_slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t logical_block_bytes() const { return block_bytes_; }
  size_t file_count() const { return files_.size(); }
  const std::string& path(size_t i) const { return files_[i].path; }
  // "2 files, 4096 slots of 2 MiB, 512-byte logical blocks"
  std::string Describe() const;
  // A digest of the geometry (paths, slot counts, slot size): an index written under a
  // different geometry does not describe these files.
  std::string GeometryKey() const;

 private:
  struct File {
    std::string path;
    int fd = -1;
    uint32_t first_slot = 0;
    uint32_t slots = 0;
  };
  SlotFiles() = default;

  std::vector<File> files_;
  uint64_t slot_bytes_ = 0;
  uint32_t block_bytes_ = 512;
  uint32_t total_slots_ = 0;
};

}  // namespace kvtier
