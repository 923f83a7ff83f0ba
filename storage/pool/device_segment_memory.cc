#include "storage/pool/device_segment_memory.h"

#include "protocol/base/units.h"

namespace kvtier {

Result<std::unique_ptr<DeviceSegmentMemory>> DeviceSegmentMemory::Open(DeviceBackend* backend, int device,
                                                                       uint64_t segment_bytes, uint32_t segments) {
  if (device < 0 || device >= backend->device_count()) {
    return InvalidArgument("GPU device " + std::to_string(device) + " does not exist (" +
                           std::to_string(backend->device_count()) + " visible)");
  }
  std::unique_ptr<DeviceSegmentMemory> m(new DeviceSegmentMemory(backend, device, segment_bytes));
  KVTIER_ASSIGN_OR_RETURN(m->stream_, backend->CreateStream(device));
  for (uint32_t i = 0; i < segments; ++i) {
    KVTIER_ASSIGN_OR_RETURN(DeviceAllocation a, backend->AllocateShareable(device, segment_bytes));
    m->segments_.push_back(a);
  }
  return m;
}

DeviceSegmentMemory::~DeviceSegmentMemory() {
  for (auto& a : segments_) backend_->Free(a);
  if (stream_) backend_->DestroyStream(stream_);
}

Status DeviceSegmentMemory::Renew(uint32_t segment) {
  if (segment >= segments_.size()) return InvalidArgument("no such segment");
  KVTIER_ASSIGN_OR_RETURN(DeviceAllocation fresh, backend_->AllocateShareable(device_, segment_bytes_));
  backend_->Free(segments_[segment]);
  segments_[segment] = fresh;
  return Status::Ok();
}

Status DeviceSegmentMemory::CopyToHost(uint32_t segment, uint64_t offset, void* dst, uint64_t bytes) {
  if (segment >= segments_.size() || offset + bytes > segment_bytes_)
    return InvalidArgument("copy outside the segment");
  KVTIER_RETURN_IF_ERROR(backend_->Copy(dst, segments_[segment].ptr + offset, bytes, CopyKind::kDeviceToHost, stream_));
  return backend_->Synchronize(stream_);
}

std::string DeviceSegmentMemory::Describe() const {
  const bool legacy = !segments_.empty() && segments_[0].legacy_ipc;
  return std::string(backend_->name()) + " device " + std::to_string(device_) + ", " +
         std::to_string(segments_.size()) + " x " + FormatBytes(segment_bytes_) +
         (backend_->name() == "cuda" ? (legacy ? ", legacy IPC handles" : ", VMM fds") : "");
}

}  // namespace kvtier
