// The daemon's metric catalogue: every series kvtierd exports, its name, help and labels,
// read from the component that counts it (docs/operations.md lists them; the promtool and
// live-Prometheus tests check them). Registered once, after the cache and server are open.
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "daemon/daemon.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

// The standard process_* series (Prometheus client libraries' names), read at scrape time
// from /proc/self and getrlimit.
void RegisterProcessMetrics(MetricsRegistry& m, int64_t started_wall) {
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  auto statm = [](int field) {
    std::ifstream f("/proc/self/statm");
    double v = 0;
    for (int i = 0; i <= field && (f >> v); ++i) {
    }
    return v;
  };
  m.AddGaugeFn("process_resident_memory_bytes", "Resident memory size in bytes.", {},
               [statm, page] { return statm(1) * page; });
  m.AddGaugeFn("process_virtual_memory_bytes", "Virtual memory size in bytes.", {},
               [statm, page] { return statm(0) * page; });
  m.AddGaugeFn("process_open_fds", "Number of open file descriptors.", {}, [] {
    std::error_code ec;
    double n = 0;
    for (auto it = fs::directory_iterator("/proc/self/fd", ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      ++n;
    }
    return n;
  });
  m.AddGaugeFn("process_max_fds", "Maximum number of open file descriptors.", {}, [] {
    rlimit r{};
    return ::getrlimit(RLIMIT_NOFILE, &r) == 0 ? static_cast<double>(r.rlim_cur) : 0.0;
  });
  m.AddCounterFn("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", {}, [ticks] {
    std::ifstream f("/proc/self/stat");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');  // the command name may hold spaces
    if (close == std::string::npos) return 0.0;
    std::istringstream rest(text.substr(close + 2));
    std::string field;
    double utime = 0, stime = 0;
    for (int i = 3; i <= 15 && (rest >> field); ++i) {
      if (i == 14) utime = std::atof(field.c_str());
      if (i == 15) stime = std::atof(field.c_str());
    }
    return (utime + stime) / ticks;
  });
  m.AddGaugeFn("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", {},
               [started_wall] { return static_cast<double>(started_wall); });
}

}  // namespace

