#include "daemon/kvctl/views.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "protocol/base/tier.h"
#include "protocol/base/units.h"

namespace kvctl {
namespace {

using json = nlohmann::json;
using kvtier::DaemonStats;
using kvtier::LowerTierStatsInfo;

double HitRatio(const DaemonStats& s) {
  const uint64_t asked = s.block_hits + s.block_misses;
  return asked ? static_cast<double>(s.block_hits) / static_cast<double>(asked) : 0.0;
}

json TierJson(const kvtier::TierStatsInfo& t) {
  const uint64_t pb = t.page_bytes;
  return json{{"name", t.name},
              {"page_bytes", pb},
              {"capacity_bytes", t.capacity_bytes()},
              {"used_bytes", t.used_bytes()},
              {"free_bytes", uint64_t{t.free_pages} * pb},
              {"leased_bytes", uint64_t{t.leased_pages} * pb},
              {"inflight_bytes", uint64_t{t.inflight_pages} * pb},
              {"cached_bytes", uint64_t{t.cached_pages} * pb},
              {"referenced_bytes", uint64_t{t.referenced_pages} * pb},
              {"quarantined_bytes", uint64_t{t.quarantined_pages} * pb},
              {"capacity_pages", t.capacity_pages},
              {"free_pages", t.free_pages},
              {"leased_pages", t.leased_pages},
              {"inflight_pages", t.inflight_pages},
              {"cached_pages", t.cached_pages},
              {"referenced_pages", t.referenced_pages},
              {"quarantined_pages", t.quarantined_pages},
              {"blocks", t.blocks},
              {"evictions", t.evictions},
              {"high_watermark", t.high_watermark},
              {"low_watermark", t.low_watermark},
              {"backend", t.backend},
              {"io_backend", t.io_backend},
              {"index_backend", t.index_backend},
              {"ready", t.ready}};
}

json LowerJson(const LowerTierStatsInfo& l) {
  json nodes = json::array();
  for (const auto& n : l.nodes) nodes.push_back(json{{"address", n.address}, {"up", n.up}, {"failures", n.failures}});
  json figures = json::object();
  for (const auto& f : l.figures) figures[f.key] = f.value;
  return json{{"name", l.name},
              {"describe", l.describe},
              {"available", l.available},
              {"write_policy", l.write_policy},
              {"hits", l.hits},
              {"promotions", l.promotions},
              {"puts", l.puts},
              {"put_failures", l.put_failures},
              {"puts_skipped", l.puts_skipped},
              {"puts_in_flight", l.puts_in_flight},
              {"puts_queued", l.puts_queued},
              {"put_backoffs", l.put_backoffs},
              {"quota_deletes", l.quota_deletes},
              {"checksum_failures", l.checksum_failures},
              {"authenticated", l.authenticated},
              {"nodes", nodes},
              {"figures", figures}};
}

// Every lower tier the same way: its own line, its nodes, what its mover did, its figures.
void PrintLower(const LowerTierStatsInfo& l) {
  std::printf("%s: %s%s\n", l.name.c_str(), l.describe.c_str(), l.available ? "" : " (cannot be asked now)");
  for (const auto& n : l.nodes) {
    std::printf("  node     %-21s %s, %llu failed batches\n", n.address.c_str(), n.up ? "up" : "DOWN (breaker open)",
                static_cast<unsigned long long>(n.failures));
  }
  std::printf("  hits     %llu, %llu promoted into host, %llu checksum failures\n",
              static_cast<unsigned long long>(l.hits), static_cast<unsigned long long>(l.promotions),
              static_cast<unsigned long long>(l.checksum_failures));
  std::printf("  puts     %s: %llu stored, %llu failed, %llu skipped, %u in flight, %u queued, %llu back-offs\n",
              l.write_policy.c_str(), static_cast<unsigned long long>(l.puts),
              static_cast<unsigned long long>(l.put_failures), static_cast<unsigned long long>(l.puts_skipped),
              l.puts_in_flight, l.puts_queued, static_cast<unsigned long long>(l.put_backoffs));
  if (l.quota_deletes) {
    std::printf("  quota    %llu values deleted for tenants past their quota\n",
                static_cast<unsigned long long>(l.quota_deletes));
  }
  std::string line;
  for (const auto& f : l.figures) {
    char v[64];
    std::snprintf(v, sizeof v, "%.15g", f.value);
    const std::string item = f.key + " " + v;
    if (!line.empty() && line.size() + item.size() > 90) {
      std::printf("  figures  %s\n", line.c_str());
      line.clear();
    }
    line += (line.empty() ? "" : ", ") + item;
  }
  if (!line.empty()) std::printf("  figures  %s\n", line.c_str());
}

// top: one screen of at most 80 x 24, redrawn every `interval_s`.
std::string Bar(double fraction, int width) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int full = static_cast<int>(fraction * width + 0.5);
  return "[" + std::string(static_cast<size_t>(full), '#') + std::string(static_cast<size_t>(width - full), '.') + "]";
}

// A session's pid: kvtierd's view, else "(pid)" as the engine reported it in its own PID
// namespace, "-" when neither is known; "!" after it when kvtierd cannot watch the process.
std::string PidText(const kvtier::SessionStatsInfo& x) {
  std::string p = x.pid > 0 ? std::to_string(x.pid) : x.engine_pid > 0 ? "(" + std::to_string(x.engine_pid) + ")" : "-";
  return x.watched ? p : p + "!";
}

std::string Rate(double bytes_per_s) { return kvtier::FormatBytes(static_cast<uint64_t>(bytes_per_s)) + "/s"; }

void DrawTop(const DaemonStats& s, const DaemonStats* prev, double dt, const std::string& socket) {
  std::vector<std::string> lines;
  char buf[256];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(buf, sizeof(buf), fmt, args...);
    lines.emplace_back(std::string(buf).substr(0, 80));
  };
  auto per_s = [&](uint64_t now, uint64_t before) {
    return prev && dt > 0 ? static_cast<double>(now - before) / dt : 0.0;
  };
  const uint64_t asked = s.block_hits + s.block_misses;
  double recent = HitRatio(s);
  if (prev && asked > prev->block_hits + prev->block_misses) {
    recent = static_cast<double>(s.block_hits - prev->block_hits) /
             static_cast<double>(asked - prev->block_hits - prev->block_misses);
  }
  add("kvtierd %s  up %s  %s", s.version.c_str(), Duration(s.uptime_s).c_str(), socket.c_str());
  add("hit ratio %5.1f%% (last %.0fs %5.1f%%)  lookups %.0f/s  sessions %u%s", 100 * HitRatio(s), dt > 0 ? dt : 1.0,
      100 * recent, per_s(s.lookups, prev ? prev->lookups : 0), s.session_count, s.draining ? "  DRAINING" : "");
  add("%s", "");
  add("%-5s %-32s %5s %17s %9s", "TIER", "USED", "", "USED / CAPACITY", "BLOCKS");
  uint64_t gpu_page = 0, host_page = 0;
  for (const auto& t : s.tiers) {
    if (t.tier == kvtier::TierKind::kGpu) gpu_page = t.page_bytes;
    if (t.tier == kvtier::TierKind::kHost) host_page = t.page_bytes;
    const double used = t.capacity_pages ? static_cast<double>(t.capacity_pages - t.free_pages) / t.capacity_pages : 0;
    const std::string amounts = kvtier::FormatBytes(t.used_bytes()) + " / " + kvtier::FormatBytes(t.capacity_bytes());
    add("%-5s %-32s %4.0f%% %17s %9llu", t.name.c_str(), Bar(used, 30).c_str(), 100 * used, amounts.c_str(),
        static_cast<unsigned long long>(t.blocks));
  }
  add("%s", "");
  add("%-14s %14s   %-14s %14s", "PATH", "RATE", "", "");
  add("%-14s %14s   %-14s %10.1f/s", "gpu -> host",
      Rate(per_s(s.gpu_demotions, prev ? prev->gpu_demotions : 0) * gpu_page).c_str(), "evictions",
      per_s(s.evictions, prev ? prev->evictions : 0));
  add("%-14s %14s   %-14s %10.1f/s", "host -> nvme", Rate(per_s(s.spill_bytes, prev ? prev->spill_bytes : 0)).c_str(),
      "refetched", per_s(s.refetches_after_evict, prev ? prev->refetches_after_evict : 0));
  add("%-14s %14s   %-14s %12u", "nvme -> host", Rate(per_s(s.fetch_bytes, prev ? prev->fetch_bytes : 0)).c_str(),
      "fetch queue", s.pending_fetches);
  add("checksum failures %llu   I/O errors %llu", static_cast<unsigned long long>(s.checksum_failures),
      static_cast<unsigned long long>(s.io_errors));
  (void)host_page;
  add("%s", "");
  add("%-5s %-14s %8s %-14s %7s %6s %9s", "ID", "ENGINE", "PID", "TENANT", "LEASED", "REFS", "REQ");
  size_t drawn = 0;
  for (const auto& x : s.sessions) {
    if (lines.size() >= 23) break;
    ++drawn;
    add("%-5llu %-14s %8s %-14s %7u %6u %9llu", static_cast<unsigned long long>(x.id),
        (x.control ? "(" + x.engine_name + ")" : x.engine_name).substr(0, 14).c_str(), PidText(x).c_str(),
        x.tenant.substr(0, 14).c_str(), x.leased_pages, x.referenced_blocks,
        static_cast<unsigned long long>(x.requests));
  }
  if (drawn < s.sessions.size()) add("  ... %u sessions in all", s.session_count);
  std::string screen = "\x1b[H\x1b[2J";
  for (size_t i = 0; i < lines.size() && i < 24; ++i) screen += lines[i] + (i + 1 < lines.size() ? "\n" : "");
  std::fwrite(screen.data(), 1, screen.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

std::string Duration(double s) {
  long t = static_cast<long>(s);
  char buf[64];
  if (t >= 86400)
    std::snprintf(buf, sizeof(buf), "%ldd%ldh", t / 86400, (t % 86400) / 3600);
  else if (t >= 3600)
    std::snprintf(buf, sizeof(buf), "%ldh%ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof(buf), "%ldm%lds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof(buf), "%.1fs", s);
  return buf;
}

int Die(const std::string& what, const kvtier::Status& s) {
  std::fprintf(stderr, "kvctl: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

int Status(const DaemonStats& s, const std::string& socket, bool as_json) {
  if (as_json) {
    json j{{"version", s.version},
           {"uptime_s", s.uptime_s},
           {"metrics_url", s.metrics_url},
           {"socket", socket},
           {"epoch", s.epoch},
           {"sessions", s.session_count},
           {"lookups", s.lookups},
           {"block_hits", s.block_hits},
           {"block_misses", s.block_misses},
           {"hit_ratio", HitRatio(s)},
           {"checksum_failures", s.checksum_failures},
           {"io_errors", s.io_errors},
           {"demotions", s.demotions},
           {"promotions", s.promotions},
           {"pending_fetches", s.pending_fetches},
           {"tiers", json::array()}};
    for (const auto& t : s.tiers) j["tiers"].push_back(TierJson(t));
    for (const auto& l : s.lower) j["lower"].push_back(LowerJson(l));
    if (s.events) {
      const auto& e = *s.events;
      j["events"] = json{{"publish", e.publish},         {"replay", e.replay},
                         {"subscribers", e.subscribers}, {"replay_peers", e.replay_peers},
                         {"events", e.events},           {"messages", e.messages},
                         {"dropped", e.dropped},         {"refused", e.refused},
                         {"retracted", e.retracted},     {"first_sequence", e.first_sequence}};
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("kvtierd %s, up %s, serving %s\n", s.version.c_str(), Duration(s.uptime_s).c_str(), socket.c_str());
  std::printf("metrics   %s\n", s.metrics_url.empty() ? "(disabled)" : s.metrics_url.c_str());
  std::printf("sessions  %u\n", s.session_count);
  std::printf("lookups   %llu, block hit ratio %.1f%% (%llu hits, %llu misses)\n",
              static_cast<unsigned long long>(s.lookups), 100.0 * HitRatio(s),
              static_cast<unsigned long long>(s.block_hits), static_cast<unsigned long long>(s.block_misses));
  std::printf("\n%-6s %12s %12s %7s %10s\n", "TIER", "CAPACITY", "USED", "USED%", "BLOCKS");
  for (const auto& t : s.tiers) {
    const double pct = t.capacity_pages ? 100.0 * (t.capacity_pages - t.free_pages) / t.capacity_pages : 0;
    std::printf("%-6s %12s %12s %6.1f%% %10llu\n", t.name.c_str(), kvtier::FormatBytes(t.capacity_bytes()).c_str(),
                kvtier::FormatBytes(t.used_bytes()).c_str(), pct, static_cast<unsigned long long>(t.blocks));
  }
  for (const auto& l : s.lower) {
    std::printf("%-6s %s; %llu hits, %llu puts\n", l.name.c_str(), l.describe.c_str(),
                static_cast<unsigned long long>(l.hits), static_cast<unsigned long long>(l.puts));
  }
  if (s.events) {
    const auto& e = *s.events;
    std::printf(
        "\nevents    %s%s%s, %u subscribers%s; %llu hashes in %llu messages, %llu dropped, %llu peers refused\n",
        e.publish.c_str(), e.replay.empty() ? "" : ", replay ", e.replay.c_str(), e.subscribers,
        e.replay.empty() ? "" : (", " + std::to_string(e.replay_peers) + " replay peers").c_str(),
        static_cast<unsigned long long>(e.events), static_cast<unsigned long long>(e.messages),
        static_cast<unsigned long long>(e.dropped), static_cast<unsigned long long>(e.refused));
  }
  return 0;
}

int Tiers(const DaemonStats& s, bool as_json) {
  if (as_json) {
    json j = json::array();
    for (const auto& t : s.tiers) j.push_back(TierJson(t));
    json out{{"tiers", j}};
    for (const auto& l : s.lower) out["lower"].push_back(LowerJson(l));
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  for (const auto& t : s.tiers) {
    std::printf("%s: %s in pages of %s (%s)\n", t.name.c_str(), kvtier::FormatBytes(t.capacity_bytes()).c_str(),
                kvtier::FormatBytes(t.page_bytes).c_str(), t.backend.c_str());
    const uint32_t sum =
        t.free_pages + t.leased_pages + t.inflight_pages + t.cached_pages + t.referenced_pages + t.quarantined_pages;
    std::printf("  pages    free %u + leased %u + inflight %u + cached %u + referenced %u", t.free_pages,
                t.leased_pages, t.inflight_pages, t.cached_pages, t.referenced_pages);
    if (t.quarantined_pages) std::printf(" + quarantined %u", t.quarantined_pages);
    std::printf(" = %u of %u%s\n", sum, t.capacity_pages, sum == t.capacity_pages ? "" : "  (MISMATCH)");
    std::printf("  blocks   %llu, evicted %llu\n", static_cast<unsigned long long>(t.blocks),
                static_cast<unsigned long long>(t.evictions));
    std::printf("  evicts   above %.0f%% used, down to %.0f%%\n", 100 * t.high_watermark, 100 * t.low_watermark);
    if (!t.io_backend.empty()) {
      std::printf("  io       %s, index %s%s\n", t.io_backend.c_str(), t.index_backend.c_str(),
                  t.ready ? "" : " (loading)");
    }
  }
  for (const auto& l : s.lower) PrintLower(l);
  if (s.demotions + s.promotions + s.checksum_failures + s.io_errors > 0) {
    std::printf("moves: %llu demotions, %llu promotions; %llu checksum failures, %llu I/O errors\n",
                static_cast<unsigned long long>(s.demotions), static_cast<unsigned long long>(s.promotions),
                static_cast<unsigned long long>(s.checksum_failures), static_cast<unsigned long long>(s.io_errors));
  }
  return 0;
}

int Sessions(const DaemonStats& s, bool as_json) {
  if (as_json) {
    json j = json::array();
    for (const auto& x : s.sessions) {
      j.push_back(json{{"id", x.id},
                       {"role", x.control ? "control" : "engine"},
                       {"engine_name", x.engine_name},
                       {"pid", x.pid},
                       {"engine_pid", x.engine_pid},
                       {"watched", x.watched},
                       {"uid", x.uid},
                       {"gid", x.gid},
                       {"tenant", x.tenant},
                       {"namespace", x.namespace_id},
                       {"model", x.model},
                       {"leased_pages", x.leased_pages},
                       {"referenced_blocks", x.referenced_blocks},
                       {"requests", x.requests},
                       {"connected_s", x.connected_s}});
    }
    std::cout << json{{"sessions", j}}.dump(2) << "\n";
    return 0;
  }
  std::printf("%-5s %-8s %-16s %8s %-18s %-16s %7s %7s %9s %9s\n", "ID", "ROLE", "ENGINE", "PID", "TENANT", "NAMESPACE",
              "LEASED", "REFS", "REQUESTS", "AGE");
  bool own_ns = false, unwatched = false;
  for (const auto& x : s.sessions) {
    own_ns |= x.pid == 0 && x.engine_pid != 0;
    unwatched |= !x.watched;
    std::printf("%-5llu %-8s %-16s %8s %-18s %-16s %7u %7u %9llu %9s\n", static_cast<unsigned long long>(x.id),
                x.control ? "control" : "engine", x.engine_name.substr(0, 16).c_str(), PidText(x).c_str(),
                x.tenant.substr(0, 18).c_str(), x.namespace_id.empty() ? "-" : x.namespace_id.c_str(), x.leased_pages,
                x.referenced_blocks, static_cast<unsigned long long>(x.requests), Duration(x.connected_s).c_str());
  }
  if (own_ns) std::printf("(pid): in the engine's own PID namespace, as it reported it; kvtierd cannot see it\n");
  if (unwatched) {
    std::printf(
        "!: kvtierd cannot watch this process (no SO_PEERPIDFD, pid not visible); its leased pages stay "
        "quarantined until a restart once its session ends\n");
  }
  return 0;
}

int Agents(const DaemonStats& s, bool as_json) {
  if (as_json) {
    json j = json::array();
    for (const auto& a : s.agent_sessions) {
      j.push_back(json{{"tenant", a.tenant},
                       {"session", a.session},
                       {"state", a.state},
                       {"ttl_left_s", static_cast<double>(a.ttl_left_ms) / 1000.0},
                       {"requests", a.requests},
                       {"hit_tokens", a.hit_tokens},
                       {"blocks", a.blocks},
                       {"gpu_blocks", a.gpu_blocks},
                       {"host_blocks", a.host_blocks},
                       {"protected_blocks", a.protected_blocks}});
    }
    std::cout << json{{"agent_sessions", j}}.dump(2) << "\n";
    return 0;
  }
  std::printf("%-18s %-24s %-7s %9s %8s %10s %7s %6s %6s %9s\n", "TENANT", "SESSION", "STATE", "TTL LEFT", "REQUESTS",
              "HIT TOKENS", "BLOCKS", "GPU", "HOST", "PROTECTED");
  for (const auto& a : s.agent_sessions) {
    std::printf("%-18s %-24s %-7s %9s %8llu %10llu %7u %6u %6u %9u\n", a.tenant.substr(0, 18).c_str(),
                a.session.substr(0, 24).c_str(), a.state.c_str(),
                a.state == "live" ? Duration(static_cast<double>(a.ttl_left_ms) / 1000.0).c_str() : "-",
                static_cast<unsigned long long>(a.requests), static_cast<unsigned long long>(a.hit_tokens), a.blocks,
                a.gpu_blocks, a.host_blocks, a.protected_blocks);
  }
  return 0;
}

int Top(kvtier::ControlClient& c, const std::string& socket, double interval_s, int iterations, bool as_json) {
  std::optional<DaemonStats> prev;
  auto last = std::chrono::steady_clock::now();
  for (int i = 0; iterations <= 0 || i < iterations; ++i) {
    auto s = c.Stats(true);
    if (!s.ok()) return Die("top", s.status());
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - last).count();
    last = now;
    if (as_json) {
      json j{{"hit_ratio", HitRatio(*s)},
             {"sessions", s->session_count},
             {"draining", s->draining},
             {"pending_fetches", s->pending_fetches},
             {"tiers", json::array()}};
      if (prev && dt > 0) {
        j["spill_bytes_per_s"] = static_cast<double>(s->spill_bytes - prev->spill_bytes) / dt;
        j["fetch_bytes_per_s"] = static_cast<double>(s->fetch_bytes - prev->fetch_bytes) / dt;
        j["lookups_per_s"] = static_cast<double>(s->lookups - prev->lookups) / dt;
      }
      for (const auto& t : s->tiers) j["tiers"].push_back(TierJson(t));
      std::cout << j.dump() << "\n" << std::flush;
    } else {
      DrawTop(*s, prev ? &*prev : nullptr, prev ? dt : 0, socket);
    }
    prev = std::move(*s);
    if (iterations <= 0 || i + 1 < iterations) {
      std::this_thread::sleep_for(std::chrono::duration<double>(interval_s));
    }
  }
  if (!as_json) std::printf("\n");
  return 0;
}

}  // namespace kvctl
