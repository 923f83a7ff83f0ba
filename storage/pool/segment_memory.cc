#include "storage/pool/segment_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>

#include "protocol/base/logging.h"
#include "protocol/base/units.h"

namespace kvtier {

constexpr uint64_t kHugePageBytes = 2ull << 20;

uint64_t FreeHugePageBytes() {
  // sysfs, not /proc/meminfo: /proc may be mounted with subset=pid (systemd's
  // ProcSubset=pid), and this pool of 2 MiB pages is the one MFD_HUGE_2MB draws from
  // whatever the default huge page size is. Reserved pages are promised to others.
  const std::string dir = "/sys/kernel/mm/hugepages/hugepages-2048kB/";
  auto read = [&dir](const char* name) -> uint64_t {
    std::ifstream in(dir + name);
    uint64_t v = 0;
    return (in >> v) ? v : 0;
  };
  const uint64_t free_pages = read("free_hugepages"), reserved = read("resv_hugepages");
  return free_pages > reserved ? (free_pages - reserved) * kHugePageBytes : 0;
}

Result<std::unique_ptr<HostSegmentMemory>> HostSegmentMemory::Open(const Options& options) {
  if (options.segments == 0 || options.segment_bytes == 0) {
    return InvalidArgument("host pool needs at least one non-empty segment");
  }
  const uint64_t total = options.segment_bytes * options.segments;
  bool huge = false;
  if (options.huge_pages != HugePages::kOff) {
    // memfd_create(MFD_HUGETLB) succeeds even with no huge pages reserved and touching the
    // mapping then raises SIGBUS, so look at what is free before choosing them.
    const bool fits = options.segment_bytes % kHugePageBytes == 0 && FreeHugePageBytes() >= total;
    if (fits) {
      huge = true;
    } else if (options.huge_pages == HugePages::kOn) {
      return FailedPrecondition("huge_pages: on, but " + FormatBytes(FreeHugePageBytes()) +
                                " of 2 MiB huge pages are free for a " + FormatBytes(total) +
                                " pool (or segment_bytes is not a multiple of 2 MiB)");
    }
  }
  auto build = [&options](bool use_huge) -> Result<std::unique_ptr<HostSegmentMemory>> {
    std::unique_ptr<HostSegmentMemory> m(new HostSegmentMemory(options, use_huge));
    m->segments_.reserve(options.segments);
    for (uint32_t i = 0; i < options.segments; ++i) {
      KVTIER_ASSIGN_OR_RETURN(Segment seg, m->Create(i));
      m->segments_.push_back(seg);
    }
    return m;
  };
  auto r = build(huge);
  if (!r.ok() && huge && options.huge_pages == HugePages::kAuto) {
    // Someone took the huge pages between the check and now.
    KVTIER_LOG(WARNING) << "hugetlb pool failed (" << r.status().ToString() << "); using 4 KiB pages";
    r = build(false);
  }
  return r;
}

HostSegmentMemory::~HostSegmentMemory() {
  for (auto& s : segments_) Destroy(s);
}

Result<HostSegmentMemory::Segment> HostSegmentMemory::Create(uint32_t index) const {
  const std::string name = options_.name + "-" + std::to_string(index);
  unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  if (huge_) flags |= MFD_HUGETLB | MFD_HUGE_2MB;
  Segment s;
  s.fd = ::memfd_create(name.c_str(), flags);
  if (s.fd < 0) return ErrnoStatus(errno, "memfd_create " + name);
  auto fail = [&](const char* what) {
    Status st = ErrnoStatus(errno, std::string(what) + " " + name);
    ::close(s.fd);
    return st;
  };
  if (::ftruncate(s.fd, static_cast<off_t>(options_.segment_bytes)) != 0) return fail("ftruncate");
  // Huge pages are reserved now, so touching them later cannot SIGBUS; 4 KiB pages when
  // asked, so the pool is charged to this process's cgroup, not an engine's.
  if ((huge_ || options_.populate) && ::fallocate(s.fd, 0, 0, static_cast<off_t>(options_.segment_bytes)) != 0) {
    if (errno == ENOSPC || errno == ENOMEM) errno = ENOMEM;  // shmem says ENOSPC for "no memory"
    return fail(huge_ ? "fallocate (huge page reservation)" : "fallocate (the segment's memory)");
  }
  if (::fcntl(s.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return fail("F_ADD_SEALS");
  }
  void* p = ::mmap(nullptr, options_.segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, 0);
  if (p == MAP_FAILED) return fail("mmap");
  s.addr = static_cast<uint8_t*>(p);
  return s;
}

void HostSegmentMemory::Destroy(Segment& s) const {
  if (s.addr) ::munmap(s.addr, options_.segment_bytes);
  if (s.fd >= 0) ::close(s.fd);
  s = Segment{};
}

Status HostSegmentMemory::Renew(uint32_t segment) {
  if (segment >= segments_.size()) return InvalidArgument("no such segment");
  Segment& old = segments_[segment];
  // First the old pages go, from every mapping of them, so the new ones never add to them.
  // A failed punch leaves them; the new memory is made all the same (the old tenant must
  // not see the new one's bytes), and the old pages go when the last mapping does.
  if (::fallocate(old.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(options_.segment_bytes)) !=
      0) {
    KVTIER_LOG(WARNING) << ErrnoStatus(errno, "punching renewed segment " + std::to_string(segment)).ToString();
  }
  KVTIER_ASSIGN_OR_RETURN(Segment fresh, Create(segment));
  Destroy(old);
  old = fresh;
  return Status::Ok();
}

Status HostSegmentMemory::CopyToHost(uint32_t segment, uint64_t offset, void* dst, uint64_t bytes) {
  if (segment >= segments_.size() || offset + bytes > options_.segment_bytes) {
    return InvalidArgument("copy outside the segment");
  }
  std::memcpy(dst, segments_[segment].addr + offset, bytes);
  return Status::Ok();
}

std::string HostSegmentMemory::Describe() const {
  return std::string("memfd, ") + (huge_ ? "2 MiB hugetlb pages" : "4 KiB pages") + ", " +
         std::to_string(segments_.size()) + " x " + FormatBytes(options_.segment_bytes);
}

}  // namespace kvtier
