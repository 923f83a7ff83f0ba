// kvtier-sim: the daemon's eviction policies over a request trace, one tier (host) and two
// (host + NVMe), against Belady's MIN; hit ratios at fractions of the trace's unique blocks.
//
//   kvtier-sim --trace FILE [--json] [--fractions 0.01,0.05,0.2] [--nvme-factor 4]
//   kvtier-sim --synthetic SHAPE [--requests N] [--seed S] [--write-trace FILE] ...
//
// Hits are prefix hits: block i of a request is a hit only if blocks 0..i all are.
// A trace with session fields (session_id, cache_ttl_s, session_end) also gets the default
// policy with those hints (rows "hints": true); every other row, and every row of a trace
// without them, has "hints": false.
// Two tiers: the host tier at the fraction, an NVMe tier nvme-factor times larger behind it;
// Belady's figure for two tiers is MIN over their combined size (an upper bound).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/tools/cache_sim.h"
#include "storage/policy/eviction_policy.h"

int main(int argc, char** argv) {
  using namespace kvtier;
  CLI::App app{"kvtier-sim: eviction policies over a KV request trace, against Belady's optimum"};
  std::string path, shape, write_path, fractions_arg = "0.01,0.05,0.2";
  bool json = false;
  double nvme_factor = 4;
  uint32_t requests = 4000;
  uint64_t seed = 1;
  auto* trace_opt = app.add_option("--trace", path, "Trace in the Mooncake format (JSON lines with hash_ids)");
  auto* shape_opt = app.add_option("--synthetic", shape,
                                   "A generated trace instead: conversation, conversation-long, recency, zipf, scan, "
                                   "agentic");
  trace_opt->excludes(shape_opt);
  app.add_option("--requests", requests, "Requests of a --synthetic trace")->check(CLI::Range(1u, 10000000u));
  app.add_option("--seed", seed, "Seed of a --synthetic trace");
  app.add_option("--write-trace", write_path, "Also write the trace (Mooncake format) to this file");
  app.add_option("--fractions", fractions_arg, "Host capacities as fractions of the unique blocks");
  app.add_option("--nvme-factor", nvme_factor, "NVMe capacity as a multiple of the host capacity");
  app.add_flag("--json", json, "Print one JSON object");
  CLI11_PARSE(app, argc, argv);
  if (path.empty() && shape.empty()) {
    std::fprintf(stderr, "kvtier-sim: give --trace FILE or --synthetic SHAPE\n");
    return 2;
  }
  std::vector<double> fractions;
  {
    std::stringstream ss(fractions_arg);
    std::string f;
    while (std::getline(ss, f, ',')) {
      char* end = nullptr;
      const double v = std::strtod(f.c_str(), &end);
      if (f.empty() || *end != '\0' || !(v > 0 && v <= 1)) {
        std::fprintf(stderr, "kvtier-sim: --fractions: '%s' is not a fraction in (0, 1]\n", f.c_str());
        return 2;
      }
      fractions.push_back(v);
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto trace = path.empty() ? GenerateTrace(shape, requests, seed) : LoadTrace(path);
  if (!trace.ok()) {
    std::fprintf(stderr, "kvtier-sim: %s\n", trace.status().ToString().c_str());
    return path.empty() ? 2 : 1;
  }
  if (!write_path.empty()) {
    if (Status s = WriteTrace(*trace, write_path); !s.ok()) {
      std::fprintf(stderr, "kvtier-sim: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  struct Row {
    std::string policy;
    int tiers;
    double fraction;
    double hit_ratio;
    uint64_t nvme_writes;
    bool hints = false;
  };
  std::vector<Row> rows;
  // The default policy runs both ways on a trace with session hints.
  std::vector<bool> hint_modes = {false};
  if (trace->has_sessions) hint_modes.push_back(true);
  for (double f : fractions) {
    const uint64_t cap = std::max<uint64_t>(1, static_cast<uint64_t>(f * trace->unique_blocks));
    for (std::string_view p : EvictionPolicyNames()) {
      for (bool hints : hint_modes) {
        if (hints && p != kDefaultEvictionPolicy) continue;
        SimConfig c;
        c.host_policy = std::string(p);
        c.host_capacity = cap;
        c.hints = hints;
        auto r = Simulate(*trace, c);
        if (!r.ok()) {
          std::fprintf(stderr, "kvtier-sim: %s\n", r.status().ToString().c_str());
          return 1;
        }
        rows.push_back({std::string(p), 1, f, r->hit_ratio(), 0, hints});
      }
    }
    rows.push_back({"belady", 1, f, SimulateBelady(*trace, cap).hit_ratio(), 0});
    const uint64_t nvme = static_cast<uint64_t>(cap * nvme_factor);
    for (std::string_view p : {std::string_view("lru"), kDefaultEvictionPolicy}) {
      for (bool admit : {false, true}) {
        for (bool hints : hint_modes) {
          if (hints && p != kDefaultEvictionPolicy) continue;
          SimConfig c;
          c.host_policy = std::string(p);
          c.host_capacity = cap;
          c.nvme_capacity = nvme;
          c.nvme_admit_reused_only = admit;
          c.hints = hints;
          auto r = Simulate(*trace, c);
          if (!r.ok()) return 1;
          rows.push_back(
              {std::string(p) + (admit ? "+admit-reused" : ""), 2, f, r->hit_ratio(), r->nvme_writes, hints});
        }
      }
    }
    rows.push_back({"belady", 2, f, SimulateBelady(*trace, cap + nvme).hit_ratio(), 0});
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (json) {
    nlohmann::json j{{"trace", trace->name},
                     {"requests", trace->requests.size()},
                     {"blocks", trace->total_blocks},
                     {"unique_blocks", trace->unique_blocks},
                     {"default_policy", kDefaultEvictionPolicy},
                     {"nvme_factor", nvme_factor},
                     {"seconds", secs},
                     {"results", nlohmann::json::array()}};
    for (const Row& r : rows) {
      nlohmann::json e{{"policy", r.policy},
                       {"tiers", r.tiers},
                       {"capacity_fraction", r.fraction},
                       {"hit_ratio", r.hit_ratio},
                       {"hints", r.hints}};
      if (r.tiers == 2) e["nvme_writes"] = r.nvme_writes;
      j["results"].push_back(e);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("kvtier-sim %s: %zu requests, %llu blocks, %u unique; default policy %s (%.1f s)\n\n",
              trace->name.c_str(), trace->requests.size(), static_cast<unsigned long long>(trace->total_blocks),
              trace->unique_blocks, std::string(kDefaultEvictionPolicy).c_str(), secs);
  for (int tiers : {1, 2}) {
    std::printf(tiers == 1 ? "one tier (host), capacity as a fraction of unique blocks:\n"
                           : "\ntwo tiers (host at the fraction + NVMe x%.0f), [NVMe writes]:\n",
                nvme_factor);
    std::printf("%-28s", "policy");
    for (double f : fractions) std::printf(" %9.0f%%", 100 * f);
    std::printf("\n");
    auto label = [](const Row& r) { return r.policy + (r.hints ? " +hints" : ""); };
    std::vector<std::string> names;
    for (const Row& r : rows) {
      if (r.tiers == tiers && std::find(names.begin(), names.end(), label(r)) == names.end()) {
        names.push_back(label(r));
      }
    }
    for (const std::string& n : names) {
      std::printf("%-28s", n.c_str());
      for (double f : fractions) {
        for (const Row& r : rows) {
          if (r.tiers == tiers && label(r) == n && r.fraction == f) std::printf(" %9.1f%%", 100 * r.hit_ratio);
        }
      }
      std::printf("\n");
    }
  }
  return 0;
}
