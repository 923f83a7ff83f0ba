#pragma once
// SegmentMemory: the backing memory of a tier pool, as a fixed number of equal segments.
// Each segment is one shareable allocation that an engine maps whole: a memfd for the
// host tier (HostSegmentMemory below), an exported device allocation for the GPU tier.
// A pool never puts pages of two tenants in one segment, since whoever maps a segment can
// read all of it.
//
// Owned by the control thread; not thread-safe.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "protocol/base/status.h"

namespace kvtier {

class SegmentMemory {
 public:
  virtual ~SegmentMemory() = default;

  virtual uint32_t segment_count() const = 0;
  virtual uint64_t segment_bytes() const = 0;
  // The descriptor a client maps (or imports) to reach `segment`. Owned by this object and
  // valid until Renew(segment) or destruction; send a dup or the fd itself over
  // SCM_RIGHTS (the kernel duplicates it).
  virtual int ShareFd(uint32_t segment) const = 0;
  // The daemon's own mapping of `segment`, or nullptr where the daemon cannot address it
  // directly (device memory).
  virtual uint8_t* HostAddress(uint32_t segment) const = 0;
  // The address a device copy names the segment by (device memory: its device address;
  // host memory: its mapping).
  virtual uint8_t* DeviceAddress(uint32_t segment) const { return HostAddress(segment); }
  // Replaces the segment's memory with fresh, zeroed memory and a new descriptor: this is
  // how a segment changes tenant without the old tenant seeing the new one's bytes. What
  // becomes of the old memory, which clients that have not re-mapped the segment still
  // map, is the kind's (HostSegmentMemory: released at once).
  virtual Status Renew(uint32_t segment) = 0;
  // Whether Renew(s) may run on another thread while no other call names `s` (the owner
  // keeps the segment out of use meanwhile). Default: no.
  virtual bool renews_off_thread() const { return false; }
  // One line for logs and kvctl, e.g. "memfd (4 KiB pages)".
  virtual std::string Describe() const = 0;
  // Copies bytes of a segment out to host memory (a GPU block demoted to a host page).
  virtual Status CopyToHost(uint32_t segment, uint64_t offset, void* dst, uint64_t bytes) = 0;
  // A legacy IPC handle for segments that have no descriptor (ShareFd() < 0), else empty.
  virtual std::span<const uint8_t> IpcHandle(uint32_t) const { return {}; }
  // The memory's kind for clients: "memfd", "cuda", "host-emulated".
  virtual std::string_view backend() const = 0;
};

enum class HugePages { kAuto, kOn, kOff };

// Host memory as sealed memfds (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL: a client can
// neither truncate a segment under the daemon, raising SIGBUS in it, nor grow it).
//
// Renew punches every page out of the old memfd before it makes the new one: the kernel
// unmaps those pages from every process that maps the old segment and frees them, so the
// pool's memory never exceeds segments x segment_bytes however long clients keep old
// mappings, and a client that touches an old mapping reads zeros and is charged (in its
// own cgroup) for what it writes. Renew may run off the owner's thread.
class HostSegmentMemory final : public SegmentMemory {
 public:
  struct Options {
    std::string name = "kvtier-host";  // memfd name, seen in /proc/PID/maps
    uint64_t segment_bytes = 256ull << 20;
    uint32_t segments = 4;
    // kAuto: hugetlb (2 MiB) when HugePages_Free covers the pool and segment_bytes is a
    // multiple of 2 MiB; 4 KiB pages otherwise. kOn: hugetlb or fail. Default: kAuto.
    HugePages huge_pages = HugePages::kAuto;
    // Allocate every page of a segment when it is created (fallocate), so the memory is
    // charged to this process's memory cgroup rather than to the first client that
    // writes a page, and stays charged here after that client exits. Huge pages are
    // always allocated at creation (touching an unreserved one raises SIGBUS). Default:
    // true.
    bool populate = true;
  };

  // kResourceExhausted when memfd/mmap fail for lack of memory, kFailedPrecondition when
  // kOn is asked and huge pages are not available.
  static Result<std::unique_ptr<HostSegmentMemory>> Open(const Options& options);
  ~HostSegmentMemory() override;

  uint32_t segment_count() const override { return static_cast<uint32_t>(segments_.size()); }
  uint64_t segment_bytes() const override { return options_.segment_bytes; }
  int ShareFd(uint32_t segment) const override { return segments_[segment].fd; }
  uint8_t* HostAddress(uint32_t segment) const override { return segments_[segment].addr; }
  Status Renew(uint32_t segment) override;
  bool renews_off_thread() const override { return true; }
  std::string Describe() const override;
  Status CopyToHost(uint32_t segment, uint64_t offset, void* dst, uint64_t bytes) override;
  std::string_view backend() const override { return "memfd"; }

  bool uses_huge_pages() const { return huge_; }

 private:
  struct Segment {
    int fd = -1;
    uint8_t* addr = nullptr;
  };
  HostSegmentMemory(const Options& options, bool huge) : options_(options), huge_(huge) {}
  Result<Segment> Create(uint32_t index) const;
  void Destroy(Segment& s) const;

  Options options_;
  bool huge_;
  std::vector<Segment> segments_;
};

// Bytes of 2 MiB huge pages free and not reserved on this system (sysfs
// hugepages-2048kB: free_hugepages - resv_hugepages), 0 if unknown.
uint64_t FreeHugePageBytes();

}  // namespace kvtier
