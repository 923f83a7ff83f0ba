// kvtier-bench nvme: spill and fetch throughput through kvtierd against fio on the same
// file system, same block size and queue depth, in the same run.
//
// fio runs with --fixedbufs: kvtier registers the host pool with io_uring, and on a VM the
// per-I/O page pinning that registration saves is worth up to 2.5x on 2 MiB reads, so
// fio without it would be a baseline kvtier beats by technique, not by being close to the
// device.
//
// Per page size (256 KiB, 2 MiB, 16 MiB): fio sequential write of the data set, then
// kvtier's spill path — an engine commits blocks into a small host tier whose Allocates
// wait for demotions, so the rate is the rate of commit -> demote -> index — then fio
// random read, then kvtier's fetch path — Acquire of NVMe-only blocks, pipelined, each
// promoted into a host page and checksum-verified. durability: relaxed (fio does not sync
// either); the strict figure is printed alongside for the 2 MiB size.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <unordered_map>

#include "protocol/base/units.h"
#include "tests/bench/bench_main.h"
#include "tests/bench/bench_util.h"

namespace kvtier::bench {
namespace {

using json = nlohmann::json;

struct SizeResult {
  uint64_t page_bytes = 0;
  uint64_t blocks = 0;
  double fio_write = 0, fio_read = 0;  // bytes/s
  double kvtier_write = 0, kvtier_read = 0;
  double strict_write = 0;
};

// fio's bandwidth for `rw` over the first `size` bytes of `file`; with `seconds` > 0 it
// runs for that long (time based) instead of once over the range.
Result<double> Fio(const std::string& file, uint64_t bs, uint64_t size, uint32_t qd, const char* rw,
                   double seconds = 0) {
  const std::string timed = seconds > 0 ? " --time_based --runtime=" + std::to_string(seconds) : "";
  const std::string cmd = "fio --name=kvtier-bench --filename=" + file + " --size=" + std::to_string(size) + timed +
                          " --bs=" + std::to_string(bs) + " --iodepth=" + std::to_string(qd) + " --rw=" + rw +
                          " --direct=1 --ioengine=io_uring --fixedbufs=1" +
                          (std::strcmp(rw, "write") == 0 ? "" : " --readonly") + " --output-format=json 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return Internal("cannot run fio");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (::pclose(p) != 0) return Unavailable("fio failed (is it installed? scripts/deps.sh)");
  try {
    auto j = json::parse(out);
    const auto& job = j["jobs"][0];
    const char* dir = std::strcmp(rw, "write") == 0 ? "write" : "read";
    return job[dir]["bw_bytes"].get<double>();
  } catch (const std::exception& e) {
    return Internal(std::string("cannot parse fio output: ") + e.what());
  }
}

ModelLayout LayoutFor(uint64_t page_bytes) {
  // One block fills its page: 2 x layers x heads x dim x 2 bytes x tokens = page_bytes.
  ModelLayout l;
  l.model_id = "bench-nvme";
  l.num_layers = 1;
  l.kv_heads = 1;
  l.head_dim = 128;
  l.dtype = DType::kBFloat16;
  l.tokens_per_block = static_cast<uint32_t>(page_bytes / (2 * 128 * 2));
  l.block_bytes = page_bytes;
  return l;
}

// Polls Stats until `n` demotions more than `before` are done and nothing is in flight.
Status WaitSpilled(ControlClient& control, uint64_t before, uint64_t n) {
  for (int i = 0; i < 120'000; ++i) {
    KVTIER_ASSIGN_OR_RETURN(DaemonStats s, control.Stats());
    bool idle = true;
    for (const auto& t : s.tiers) idle &= t.inflight_pages == 0;
    if (s.demotions - before >= n && idle) return Status::Ok();
    ::usleep(200);
  }
  return Unavailable("spills did not finish");
}

// Engine-side spill run: commits `blocks` blocks; returns bytes/s from the first commit to
// the last block indexed on NVMe.
Result<double> KvtierWrite(const std::string& socket, const ModelLayout& layout, uint64_t blocks, uint32_t batch,
                           uint64_t seed) {
  ClientOptions o;
  o.socket_path = socket;
  o.engine_name = "bench-nvme-writer";
  o.layout = layout;
  KVTIER_ASSIGN_OR_RETURN(auto c, Client::Connect(o));
  ControlClientOptions co;
  co.socket_path = o.socket_path;
  KVTIER_ASSIGN_OR_RETURN(auto control, ControlClient::Connect(co));
  KVTIER_ASSIGN_OR_RETURN(DaemonStats before, control->Stats());
  const double t0 = NowUs();
  uint64_t done = 0;
  for (uint64_t b = 0; b < blocks; b += batch) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(batch, blocks - b));
    KVTIER_ASSIGN_OR_RETURN(auto pages, c->Allocate(TierKind::kHost, n));
    std::vector<CommitEntry> e;
    for (uint32_t i = 0; i < n; ++i) {
      const BlockHash h = IndexHash(seed, b + i);
      auto bytes = c->PageBytes(TierKind::kHost, pages[i]);
      std::memcpy(bytes.data(), h.bytes().data(), h.size());  // distinct content, cheaply
      e.push_back({pages[i], h, {}});
    }
    KVTIER_ASSIGN_OR_RETURN(auto r, c->Commit(TierKind::kHost, e));
    done += r.size();
  }
  // Everything committed beyond what the host tier keeps has been demoted.
  uint64_t host_pages = 0;
  for (const auto& t : c->tiers()) {
    if (t.tier == TierKind::kHost) host_pages = t.capacity_pages;
  }
  KVTIER_RETURN_IF_ERROR(WaitSpilled(*control, before.demotions, done > host_pages ? done - host_pages : 0));
  const double secs = (NowUs() - t0) * 1e-6;
  KVTIER_ASSIGN_OR_RETURN(DaemonStats after, control->Stats());
  const uint64_t spilled = after.demotions - before.demotions;
  return static_cast<double>(spilled * layout.block_bytes) / secs;
}

