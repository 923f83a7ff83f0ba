#pragma once
// SegmentMap: the pool segments one client session has mapped, and the device backend it
// maps GPU segments (and pins host segments) with. Internal to the client library.
//
// A host segment is mmap'ed from the descriptor the daemon sent; a GPU segment is
// imported through the DeviceBackend (by descriptor, or by legacy IPC handle). A segment
// granted again (the daemon renewed its memory) replaces the old mapping. Mappings are not
// inherited by fork() (MADV_DONTFORK): a child touching them faults, as it would touch
// pages the daemon hands to others once this process ends. Thread-compatible.

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "kernels/device_backend.h"
#include "protocol/base/status.h"
#include "protocol/base/tier.h"

namespace kvtier {

// One segment grant as it came off the wire.
struct SegmentGrantView {
  TierKind tier = TierKind::kHost;
  uint32_t index = 0;
  uint32_t first_page = 0;
  uint32_t num_pages = 0;
  uint64_t bytes = 0;
  int fd = -1;                          // borrowed: the caller closes it
  std::span<const uint8_t> ipc_handle;  // legacy CUDA IPC handle when fd < 0
};

class SegmentMap {
 public:
  // `device`: "auto" (CUDA when visible, else host-emulated), "cuda" or "host-emulated".
  SegmentMap(std::string device, int cuda_device, bool protect = true)
      : device_name_(std::move(device)), cuda_device_(cuda_device), protect_(protect) {}
  ~SegmentMap();
  SegmentMap(const SegmentMap&) = delete;
  SegmentMap& operator=(const SegmentMap&) = delete;

  // The daemon's tiers and its GPU tier's backend ("cuda", "host-emulated", or "" for
  // none), from Welcome, before any segment is mapped.
  void SetTiers(std::vector<TierInfo> tiers, std::string gpu_backend);
  // Maps a granted segment. kFailedPrecondition when the daemon's GPU tier is CUDA and this
  // client has no CUDA; the mmap or import error otherwise.
  Status Map(const SegmentGrantView& g);

  // Opens the device backend on first use.
  Status EnsureDevice();
  DeviceBackend* device() const { return device_.get(); }
  std::string_view device_name() const { return device_ ? device_->name() : std::string_view("none"); }

  // Host pages are mapped read-only except those marked writable (leased by this session):
  // Allocate marks its pages, Commit and Release unmark them. Other tiers are unaffected
  // (device memory has no CPU protection). An mprotect the kernel refuses (too many
  // mappings: vm.max_map_count) leaves the page as it was and is logged once.
  void SetWritable(TierKind tier, std::span<const PageId> pages, bool writable);
  bool IsWritable(PageId host_page) const { return !protect_ || writable_.count(host_page) != 0; }

  // Address of a mapped page (device memory for a CUDA GPU tier); nullptr when unmapped.
  void* PageAddress(TierKind tier, PageId page) const;
  // Host-addressable bytes of a page (host tier; GPU tier when emulated), or empty.
  std::span<uint8_t> PageBytes(TierKind tier, PageId page) const;
  uint64_t page_bytes(TierKind tier) const;
  const std::vector<TierInfo>& tiers() const { return tiers_; }

 private:
  struct Mapping {
    uint8_t* addr = nullptr;
    uint64_t bytes = 0;
    uint32_t first_page = 0;
    uint32_t num_pages = 0;
    bool device = false;      // imported through the device backend
    bool registered = false;  // host memory pinned for the device
  };
  void Unmap(const Mapping& m);
  void Protect(uint8_t* addr, uint64_t bytes, bool writable);

  std::string device_name_;
  int cuda_device_;
  std::unique_ptr<DeviceBackend> device_;
  std::vector<TierInfo> tiers_;
  std::string gpu_backend_;
  std::map<std::pair<int, uint32_t>, Mapping> mappings_;  // (tier, segment) -> mapping
  bool protect_;
  bool protect_failed_logged_ = false;
  std::unordered_set<PageId> writable_;  // host pages this session holds leased
};

}  // namespace kvtier
