// Synthetic traces (trace.h). The random draws are written out (not <random>'s
// distributions, whose results differ between standard libraries) so a seed names the same
// trace everywhere.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/tools/trace.h"

namespace kvtier {
namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t Next() {  // splitmix64
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  // Integer in [lo, hi].
  uint32_t Between(uint32_t lo, uint32_t hi) { return lo + static_cast<uint32_t>(Next() % (hi - lo + 1)); }
  double Exponential(double mean) { return -mean * std::log(1.0 - Uniform()); }
  // Pareto with shape a and scale 1: >= 1, heavy tailed.
  double Pareto(double a) { return std::pow(1.0 - Uniform(), -1.0 / a); }

 private:
  uint64_t s_;
};

constexpr uint64_t kSharedRoot = 0;

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}

  std::vector<uint64_t> Fresh(uint32_t n) {
    std::vector<uint64_t> v;
    for (uint32_t i = 0; i < n; ++i) v.push_back(next_id_++);
    return v;
  }

  // Chats open (30%) or continue; a continued chat is a uniformly chosen open one half the
  // time, else one `gap_mean` back from the newest on average. A chat ends after a turn
  // with probability 0.2.
  void Conversations(uint32_t n, double gap_mean) {
    std::vector<std::vector<uint64_t>> open;
    while (out_.size() < n) {
      if (open.empty() || rng_.Uniform() < 0.3) {
        std::vector<uint64_t> c{kSharedRoot};
        for (uint64_t id : Fresh(rng_.Between(1, 30))) c.push_back(id);
        open.push_back(c);
        Emit(open.back());
        continue;
      }
      size_t k;
      if (rng_.Uniform() < 0.5) {
        k = rng_.Next() % open.size();
      } else {
        const size_t back = static_cast<size_t>(rng_.Exponential(gap_mean));
        k = back >= open.size() ? 0 : open.size() - 1 - back;
      }
      for (uint64_t id : Fresh(rng_.Between(1, 6))) open[k].push_back(id);
      Emit(open[k]);
      if (rng_.Uniform() < 0.2) open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }

  void Recency(uint32_t n) {
    std::vector<std::vector<uint64_t>> chains;
    for (int i = 0; i < 30; ++i) chains.push_back(Fresh(20));
    for (uint32_t i = 0; i < n; ++i) {
      auto& c = chains[i % chains.size()];
      if (rng_.Uniform() < 0.1) c = Fresh(20);
      Emit(c);
    }
  }

  void Zipf(uint32_t n) {
    std::vector<std::vector<uint64_t>> prompts;
    for (int i = 0; i < 200; ++i) prompts.push_back(Fresh(rng_.Between(2, 20)));
    for (uint32_t i = 0; i < n; ++i) {
      const size_t k = std::min<size_t>(static_cast<size_t>(rng_.Pareto(1.2)) - 1, prompts.size() - 1);
      std::vector<uint64_t> r = prompts[k];
      for (uint64_t id : Fresh(rng_.Between(1, 15))) r.push_back(id);
      Emit(r);
    }
  }

  void Scan(uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) Emit(Fresh(10));
  }

  std::vector<TraceRequest> Take() { return std::move(out_); }

 private:
  void Emit(const std::vector<uint64_t>& ids) {
    TraceRequest r;
    r.timestamp_ms = static_cast<int64_t>(out_.size()) * 100;
    r.input_length = static_cast<uint32_t>(ids.size() * 512);
    r.output_length = 100;
    r.hash_ids = ids;
    out_.push_back(std::move(r));
  }

  Rng rng_;
  uint64_t next_id_ = kSharedRoot + 1;
  std::vector<TraceRequest> out_;
};

}  // namespace

std::vector<std::string_view> TraceShapes() { return {"conversation", "conversation-long", "recency", "zipf", "scan"}; }

Result<Trace> GenerateTrace(std::string_view shape, uint32_t requests, uint64_t seed) {
  if (requests == 0) return InvalidArgument("a trace needs at least one request");
  Generator g(seed);
  if (shape == "conversation")
    g.Conversations(requests, 3);
  else if (shape == "conversation-long")
    g.Conversations(requests, 50);
  else if (shape == "recency")
    g.Recency(requests);
  else if (shape == "zipf")
    g.Zipf(requests);
  else if (shape == "scan")
    g.Scan(requests);
  else
    return InvalidArgument("unknown trace shape '" + std::string(shape) +
                           "' (conversation, conversation-long, recency, zipf, scan)");
  return MakeTrace(std::string(shape) + "-" + std::to_string(seed), g.Take());
}

}  // namespace kvtier
