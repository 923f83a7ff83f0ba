// kvctl: the operator's view of kvtierd. Speaks the kvtier protocol as a control session.
//
//   kvctl status [--json]     daemon, tiers and hit ratio at a glance
//   kvctl tiers [--json]      per-tier page states (they sum to capacity)
//   kvctl sessions [--json]   connected engines and control clients
//   kvctl verify [--json]     scrub the NVMe tier: verify every block, drop what fails
//   kvctl blocks              top blocks by hits or recency, per tier, per namespace
//   kvctl lookup HASH...      which tier holds each block
//   kvctl explain HASH...     why each block is or is not a hit
//   kvctl evict --tier T --bytes N   free cache space now (admin)
//   kvctl drain [--resume]    before maintenance: GPU -> host -> NVMe, no new GPU leases (admin)
//   kvctl top                 a live view, one 80x24 screen a second
//   kvctl health              exit 0 ready, 1 not live (no answer, stuck), 3 live but not ready
//   kvctl plan ...            capacity planner (no daemon needed)
//
// With no --socket, kvctl uses $KVTIER_SOCKET or kvtierd's default ./var/kvtierd.sock.
// Exit status: 0 success, 1 the daemon did not answer or refused, 2 usage error.
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <tuple>

#include "daemon/kvctl/plan.h"
#include "daemon/kvctl/views.h"
#include "engine/control_client.h"
#include "protocol/base/block_key.h"
#include "protocol/base/defaults.h"
#include "protocol/base/tier.h"
#include "protocol/base/units.h"