// Fetch run: for `seconds`, acquires NVMe-only blocks from `pool` in random order, `depth`
// requests at a time in flight (twice the device queue depth, so the requests' round trips
// do not leave the device idle; the daemon never has more than its queue_depth reads on
// the device, like fio's iodepth); a fetched block is released at once and soon evicted from the small
// host tier again, so cycling through a pool many times its size always reads NVMe.
Result<double> KvtierRead(const std::string& socket, const ModelLayout& layout, std::vector<BlockHash> hashes,
                          uint32_t depth, double seconds, uint64_t seed) {
  ClientOptions o;
  o.socket_path = socket;
  o.engine_name = "bench-nvme-reader";
  o.layout = layout;
  KVTIER_ASSIGN_OR_RETURN(auto c, Client::Connect(o));
  const uint64_t blocks = hashes.size();
  // Random order, as fio's randread: slots were written in order, so reading them in order
  // would be a sequential read.
  std::mt19937_64 rng(seed);
  std::shuffle(hashes.begin(), hashes.end(), rng);
  std::unordered_map<Ticket, BlockHash> inflight;
  std::vector<Ticket> tickets;
  std::vector<Ticket> releases;  // sent without waiting, so the fetch queue stays full
  uint64_t got = 0, failed = 0;
  // Takes whichever fetch finishes first, as fio reaps any completion: waiting for the
  // oldest would let one slow read hold the queue below its depth.
  auto drain_one = [&]() -> Status {
    tickets.clear();
    for (const auto& [t, h] : inflight) tickets.push_back(t);
    KVTIER_ASSIGN_OR_RETURN(Ticket t, c->WaitAny(tickets));
    const BlockHash h = inflight.at(t);
    inflight.erase(t);
    KVTIER_ASSIGN_OR_RETURN(auto r, c->WaitAcquire(t));
    if (!r[0].status.ok()) {
      ++failed;
      return Status::Ok();
    }
    ++got;
    std::vector<BlockHash> one = {h};
    KVTIER_ASSIGN_OR_RETURN(Ticket rt, c->StartRelease(TierKind::kHost, {}, one));
    releases.push_back(rt);
    return Status::Ok();
  };
  ControlClientOptions co;
  co.socket_path = o.socket_path;
  KVTIER_ASSIGN_OR_RETURN(auto control, ControlClient::Connect(co));
  KVTIER_ASSIGN_OR_RETURN(DaemonStats before, control->Stats());
  const double t0 = NowUs();
  for (size_t i = 0; NowUs() - t0 < seconds * 1e6; i = (i + 1) % hashes.size()) {
    const BlockHash& h = hashes[i];
    std::vector<BlockHash> one = {h};
    KVTIER_ASSIGN_OR_RETURN(Ticket t, c->StartAcquire(one));
    inflight.emplace(t, h);
    if (inflight.size() >= depth) KVTIER_RETURN_IF_ERROR(drain_one());
  }
  while (!inflight.empty()) KVTIER_RETURN_IF_ERROR(drain_one());
  const double secs = (NowUs() - t0) * 1e-6;
  for (Ticket rt : releases) KVTIER_RETURN_IF_ERROR(c->WaitRelease(rt).status());
  if (got == 0) return Internal("no block could be fetched");
  if (failed > got / 20) return Internal(std::to_string(failed) + " of " + std::to_string(blocks) + " fetches failed");
  // Count only what was read from NVMe, not blocks that happened to still be in host.
  KVTIER_ASSIGN_OR_RETURN(DaemonStats after, control->Stats());
  const uint64_t promoted = after.promotions - before.promotions;
  if (promoted < got * 9 / 10) {
    return Internal("only " + std::to_string(promoted) + " of " + std::to_string(got) + " fetches came from NVMe");
  }
  return static_cast<double>(promoted * layout.block_bytes) / secs;
}

