#include "engine/tools/trace.h"

#include <cerrno>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

namespace kvtier {
namespace {

struct PairHash {
  size_t operator()(const std::pair<uint32_t, uint64_t>& p) const {
    return std::hash<uint64_t>()(p.second * 0x9e3779b97f4a7c15ull ^ p.first);
  }
};

}  // namespace

Result<Trace> LoadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read trace " + path);
  std::vector<TraceRequest> requests;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    TraceRequest r;
    try {
      const auto j = nlohmann::json::parse(line);
      r.timestamp_ms = j.value("timestamp", int64_t{0});
      r.input_length = j.value("input_length", 0u);
      r.output_length = j.value("output_length", 0u);
      for (const auto& h : j.at("hash_ids")) r.hash_ids.push_back(h.get<uint64_t>());
      if (auto s = j.find("session_id"); s != j.end() && !s->is_null()) {
        r.session_id = s->is_string() ? s->get<std::string>() : s->dump();
      }
      if (auto t = j.find("cache_ttl_s"); t != j.end() && !t->is_null()) r.cache_ttl_s = t->get<double>();
      r.session_end = j.value("session_end", false);
    } catch (const std::exception& e) {
      return InvalidArgument(path + ":" + std::to_string(lineno) + ": not a trace request: " + e.what());
    }
    requests.push_back(std::move(r));
  }
  if (requests.empty()) return InvalidArgument(path + " holds no requests");
  return MakeTrace(path.substr(path.rfind('/') + 1), std::move(requests));
}

Trace MakeTrace(std::string name, std::vector<TraceRequest> requests) {
  Trace t;
  t.name = std::move(name);
  std::unordered_map<std::pair<uint32_t, uint64_t>, uint32_t, PairHash> ids;
  for (TraceRequest& r : requests) {
    r.blocks.clear();
    uint32_t prev = 0xffffffffu;
    for (uint64_t h : r.hash_ids) {
      auto [it, fresh] = ids.try_emplace({prev, h}, static_cast<uint32_t>(ids.size()));
      r.blocks.push_back(it->second);
      prev = it->second;
    }
    t.total_blocks += r.blocks.size();
    t.has_sessions = t.has_sessions || !r.session_id.empty();
  }
  t.requests = std::move(requests);
  t.unique_blocks = static_cast<uint32_t>(ids.size());
  return t;
}

Status WriteTrace(const Trace& trace, const std::string& path) {
  std::ofstream out(path);
  if (!out) return ErrnoStatus(errno, "cannot write trace " + path);
  for (const TraceRequest& r : trace.requests) {
    nlohmann::json j{{"timestamp", r.timestamp_ms},
                     {"input_length", r.input_length},
                     {"output_length", r.output_length},
                     {"hash_ids", r.hash_ids}};
    if (!r.session_id.empty()) j["session_id"] = r.session_id;
    if (r.cache_ttl_s >= 0) j["cache_ttl_s"] = r.cache_ttl_s;
    if (r.session_end) j["session_end"] = true;
    out << j.dump() << "\n";
  }
  out.flush();
  if (!out) return ErrnoStatus(errno, "cannot write trace " + path);
  return Status::Ok();
}

}  // namespace kvtier