namespace {

using json = nlohmann::json;
using kvctl::Die;
using kvctl::Duration;
using kvtier::DaemonStats;

kvtier::Result<std::vector<kvtier::BlockHash>> ParseHashes(const std::vector<std::string>& hex) {
  std::vector<kvtier::BlockHash> out;
  for (const std::string& h : hex) {
    std::string bytes;
    if (!kvtier::HexDecode(h, &bytes) || !kvtier::BlockHash::ValidSize(bytes.size())) {
      return kvtier::InvalidArgument("'" + h + "' is not a block hash (32 or 64 hex digits)");
    }
    out.emplace_back(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  }
  return out;
}

// hint: an operator's (or a router's) hint for an agentic session of a namespace.
int Hint(kvtier::ControlClient& c, const std::vector<std::string>& hex, const std::string& ns,
         const std::string& session, double ttl_s, bool release, bool end, bool prefetch, bool as_json) {
  auto hashes = ParseHashes(hex);
  if (!hashes.ok()) {
    std::fprintf(stderr, "kvctl: %s\n", hashes.status().message().c_str());
    return 2;
  }
  // --release: not expected back (TTL 0: the protection lapses at the daemon's next tick).
  const int64_t ttl_ms = release ? 0 : ttl_s < 0 ? -1 : static_cast<int64_t>(ttl_s * 1000);
  auto r = c.Hint(ns, session, *hashes, ttl_ms, end, prefetch);
  if (!r.ok()) return Die("hint", r.status());
  if (as_json) {
    std::cout << json{{"session", session}, {"namespace", ns}, {"blocks", *r}, {"prefetch", prefetch}}.dump(2) << "\n";
  } else {
    std::printf("session %s: %u of %zu blocks cached and %s%s\n", session.c_str(), *r, hashes->size(),
                end       ? "ended (evicted first)"
                : release ? "released"
                          : "protected",
                prefetch ? "; the rest is read up from the tiers below where found" : "");
  }
  return 0;
}

// lookup: where each block is; explain: and why it is not a hit.
int Explain(kvtier::ControlClient& c, const std::vector<std::string>& hex, const std::string& ns, bool verbose,
            bool as_json) {
  auto hashes = ParseHashes(hex);
  if (!hashes.ok()) {
    std::fprintf(stderr, "kvctl: %s\n", hashes.status().message().c_str());
    return 2;
  }
  const bool all_same_size = std::all_of(
      hashes->begin(), hashes->end(), [&](const kvtier::BlockHash& h) { return h.size() == hashes->front().size(); });
  if (!all_same_size) {
    std::fprintf(stderr, "kvctl: every hash of one call must have the same size\n");
    return 2;
  }
  auto r = c.Explain(*hashes, ns);
  if (!r.ok()) return Die(verbose ? "explain" : "lookup", r.status());
  if (as_json) {
    json j = json::array();
    for (size_t i = 0; i < r->size(); ++i) {
      const auto& e = (*r)[i];
      j.push_back(json{{"hash", hex[i]},
                       {"state", std::string(kvtier::BlockStateName(e.state))},
                       {"hit", e.state == kvtier::BlockExplanation::State::kCached},
                       {"tier", std::string(kvtier::TierKindName(e.tier))},
                       {"on_nvme", e.on_nvme},
                       {"writing", e.writing},
                       {"namespace", e.namespace_id},
                       {"tenant", e.tenant},
                       {"model", e.model},
                       {"seconds_ago", e.seconds_ago},
                       {"detail", e.detail}});
    }
    std::cout << json{{"blocks", j}}.dump(2) << "\n";
    return 0;
  }
  for (size_t i = 0; i < r->size(); ++i) {
    const auto& e = (*r)[i];
    using S = kvtier::BlockExplanation::State;
    const bool located = e.state == S::kCached || e.state == S::kInFlight;
    if (!verbose) {
      std::printf("%s  %-15s %-5s %s\n", hex[i].c_str(), std::string(kvtier::BlockStateName(e.state)).c_str(),
                  located ? std::string(kvtier::TierKindName(e.tier)).c_str() : "-",
                  e.namespace_id.empty() ? "" : ("namespace " + e.namespace_id + " (" + e.tenant + ")").c_str());
    } else {
      std::printf("%s\n  %s\n", hex[i].c_str(), e.detail.c_str());
      if (!e.namespace_id.empty()) {
        std::printf("  namespace %s: tenant '%s', model %s\n", e.namespace_id.c_str(), e.tenant.c_str(),
                    e.model.c_str());
      }
    }
  }
  return 0;
}

int Blocks(kvtier::ControlClient& c, const std::string& tier_name, const std::string& ns, bool by_recent,
           uint32_t limit, bool as_json) {
  std::optional<kvtier::TierKind> tier;
  if (!tier_name.empty() && tier_name != "memory") {
    tier = kvtier::ParseTierKind(tier_name);
    if (!tier) {
      std::fprintf(stderr, "kvctl: --tier must be gpu, host, nvme or memory (GPU and host)\n");
      return 2;
    }
  }
  auto r = c.Blocks(tier, ns, by_recent, limit);
  if (!r.ok()) return Die("blocks", r.status());
  if (as_json) {
    json j = json::array();
    for (const auto& b : *r) {
      j.push_back(json{{"hash", b.hash.Hex()},
                       {"namespace", b.namespace_id},
                       {"tenant", b.tenant},
                       {"model", b.model},
                       {"tier", std::string(kvtier::TierKindName(b.tier))},
                       {"on_nvme", b.on_nvme},
                       {"bytes", b.bytes},
                       {"hits", b.hits},
                       {"refs", b.refs},
                       {"idle_s", b.idle_s}});
    }
    std::cout << json{{"blocks", j}}.dump(2) << "\n";
    return 0;
  }
  std::printf("%-32s %-5s %5s %8s %5s %9s %10s  %-16s %s\n", "HASH", "TIER", "NVME", "HITS", "REFS", "IDLE", "BYTES",
              "NAMESPACE", "TENANT");
  for (const auto& b : *r) {
    std::string h = b.hash.Hex();
    if (h.size() > 32) h = h.substr(0, 29) + "...";
    std::printf("%-32s %-5s %5s %8u %5u %9s %10s  %-16s %s\n", h.c_str(),
                std::string(kvtier::TierKindName(b.tier)).c_str(), b.on_nvme ? "yes" : "-", b.hits, b.refs,
                Duration(b.idle_s).c_str(), kvtier::FormatBytes(b.bytes).c_str(), b.namespace_id.c_str(),
                b.tenant.c_str());
  }
  return 0;
}

int Evict(kvtier::ControlClient& c, const std::string& tier_name, const std::string& bytes_text, bool as_json) {
  auto tier = kvtier::ParseTierKind(tier_name);
  auto bytes = kvtier::ParseBytes(bytes_text);
  if (!tier || !bytes.ok()) {
    std::fprintf(stderr, "kvctl: evict needs --tier gpu|host|nvme and --bytes N (e.g. 4GiB)\n");
    return 2;
  }
  auto r = c.Evict(*tier, *bytes);
  if (!r.ok()) return Die("evict", r.status());
  if (as_json) {
    std::cout << json{{"tier", tier_name}, {"blocks", r->blocks}, {"bytes", r->bytes}, {"demoting", r->demoting}}.dump(
                     2)
              << "\n";
    return 0;
  }
  std::printf("evicted %llu blocks (%s) from the %s tier", static_cast<unsigned long long>(r->blocks),
              kvtier::FormatBytes(r->bytes).c_str(), tier_name.c_str());
  if (r->demoting) std::printf("; %llu still being written to NVMe", static_cast<unsigned long long>(r->demoting));
  std::printf("\n");
  if (r->bytes < *bytes) std::printf("(less than asked: the rest is referenced, in flight or reserved)\n");
  return 0;
}

// GET http://HOST:PORT/PATH of the metrics endpoint: (status code, body), or an error.
// Blocking, bounded by `timeout_ms` per send and receive.
kvtier::Result<std::pair<int, std::string>> HttpGet(const std::string& metrics_url, const std::string& path,
                                                    int timeout_ms) {
  const std::string prefix = "http://";
  if (metrics_url.rfind(prefix, 0) != 0) return kvtier::InvalidArgument("metrics URL '" + metrics_url + "'");
  const std::string rest = metrics_url.substr(prefix.size());
  const std::string authority = rest.substr(0, rest.find('/'));
  const size_t colon = authority.rfind(':');
  if (colon == std::string::npos) return kvtier::InvalidArgument("metrics URL '" + metrics_url + "' has no port");
  std::string host = authority.substr(0, colon);
  if (host.size() > 1 && host.front() == '[') host = host.substr(1, host.size() - 2);
  const std::string port = authority.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return kvtier::Unavailable("cannot resolve " + authority);
  }
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const bool connected = fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  freeaddrinfo(found);
  if (!connected) {
    if (fd >= 0) ::close(fd);
    return kvtier::Unavailable("cannot connect to " + authority);
  }
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: " + authority + "\r\nConnection: close\r\n\r\n";
  std::string response;
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    char buf[4096];
    for (ssize_t n; response.size() < (1 << 20) && (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) response.append(buf, n);
  }
  ::close(fd);
  int code = 0;
  if (std::sscanf(response.c_str(), "HTTP/1.%*d %d", &code) != 1) {
    return kvtier::Unavailable("no HTTP answer from " + authority + path + " within " + std::to_string(timeout_ms) +
                               " ms");
  }
  const size_t body = response.find("\r\n\r\n");
  std::string text = body == std::string::npos ? "" : response.substr(body + 4);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return std::make_pair(code, text);
}

// kvctl health: the readiness probe's answer (/readyz of the metrics endpoint) after the
// socket answered; from the stats reply when there is no metrics endpoint.
int Health(kvtier::Result<DaemonStats> stats, int timeout_ms, bool live_only, bool as_json) {
  enum { kReady = 0, kNotLive = 1, kNotReady = 3 };
  int code = kReady;
  std::string why;
  if (!stats.ok()) {
    code = kNotLive;
    why = stats.status().message();
  } else if (!stats->metrics_url.empty()) {
    // /readyz answers 503 when not live too; /healthz tells the two apart.
    auto ready = HttpGet(stats->metrics_url, "/readyz", timeout_ms);
    auto live = ready.ok() && ready->first != 200 ? HttpGet(stats->metrics_url, "/healthz", timeout_ms) : ready;
    if (!ready.ok() || !live.ok()) {
      code = kNotLive;
      why = (ready.ok() ? live : ready).status().message();
    } else {
      code = ready->first == 200 ? kReady : live->first == 200 ? kNotReady : kNotLive;
      why = ready->second;
    }
  } else if (stats->draining) {
    code = kNotReady;
    why = "draining (kvctl drain)";
  } else {
    why = "ready";
    for (const auto& t : stats->tiers) {
      if (!t.ready) {
        code = kNotReady;
        why = "the NVMe index is loading";
      }
    }
  }
  if (live_only && code == kNotReady) {
    code = kReady;  // alive: what a container's HEALTHCHECK asks (a drain is not a fault)
    why = "live; not ready: " + why;
  }
  const char* state = code == kNotLive ? "not live" : live_only ? "live" : code == kReady ? "ready" : "not ready";
  if (as_json) {
    std::cout << json{{"state", state}, {"why", why}, {"exit", code}}.dump(2) << "\n";
  } else {
    std::printf("%s%s%s\n", state, why == state ? "" : ": ", why == state ? "" : why.c_str());
  }
  return code;
}

int Drain(kvtier::ControlClient& c, bool resume, bool no_wait, double timeout_s, bool as_json) {
  auto r = c.Drain(!resume);
  if (!r.ok()) return Die("drain", r.status());
  const auto start = std::chrono::steady_clock::now();
  auto done = [](const kvtier::DrainStatus& d) {
    return d.gpu_blocks_left == 0 && d.host_blocks_unspilled == 0 && d.spills_in_flight == 0;
  };
  while (!resume && !no_wait && !done(*r) &&
         std::chrono::steady_clock::now() - start < std::chrono::duration<double>(timeout_s)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    r = c.Drain(true, /*query=*/true);
    if (!r.ok()) return Die("drain", r.status());
  }
  const bool complete = resume || done(*r);
  if (as_json) {
    std::cout << json{{"draining", r->draining},
                      {"complete", complete},
                      {"gpu_blocks_left", r->gpu_blocks_left},
                      {"gpu_blocks_pinned", r->gpu_blocks_pinned},
                      {"host_blocks_unspilled", r->host_blocks_unspilled},
                      {"spills_in_flight", r->spills_in_flight}}
                     .dump(2)
              << "\n";
  } else if (resume) {
    std::printf("drain ended: GPU leases are granted again\n");
  } else {
    std::printf(
        "draining: new GPU leases refused; %llu GPU blocks left to demote (%llu pinned by sessions), "
        "%llu host blocks not yet on NVMe, %u writes in flight%s\n",
        static_cast<unsigned long long>(r->gpu_blocks_left), static_cast<unsigned long long>(r->gpu_blocks_pinned),
        static_cast<unsigned long long>(r->host_blocks_unspilled), r->spills_in_flight,
        complete ? "\ndrained: every cached block is on NVMe; a restart keeps them (kvctl drain --resume to undo)"
                 : "");
  }
  return complete || no_wait ? 0 : 1;
}

struct PlanFlags {
  kvtier::PlanInput in;
  std::string kv_dtype = "bf16", gpu_mem, host_mem, nvme, activation;
};

int Plan(PlanFlags f, bool as_json) {
  using kvtier::FormatBytes;
  for (auto [text, out, name] :
       {std::tuple{&f.gpu_mem, &f.in.gpu_mem_bytes, "--gpu-mem"},
        std::tuple{&f.host_mem, &f.in.host_mem_bytes, "--host-mem"}, std::tuple{&f.nvme, &f.in.nvme_bytes, "--nvme"},
        std::tuple{&f.activation, &f.in.activation_bytes, "--activation-reserve"}}) {
    if (text->empty()) continue;
    auto b = kvtier::ParseBytes(*text);
    if (!b.ok()) {
      std::fprintf(stderr, "kvctl plan: %s: %s\n", name, b.status().message().c_str());
      return 2;
    }
    *out = *b;
  }
  if (!kvtier::ParseDType(f.kv_dtype, &f.in.kv_dtype)) {
    std::fprintf(stderr, "kvctl plan: --kv-dtype: unknown dtype '%s' (bf16, fp16, fp8)\n", f.kv_dtype.c_str());
    return 2;
  }
  auto r = kvtier::MakePlan(f.in);
  if (!r.ok()) {
    std::fprintf(stderr, "kvctl plan: %s\n", r.status().message().c_str());
    return 2;
  }
  const kvtier::Plan& p = *r;
  const auto& l = p.layout;
  if (as_json) {
    json j{{"model", l.model_id},
           {"layout", l.ToString()},
           {"num_layers", l.num_layers},
           {"kv_heads", l.kv_heads},
           {"head_dim", l.head_dim},
           {"kv_dtype", std::string(kvtier::DTypeName(l.dtype))},
           {"params_billion", p.params_billion},
           {"weights", f.in.weights},
           {"context_tokens", f.in.context_tokens},
           {"concurrency", f.in.concurrency},
           {"gpus", f.in.gpus},
           {"kv_bytes_per_token", p.kv_bytes_per_token},
           {"kv_bytes_per_sequence", p.kv_bytes_per_sequence},
           {"kv_bytes_total", p.kv_bytes_total},
           {"block_bytes", p.block_bytes},
           {"weights_bytes", p.weights_bytes},
           {"activation_bytes", p.activation_bytes},
           {"gpu_usable_bytes", p.gpu_usable_bytes},
           {"weights_fit", p.weights_fit},
           {"gpu_kv_budget_bytes", p.gpu_kv_budget_bytes},
           {"gpu_fraction", p.gpu_fraction},
           {"offload_bytes", p.offload_bytes},
           {"host_tier_bytes", p.host_tier_bytes},
           {"nvme_tier_bytes", p.nvme_tier_bytes},
           {"sequences_gpu", p.sequences_gpu},
           {"sequences_gpu_host", p.sequences_gpu_host},
           {"sequences_gpu_host_nvme", p.sequences_gpu_host_nvme},
           {"kvtierd_config", p.kvtierd_config}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("model          %s\n", l.ToString().c_str());
  std::printf("KV per token   %s = 2 x %u layers x %u KV heads x %u dims x %zu bytes (%s)\n",
              FormatBytes(p.kv_bytes_per_token).c_str(), l.num_layers, l.kv_heads, l.head_dim,
              kvtier::DTypeBytes(l.dtype), std::string(kvtier::DTypeName(l.dtype)).c_str());
  std::printf("KV per seq     %s (%llu tokens)\n", FormatBytes(p.kv_bytes_per_sequence).c_str(),
              static_cast<unsigned long long>(f.in.context_tokens));
  std::printf("KV total       %s (%llu sequences)\n", FormatBytes(p.kv_bytes_total).c_str(),
              static_cast<unsigned long long>(f.in.concurrency));
  std::printf("GPU            %u x %s at %.0f%% = %s; weights %s (%s), activations %s\n", f.in.gpus,
              FormatBytes(f.in.gpu_mem_bytes).c_str(), 100 * f.in.gpu_utilization,
              FormatBytes(p.gpu_usable_bytes).c_str(), FormatBytes(p.weights_bytes).c_str(), f.in.weights.c_str(),
              FormatBytes(p.activation_bytes).c_str());
  if (!p.weights_fit) {
    std::printf("               the weights do not fit: add GPUs (--gpus) or quantize them (--weights fp8)\n");
  }
  std::printf("GPU KV budget  %s: %llu of %llu sequences fit in GPU memory alone (%.1f%% of the KV)\n",
              FormatBytes(p.gpu_kv_budget_bytes).c_str(), static_cast<unsigned long long>(p.sequences_gpu),
              static_cast<unsigned long long>(f.in.concurrency), 100 * p.gpu_fraction);
  std::printf("below the GPU  %s must live in host RAM or on NVMe: host %s, NVMe %s\n",
              FormatBytes(p.offload_bytes).c_str(), FormatBytes(p.host_tier_bytes).c_str(),
              FormatBytes(p.nvme_tier_bytes).c_str());
  std::printf("sequences      GPU %llu, GPU + host %llu, GPU + host + NVMe %llu\n",
              static_cast<unsigned long long>(p.sequences_gpu), static_cast<unsigned long long>(p.sequences_gpu_host),
              static_cast<unsigned long long>(p.sequences_gpu_host_nvme));
  std::printf("\n%s", p.kvtierd_config.c_str());
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
  app.footer(
      "\nEXAMPLES\n"
      "  kvctl status                         is it up, how full, is it hitting\n"
      "  kvctl top                            watch it live (Ctrl-C quits)\n"
      "  kvctl sessions                       which engines, tenants and namespaces\n"
      "  kvctl agents                         agentic sessions: TTL left, hit tokens, blocks per tier\n"
      "  kvctl hint -n NS --session S --ttl 300 HASH...   keep a session's chain for 5 minutes\n"
      "  kvctl explain --namespace NS HASH    why this prompt's first block misses\n"
      "  kvctl blocks --tier nvme --limit 10  the hottest blocks on NVMe\n"
      "  kvctl drain && systemctl restart kvtierd   upgrade keeping the cache\n"
      "  kvctl plan --model llama3.1-70b --gpus 4 --gpu-mem 80GiB --context 32768 --concurrency 64\n"
      "\nENVIRONMENT\n"
      "  KVTIER_SOCKET   the socket when --socket is not given\n"
      "\nPERMISSIONS\n"
      "  Anyone who may open the socket reads status, tiers, top, blocks, lookup and explain for\n"
      "  their own tenant. verify, evict, drain and other tenants' sessions need root, the\n"
      "  daemon's uid or a uid in security.admin_uids.\n"
      "\nSEE ALSO\n"
      "  kvtierd --help, /usr/share/doc/kvtier/operations.md");
  app.require_subcommand(1);
  std::string socket;
  bool as_json = false;
  app.add_option("-s,--socket", socket, "kvtierd's Unix socket");
  app.add_flag("--json", as_json, "Print one JSON object instead of a table");
  auto* status = app.add_subcommand("status", "Version, uptime, metrics URL, sessions, tier usage, hit ratio");
  auto* tiers = app.add_subcommand(
      "tiers", "Each tier's page states (free + leased + inflight + cached + referenced = capacity)");
  auto* sessions = app.add_subcommand("sessions", "Connected engines and control clients");
  auto* agents = app.add_subcommand(
      "agents", "Agentic sessions their hints made: state, TTL left, requests, hit tokens, cached blocks per tier");
  auto* verify = app.add_subcommand(
      "verify", "Scrub the NVMe tier: read every indexed block, verify its checksum, drop those that fail");
  PlanFlags pf;
  auto* plan = app.add_subcommand(
      "plan",
      "Capacity planner (no daemon needed): KV bytes per token = 2 x layers x KV heads x head dim x\n"
      "dtype bytes; the KV a load needs (context x concurrency), how much of it fits in GPU memory\n"
      "beside the weights, how much must live in host RAM and on NVMe, and the kvtierd tiers for it.\n"
      "Example: kvctl plan --model llama3.1-8b --context 131072 --concurrency 32 --gpu-mem 141GiB");
  plan->add_option("--model", pf.in.model,
                   "Preset: llama3.1-8b, llama3.1-70b, qwen2.5-7b, qwen2.5-72b, mistral-7b, mixtral-8x7b");
  plan->add_option("--layers", pf.in.num_layers, "Explicit geometry: transformer layers");
  plan->add_option("--kv-heads", pf.in.kv_heads, "Explicit geometry: KV heads (GQA/MQA: fewer than attention heads)");
  plan->add_option("--head-dim", pf.in.head_dim, "Explicit geometry: head dimension");
  plan->add_option("--params", pf.in.params_billion, "Weights, in billions of parameters (default: the preset's)");
  plan->add_option("--kv-dtype", pf.kv_dtype, "KV cache element type: bf16 (default), fp16, fp8");
  plan->add_option("--weights", pf.in.weights, "Weight precision: bf16 (default), fp16, fp8, int8, int4");
  plan->add_option("--gpu-mem", pf.gpu_mem, "Memory of one GPU, e.g. 80GiB or 141GiB")->required();
  plan->add_option("--gpus", pf.in.gpus, "GPUs the model is split over (tensor parallel); default 1");
  plan->add_option("--gpu-utilization", pf.in.gpu_utilization,
                   "Fraction of GPU memory the engine may use (vLLM's gpu_memory_utilization); default 0.90");
  plan->add_option("--activation-reserve", pf.activation, "GPU memory kept for activations; default 5% (>= 1 GiB)");
  plan->add_option("--context", pf.in.context_tokens, "Context length per sequence, tokens")->required();
  plan->add_option("--concurrency", pf.in.concurrency, "Sequences in flight at once; default 1");
  plan->add_option("--tokens-per-block", pf.in.tokens_per_block, "Tokens per KV block (kvtierd page); default 16");
  plan->add_option("--host-mem", pf.host_mem, "Host RAM for the host tier; default: as much as needed");
  plan->add_option("--nvme", pf.nvme, "NVMe for the NVMe tier; default: the rest");
  plan->add_flag("--json", as_json, "Print JSON");
  std::vector<std::string> hashes;
  std::string ns, tier_name, bytes_text;
  auto* lookup = app.add_subcommand("lookup", "Which tier holds each block (hashes in hex, as engines hash them)");
  auto* explain = app.add_subcommand(
      "explain",
      "Why each block is or is not a hit: cached (where), being read from NVMe, evicted (from which tier\n"
      "and when), stored under another namespace (another tenant, model or layout), or never stored");
  for (auto* sub : {lookup, explain}) {
    sub->add_option("hashes", hashes, "Block hashes, 32 or 64 hex digits each")->required();
    sub->add_option("-n,--namespace", ns,
                    "Only this namespace (the id kvctl sessions shows); default: all you may see");
  }
  std::string hint_session;
  double hint_ttl = -1;
  bool hint_release = false, hint_end = false, hint_prefetch = false;
  auto* hint = app.add_subcommand(
      "hint",
      "A router's or operator's hint for an agentic session of a namespace (your tenant's; any for an admin):\n"
      "keep its chain while it is away (--ttl), release it (--release), end it (--end: evicted first), or read it\n"
      "up from NVMe and the lower tiers before its next turn (--prefetch)");
  hint->add_option("hashes", hashes, "The session's chain: block hashes in hex, first block first")->required();
  hint->add_option("-n,--namespace", ns, "The namespace (the id kvctl sessions shows)")->required();
  hint->add_option("--session", hint_session, "The session id (at most 256 bytes)")->required();
  hint->add_option("--ttl", hint_ttl, "Seconds the session expects to be away (default: its last TTL stands)")
      ->check(CLI::Range(0.0, 1e9));
  hint->add_flag("--release", hint_release, "Not expected back: its blocks lose their protection");
  hint->add_flag("--end", hint_end, "The session has ended: its blocks no live session shares go first");
  hint->add_flag("--prefetch", hint_prefetch,
                 "Also read the chain's blocks found on NVMe or a lower tier into free host pages now, before the "
                 "session's next turn (never evicting)");
  auto* blocks = app.add_subcommand("blocks", "Top blocks by hits (or --recent) in a tier, optionally one namespace");
  bool by_recent = false;
  uint32_t limit = 20;
  blocks->add_option("-t,--tier", tier_name, "gpu, host, nvme, or memory (GPU and host; the default)");
  blocks->add_option("-n,--namespace", ns, "Only this namespace");
  blocks->add_flag("--recent", by_recent, "Order by last use instead of hits");
  blocks->add_option("--limit", limit, "How many (default 20)")->check(CLI::Range(1u, 65536u));
  auto* evict =
      app.add_subcommand("evict",
                         "Admin: evict cached blocks of a tier until N bytes are gone (GPU -> host -> NVMe as under\n"
                         "pressure; blocks with nowhere to go are dropped; referenced blocks and reserves stay)");
  evict->add_option("-t,--tier", tier_name, "gpu, host or nvme")->required();
  evict->add_option("-b,--bytes", bytes_text, "How much, e.g. 8GiB")->required();
  auto* drain =
      app.add_subcommand("drain",
                         "Admin, before maintenance: refuse new GPU leases, demote GPU blocks to host and write every\n"
                         "host block to NVMe, so a restart keeps the cache; waits until done. --resume ends it");
  bool resume = false, no_wait = false;
  double drain_timeout = 600;
  drain->add_flag("--resume", resume, "End the drain: grant GPU leases again");
  drain->add_flag("--no-wait", no_wait, "Start it and return");
  drain->add_option("--timeout", drain_timeout, "Seconds to wait for it (default 600); exit 1 if not done");
  auto* health = app.add_subcommand(
      "health",
      "Whether kvtierd should get engines (an exec probe): exit 0 ready, 1 not live (no answer on the socket "
      "within --timeout, or the control loop stuck: /healthz 503), 3 live but not ready (/readyz 503: "
      "starting, draining, NVMe index loading or failing)");
  double health_timeout = 5;
  bool health_live = false;
  health->add_flag("--live", health_live, "Only whether it is live (exit 0 or 1): a container's HEALTHCHECK");
  health->add_option("--timeout", health_timeout, "Seconds to wait for each answer (default 5)")
      ->check(CLI::Range(0.1, 600.0));
  auto* top = app.add_subcommand("top",
                                 "A live view (80x24, once a second): tier usage, hit ratio, bytes/s per path, "
                                 "sessions, fetch queue. Ctrl-C quits");
  double interval = 1.0;
  int iterations = 0;
  top->add_option("--interval", interval, "Seconds between screens (default 1)")->check(CLI::Range(0.05, 3600.0));
  top->add_option("--iterations", iterations, "Screens to draw, then exit (default: until interrupted)");
  for (auto* sub :
       {status, tiers, sessions, agents, verify, lookup, explain, hint, blocks, evict, drain, top, health}) {
    sub->add_option("-s,--socket", socket, "kvtierd's Unix socket");
    sub->add_flag("--json", as_json, "Print JSON");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (plan->parsed()) return Plan(pf, as_json);

  kvtier::ControlClientOptions o;
  o.name = "kvctl";
  o.socket_path = kvtier::ResolveSocketPath(socket.c_str());
  o.timeout_ms = 10'000;
  // The session's hash size is the size of the hashes asked about (32 hex digits: 16 bytes).
  if ((lookup->parsed() || explain->parsed() || hint->parsed()) && !hashes.empty() && hashes.front().size() == 64) {
    o.hash_bytes = 32;
  }
  if (health->parsed()) {
    o.timeout_ms = static_cast<int>(health_timeout * 1000);
    auto hc = kvtier::ControlClient::Connect(o);
    if (!hc.ok()) return Health(hc.status(), o.timeout_ms, health_live, as_json);
    return Health((*hc)->Stats(false), o.timeout_ms, health_live, as_json);
  }
  auto client = kvtier::ControlClient::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "kvctl: %s\n", client.status().message().c_str());
    return 1;
  }
  kvtier::ControlClient& c = **client;
  if (lookup->parsed() || explain->parsed()) return Explain(c, hashes, ns, explain->parsed(), as_json);
  if (hint->parsed())
    return Hint(c, hashes, ns, hint_session, hint_ttl, hint_release, hint_end, hint_prefetch, as_json);
  if (blocks->parsed()) return Blocks(c, tier_name, ns, by_recent, limit, as_json);
  if (evict->parsed()) return Evict(c, tier_name, bytes_text, as_json);
  if (drain->parsed()) return Drain(c, resume, no_wait, drain_timeout, as_json);
  if (top->parsed()) return kvctl::Top(c, o.socket_path, interval, iterations, as_json);
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
                  static_cast<unsigned long long>(v->checked), v->seconds, static_cast<unsigned long long>(v->dropped));
    }
    return 0;
  }
  auto stats = (*client)->Stats(sessions->parsed(), agents->parsed());
  if (!stats.ok()) {
    std::fprintf(stderr, "kvctl: %s\n", stats.status().ToString().c_str());
    return 1;
  }
  if (status->parsed()) return kvctl::Status(*stats, o.socket_path, as_json);
  if (tiers->parsed()) return kvctl::Tiers(*stats, as_json);
  if (agents->parsed()) return kvctl::Agents(*stats, as_json);
  return kvctl::Sessions(*stats, as_json);
}
