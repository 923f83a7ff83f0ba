#include "daemon/cache/allocation_headroom.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvtier {
namespace {
constexpr double kTripWeight = 1.0 / 8;
}  // namespace

void AllocationHeadroom::NoteTaken(int64_t now_ns, uint64_t taken_total) {
  if (last_ns_ < 0) {
    last_ns_ = now_ns;
    last_total_ = taken_total;
    return;
  }
  const uint64_t pages = taken_total - last_total_;
  last_total_ = taken_total;
  // rate(t) = sum over takes of e^(-(t - t_i)/w) / w: a steady λ pages/s converges to λ.
  rate_ = rate_per_s(now_ns) + static_cast<double>(pages) / window_s_;
  last_ns_ = std::max(last_ns_, now_ns);
}

void AllocationHeadroom::NoteRoundTrip(double seconds) {
  if (!(seconds >= 0)) return;
  round_trip_s_ = seen_trip_ ? round_trip_s_ + kTripWeight * (seconds - round_trip_s_) : seconds;
  seen_trip_ = true;
}

double AllocationHeadroom::rate_per_s(int64_t now_ns) const {
  if (last_ns_ < 0 || now_ns <= last_ns_) return rate_;
  return rate_ * std::exp(-static_cast<double>(now_ns - last_ns_) * 1e-9 / window_s_);
}

uint32_t AllocationHeadroom::Pages(int64_t now_ns) const {
  if (!seen_trip_ || factor_ <= 0) return 0;
  const double pages = std::ceil(factor_ * rate_per_s(now_ns) * round_trip_s_);
  return static_cast<uint32_t>(std::min(pages, static_cast<double>(std::numeric_limits<uint32_t>::max())));
}

}  // namespace kvtier
