// kvctl: the operator's view of kvtierd. Speaks the kvtier protocol as a control session.
//
//   kvctl status [--json]     daemon, tiers and hit ratio at a glance
//   kvctl tiers [--json]      per-tier page states (they sum to capacity)
//   kvctl sessions [--json]   connected engines and control clients
//   kvctl verify [--json]     scrub the NVMe tier: verify every block, drop what fails
//
// With no --socket, kvctl uses $KVTIER_SOCKET or kvtierd's default ./var/kvtierd.sock.
// Exit status: 0 success, 1 the daemon did not answer or refused, 2 usage error.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "engine/client.h"
#include "protocol/base/defaults.h"
#include "protocol/base/units.h"

namespace {

using json = nlohmann::json;
using kvtier::DaemonStats;

std::string Duration(double s) {
  long t = static_cast<long>(s);
  char buf[64];
  if (t >= 86400) std::snprintf(buf, sizeof(buf), "%ldd%ldh", t / 86400, (t % 86400) / 3600);
  else if (t >= 3600) std::snprintf(buf, sizeof(buf), "%ldh%ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) std::snprintf(buf, sizeof(buf), "%ldm%lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof(buf), "%.1fs", s);
  return buf;
}

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
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("kvtierd %s, up %s, serving %s\n", s.version.c_str(), Duration(s.uptime_s).c_str(),
              socket.c_str());
  std::printf("metrics   %s\n", s.metrics_url.empty() ? "(disabled)" : s.metrics_url.c_str());
  std::printf("sessions  %u\n", s.session_count);
  std::printf("lookups   %llu, block hit ratio %.1f%% (%llu hits, %llu misses)\n",
              static_cast<unsigned long long>(s.lookups), 100.0 * HitRatio(s),
              static_cast<unsigned long long>(s.block_hits),
              static_cast<unsigned long long>(s.block_misses));
  std::printf("\n%-6s %12s %12s %7s %10s\n", "TIER", "CAPACITY", "USED", "USED%", "BLOCKS");
  for (const auto& t : s.tiers) {
    const double pct = t.capacity_pages ? 100.0 * (t.capacity_pages - t.free_pages) / t.capacity_pages : 0;
    std::printf("%-6s %12s %12s %6.1f%% %10llu\n", t.name.c_str(),
                kvtier::FormatBytes(t.capacity_bytes()).c_str(), kvtier::FormatBytes(t.used_bytes()).c_str(),
                pct, static_cast<unsigned long long>(t.blocks));
  }
  return 0;
}

