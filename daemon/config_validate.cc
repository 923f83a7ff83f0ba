// Checks of a parsed config across its keys (ValidateConfig): what no single key's parser
// can see — endpoints that must differ, sizes that must agree, a socket path's length.
#include <arpa/inet.h>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>

#include "daemon/config.h"
#include "daemon/lower_tiers.h"
#include "protocol/base/units.h"

namespace kvtier {

uint64_t NvmeSlotBytes(const DaemonConfig& c) {
  const uint64_t page = c.host.page_bytes;
  if (!c.nvme.mover.quantization) return page;
  const uint64_t q = (page * 33 + 63) / 64;
  return std::min(page, (q + 4095) / 4096 * 4096);
}

Status ValidateConfig(const DaemonConfig& c) {
  const TierOptions& h = c.host;
  // Checked whether or not events are on: a section switched off is still the operator's
  // text, and its mistakes should show now rather than when it is switched on.
  // (Two "port *" endpoints are two ports the system picks.)
  if (!c.events.options.publish.empty() && c.events.options.publish == c.events.options.replay &&
      c.events.options.publish.find('*') == std::string::npos) {
    return ConfigKeyError("events.replay", "must differ from events.publish");
  }
  if (c.events.options.topic.empty()) return ConfigKeyError("events.topic", "must not be empty");
  // A file-system socket only: its directory and mode are the access control (an abstract
  // socket has neither).
  if (c.server.socket_path.empty() || c.server.socket_path[0] == '@' ||
      c.server.socket_path.find('\0') != std::string::npos) {
    return InvalidArgument("config key 'socket.path': '" + c.server.socket_path +
                           "' must be a file-system path (abstract sockets have no permissions)");
  }
  if (c.server.socket_path.size() >= kMaxSocketPathBytes) {
    return InvalidArgument("config key 'socket.path': '" + c.server.socket_path + "' is " +
                           std::to_string(c.server.socket_path.size()) + " bytes; a Unix socket path has at most " +
                           std::to_string(kMaxSocketPathBytes - 1));
  }
  if (c.max_entries_per_request > MaxEntriesForFrame(c.server.max_frame_bytes)) {
    return InvalidArgument("config key 'protocol.max_entries_per_request' (" +
                           std::to_string(c.max_entries_per_request) + ") cannot be reached: the largest request of " +
                           "that many entries does not fit protocol.max_frame_bytes (" +
                           FormatBytes(c.server.max_frame_bytes) + ", which holds " +
                           std::to_string(MaxEntriesForFrame(c.server.max_frame_bytes)) +
                           "); raise max_frame_bytes or leave max_entries_per_request at auto");
  }
  if (c.server.admin_sessions >= c.server.max_sessions) {
    return InvalidArgument("config key 'protocol.admin_sessions' (" + std::to_string(c.server.admin_sessions) +
                           ") must be below protocol.max_sessions (" + std::to_string(c.server.max_sessions) + ")");
  }
  if (!h.enabled && !c.gpu.enabled) {
    return InvalidArgument(
        "config key 'tiers.host.enabled': no tier is enabled (host and gpu are both off): "
        "such a daemon could hold nothing");
  }
  if (h.low_watermark >= h.high_watermark) {
    return InvalidArgument("config key 'tiers.host.low_watermark' must be below high_watermark");
  }
  {
    in6_addr a6;
    in_addr a4;
    if (::inet_pton(AF_INET, c.metrics_listen.c_str(), &a4) != 1 &&
        ::inet_pton(AF_INET6, c.metrics_listen.c_str(), &a6) != 1) {
      return InvalidArgument("config key 'metrics.listen': '" + c.metrics_listen +
                             "' is not an IPv4 or IPv6 address (e.g. 127.0.0.1)");
    }
  }
  if (h.page_bytes % 4096 != 0) {
    return InvalidArgument("config key 'tiers.host.page_bytes' must be a multiple of 4 KiB");
  }
  if (h.segment_bytes % h.page_bytes != 0) {
    return InvalidArgument("config key 'tiers.host.segment_bytes' (" + FormatBytes(h.segment_bytes) +
                           ") must be a multiple of page_bytes (" + FormatBytes(h.page_bytes) + ")");
  }
  if (h.capacity_bytes % h.segment_bytes != 0) {
    return InvalidArgument("config key 'tiers.host.capacity' (" + FormatBytes(h.capacity_bytes) +
                           ") must be a multiple of segment_bytes (" + FormatBytes(h.segment_bytes) + ")");
  }
  if (h.capacity_bytes / h.page_bytes > (1ull << 31)) {
    return InvalidArgument("config key 'tiers.host.capacity' has too many pages");
  }
  if (c.gpu.enabled) {
    const TierOptions& g = c.gpu;
    if (g.low_watermark >= g.high_watermark) {
      return InvalidArgument("config key 'tiers.gpu.low_watermark' must be below high_watermark");
    }
    if (g.segment_bytes % h.page_bytes != 0) {
      return InvalidArgument("config key 'tiers.gpu.segment_bytes' must be a multiple of tiers.host.page_bytes");
    }
    if (g.capacity_bytes % g.segment_bytes != 0) {
      return InvalidArgument("config key 'tiers.gpu.capacity' must be a multiple of tiers.gpu.segment_bytes");
    }
  }
  for (const LowerTierRow& row : LowerTierRows()) {
    if (row.enabled(c) && !h.enabled) {
      const std::string tier(TierKindName(row.kind));
      return InvalidArgument("config key '" + std::string(row.keys().front().path) + "' needs the host tier enabled (" +
                             tier + " blocks are read into host pages)");
    }
  }
  if (c.nvme.enabled()) {
    if (c.nvme.tier.low_watermark >= c.nvme.tier.high_watermark) {
      return InvalidArgument("config key 'tiers.nvme.low_watermark' must be below high_watermark");
    }
    if (!h.enabled) return InvalidArgument("config key 'tiers.nvme.files' needs the host tier enabled");
    const uint64_t slot = NvmeSlotBytes(c);
    for (size_t i = 0; i < c.nvme.tier.files.size(); ++i) {
      if (c.nvme.tier.files[i].capacity_bytes < slot) {
        return InvalidArgument("config key 'tiers.nvme.files[" + std::to_string(i) + "].capacity' holds no slot of " +
                               FormatBytes(slot));
      }
      // Quantized slots are not a divisor of page-sized capacities; the rest is left unused.
      if (slot == h.page_bytes && c.nvme.tier.files[i].capacity_bytes % h.page_bytes != 0) {
        return InvalidArgument("config key 'tiers.nvme.files[" + std::to_string(i) + "].capacity' (" +
                               FormatBytes(c.nvme.tier.files[i].capacity_bytes) +
                               ") is not a whole number of slots of tiers.host.page_bytes (" +
                               FormatBytes(h.page_bytes) + "): the rest would never be used");
      }
    }
  }
  {
    const SecurityConfig& s = c.security;
    std::set<std::string> names;
    std::set<uint32_t> uids;
    TierBytes reserved{};
    for (size_t i = 0; i < s.tenants.size(); ++i) {
      const TenantConfig& t = s.tenants[i];
      const std::string at = "config key 'security.tenants[" + std::to_string(i) + "]";
      if (!names.insert(t.name).second) return InvalidArgument(at + ".name': tenant '" + t.name + "' is named twice");
      for (uint32_t u : t.uids) {
        if (!uids.insert(u).second)
          return InvalidArgument(at + ".uids': uid " + std::to_string(u) + " is in two tenants");
      }
      for (TierKind k : kAllTiers) {
        const uint64_t q = t.quota[TierIndex(k)], r = t.reserve[TierIndex(k)];
        const std::string tier(TierKindName(k));
        if (q != 0 && r > q) return InvalidArgument(at + ".reserve." + tier + "' is above its quota");
        if (r > 0 && IsLowerTier(k)) {
          // Refused rather than ignored: a lower tier evicts by its own rule across every
          // tenant (a cluster's maxmemory-policy), which no kvtierd can hold back for one.
          return InvalidArgument(at + ".reserve." + tier + "': the " + tier +
                                 " tier cannot reserve room for a tenant (its own eviction is shared by all); give "
                                 "the other tenants a " +
                                 tier + " quota instead");
        }
        reserved[TierIndex(k)] += r;
      }
    }
    uint64_t nvme_bytes = 0;
    for (const auto& f : c.nvme.tier.files) nvme_bytes += f.capacity_bytes;
    for (TierKind k : kAllTiers) {
      if (!IsPoolTier(k) && s.unknown_quota[TierIndex(k)] > 0) {
        return InvalidArgument("config key 'security.unknown_quota." + std::string(TierKindName(k)) +
                               "': NVMe and lower-tier quotas are for configured tenants (security.tenants); an "
                               "unknown tenant's blocks there count with everyone else's");
      }
    }
    // Reserves must fit below the low watermark, or eviction could never honour them.
    for (auto [r, cap, low, tier] :
         {std::tuple{reserved[TierIndex(TierKind::kHost)], h.capacity_bytes, h.low_watermark, "host"},
          std::tuple{reserved[TierIndex(TierKind::kGpu)], c.gpu.enabled ? c.gpu.capacity_bytes : 0, c.gpu.low_watermark,
                     "gpu"},
          std::tuple{reserved[TierIndex(TierKind::kNvme)], nvme_bytes, c.nvme.tier.low_watermark, "nvme"}}) {
      if (r > 0 && static_cast<double>(r) > low * static_cast<double>(cap)) {
        return InvalidArgument("config key 'security.tenants': " + std::string(tier) + " reserves add up to " +
                               FormatBytes(r) + ", more than the tier's low watermark of " +
                               FormatBytes(static_cast<uint64_t>(low * static_cast<double>(cap))));
      }
    }
  }
  if (c.server.max_pending_output_bytes < c.server.max_frame_bytes) {
    return InvalidArgument("config key 'protocol.max_pending_output' must be >= max_frame_bytes");
  }
  return Status::Ok();
}

}  // namespace kvtier