void Daemon::RegisterMetrics() {
  MetricsRegistry& m = metrics_;
  const CacheManager* cache = cache_.get();
  const Server* server = server_.get();
  m.AddGaugeFn("kvtier_build_info", "Always 1; the version label says which kvtierd runs.", {{"version", kVersion}},
               [] { return 1.0; });
  const int64_t started_wall = SystemClock::Default()->WallSeconds();
  m.AddGaugeFn("kvtier_start_time_seconds", "Unix time kvtierd started.", {},
               [started_wall] { return static_cast<double>(started_wall); });
  RegisterProcessMetrics(m, started_wall);
  m.AddCounterFn("kvtier_metrics_renders_total",
                 "Renders of /metrics on the control loop (at most one each 250 ms; the scrapes waiting when one "
                 "starts share it).",
                 {}, [&m] { return static_cast<double>(m.renders()); });
  const char* hits_help =
      "Blocks matched by lookups, by the tier they were found in. Hit ratio = "
      "sum(kvtier_block_hits_total) / kvtier_lookup_blocks_total.";
  for (TierKind kind : kAllTiers) {
    if (!cache->tier_enabled(kind)) continue;
    const std::string tier(TierKindName(kind));
    if (IsLowerTier(kind)) {  // no pages of its own: hits only (RegisterLowerTierMetrics has the rest)
      m.AddCounterFn("kvtier_block_hits_total", hits_help, {{"tier", tier}},
                     [cache, kind] { return cache->counters().block_hits[TierIndex(kind)]; });
      continue;
    }
    m.AddGaugeFn("kvtier_tier_capacity_bytes", "Bytes of a tier's pool.", {{"tier", tier}}, [cache, kind] {
      TierCounts c = cache->Counts(kind);
      return static_cast<double>(c.capacity) * static_cast<double>(c.page_bytes);
    });
    const std::pair<const char*, uint32_t TierCounts::*> states[] = {{"free", &TierCounts::free},
                                                                     {"leased", &TierCounts::leased},
                                                                     {"inflight", &TierCounts::inflight},
                                                                     {"cached", &TierCounts::cached},
                                                                     {"referenced", &TierCounts::referenced},
                                                                     {"quarantined", &TierCounts::quarantined}};
    for (const auto& [state, field] : states) {
      m.AddGaugeFn("kvtier_tier_bytes", "Bytes of a tier's pool by page state; the states sum to the capacity.",
                   {{"tier", tier}, {"state", state}}, [cache, kind, field = field] {
                     TierCounts c = cache->Counts(kind);
                     return static_cast<double>(c.*field) * static_cast<double>(c.page_bytes);
                   });
    }
    m.AddGaugeFn("kvtier_tier_blocks", "Blocks resident in a tier.", {{"tier", tier}},
                 [cache, kind] { return static_cast<double>(cache->Counts(kind).blocks); });
    if (IsPoolTier(kind)) {
      m.AddGaugeFn("kvtier_tier_headroom_bytes",
                   "Bytes of a pool tier kept free or on their way down ahead of allocations, sized from the "
                   "recent allocation rate and demotion round trip (tiers.<tier>.allocation_headroom); 0: the "
                   "watermarks alone.",
                   {{"tier", tier}}, [cache, kind] {
                     return static_cast<double>(cache->headroom_pages(kind)) *
                            static_cast<double>(cache->Counts(kind).page_bytes);
                   });
      const char* renewals_help =
          "Pool segments given new memory as they changed tenant, by outcome (host: the old memory's pages are "
          "released from every process that still maps them, so the pool's memory stays its capacity; a failed "
          "renewal leaves the segment unclaimed).";
      m.AddCounterFn("kvtier_segment_renewals_total", renewals_help, {{"tier", tier}, {"outcome", "ok"}},
                     [cache, kind] { return cache->Stats(kind).segment_renewals; });
      m.AddCounterFn("kvtier_segment_renewals_total", renewals_help, {{"tier", tier}, {"outcome", "failed"}},
                     [cache, kind] { return cache->Stats(kind).segment_renewal_failures; });
    }
    m.AddGaugeFn("kvtier_tier_high_watermark_ratio", "Fraction of a tier in use above which cached blocks are evicted.",
                 {{"tier", tier}}, [cache, kind] { return cache->Stats(kind).high_watermark; });
    m.AddCounterFn("kvtier_evictions_total",
                   "Blocks removed from a tier under pressure (from host: dropped, or demoted "
                   "when already on NVMe; from NVMe: dropped).",
                   {{"tier", tier}}, [cache, kind] { return cache->Stats(kind).evictions; });
    m.AddCounterFn("kvtier_block_hits_total", hits_help, {{"tier", tier}},
                   [cache, kind] { return cache->counters().block_hits[TierIndex(kind)]; });
  }
  m.AddCounterFn("kvtier_lookups_total", "Lookup requests served.", {}, [cache] { return cache->counters().lookups; });
  m.AddCounterFn("kvtier_lookup_blocks_total", "Block hashes asked about by lookups.", {},
                 [cache] { return cache->counters().lookup_blocks; });
  m.AddCounterFn("kvtier_block_misses_total",
                 "Block hashes of lookups that did not match (from the first missing block on).", {},
                 [cache] { return cache->counters().block_misses; });
  m.AddCounterFn("kvtier_commits_total", "Blocks committed, by outcome.", {{"outcome", "stored"}},
                 [cache] { return cache->counters().commits_stored; });
  m.AddCounterFn("kvtier_commits_total", "Blocks committed, by outcome.", {{"outcome", "duplicate"}},
                 [cache] { return cache->counters().commits_duplicate; });
  m.AddCounterFn("kvtier_acquires_total", "Blocks asked for by Acquire.", {},
                 [cache] { return cache->counters().acquires; });
  m.AddCounterFn("kvtier_acquire_misses_total", "Blocks asked for by Acquire and not found.", {},
                 [cache] { return cache->counters().acquire_misses; });
  m.AddCounterFn("kvtier_allocate_failures_total", "Allocate requests refused because the tier had no page to give.",
                 {}, [cache] { return cache->counters().allocate_failures; });
  m.AddCounterFn("kvtier_quota_refusals_total",
                 "Allocate requests refused because the tenant was at its quota of the tier.", {},
                 [cache] { return cache->counters().quota_refusals; });
  m.AddCounterFn("kvtier_refetches_after_evict_total",
                 "Blocks committed again while the eviction history (the last 16384 blocks whose last copy "
                 "left the cache) remembered them: engines recomputed what the cache had evicted. Its rate over "
                 "kvtier_lookup_blocks_total is the thrash ratio.",
                 {}, [cache] { return cache->counters().refetches_after_evict; });
  m.AddGaugeFn("kvtier_draining", "1 while a maintenance drain (kvctl drain) refuses new GPU leases.", {},
               [cache] { return cache->draining() ? 1.0 : 0.0; });
  m.AddGaugeFn("kvtier_sessions", "Connected sessions (engines and control clients).", {},
               [server] { return static_cast<double>(server->session_count()); });
  m.AddCounterFn("kvtier_sessions_opened_total", "Connections accepted.", {},
                 [server] { return server->sessions_opened(); });
  m.AddCounterFn("kvtier_sessions_without_hello_closed_total",
                 "Connections closed for sending no Hello within protocol.hello_timeout, or to make room for a "
                 "newer connection.",
                 {}, [server] { return server->sessions_without_hello_closed(); });
  m.AddCounterFn("kvtier_sessions_refused_total",
                 "Connections refused (max_sessions, max_sessions_per_uid), each answered with an error frame.", {},
                 [server] { return server->sessions_refused(); });
  m.AddCounterFn("kvtier_sessions_expired_total",
                 "Sessions closed for sending nothing for longer than protocol.heartbeat_ttl.", {},
                 [server] { return server->sessions_expired(); });
  m.AddGaugeFn("kvtier_quarantines",
               "Ended sessions whose leased pages wait for their process to exit (or, for a process kvtierd "
               "cannot watch, for their segments to be renewed, or a restart); the pages are "
               "kvtier_tier_bytes{state=\"quarantined\"}.",
               {}, [cache] { return static_cast<double>(cache->quarantine_count()); });
  m.AddCounterFn("kvtier_quarantine_pages_reclaimed_total",
                 "Quarantined pages taken back before their process exited: every allocated page of their "
                 "segment was quarantined, and the segment got new memory.",
                 {}, [cache] { return cache->counters().quarantine_reclaims; });
  m.AddGaugeFn("kvtier_quarantine_watches",
               "Descriptors watching quarantines: one per process (however many of its sessions ended while it "
               "lives), one per socket another process holds.",
               {}, [server] { return static_cast<double>(server->quarantine_watches()); });
  m.AddCounterFn("kvtier_sessions_unwatched_total",
                 "Sessions whose peer's process kvtierd cannot watch (no SO_PEERPIDFD and a pid it cannot see): "
                 "their leased pages stay quarantined until a restart once the session ends.",
                 {}, [server] { return server->sessions_unwatched(); });
  m.AddGaugeFn("kvtier_explains_in_progress",
               "kvctl explains answered a slice a loop turn, queued now (at most 4 a tenant, 32 in all).", {},
               [cache] { return cache->views().explain_counts().in_progress; });
  m.AddCounterFn("kvtier_explains_refused_total",
                 "kvctl explains refused because their tenant (or everyone) had the most in progress.", {},
                 [cache] { return cache->views().explain_counts().refused; });
  m.AddCounterFn("kvtier_explains_dropped_total",
                 "kvctl explains dropped unanswered because their session closed first.", {},
                 [cache] { return cache->views().explain_counts().dropped; });
  m.AddCounterFn("kvtier_session_hints_total",
                 "Agentic sessions' hints taken (SessionHint: engines, routers, vLLM's kv_transfer_params).", {},
                 [cache] { return cache->session_stats().hints; });
  m.AddCounterFn("kvtier_session_hints_refused_total",
                 "Hints of a new agentic session refused: its tenant held sessions.max_per_tenant.", {},
                 [cache] { return cache->session_stats().refused; });
  m.AddCounterFn("kvtier_session_protection_over_share_total",
                 "Blocks a live session's hint would have protected beyond its tenant's "
                 "sessions.protected_share of a tier: left unprotected.",
                 {}, [cache] { return cache->session_stats().over_share; });
  m.AddCounterFn("kvtier_session_hit_tokens_total",
                 "Tokens agentic sessions' requests loaded from kvtierd, as their engines reported them "
                 "(SessionHint.hit_tokens; per session: kvctl agents).",
                 {}, [cache] { return cache->session_stats().hit_tokens; });
  m.AddCounterFn("kvtier_agent_sessions_expired_total",
                 "Agentic sessions that went quiet past their TTL: their blocks lost the protection they gave.", {},
                 [cache] { return cache->session_stats().expired; });
  m.AddGaugeFn("kvtier_agent_sessions", "Agentic sessions known, and live (within their TTL).", {{"state", "known"}},
               [cache] { return static_cast<double>(cache->session_stats().sessions); });
  m.AddGaugeFn("kvtier_agent_sessions", "Agentic sessions known, and live (within their TTL).", {{"state", "live"}},
               [cache] { return static_cast<double>(cache->session_stats().live); });
  for (TierKind tier : {TierKind::kGpu, TierKind::kHost}) {
    if (!cache->tier_enabled(tier)) continue;
    m.AddGaugeFn(
        "kvtier_protected_blocks", "Blocks a live agentic session protects (evicted after every other block), by tier.",
        {{"tier", std::string(TierKindName(tier))}},
        [cache, tier] { return static_cast<double>(cache->session_stats().protected_blocks[TierIndex(tier)]); });
  }
  m.AddGaugeFn("kvtier_namespaces", "Namespaces (tenant x model) with blocks or sessions.", {},
               [cache] { return static_cast<double>(cache->namespace_count()); });
  m.AddCounterFn("kvtier_gpu_demotions_total", "GPU blocks copied down to host pages under pressure.", {},
                 [cache] { return cache->counters().gpu_demotions; });
  m.AddGaugeFn("kvtier_pending_allocates", "Allocate requests waiting for demotions to free pages.", {},
               [cache] { return static_cast<double>(cache->pending_allocates()); });
  m.AddCounterFn("kvtier_allocate_waits_total", "Allocate requests that had to wait for room.", {},
                 [cache] { return cache->counters().allocate_waits; });
  m.AddCounterFn("kvtier_unspillable_evictions_total",
                 "Host blocks evicted without going to NVMe because the tier quantizes and they may not be "
                 "quantized (tenant not opted in, or a layout the kernels cannot quantize): lost.",
                 {}, [cache] { return cache->counters().unspillable_drops; });
  if (const KvEvents* events = events_.get()) {
    m.AddCounterFn("kvtier_events_published_total",
                   "Block hashes announced on the KV event socket (BlockStored, BlockRemoved).", {},
                   [events] { return events->counters().events; });
    m.AddCounterFn("kvtier_event_messages_total", "Messages sent on the KV event socket.", {},
                   [events] { return events->counters().messages; });
    m.AddCounterFn("kvtier_events_dropped_total",
                   "KV events dropped because events.buffer_events (or events.buffer_bytes) were already waiting to be "
                   "sent, in all or of the tenant's share.",
                   {}, [events] { return events->counters().dropped; });
    m.AddCounterFn("kvtier_event_replays_total", "Replay requests answered on events.replay.", {},
                   [events] { return events->counters().replays; });
    const char* peers = "Connections to the KV event sockets, by socket (publish: subscribers).";
    m.AddGaugeFn("kvtier_events_peers", peers, {{"socket", "publish"}},
                 [events] { return static_cast<double>(events->counters().subscribers); });
    m.AddGaugeFn("kvtier_events_peers", peers, {{"socket", "replay"}},
                 [events] { return static_cast<double>(events->counters().replay_peers); });
    m.AddCounterFn("kvtier_events_peers_refused_total",
                   "Connections to the KV event sockets shut down: events.max_subscribers or "
                   "events.max_replay_peers were connected, or the connecting local user held its "
                   "events.max_peer_share_per_user of them.",
                   {}, [events] { return events->counters().refused; });
    m.AddCounterFn("kvtier_events_retracted_total",
                   "Block hashes the last run announced, removed (BlockRemoved) after this start.", {},
                   [events] { return events->counters().retracted; });
    m.AddGaugeFn("kvtier_events_topics", "KV event topics, lingering ones (no engine attached) among them.", {},
                 [events] { return static_cast<double>(events->counters().topics); });
    m.AddCounterFn("kvtier_events_topics_removed_total",
                   "KV event topics ended events.topic_linger after their last engine detached (what they "
                   "announced removed).",
                   {}, [events] { return events->counters().topics_removed; });
    m.AddCounterFn("kvtier_events_topics_refused_total",
                   "Hellos refused for events: a tenant at events.max_topics_per_tenant, or a routable id "
                   "another tenant's engine holds.",
                   {}, [events] { return events->counters().topics_refused; });
  }
  RegisterLowerTierMetrics();
  const NvmeTier* nvme = cache_->nvme();
  if (nvme == nullptr) return;
  m.AddGaugeFn("kvtier_nvme_info", "Always 1; labels say which I/O and index backends the NVMe tier uses.",
               {{"io_backend", std::string(nvme->io_backend())}, {"index", std::string(nvme->index_backend())}},
               [] { return 1.0; });
  m.AddGaugeFn("kvtier_nvme_index_ready", "1 once the NVMe index is loaded and spills are accepted.", {},
               [nvme] { return nvme->ready() ? 1.0 : 0.0; });
  m.AddGaugeFn("kvtier_nvme_memory_bytes", "RAM the NVMe tier holds: per-slot state and index caches.", {},
               [nvme] { return static_cast<double>(nvme->MemoryUsage()); });
  m.AddGaugeFn("kvtier_pending_fetches", "NVMe blocks being read into host pages (the fetch queue).", {},
               [cache] { return static_cast<double>(cache->pending_promotions()); });
  m.AddCounterFn("kvtier_demotions_total", "Host blocks spilled to NVMe and their host page freed.", {},
                 [cache] { return cache->counters().demotions; });
  m.AddCounterFn("kvtier_write_throughs_total", "Blocks copied to NVMe with the host copy kept.", {},
                 [cache] { return cache->counters().write_throughs; });
  m.AddCounterFn("kvtier_spill_failures_total", "Spills that did not complete (I/O error, no slot).", {},
                 [cache] { return cache->counters().spill_failures; });
  m.AddCounterFn("kvtier_promotions_total", "NVMe blocks read back into host pages.", {},
                 [cache] { return cache->counters().promotions; });
  m.AddCounterFn("kvtier_promotion_failures_total", "NVMe reads that did not yield a verified block.", {},
                 [cache] { return cache->counters().promotion_failures; });
  m.AddCounterFn("kvtier_prefetches_total",
                 "Blocks read up before any Acquire: NVMe hits of a Lookup, and what sessions' prefetch hints found "
                 "below the host tier.",
                 {}, [cache] { return cache->counters().prefetches; });
  m.AddCounterFn("kvtier_load_holds_used_total",
                 "NVMe index records a load took from the Lookup before it instead of reading the index again "
                 "(tiers.nvme.load_hold).",
                 {}, [cache] { return cache->counters().load_holds_used; });
  const char* moved = "Block bytes moved between tiers, by path.";
  m.AddCounterFn("kvtier_bytes_moved_total", moved, {{"path", "host_to_nvme"}},
                 [nvme] { return nvme->counters().spill_bytes; });
  m.AddCounterFn("kvtier_bytes_moved_total", moved, {{"path", "nvme_to_host"}},
                 [nvme] { return nvme->counters().fetch_bytes; });
  m.AddCounterFn("kvtier_checksum_failures_total",
                 "NVMe blocks whose bytes did not verify; each was a miss and its entry dropped.", {},
                 [nvme] { return nvme->counters().checksum_failures; });
  m.AddCounterFn("kvtier_io_errors_total", "NVMe reads, writes and syncs that failed.", {},
                 [nvme] { return nvme->counters().io_errors; });
  m.AddCounterFn("kvtier_nvme_index_errors_total", "NVMe index writes that failed.", {},
                 [nvme] { return nvme->counters().index_errors; });
  m.AddGaugeFn("kvtier_nvme_index_writable",
               "1 while the NVMe index takes writes; 0 after a write failed (full or failing disk): spilling is "
               "stopped until a retry succeeds.",
               {}, [nvme] { return nvme->index_writable() ? 1.0 : 0.0; });
  m.AddCounterFn("kvtier_nvme_files_lost_total",
                 "Slot files found deleted, truncated or replaced while kvtierd used them; their blocks were dropped.",
                 {}, [nvme] { return nvme->counters().files_lost; });
  m.AddCounterFn("kvtier_nvme_syncs_total", "fdatasync calls issued for spilled data (strict durability).", {},
                 [nvme] { return nvme->counters().syncs; });
  m.AddCounterFn("kvtier_nvme_quota_refusals_total",
                 "Spills refused because the tenant was at its NVMe quota with nothing of its own to give up.", {},
                 [nvme] { return nvme->counters().quota_refusals; });
  for (size_t o = 1; o < nvme_owners_.size(); ++o) {
    m.AddGaugeFn("kvtier_nvme_tenant_bytes",
                 "NVMe bytes a tenant with NVMe limits holds (blocks indexed or being written), by tenant.",
                 {{"tenant", nvme_owners_[o]}}, [nvme, o] {
                   return static_cast<double>(nvme->held_by(static_cast<uint16_t>(o))) *
                          static_cast<double>(nvme->slot_bytes());
                 });
  }
}

