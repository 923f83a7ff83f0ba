#pragma once
// Quantities as people write them. Byte sizes: "1GiB", "256MiB", "4096", "1.5TB". Binary suffixes
// (KiB, MiB, GiB, TiB; K/M/G/T alone mean the same) and decimal ones (kB, MB, GB, TB).

#include <cstdint>
#include <string>
#include <string_view>

#include "protocol/base/status.h"

namespace kvtier {

// kInvalidArgument on an unknown suffix, a negative number, or overflow.
Result<uint64_t> ParseBytes(std::string_view text);
// Durations: "500ms", "30s", "5m", "1h" (also ns, us, min); "0" alone needs no unit.
Result<int64_t> ParseDurationNanos(std::string_view text);
// Largest binary unit that keeps the value >= 1, e.g. "1 GiB", "1.5 MiB", "512 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace kvtier
