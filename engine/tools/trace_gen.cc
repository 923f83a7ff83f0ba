// Synthetic traces (trace.h). The random draws are written out (not <random>'s
// distributions, whose results differ between standard libraries) so a seed names the same
// trace everywhere.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
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
  // Standard normal (Box-Muller).
  double Normal() { return std::sqrt(-2.0 * std::log(1.0 - Uniform())) * std::cos(6.283185307179586 * Uniform()); }
  // Log-normal with this mean and sigma of the log.
  double LogNormal(double mean, double sigma) {
    return std::exp(std::log(mean) - sigma * sigma / 2 + sigma * Normal());
  }
  // At least 1, geometric with this mean.
  uint32_t Geometric(double mean) {
    return 1 +
           static_cast<uint32_t>(std::floor(std::log(1.0 - Uniform()) / std::log(1.0 - 1.0 / std::max(mean, 1.0001))));
  }
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

  // Agentic sessions (AgentParams): each a chain of turns over one growing context.
  void Agentic(const AgentParams& p) {
    auto blocks = [&](double tokens) { return std::max<uint32_t>(1, static_cast<uint32_t>(tokens * p.scale / 512)); };
    std::vector<std::vector<uint64_t>> prompts;
    for (uint32_t i = 0; i < std::max<uint32_t>(1, p.system_prompts); ++i) {
      prompts.push_back(Fresh(blocks(p.system_prompt_tokens)));
    }
    double start = 0;
    for (uint32_t s = 0; s < p.sessions; ++s) {
      start += rng_.Exponential(p.session_gap_s);
      const size_t sp = std::min<size_t>(static_cast<size_t>(rng_.Pareto(1.2)) - 1, prompts.size() - 1);
      std::vector<uint64_t> context = prompts[sp];
      for (uint64_t id : Fresh(blocks(rng_.Exponential(p.task_tokens)))) context.push_back(id);
      const uint32_t turns = rng_.Geometric(p.turns_mean);
      const bool abandoned = rng_.Uniform() < p.abandon_rate;
      const uint32_t fork_at = rng_.Uniform() < p.subagent_rate ? rng_.Between(0, turns - 1) : turns;
      Session(p, std::to_string(s), std::move(context), turns, abandoned, fork_at, start, blocks);
    }
    std::stable_sort(out_.begin(), out_.end(),
                     [](const TraceRequest& a, const TraceRequest& b) { return a.timestamp_ms < b.timestamp_ms; });
  }

 private:
  void Emit(const std::vector<uint64_t>& ids) {
    TraceRequest r;
    r.timestamp_ms = static_cast<int64_t>(out_.size()) * 100;
    r.input_length = static_cast<uint32_t>(ids.size() * 512);
    r.output_length = 100;
    r.hash_ids = ids;
    out_.push_back(std::move(r));
  }

  // One session's turns from time `t` (seconds); a subagent forks from the context at turn
  // `fork_at` and runs before the parent's next turn. Returns when the session's last turn
  // was sent.
  template <class Blocks>
  double Session(const AgentParams& p, const std::string& id, std::vector<uint64_t> context, uint32_t turns,
                 bool abandoned, uint32_t fork_at, double t, const Blocks& blocks) {
    for (uint32_t turn = 0; turn < turns; ++turn) {
      double pause = rng_.LogNormal(p.pause_mean_s, p.pause_sigma);
      const bool last = turn + 1 == turns;
      if (turn == fork_at && !last) {
        // The subagent starts from the parent's context with a task of its own; the parent
        // waits for it.
        std::vector<uint64_t> sub = context;
        for (uint64_t b : Fresh(blocks(p.task_tokens / 2.0))) sub.push_back(b);
        const double done = Session(p, id + ".sub", std::move(sub), rng_.Geometric(p.subagent_turns), false, UINT32_MAX,
                                    t + 1.0, blocks);
        pause = std::max(pause, done - t + 1.0);
      }
      TraceRequest r;
      r.timestamp_ms = static_cast<int64_t>(t * 1000);
      r.input_length = static_cast<uint32_t>(context.size() * 512);
      r.output_length = static_cast<uint32_t>(p.output_tokens * p.scale) + 1;
      r.hash_ids = context;
      r.session_id = id;
      // The client's hint: how long it expects to be away (its estimate of the pause, with a
      // margin); a client that abandons does not know it will.
      r.cache_ttl_s = std::round(pause * std::exp(p.ttl_noise_sigma * rng_.Normal()) * p.ttl_margin * 10) / 10;
      r.session_end = last && !abandoned;
      out_.push_back(std::move(r));
      if (last) return t;
      t += pause;
      for (uint64_t b : Fresh(blocks(rng_.Exponential(p.turn_tokens)))) context.push_back(b);
    }
    return t;
  }

  Rng rng_;
  uint64_t next_id_ = kSharedRoot + 1;
  std::vector<TraceRequest> out_;
};

}  // namespace

std::vector<std::string_view> TraceShapes() {
  return {"conversation", "conversation-long", "recency", "zipf", "scan", "agentic"};
}

Result<Trace> GenerateAgenticTrace(const AgentParams& p, uint64_t seed) {
  if (p.sessions == 0 || !(p.scale > 0) || !(p.pause_mean_s > 0) || !(p.turns_mean >= 1)) {
    return InvalidArgument("agentic trace: sessions, scale, pause_mean_s must be positive and turns_mean >= 1");
  }
  Generator g(seed);
  g.Agentic(p);
  return MakeTrace("agentic-" + std::to_string(seed), g.Take());
}

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
  else if (shape == "agentic") {
    // Sessions enough for about `requests` requests (a subagent adds a few turns).
    AgentParams p;
    p.sessions =
        std::max<uint32_t>(1, static_cast<uint32_t>(requests / (p.turns_mean + p.subagent_rate * p.subagent_turns)));
    return GenerateAgenticTrace(p, seed);
  } else
    return InvalidArgument("unknown trace shape '" + std::string(shape) +
                           "' (conversation, conversation-long, recency, zipf, scan, agentic)");
  return MakeTrace(std::string(shape) + "-" + std::to_string(seed), g.Take());
}

}  // namespace kvtier
