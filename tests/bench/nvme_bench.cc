// kvtier-bench nvme: spill and fetch throughput through kvtierd against fio on the same
// file system, same block size and queue depth, in the same run.
//
// Per page size (256 KiB, 2 MiB, 16 MiB): fio sequential write of the data set, then
// kvtier's spill path — an engine commits blocks into a small host tier whose Allocates
// wait for demotions, so the rate is the rate of commit -> demote -> index — then fio
// random read, then kvtier's fetch path — Acquire of NVMe-only blocks, pipelined, each
// promoted into a host page and checksum-verified. durability: relaxed (fio does not sync
// either); the strict figure is printed alongside for the 2 MiB size.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <nlohmann/json.hpp>
#include <thread>

#include "protocol/base/units.h"
#include "tests/bench/bench_main.h"
#include "tests/bench/bench_util.h"

namespace kvtier::bench {
namespace {

using json = nlohmann::json;

struct SizeResult {
  uint64_t page_bytes = 0;
  uint64_t blocks = 0;
  double fio_write = 0, fio_read = 0;      // bytes/s
  double kvtier_write = 0, kvtier_read = 0;
  double strict_write = 0;
};

Result<double> Fio(const std::string& file, uint64_t bs, uint64_t size, uint32_t qd, const char* rw) {
  const std::string cmd = "fio --name=kvtier-bench --filename=" + file + " --size=" + std::to_string(size) +
                          " --bs=" + std::to_string(bs) + " --iodepth=" + std::to_string(qd) + " --rw=" + rw +
                          " --direct=1 --ioengine=io_uring --output-format=json 2>/dev/null";
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

// Polls Stats until the NVMe tier has `n` blocks and nothing in flight.
Status WaitSpilled(Client& control, uint64_t n) {
  for (int i = 0; i < 60'000; ++i) {
    KVTIER_ASSIGN_OR_RETURN(DaemonStats s, control.Stats());
    for (const auto& t : s.tiers) {
      if (t.tier == TierKind::kNvme && t.blocks >= n && t.inflight_pages == 0) return Status::Ok();
    }
    ::usleep(1000);
  }
  return Unavailable("spills did not finish");
}

// Engine-side spill run: commits `blocks` blocks; returns bytes/s from the first commit to
// the last block indexed on NVMe.
Result<double> KvtierWrite(const std::string& socket, const ModelLayout& layout, uint64_t blocks,
                           uint32_t batch, uint64_t seed) {
  ClientOptions o;
  o.socket_path = socket;
  o.engine_name = "bench-nvme-writer";
  o.layout = layout;
  KVTIER_ASSIGN_OR_RETURN(auto c, Client::Connect(o));
  ClientOptions co = o;
  co.control = true;
  KVTIER_ASSIGN_OR_RETURN(auto control, Client::Connect(co));
  KVTIER_ASSIGN_OR_RETURN(DaemonStats before, control->Stats());
  uint64_t nvme_before = 0;
  for (const auto& t : before.tiers) {
    if (t.tier == TierKind::kNvme) nvme_before = t.blocks;
  }
  const double t0 = NowUs();
  uint64_t done = 0;
  for (uint64_t b = 0; b < blocks; b += batch) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(batch, blocks - b));
    KVTIER_ASSIGN_OR_RETURN(auto pages, c->Allocate(TierKind::kHost, n));
    std::vector<CommitEntry> e;
    auto hashes = testing::HashChain(seed + b, n);
    for (uint32_t i = 0; i < n; ++i) {
      auto bytes = c->PageBytes(TierKind::kHost, pages[i]);
      std::memcpy(bytes.data(), &hashes[i], sizeof(uint64_t));  // distinct content, cheaply
      e.push_back({pages[i], hashes[i], {}});
    }
    KVTIER_ASSIGN_OR_RETURN(auto r, c->Commit(TierKind::kHost, e));
    done += r.size();
  }
  // Everything committed beyond what the host tier keeps has reached NVMe.
  const uint64_t host_pages = c->tiers().empty() ? 0 : [&] {
    for (const auto& t : c->tiers()) {
      if (t.tier == TierKind::kHost) return static_cast<uint64_t>(t.capacity_pages);
    }
    return uint64_t{0};
  }();
  const uint64_t expect = nvme_before + (done > host_pages ? done - host_pages : 0);
  KVTIER_RETURN_IF_ERROR(WaitSpilled(*control, expect));
  const double secs = (NowUs() - t0) * 1e-6;
  KVTIER_ASSIGN_OR_RETURN(DaemonStats after, control->Stats());
  const uint64_t spilled = after.demotions - before.demotions;
  return static_cast<double>(spilled * layout.block_bytes) / secs;
}

// Fetch run: acquires `blocks` NVMe-only blocks, `depth` at a time in flight.
Result<double> KvtierRead(const std::string& socket, const ModelLayout& layout, uint64_t blocks,
                          uint32_t depth, uint64_t seed) {
  ClientOptions o;
  o.socket_path = socket;
  o.engine_name = "bench-nvme-reader";
  o.layout = layout;
  KVTIER_ASSIGN_OR_RETURN(auto c, Client::Connect(o));
  // The first blocks of the write run are the ones long demoted.
  std::vector<BlockHash> hashes;
  for (uint64_t b = 0; b < blocks; ++b) hashes.push_back(testing::HashChain(seed + b, 1)[0]);
  std::deque<std::pair<Ticket, BlockHash>> inflight;
  uint64_t got = 0, failed = 0;
  auto drain_one = [&]() -> Status {
    auto [t, h] = inflight.front();
    inflight.pop_front();
    KVTIER_ASSIGN_OR_RETURN(auto r, c->WaitAcquire(t));
    if (!r[0].status.ok()) {
      ++failed;
      return Status::Ok();
    }
    ++got;
    std::vector<BlockHash> one = {h};
    return c->Release(TierKind::kHost, {}, one).status();
  };
  const double t0 = NowUs();
  for (const BlockHash& h : hashes) {
    std::vector<BlockHash> one = {h};
    KVTIER_ASSIGN_OR_RETURN(Ticket t, c->StartAcquire(one));
    inflight.emplace_back(t, h);
    if (inflight.size() >= depth) KVTIER_RETURN_IF_ERROR(drain_one());
  }
  while (!inflight.empty()) KVTIER_RETURN_IF_ERROR(drain_one());
  const double secs = (NowUs() - t0) * 1e-6;
  if (got == 0) return Internal("no block could be fetched");
  if (failed > blocks / 20) return Internal(std::to_string(failed) + " of " + std::to_string(blocks) + " fetches failed");
  return static_cast<double>(got * layout.block_bytes) / secs;
}

Result<double> RunDaemonWrite(const testing::TempDir& dir, uint64_t page, uint64_t blocks, uint32_t qd,
                              const std::string& durability, bool also_read, double* read_bps) {
  testing::DaemonProcess::Options o;
  const uint64_t host_pages = 32;
  o.page_bytes = std::to_string(page);
  o.segment_bytes = std::to_string(page * 8);
  o.host_capacity = std::to_string(page * host_pages);
  o.nvme_capacity = std::to_string(page * (blocks + 64));
  o.nvme_yaml = "    durability: " + durability + "\n    queue_depth: " + std::to_string(qd * 2) + "\n";
  o.extra_yaml = "";
  (void)dir;
  KVTIER_ASSIGN_OR_RETURN(auto daemon, BenchDaemon::Start("", o));
  const ModelLayout layout = LayoutFor(page);
  // Warm-up: the host pool's pages are touched and its segments registered for I/O.
  KVTIER_RETURN_IF_ERROR(KvtierWrite(daemon->socket(), layout, host_pages * 2, 8, 1'000'000'000).status());
  KVTIER_ASSIGN_OR_RETURN(double w, KvtierWrite(daemon->socket(), layout, blocks, 8, 0));
  if (also_read) {
    KVTIER_ASSIGN_OR_RETURN(*read_bps, KvtierRead(daemon->socket(), layout, blocks - host_pages, qd, 0));
  }
  return w;
}

}  // namespace

int RunNvmeBench(const BenchArgs& args) {
  testing::TempDir dir;
  const uint32_t qd = 8;
  std::vector<SizeResult> results;
  for (uint64_t page : {256ull << 10, 2ull << 20, 16ull << 20}) {
    SizeResult r;
    r.page_bytes = page;
    const uint64_t bytes = page == (256ull << 10) ? (512ull << 20) : (1ull << 30);
    r.blocks = bytes / page;
    const std::string fio_file = dir.File("fio.dat");
    auto fw = Fio(fio_file, page, bytes, qd, "write");
    auto fr = fw.ok() ? Fio(fio_file, page, bytes, qd, "randread") : fw;
    ::unlink(fio_file.c_str());
    if (!fr.ok()) {
      std::fprintf(stderr, "kvtier-bench nvme: %s\n", fr.status().ToString().c_str());
      return 1;
    }
    r.fio_write = *fw;
    r.fio_read = *fr;
    double read_bps = 0;
    auto kw = RunDaemonWrite(dir, page, r.blocks, qd, "relaxed", true, &read_bps);
    if (!kw.ok()) {
      std::fprintf(stderr, "kvtier-bench nvme: %s pages: %s\n", FormatBytes(page).c_str(),
                   kw.status().ToString().c_str());
      return 1;
    }
    r.kvtier_write = *kw;
    r.kvtier_read = read_bps;
    if (page == (2ull << 20)) {
      auto sw = RunDaemonWrite(dir, page, r.blocks / 2, qd, "strict", false, nullptr);
      if (sw.ok()) r.strict_write = *sw;
    }
    results.push_back(r);
  }
  json j;
  j["queue_depth"] = qd;
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
  std::printf("through kvtierd vs fio --direct=1 --ioengine=io_uring on the same file system, QD %u\n\n", qd);
  std::printf("%-8s %12s %12s %7s | %12s %12s %7s\n", "page", "fio write", "kvtier", "ratio", "fio randread",
              "kvtier", "ratio");
  for (const SizeResult& r : results) {
    std::printf("%-8s %10.0f/s %10.0f/s %7.2f | %10.0f/s %10.0f/s %7.2f\n", FormatBytes(r.page_bytes).c_str(),
                r.fio_write / 1048576, r.kvtier_write / 1048576, r.kvtier_write / r.fio_write,
                r.fio_read / 1048576, r.kvtier_read / 1048576, r.kvtier_read / r.fio_read);
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
