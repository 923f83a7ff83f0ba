#pragma once
// A memory cgroup of a test's own, made below the cgroup this process is in (cgroup v1's
// memory hierarchy, or v2 with the memory controller), for tests that look at where
// memory is charged. Removed (with its processes moved back to the parent) on
// destruction. Needs root or a delegated cgroup.
//
// Thread-compatible.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "protocol/base/status.h"

namespace kvtier::testing {

class MemoryCgroup {
 public:
  // kUnavailable (with the reason) where no memory cgroup can be made here.
  static Result<std::unique_ptr<MemoryCgroup>> Make(const std::string& name);
  ~MemoryCgroup();

  // Moves `pid` (0: the calling process) into this cgroup. Safe in a forked child.
  bool Join(pid_t pid = 0) const;
  // Shared memory (memfd, tmpfs) charged to the cgroup: v1 total_shmem, v2 shmem.
  uint64_t ShmemBytes() const;
  // All memory charged to it: v1 memory.usage_in_bytes, v2 memory.current.
  uint64_t UsageBytes() const;
  const std::string& path() const { return path_; }
  int version() const { return version_; }

 private:
  MemoryCgroup(std::string path, std::string parent, int version)
      : path_(std::move(path)), parent_(std::move(parent)), version_(version) {}
  uint64_t Stat(const std::string& key) const;

  std::string path_, parent_;
  int version_;
};

}  // namespace kvtier::testing
