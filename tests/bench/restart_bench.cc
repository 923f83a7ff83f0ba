// kvtier-bench restart: how fast kvtierd serves again after a restart with a large NVMe
// index, and what that index costs in RAM. kvtier-bench cold-index: what reading that index
// for long cold chains costs another session (its Lookup p99 beside them ÷ alone).
//
// The index (1,000,000 blocks by default, 4 KiB slots; the slot file sparse, so that a
// drive-sized index fits any disk) is written straight into the
// daemon's RocksDB directory with the storage library, exactly as the daemon would have
// left it at a clean shutdown; a few sample blocks also get real bytes and checksums. Then
// kvtierd starts on it and an engine retries Lookup + Acquire of a sample until it is
// served with verified bytes: restart_s. RAM per NVMe block is the RSS of that daemon once
// its index is loaded, minus the RSS of the same daemon without an NVMe tier, over the
// block count — measured in the same run.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "daemon/dispatcher.h"
#include "engine/tools/block_pattern.h"
#include "storage/io/slot_files.h"
#include "storage/nvme/block_index_store.h"
#include "storage/nvme/nvme_tier.h"
#include "tests/bench/bench_main.h"
#include "tests/bench/bench_util.h"

namespace kvtier::bench {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kSamples = 64;

ModelLayout RestartLayout() {
  ModelLayout l;
  l.model_id = "bench-restart";
  l.num_layers = 1;
  l.kv_heads = 1;
  l.head_dim = 64;
  l.dtype = DType::kBFloat16;
  l.tokens_per_block = 16;  // 2 x 64 x 2 bytes x 16 = 4 KiB
  l.block_bytes = l.NaturalBlockBytes();
  return l;
}

BlockHash HashOf(uint64_t i) { return IndexHash(77, i); }

uint64_t RssKb(pid_t pid) { return ProcStatusKb(pid, "RssAnon"); }

// Slots for `blocks` below the NVMe high watermark (0.95), so the restart evicts nothing.
uint64_t SlotsFor(uint64_t blocks) { return blocks + blocks / 8 + 1024; }

testing::DaemonProcess::Options RestartDaemon(bool nvme, uint64_t blocks) {
  testing::DaemonProcess::Options o;
  o.host_capacity = "16MiB";
  o.page_bytes = "4KiB";
  o.segment_bytes = "4MiB";
  if (nvme) o.nvme_capacity = std::to_string(SlotsFor(blocks) * kPage);
  o.nvme_preallocate = false;  // 10M blocks of 4 KiB are 46 GB: sparse, so any disk takes it
  o.kvtierd = SiblingBinary("kvtierd");
  o.log_level = "notice";
  return o;
}

// Writes the index and the sample blocks the daemon will find at start.
Status Populate(const testing::DaemonProcess& d, uint64_t blocks) {
  KVTIER_ASSIGN_OR_RETURN(auto files,
                          SlotFiles::Open({SlotFileSpec{d.slot_file(), SlotsFor(blocks) * kPage, false}}, kPage));
  RocksDbIndexOptions ro;
  ro.path = d.dir() + "/data/index";
  KVTIER_ASSIGN_OR_RETURN(auto store, OpenRocksDbBlockIndexStore(ro));
  KVTIER_RETURN_IF_ERROR(store->PutMeta(kNvmeGeometryMeta, files->GeometryKey()));
  const ModelLayout layout = RestartLayout();
  // The tenant kvtierd's default config gives this user's engines.
  const std::string tenant =
      TenantResolver(SecurityConfig{}, ::geteuid()).Resolve({::getpid(), ::getuid(), ::getgid(), {}})->tenant;
  const std::string ns = EncodeNamespace(tenant, layout.Fingerprint());
  const int fd = ::open(d.slot_file().c_str(), O_WRONLY);
  if (fd < 0) return ErrnoStatus(errno, "open slot file");
  std::vector<uint8_t> data(kPage);
  std::vector<IndexMutation> batch;
  const uint32_t now = static_cast<uint32_t>(::time(nullptr));
  for (uint64_t i = 0; i < blocks; ++i) {
    const BlockHash h = HashOf(i);
    IndexMutation m{IndexMutation::Kind::kPut, EncodeBlockKey(ns, h), {}};
    m.record.slot = static_cast<uint32_t>(i);
    m.record.length = static_cast<uint32_t>(layout.block_bytes);
    m.record.layout_fingerprint = layout.Fingerprint();
    m.record.last_access = now;
    if (i < kSamples) {
      FillBlockPattern(h, data);
      if (::pwrite(fd, data.data(), kPage, static_cast<off_t>(i * kPage)) != static_cast<ssize_t>(kPage)) {
        ::close(fd);
        return ErrnoStatus(errno, "pwrite sample");
      }
      m.record.checksum = BlockChecksum(m.key, data);
    }
    batch.push_back(std::move(m));
    if (batch.size() == 20'000 || i + 1 == blocks) {
      KVTIER_RETURN_IF_ERROR(store->Apply(batch, false));
      batch.clear();
    }
  }
  ::fdatasync(fd);
  ::close(fd);
  // As a clean shutdown of a daemon that built this index over hours leaves it: nothing to
  // replay, and compacted by RocksDB's background work (a bulk load of 10M entries in a
  // minute leaves a compaction backlog that a real index would not have).
  return store->Compact();
}

// An engine session of the bench's layout.
Result<std::unique_ptr<Client>> Engine(const std::string& socket, const std::string& name) {
  ClientOptions o;
  o.socket_path = socket;
  o.engine_name = name;
  o.layout = RestartLayout();
  return Client::Connect(o);
}

// Retries until a sample block is served with its bytes; returns the seconds since t0.
Result<double> FirstHit(const std::string& socket, double t0_us) {
  const ModelLayout layout = RestartLayout();
  const std::vector<BlockHash> sample = {HashOf(kSamples / 2)};
  for (int attempt = 0; attempt < 2'000; ++attempt) {
    auto c = Engine(socket, "bench-restart");
    if (!c.ok()) {
      ::usleep(500);
      continue;
    }
    for (int i = 0; i < 5'000; ++i) {
      auto l = (*c)->Lookup(sample);
      if (!l.ok()) break;
      if (l->matched == 1) {
        auto a = (*c)->Acquire(sample);
        if (a.ok() && (*a)[0].status.ok()) {
          auto bytes = (*c)->PageBytes((*a)[0].tier, (*a)[0].page);
          if (CheckBlockPattern(sample[0], bytes.first(layout.block_bytes))) return (NowUs() - t0_us) * 1e-6;
          return DataLoss("the sample came back with other bytes");
        }
      }
      ::usleep(200);
    }
  }
  return Unavailable("no hit was served");
}

// Waits until the NVMe tier's index is loaded and it takes spills; the seconds since t0, or
// 0 when it was not within a minute.
double WaitReady(const std::string& socket, double t0_us) {
  ControlClientOptions o;
  o.socket_path = socket;
  auto c = ControlClient::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "kvtier-bench: %s\n", c.status().ToString().c_str());
    return 0;
  }
  for (int i = 0; i < 60'000; ++i) {
    auto s = (*c)->Stats();
    if (!s.ok()) {
      std::fprintf(stderr, "kvtier-bench: stats: %s\n", s.status().ToString().c_str());
      return 0;
    }
    for (const auto& t : s->tiers) {
      if (t.tier == TierKind::kNvme && t.ready) return (NowUs() - t0_us) * 1e-6;
    }
    ::usleep(1000);
  }
  return 0;
}

}  // namespace

