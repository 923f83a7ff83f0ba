#include "engine/segment_map.h"

#include <errno.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace kvtier {

SegmentMap::~SegmentMap() {
  for (auto& [key, m] : mappings_) Unmap(m);
}

void SegmentMap::SetTiers(std::vector<TierInfo> tiers, std::string gpu_backend) {
  tiers_ = std::move(tiers);
  gpu_backend_ = std::move(gpu_backend);
}

Status SegmentMap::EnsureDevice() {
  if (device_) return Status::Ok();
  KVTIER_ASSIGN_OR_RETURN(device_, OpenDeviceBackend(device_name_, WithoutDevice::kHostEmulated));
  return Status::Ok();
}

Status SegmentMap::Map(const SegmentGrantView& g) {
  Mapping m{nullptr, g.bytes, g.first_page, g.num_pages, false, false};
  if (g.tier == TierKind::kGpu && gpu_backend_ == "cuda") {
    KVTIER_RETURN_IF_ERROR(EnsureDevice());
    if (device_->name() != "cuda") return FailedPrecondition("the daemon's GPU tier is CUDA; this client has no CUDA");
    const uint8_t* handle = g.ipc_handle.size() >= kIpcHandleBytes ? g.ipc_handle.data() : nullptr;
    if (g.fd < 0 && handle == nullptr) return Internal("GPU segment with neither descriptor nor handle");
    KVTIER_ASSIGN_OR_RETURN(m.addr, device_->Import(cuda_device_, g.fd, handle, g.bytes));
    m.device = true;
  } else {
    if (g.fd < 0) return Internal("segment without a descriptor");
    void* addr = ::mmap(nullptr, g.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, g.fd, 0);
    if (addr == MAP_FAILED) return ErrnoStatus(errno, "mmap of a pool segment");
    // A process forked from this one (multiprocessing's fork, a daemonizing launcher) gets
    // no copy of the mapping: pages the daemon frees when this process ends must not stay
    // writable, or even readable, in a child it cannot see.
    if (::madvise(addr, g.bytes, MADV_DONTFORK) != 0) {
      const int err = errno;
      ::munmap(addr, g.bytes);
      return ErrnoStatus(err, "madvise(MADV_DONTFORK) of a pool segment");
    }
    m.addr = static_cast<uint8_t*>(addr);
    if (g.tier == TierKind::kHost && EnsureDevice().ok() && device_->name() == "cuda") {
      // Pinned and mapped for the device: the gather kernel writes it over the bus.
      m.registered = device_->RegisterHost(m.addr, m.bytes).ok();
    }
    if (g.tier == TierKind::kHost && protect_) {
      // Read-only but for the pages this session holds leased (a segment granted again
      // while some are).
      Protect(m.addr, m.bytes, false);
      const uint64_t pb = page_bytes(TierKind::kHost);
      for (uint32_t p = g.first_page; pb > 0 && p < g.first_page + g.num_pages; ++p) {
        if (writable_.count(p)) Protect(m.addr + uint64_t{p - g.first_page} * pb, pb, true);
      }
    }
  }
  const auto key = std::make_pair(static_cast<int>(g.tier), g.index);
  if (auto old = mappings_.find(key); old != mappings_.end()) Unmap(old->second);
  mappings_[key] = m;
  return Status::Ok();
}

void SegmentMap::Protect(uint8_t* addr, uint64_t bytes, bool writable) {
  if (::mprotect(addr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ) == 0 || protect_failed_logged_) return;
  protect_failed_logged_ = true;
  std::fprintf(stderr, "kvtier client: mprotect of a host page failed (%s); pages stay as they are\n",
               std::strerror(errno));
}

void SegmentMap::SetWritable(TierKind tier, std::span<const PageId> pages, bool writable) {
  if (tier != TierKind::kHost || !protect_) return;
  const uint64_t pb = page_bytes(tier);
  std::vector<uint8_t*> changed;
  changed.reserve(pages.size());
  for (PageId p : pages) {
    if (p == kNoPage) continue;
    if (writable ? !writable_.insert(p).second : writable_.erase(p) == 0) continue;  // no change
    if (auto* addr = static_cast<uint8_t*>(PageAddress(tier, p))) changed.push_back(addr);
  }
  // One mprotect per run of adjacent pages (an Allocate's pages usually are one run).
  std::sort(changed.begin(), changed.end());
  for (size_t i = 0; i < changed.size();) {
    size_t j = i + 1;
    while (j < changed.size() && changed[j] == changed[j - 1] + pb) ++j;
    Protect(changed[i], pb * (j - i), writable);
    i = j;
  }
}

void SegmentMap::Unmap(const Mapping& m) {
  if (m.device) {
    device_->Unimport(m.addr, m.bytes);
    return;
  }
  if (m.registered) device_->UnregisterHost(m.addr);
  ::munmap(m.addr, m.bytes);
}

uint64_t SegmentMap::page_bytes(TierKind tier) const {
  for (const TierInfo& t : tiers_) {
    if (t.tier == tier) return t.page_bytes;
  }
  return 0;
}

void* SegmentMap::PageAddress(TierKind tier, PageId page) const {
  const uint64_t pb = page_bytes(tier);
  if (pb == 0) return nullptr;
  for (const auto& [key, m] : mappings_) {
    if (key.first != static_cast<int>(tier)) continue;
    if (page >= m.first_page && page < m.first_page + m.num_pages) {
      const uint64_t off = uint64_t{page - m.first_page} * pb;
      return off + pb > m.bytes ? nullptr : m.addr + off;
    }
  }
  return nullptr;
}

std::span<uint8_t> SegmentMap::PageBytes(TierKind tier, PageId page) const {
  if (tier == TierKind::kGpu && gpu_backend_ == "cuda") return {};
  uint8_t* p = static_cast<uint8_t*>(PageAddress(tier, page));
  return p ? std::span<uint8_t>(p, page_bytes(tier)) : std::span<uint8_t>();
}

}  // namespace kvtier
