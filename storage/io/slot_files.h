#pragma once
// SlotFiles: the NVMe tier's backing files, cut into fixed-size slots.
//
// Each file is created if missing (its directory must exist), preallocated with fallocate to its capacity (so a
// spill never fails for lack of space the filesystem promised) and opened O_DIRECT. The
// logical block size is read at open (statx STATX_DIOALIGN, else 4096) and slot size and
// offsets must be multiples of it. Slots are numbered across files in order.
//
// One daemon per file: Open takes an exclusive flock on every file and fails with
// kFailedPrecondition when another process (or another open in this one) holds it; the
// lock goes with the fds. Each file carries an identity stamp in one logical block past
// its last slot (magic, a random 128-bit id, slot size and count), written when the file
// is created or its stamp is missing or describes other slots; GeometryKey() includes the
// ids, so an index recorded for one file never describes a file recreated, truncated or
// swapped in under the same path.
//
// A failed Open removes the files it created. Immutable after Open; thread-safe.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "protocol/base/status.h"

namespace kvtier {

struct SlotFileSpec {
  std::string path;
  uint64_t capacity_bytes = 0;
  // Allocate the file's blocks at open (fallocate), so a spill never finds the file system
  // full. false: the file is only sized (sparse until written) — for thin-provisioned
  // volumes, or an index larger than the disk in a benchmark; a spill into a hole may then
  // fail with ENOSPC, which backs spills off like any write error.
  bool preallocate = true;
  bool operator==(const SlotFileSpec&) const = default;
};

class SlotFiles {
 public:
  // kInvalidArgument when slot_bytes is not a multiple of a file's logical block size or a
  // file holds no slot; kResourceExhausted when preallocation fails for lack of space;
  // kFailedPrecondition when a file is locked by another open.
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
  // A digest of the geometry (paths, slot counts, slot size, identity stamps): an index
  // written under a different geometry does not describe these files.
  std::string GeometryKey() const;
  // What a file should look like while it is ours (see Check).
  struct FileHealth {
    size_t file = 0;
    std::string problem;  // "deleted", "truncated to 1 MiB", "replaced" ...
  };
  // fstat of every file against what Open left: a file unlinked, shrunk below its slots,
  // or with its path now naming another file is reported. Cheap (one fstat and one stat
  // per file); the daemon calls it on its tick.
  std::vector<FileHealth> Check() const;
  // The file holding `slot`. REQUIRES: slot < slot_count().
  size_t FileOf(uint32_t slot) const;
  // The slots of file `i`: [first, first + count).
  std::pair<uint32_t, uint32_t> SlotRange(size_t i) const { return {files_[i].first_slot, files_[i].slots}; }
  // Most bytes past the slots a file holds for its stamp (4 KiB, or the file's block size).
  uint32_t stamp_bytes() const { return stamp_len_; }

 private:
  struct File {
    std::string path;
    int fd = -1;
    uint32_t first_slot = 0;
    uint32_t slots = 0;
    bool created = false;
    uint32_t stamp_len = 4096;
    std::string id;  // the stamp's id, 32 hex digits
    dev_t dev = 0;
    ino_t ino = 0;
  };
  SlotFiles() = default;
  Status OpenAll(const std::vector<SlotFileSpec>& specs);
  Status Stamp(File& f);

  std::vector<File> files_;
  uint64_t slot_bytes_ = 0;
  uint32_t block_bytes_ = 512;
  uint32_t total_slots_ = 0;
  uint32_t stamp_len_ = 4096;
};

}  // namespace kvtier