int RunColdIndexBench(const BenchArgs& args) {
  const uint64_t blocks = args.blocks;
  constexpr size_t kChain = 8192;  // a 128K-token prompt of 16-token blocks
  testing::DaemonProcess d(RestartDaemon(true, blocks));
  if (Status s = Populate(d, blocks); !s.ok()) {
    std::fprintf(stderr, "kvtier-bench cold-index: populating the index: %s\n", s.ToString().c_str());
    return 1;
  }
  const double t0 = NowUs();
  if (Status s = d.Start(); !s.ok()) {
    std::fprintf(stderr, "kvtier-bench cold-index: %s\n", s.ToString().c_str());
    return 1;
  }
  if (WaitReady(d.socket_path(), t0) == 0) {
    std::fprintf(stderr, "kvtier-bench cold-index: the NVMe index was not loaded in time\n%s\n", d.Log().c_str());
    return 1;
  }
  // The other session: an 8-block chain of its own in host memory, looked up again and again.
  auto other = Engine(d.socket_path(), "bench-other");
  if (!other.ok()) {
    std::fprintf(stderr, "kvtier-bench cold-index: %s\n", other.status().ToString().c_str());
    return 1;
  }
  std::vector<BlockHash> warm;
  for (uint64_t i = 0; i < 8; ++i) warm.push_back(IndexHash(78, i));
  {
    auto pages = (*other)->Allocate(TierKind::kHost, 8);
    if (!pages.ok()) return 1;
    std::vector<CommitEntry> e;
    for (size_t i = 0; i < warm.size(); ++i) e.push_back({(*pages)[i], warm[i], i ? warm[i - 1] : BlockHash()});
    if (!(*other)->Commit(TierKind::kHost, e).ok()) return 1;
  }
  auto measure = [&](double seconds) {
    Latencies l;
    const double end = NowUs() + seconds * 1e6;
    while (NowUs() < end) {
      const double a = NowUs();
      auto r = (*other)->Lookup(warm);
      if (!r.ok() || r->matched != warm.size()) return Latencies{};
      l.Add(NowUs() - a);
      ::usleep(500);
    }
    return l;
  };
  // Rounds of: the other session alone, then beside a session looking up cold chains: 8,192
  // blocks each, all in the NVMe index and none in memory, so the whole chain is probed.
  Latencies alone, beside, cold;
  std::mt19937_64 rng(7);
  for (int round = 0; round < args.rounds; ++round) {
    alone.Append(measure(1.0));
    std::atomic<bool> stop{false};
    std::thread reader([&] {
      auto c = Engine(d.socket_path(), "bench-cold");
      if (!c.ok()) return;
      std::vector<BlockHash> chain(kChain);
      while (!stop.load()) {
        const uint64_t from = kSamples + rng() % (blocks - kSamples - kChain);
        for (size_t i = 0; i < kChain; ++i) chain[i] = HashOf(from + i);
        const double a = NowUs();
        auto r = (*c)->Lookup(chain);
        if (!r.ok() || r->matched != kChain) {
          std::fprintf(stderr, "kvtier-bench cold-index: a cold chain matched %zu of %zu\n", r.ok() ? r->matched : 0,
                       kChain);
          return;
        }
        cold.Add(NowUs() - a);
      }
    });
    beside.Append(measure(1.0));
    stop = true;
    reader.join();
  }
  d.Stop();
  if (alone.count() == 0 || beside.count() == 0 || cold.count() == 0) {
    std::fprintf(stderr, "kvtier-bench cold-index: a measurement failed\n");
    return 1;
  }
  const double ratio = beside.Percentile(99) / alone.Percentile(99);
  nlohmann::json j{{"blocks", blocks},
                   {"cold_chain_blocks", kChain},
                   {"cold_lookup_p50_us", cold.Percentile(50)},
                   {"cold_lookups", cold.count()},
                   {"other_p99_alone_us", alone.Percentile(99)},
                   {"other_p99_beside_us", beside.Percentile(99)},
                   {"other_p99_ratio", ratio}};
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("kvtier-bench cold-index: %llu indexed NVMe blocks, cold chains of %zu blocks\n",
              static_cast<unsigned long long>(blocks), kChain);
  std::printf("  a cold chain's Lookup (the whole chain read from the index): p50 %.0f us (%zu lookups)\n",
              cold.Percentile(50), cold.count());
  std::printf("  another session's 8-block Lookup p99: %.0f us alone, %.0f us beside them: ratio %.2f\n",
              alone.Percentile(99), beside.Percentile(99), ratio);
  return 0;
}