int Tiers(const DaemonStats& s, bool as_json) {
  if (as_json) {
    json j = json::array();
    for (const auto& t : s.tiers) j.push_back(TierJson(t));
    std::cout << json{{"tiers", j}}.dump(2) << "\n";
    return 0;
  }
  for (const auto& t : s.tiers) {
    std::printf("%s: %s in pages of %s (%s)\n", t.name.c_str(),
                kvtier::FormatBytes(t.capacity_bytes()).c_str(), kvtier::FormatBytes(t.page_bytes).c_str(),
                t.backend.c_str());
    const uint32_t sum = t.free_pages + t.leased_pages + t.inflight_pages + t.cached_pages + t.referenced_pages +
                         t.quarantined_pages;
    std::printf("  pages    free %u + leased %u + inflight %u + cached %u + referenced %u", t.free_pages,
                t.leased_pages, t.inflight_pages, t.cached_pages, t.referenced_pages);
    if (t.quarantined_pages) std::printf(" + quarantined %u", t.quarantined_pages);
    std::printf(" = %u of %u%s\n", sum, t.capacity_pages, sum == t.capacity_pages ? "" : "  (MISMATCH)");
    std::printf("  blocks   %llu, evicted %llu\n", static_cast<unsigned long long>(t.blocks),
                static_cast<unsigned long long>(t.evictions));
    std::printf("  evicts   above %.0f%% used, down to %.0f%%\n", 100 * t.high_watermark,
                100 * t.low_watermark);
    if (!t.io_backend.empty()) {
      std::printf("  io       %s, index %s%s\n", t.io_backend.c_str(), t.index_backend.c_str(),
                  t.ready ? "" : " (loading)");
    }
  }
  if (s.demotions + s.promotions + s.checksum_failures + s.io_errors > 0) {
    std::printf("moves: %llu demotions, %llu promotions; %llu checksum failures, %llu I/O errors\n",
                static_cast<unsigned long long>(s.demotions), static_cast<unsigned long long>(s.promotions),
                static_cast<unsigned long long>(s.checksum_failures),
                static_cast<unsigned long long>(s.io_errors));
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
  std::printf("%-5s %-8s %-16s %8s %-18s %-16s %7s %7s %9s %9s\n", "ID", "ROLE", "ENGINE", "PID",
              "TENANT", "NAMESPACE", "LEASED", "REFS", "REQUESTS", "AGE");
  for (const auto& x : s.sessions) {
    std::printf("%-5llu %-8s %-16s %8d %-18s %-16s %7u %7u %9llu %9s\n",
                static_cast<unsigned long long>(x.id), x.control ? "control" : "engine",
                x.engine_name.substr(0, 16).c_str(), x.pid, x.tenant.substr(0, 18).c_str(),
                x.namespace_id.empty() ? "-" : x.namespace_id.c_str(), x.leased_pages,
                x.referenced_blocks, static_cast<unsigned long long>(x.requests),
                Duration(x.connected_s).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kvctl: inspect and steer kvtierd, the node-local KV-cache tiering daemon.\n\n"
      "Every command talks to the daemon over its Unix socket. With no --socket, kvctl uses\n"
      "$KVTIER_SOCKET, else ./var/kvtierd.sock (kvtierd's embedded default), so both work\n"
      "from the same directory with no flags. Exit status: 0 on success, 1 when the daemon\n"
      "does not answer or refuses, 2 on a usage error."};
  app.require_subcommand(1);
  std::string socket;
  bool as_json = false;
  app.add_option("-s,--socket", socket, "kvtierd's Unix socket");
  app.add_flag("--json", as_json, "Print one JSON object instead of a table");
  auto* status = app.add_subcommand("status", "Version, uptime, metrics URL, sessions, tier usage, hit ratio");
  auto* tiers = app.add_subcommand("tiers", "Each tier's page states (free + leased + inflight + cached + referenced = capacity)");
  auto* sessions = app.add_subcommand("sessions", "Connected engines and control clients");
  auto* verify = app.add_subcommand(
      "verify", "Scrub the NVMe tier: read every indexed block, verify its checksum, drop those that fail");
  for (auto* sub : {status, tiers, sessions, verify}) {
    sub->add_option("-s,--socket", socket, "kvtierd's Unix socket");
    sub->add_flag("--json", as_json, "Print JSON");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  kvtier::ClientOptions o;
  o.control = true;
  o.engine_name = "kvctl";
  o.socket_path = kvtier::ResolveSocketPath(socket.c_str());
  o.timeout_ms = 10'000;
  auto client = kvtier::Client::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "kvctl: %s\n", client.status().message().c_str());
    return 1;
  }
  if (verify->parsed()) {
    auto v = (*client)->Verify();
    if (!v.ok()) {
      std::fprintf(stderr, "kvctl: verify: %s\n", v.status().ToString().c_str());
      return 1;
    }
    if (as_json) {
      std::cout << json{{"checked", v->checked}, {"dropped", v->dropped}, {"seconds", v->seconds}}.dump(2) << "\n";
    } else {
      std::printf("verified %llu NVMe blocks in %.2f s: %llu dropped (bytes did not match their checksum)\n",
                  static_cast<unsigned long long>(v->checked), v->seconds,
                  static_cast<unsigned long long>(v->dropped));
    }
    return 0;
  }
  auto stats = (*client)->Stats(sessions->parsed());
  if (!stats.ok()) {
    std::fprintf(stderr, "kvctl: %s\n", stats.status().ToString().c_str());
    return 1;
  }
  if (status->parsed()) return Status(*stats, o.socket_path, as_json);
  if (tiers->parsed()) return Tiers(*stats, as_json);
  return Sessions(*stats, as_json);
}
