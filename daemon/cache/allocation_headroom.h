#pragma once
// AllocationHeadroom: how many pages of a pool tier to keep free (or already on their way
// down) so that an Allocate finds one without waiting for a demotion.
//
// A page freed by demotion arrives one demotion round trip after the demotion starts (an
// NVMe spill: its write, an index batch and turns of the event loop). Engines that take
// `rate` pages a second therefore need rate x round_trip pages free when the background
// eviction starts, or they wait. The estimate is `factor` x rate x round_trip, where rate
// is the recent allocation rate (an exponentially decaying average with time constant
// `window_s`, so an idle tier's headroom decays to nothing and it caches up to its
// watermarks again) and round_trip the recent demotions' mean (each new one weighs 1/8).
//
// Fed by the owner (CacheManager, control thread) with the tier's cumulative count of
// pages taken from its free pool and with each demotion's round trip. Not thread-safe.

#include <cstdint>

namespace kvtier {

class AllocationHeadroom {
 public:
  explicit AllocationHeadroom(double factor = 2.0, double window_s = 1.0) : factor_(factor), window_s_(window_s) {}

  // The tier has handed out `taken_total` pages since it started (a cumulative count).
  void NoteTaken(int64_t now_ns, uint64_t taken_total);
  // A demotion took `seconds` from start to its page being free.
  void NoteRoundTrip(double seconds);

  // Pages to keep free or in flight at `now_ns`: 0 until a round trip has been seen.
  uint32_t Pages(int64_t now_ns) const;
  double rate_per_s(int64_t now_ns) const;  // decayed to `now_ns`
  double round_trip_s() const { return round_trip_s_; }

 private:
  double factor_;
  double window_s_;
  double rate_ = 0;  // pages per second as of last_ns_
  int64_t last_ns_ = -1;
  uint64_t last_total_ = 0;
  double round_trip_s_ = 0;
  bool seen_trip_ = false;
};

}  // namespace kvtier