constexpr double kReadSeconds = 1.5;

// One page size: a daemon of its own, then `rounds` rounds of fio write, kvtier spill,
// fio random read, kvtier fetch — interleaved so that the machine's drift hits both sides.
Result<SizeResult> MeasureSize(const testing::TempDir& dir, uint64_t page, uint64_t bytes_per_round, int rounds,
                               uint32_t qd, const std::string& durability) {
  SizeResult r;
  r.page_bytes = page;
  r.blocks = bytes_per_round / page;
  // A small host tier (at most a quarter of a round) so most of each round goes to NVMe.
  const uint64_t host_pages = std::min<uint64_t>(32, r.blocks / 4);
  testing::DaemonProcess::Options o;
  o.page_bytes = std::to_string(page);
  o.segment_bytes = std::to_string(page * 4);
  o.host_capacity = std::to_string(page * host_pages);
  // Room for every round below the NVMe high watermark: nothing is evicted.
  o.nvme_capacity = std::to_string(page * ((r.blocks * rounds + 2 * host_pages) * 10 / 9 + 64));
  // The daemon's device queue depth is fio's iodepth: never more than qd I/Os in flight.
  o.nvme_yaml = "    durability: " + durability + "\n    queue_depth: " + std::to_string(qd) + "\n";
  KVTIER_ASSIGN_OR_RETURN(auto daemon, BenchDaemon::Start("", o));
  const ModelLayout layout = LayoutFor(page);
  // Warm-up: the host pool's pages are touched and its segments registered for I/O.
  KVTIER_RETURN_IF_ERROR(KvtierWrite(daemon->socket(), layout, host_pages * 2, 8, 999).status());
  std::vector<double> fw, fr, kw, kr;
  uint64_t written = 2 * host_pages * page;  // the warm-up's
  std::vector<BlockHash> pool;
  const std::string fio_file = dir.File("fio.dat");
  for (int round = 0; round < rounds; ++round) {
    // Which side goes first alternates (ABBA): this disk's speed drifts with its own
    // recent load, and going second after a burst must not always fall to one side.
    const bool fio_first = round % 2 == 0;
    auto fio_write = [&]() -> Status {
      KVTIER_ASSIGN_OR_RETURN(double v, Fio(fio_file, page, bytes_per_round, qd, "write"));
      fw.push_back(v);
      return Status::Ok();
    };
    auto kvtier_write = [&]() -> Status {
      KVTIER_ASSIGN_OR_RETURN(double v, KvtierWrite(daemon->socket(), layout, r.blocks, 8, round));
      kw.push_back(v);
      written += r.blocks * page;
      // Every round's blocks but the last few (still in the host tier) are NVMe-only.
      for (uint64_t b = 0; b + host_pages < r.blocks; ++b) pool.push_back(IndexHash(round, b));
      return Status::Ok();
    };
    // Random reads of the kvtier slot file itself, over what has been written to it: the
    // same blocks on the same device in the same state as the fetches.
    auto fio_read = [&]() -> Status {
      KVTIER_ASSIGN_OR_RETURN(double v, Fio(daemon->slot_file(), page, written, qd, "randread", kReadSeconds));
      fr.push_back(v);
      return Status::Ok();
    };
    auto kvtier_read = [&]() -> Status {
      KVTIER_ASSIGN_OR_RETURN(double v, KvtierRead(daemon->socket(), layout, pool, 2 * qd, kReadSeconds, round));
      kr.push_back(v);
      return Status::Ok();
    };
    if (fio_first) {
      KVTIER_RETURN_IF_ERROR(fio_write());
      KVTIER_RETURN_IF_ERROR(kvtier_write());
      KVTIER_RETURN_IF_ERROR(fio_read());
      KVTIER_RETURN_IF_ERROR(kvtier_read());
    } else {
      KVTIER_RETURN_IF_ERROR(kvtier_write());
      KVTIER_RETURN_IF_ERROR(fio_write());
      KVTIER_RETURN_IF_ERROR(kvtier_read());
      KVTIER_RETURN_IF_ERROR(fio_read());
    }
    ::unlink(fio_file.c_str());
  }
  r.fio_write = Median(fw);
  r.fio_read = Median(fr);
  r.kvtier_write = Median(kw);
  r.kvtier_read = Median(kr);
  return r;
}

}  // namespace