// Each lower tier's series: what its mover counts (the same for every lower tier, named
// kvtier_<tier>_*), then the figures its report exports, registered once from its first
// report (a tier reports the same figures every time).
void Daemon::RegisterLowerTierMetrics() {
  MetricsRegistry& m = metrics_;
  for (const auto& owned : cache_->lower_tiers()) {
    const LowerTierMover* rm = owned.get();
    const std::string tier(TierKindName(rm->kind()));
    const std::string p = "kvtier_" + tier + "_";
    m.AddCounterFn(p + "puts_total", "Blocks stored in the " + tier + " tier.", {},
                   [rm] { return rm->counters().puts; });
    m.AddCounterFn(p + "put_failures_total", "Puts into the " + tier + " tier that failed.", {},
                   [rm] { return rm->counters().put_failures; });
    m.AddCounterFn(
        p + "puts_skipped_total",
        "Write-throughs to the " + tier + " tier not made: the queue was full, or the block left host first.", {},
        [rm] { return rm->puts_skipped(); });
    m.AddGaugeFn(p + "puts_in_flight", "Puts into the " + tier + " tier waiting for it.", {},
                 [rm] { return static_cast<double>(rm->puts_in_flight()); });
    m.AddGaugeFn(p + "puts_queued", "Write-throughs to the " + tier + " tier waiting for their turn.", {},
                 [rm] { return static_cast<double>(rm->puts_queued()); });
    m.AddCounterFn(p + "promotions_total", "Blocks of the " + tier + " tier read and verified into host pages.", {},
                   [rm] { return rm->counters().promotions; });
    m.AddCounterFn(p + "put_backoffs_total",
                   "Times puts stopped for a while because the " + tier + " tier refused a write for space.", {},
                   [rm] { return rm->put_backoffs(); });
    m.AddCounterFn(
        p + "quota_deletes_total",
        "Values this kvtierd deleted from the " + tier + " tier because their tenant was past its " + tier + " quota.",
        {}, [rm] { return rm->quota_deletes(); });
    // One report per tier per render, shared by its series (Render counts itself first).
    struct Cached {
      uint64_t render = 0;
      LowerTierReport report;
    };
    auto cached = std::make_shared<Cached>(Cached{m.renders(), rm->tier().Report()});
    const LowerTierReport& first = cached->report;
    for (size_t i = 0; i < first.figures.size(); ++i) {
      const TierFigure& f = first.figures[i];
      if (f.metric.empty()) continue;
      Labels labels;
      if (!f.label.first.empty()) labels.emplace_back(f.label.first, f.label.second);
      auto value = [rm, i, cached, &m] {
        if (cached->render != m.renders()) *cached = {m.renders(), rm->tier().Report()};
        const auto& figures = cached->report.figures;
        return i < figures.size() ? figures[i].value : 0.0;
      };
      if (f.counter) {
        m.AddCounterFn(std::string(f.metric), std::string(f.help), std::move(labels), value);
      } else {
        m.AddGaugeFn(std::string(f.metric), std::string(f.help), std::move(labels), value);
      }
    }
  }
}

}  // namespace kvtier