int RunRestartBench(const BenchArgs& args) {
  const uint64_t blocks = args.blocks;
  // Baseline: the same daemon without an NVMe tier.
  uint64_t base_rss = 0;
  {
    testing::DaemonProcess base(RestartDaemon(false, blocks));
    if (Status s = base.Start(); !s.ok()) {
      std::fprintf(stderr, "kvtier-bench restart: %s\n", s.ToString().c_str());
      return 1;
    }
    {
      ClientOptions o;  // an engine session, as in the real run
      o.socket_path = base.socket_path();
      o.layout = RestartLayout();
      auto c = Client::Connect(o);
      if (c.ok()) (void)(*c)->Lookup(std::vector<BlockHash>{HashOf(0)});
    }
    base_rss = RssKb(base.pid());
    base.Stop();
  }
  testing::DaemonProcess d(RestartDaemon(true, blocks));
  const double p0 = NowUs();
  if (Status s = Populate(d, blocks); !s.ok()) {
    std::fprintf(stderr, "kvtier-bench restart: populating the index: %s\n", s.ToString().c_str());
    return 1;
  }
  const double populate_s = (NowUs() - p0) * 1e-6;
  const double t0 = NowUs();
  if (Status s = d.Start(); !s.ok()) {
    std::fprintf(stderr, "kvtier-bench restart: %s\n", s.ToString().c_str());
    return 1;
  }
  auto first = FirstHit(d.socket_path(), t0);
  if (!first.ok()) {
    std::fprintf(stderr, "kvtier-bench restart: %s\n%s\n", first.status().ToString().c_str(), d.Log().c_str());
    return 1;
  }
  // Wait for the background load of slot occupancy, then weigh the daemon.
  const double ready_s = WaitReady(d.socket_path(), t0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const uint64_t rss = RssKb(d.pid());
  if (std::getenv("KVTIER_BENCH_PAUSE")) {
    std::fprintf(stderr, "pid %d paused\n", d.pid());
    std::this_thread::sleep_for(std::chrono::seconds(std::atoi(std::getenv("KVTIER_BENCH_PAUSE"))));
  }
  const double per_block = (static_cast<double>(rss) - static_cast<double>(base_rss)) * 1024.0 / blocks;
  d.Stop();
  nlohmann::json j{{"blocks", blocks},
                   {"restart_s", *first},
                   {"spills_ready_s", ready_s},
                   {"index_bytes_per_block", per_block},
                   {"rss_kb", rss},
                   {"baseline_rss_kb", base_rss},
                   {"populate_s", populate_s}};
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("kvtier-bench restart: %llu indexed NVMe blocks of 4 KiB\n", static_cast<unsigned long long>(blocks));
  std::printf("  start -> first verified hit served   %.3f s\n", *first);
  std::printf("  start -> index loaded, spills on     %.3f s\n", ready_s);
  std::printf("  anonymous RSS %llu kB vs %llu kB without NVMe: %.1f bytes of RAM per NVMe block\n",
              static_cast<unsigned long long>(rss), static_cast<unsigned long long>(base_rss), per_block);
  std::printf("  (index written in %.1f s)\n", populate_s);
  return 0;
}

}  // namespace kvtier::bench