int RunNvmeBench(const BenchArgs& args) {
  testing::TempDir dir;
  const uint32_t qd = 8;
  const int rounds = 4;
  std::vector<SizeResult> results;
  for (uint64_t page : {256ull << 10, 2ull << 20, 16ull << 20}) {
    auto r = MeasureSize(dir, page, 1ull << 30, rounds, qd, "relaxed");
    if (!r.ok()) {
      std::fprintf(stderr, "kvtier-bench nvme: %s pages: %s\n", FormatBytes(page).c_str(),
                   r.status().ToString().c_str());
      return 1;
    }
    if (page == (2ull << 20)) {
      auto strict = MeasureSize(dir, page, 1ull << 30, 1, qd, "strict");
      if (strict.ok()) r->strict_write = strict->kvtier_write;
    }
    results.push_back(*r);
  }
  json j;
  j["queue_depth"] = qd;
  j["rounds"] = rounds;
  for (const SizeResult& r : results) {
    const std::string sfx = r.page_bytes == (256ull << 10) ? "256k" : r.page_bytes == (2ull << 20) ? "2m" : "16m";
    j["fio_write_bps_" + sfx] = r.fio_write;
    j["fio_read_bps_" + sfx] = r.fio_read;
    j["kvtier_write_bps_" + sfx] = r.kvtier_write;
    j["kvtier_read_bps_" + sfx] = r.kvtier_read;
    j["write_ratio_" + sfx] = r.kvtier_write / r.fio_write;
    j["read_ratio_" + sfx] = r.kvtier_read / r.fio_read;
    if (r.strict_write > 0) j["kvtier_strict_write_bps_" + sfx] = r.strict_write;
  }
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("kvtier-bench nvme: spill (commit -> demote -> index) and fetch (acquire -> read -> verify)\n");
  std::printf("through kvtierd vs fio --direct=1 --ioengine=io_uring --fixedbufs on the same file system, QD %u;\n",
              qd);
  std::printf("medians of %d interleaved rounds: writes of 1 GiB, reads for %.1f s\n\n", rounds, kReadSeconds);
  std::printf("%-8s %12s %12s %7s | %12s %12s %7s\n", "page", "fio write", "kvtier", "ratio", "fio randread", "kvtier",
              "ratio");
  for (const SizeResult& r : results) {
    std::printf("%-8s %10.0f/s %10.0f/s %7.2f | %10.0f/s %10.0f/s %7.2f\n", FormatBytes(r.page_bytes).c_str(),
                r.fio_write / 1048576, r.kvtier_write / 1048576, r.kvtier_write / r.fio_write, r.fio_read / 1048576,
                r.kvtier_read / 1048576, r.kvtier_read / r.fio_read);
  }
  std::printf("(MiB/s)\n");
  for (const SizeResult& r : results) {
    if (r.strict_write > 0) {
      std::printf("durability strict, %s pages: spill %.0f MiB/s (%.2f of fio's unsynced write)\n",
                  FormatBytes(r.page_bytes).c_str(), r.strict_write / 1048576, r.strict_write / r.fio_write);
    }
  }
  return 0;
}

}  // namespace kvtier::bench
