// kvtier-bench rpc: request latency through kvtierd against a bare Unix-socket echo of the
// same message sizes, measured in the same run, interleaved round by round so drift on a
// noisy machine hits both alike.
//
// Operations: Lookup of 1 block; Lookup of a 64-block chain; Lookup and Acquire of an
// 8,192-block chain (128K tokens in 16-token blocks; the Acquire's references are released
// after each timed call, untimed); Allocate + Commit + Release of 16 pages (three round
// trips). The echo baseline does, per operation, the same number of
// round trips with requests and replies of the same sizes as kvtier's frames, between
// this process and a forked server process blocked in read(2).
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "protocol/codec.h"
#include "protocol/framing.h"
#include "tests/bench/bench_main.h"
#include "tests/bench/bench_util.h"

namespace kvtier::bench {
namespace {

using json = nlohmann::json;

// Sizes of one round trip: request frame bytes, response frame bytes.
struct Trip {
  uint32_t request;
  uint32_t response;
};

uint32_t Size(flatbuffers::FlatBufferBuilder& b) { return b.GetSize(); }

// Frames kvtier exchanges for each operation, built the way client and daemon build them.
std::vector<Trip> LookupTrips(size_t n_hashes) {
  std::vector<BlockHash> hs = testing::HashChain(1, n_hashes);
  flatbuffers::FlatBufferBuilder q, r;
  q.FinishSizePrefixed(fb::CreateRequest(q, 1, fb::Op::Lookup, fb::CreateLookup(q, HashesToWire(q, hs)).Union()));
  std::vector<uint8_t> tiers(n_hashes, static_cast<uint8_t>(fb::Tier::Host));
  auto tv = r.CreateVector(reinterpret_cast<const fb::Tier*>(tiers.data()), tiers.size());
  fb::ResponseBuilder rb(r);
  auto body = fb::CreateLookupReply(r, static_cast<uint32_t>(n_hashes), tv);
  fb::ResponseBuilder rb2(r);
  (void)rb;
  rb2.add_id(1);
  rb2.add_reply_type(fb::Reply::LookupReply);
  rb2.add_reply(body.Union());
  r.FinishSizePrefixed(rb2.Finish());
  return {{Size(q), Size(r)}};
}

std::vector<Trip> AcquireTrips(size_t n_hashes) {
  std::vector<BlockHash> hs = testing::HashChain(1, n_hashes);
  flatbuffers::FlatBufferBuilder q, r;
  q.FinishSizePrefixed(fb::CreateRequest(q, 1, fb::Op::Acquire, fb::CreateAcquire(q, HashesToWire(q, hs)).Union()));
  std::vector<fb::EntryResult> results(
      n_hashes, fb::EntryResult(fb::Status::Ok, fb::CommitOutcome::Stored, fb::Tier::Host, 0, 7));
  auto body = fb::CreateAcquireReply(r, r.CreateVectorOfStructs(results));
  r.FinishSizePrefixed(fb::CreateResponse(r, 1, fb::Status::Ok, 0, fb::Reply::AcquireReply, body.Union()));
  return {{Size(q), Size(r)}};
}

std::vector<Trip> AllocCommitReleaseTrips(size_t n) {
  std::vector<Trip> trips;
  std::vector<BlockHash> hs = testing::HashChain(2, n);
  std::vector<uint32_t> pages(n, 7);
  std::vector<fb::EntryResult> results(n);
  {
    flatbuffers::FlatBufferBuilder q, r;
    q.FinishSizePrefixed(fb::CreateRequest(q, 1, fb::Op::Allocate, fb::CreateAllocate(q, fb::Tier::Host, 16).Union()));
    auto body = fb::CreateAllocateReply(r, fb::Tier::Host, r.CreateVector(pages));
    r.FinishSizePrefixed(fb::CreateResponse(r, 1, fb::Status::Ok, 0, fb::Reply::AllocateReply, body.Union()));
    trips.push_back({Size(q), Size(r)});
  }
  {
    flatbuffers::FlatBufferBuilder q, r;
    auto c = fb::CreateCommit(q, fb::Tier::Host, q.CreateVector(pages), HashesToWire(q, hs), 0, true);
    q.FinishSizePrefixed(fb::CreateRequest(q, 2, fb::Op::Commit, c.Union()));
    auto body = fb::CreateCommitReply(r, r.CreateVectorOfStructs(results));
    r.FinishSizePrefixed(fb::CreateResponse(r, 2, fb::Status::Ok, 0, fb::Reply::CommitReply, body.Union()));
    trips.push_back({Size(q), Size(r)});
  }
  {
    flatbuffers::FlatBufferBuilder q, r;
    auto rel = fb::CreateRelease(q, fb::Tier::Host, 0, HashesToWire(q, hs));
    q.FinishSizePrefixed(fb::CreateRequest(q, 3, fb::Op::Release, rel.Union()));
    std::vector<uint8_t> st(n, 0);
    auto body = fb::CreateReleaseReply(r, r.CreateVector(reinterpret_cast<const fb::Status*>(st.data()), n));
    r.FinishSizePrefixed(fb::CreateResponse(r, 3, fb::Status::Ok, 0, fb::Reply::ReleaseReply, body.Union()));
    trips.push_back({Size(q), Size(r)});
  }
  return trips;
}

// The echo server: reads a frame whose first payload word is the reply size, answers
// with a frame of that size. One connection, blocking I/O.
[[noreturn]] void EchoServer(int listen_fd) {
  int fd = ::accept(listen_fd, nullptr, nullptr);
  std::vector<uint8_t> buf(1 << 20, 0);
  auto read_full = [&](uint8_t* p, size_t n) {
    while (n > 0) {
      ssize_t r = ::read(fd, p, n);
      if (r <= 0) ::_exit(0);
      p += r;
      n -= static_cast<size_t>(r);
    }
  };
  for (;;) {
    uint32_t len, reply;
    read_full(reinterpret_cast<uint8_t*>(&len), 4);
    read_full(buf.data(), len);
    std::memcpy(&reply, buf.data(), 4);
    std::memcpy(buf.data(), &reply, 4);  // reply frame: prefix = its own payload length
    const uint32_t payload = reply - 4;
    std::memcpy(buf.data(), &payload, 4);
    size_t off = 0;
    while (off < reply) {
      ssize_t w = ::write(fd, buf.data() + off, reply - off);
      if (w <= 0) ::_exit(0);
      off += static_cast<size_t>(w);
    }
  }
}

class EchoClient {
 public:
  ~EchoClient() {
    if (fd_ >= 0) ::close(fd_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Status Start(const std::string& dir, int cpu) {
    const std::string path = dir + "/echo.sock";
    int l = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    if (::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(l, 1) != 0) {
      return ErrnoStatus(errno, "echo bind");
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      PinToCpu(cpu);
      EchoServer(l);
    }
    ::close(l);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return ErrnoStatus(errno, "echo connect");
    }
    buf_.resize(1 << 20);
    return Status::Ok();
  }
  // One round trip of the given sizes.
  Status Trip(const bench::Trip& t) {
    const uint32_t payload = t.request - 4;
    std::memcpy(buf_.data(), &payload, 4);
    std::memcpy(buf_.data() + 4, &t.response, 4);
    KVTIER_RETURN_IF_ERROR(SendFrame(fd_, std::span<const uint8_t>(buf_.data(), t.request), {}));
    size_t got = 0;
    while (got < t.response) {
      ssize_t r = ::read(fd_, buf_.data() + got, t.response - got);
      if (r <= 0) return Internal("echo server went away");
      got += static_cast<size_t>(r);
    }
    return Status::Ok();
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::vector<uint8_t> buf_;
};

struct OpResult {
  std::string name;
  Latencies kvtier, echo;
  double kvtier_ops_s() const { return kvtier.count() / (kvtier.total_us() * 1e-6); }
  double echo_ops_s() const { return echo.count() / (echo.total_us() * 1e-6); }
};

}  // namespace

int RunRpcBench(const BenchArgs& args) {
  testing::DaemonProcess::Options opts;
  opts.host_capacity = "512MiB";
  opts.page_bytes = "16KiB";  // one block of the bench layout; the 8,192-block chain takes 128 MiB
  opts.segment_bytes = "64MiB";
  const int server_cpu = PinClientAndPickServerCpu();
  auto daemon = BenchDaemon::Start(args.socket, opts, server_cpu);
  if (!daemon.ok()) {
    std::fprintf(stderr, "kvtier-bench rpc: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  ClientOptions co;
  co.socket_path = (*daemon)->socket();
  co.engine_name = "kvtier-bench";
  co.layout = testing::TestLayout("bench-model");
  auto client = Client::Connect(co);
  if (!client.ok()) {
    std::fprintf(stderr, "kvtier-bench rpc: %s\n", client.status().ToString().c_str());
    return 1;
  }
  Client& c = **client;
  testing::TempDir dir;
  EchoClient echo;
  if (Status s = echo.Start(dir.path(), server_cpu); !s.ok()) {
    std::fprintf(stderr, "kvtier-bench rpc: %s\n", s.ToString().c_str());
    return 1;
  }

  // Blocks to look up: a 64-block chain, stored once.
  const auto chain = testing::HashChain(1000, 64);
  {
    auto pages = c.Allocate(TierKind::kHost, 64);
    if (!pages.ok()) {
      std::fprintf(stderr, "kvtier-bench rpc: allocate: %s\n", pages.status().ToString().c_str());
      return 1;
    }
    std::vector<CommitEntry> e;
    for (int i = 0; i < 64; ++i) e.push_back({(*pages)[i], chain[i], i ? chain[i - 1] : BlockHash()});
    // Retained: the Allocate+Commit+Release load below must not evict what lookups read.
    if (!c.Commit(TierKind::kHost, e, /*retain=*/true).ok()) return 1;
  }
  // A 128K-token chain, stored once and retained the same way.
  constexpr size_t kLong = 8192;
  const auto long_chain = testing::HashChain(5000, kLong);
  for (size_t at = 0; at < kLong; at += 512) {
    auto pages = c.Allocate(TierKind::kHost, 512);
    if (!pages.ok()) {
      std::fprintf(stderr, "kvtier-bench rpc: allocate: %s\n", pages.status().ToString().c_str());
      return 1;
    }
    std::vector<CommitEntry> e;
    for (size_t i = 0; i < 512; ++i) {
      e.push_back({(*pages)[i], long_chain[at + i], at + i ? long_chain[at + i - 1] : BlockHash()});
    }
    if (!c.Commit(TierKind::kHost, e, /*retain=*/true).ok()) return 1;
  }
  const std::span<const BlockHash> one(chain.data(), 1);
  uint64_t seq = 0;

  constexpr int kOps = 5, kAcr = 4;
  OpResult ops[kOps] = {{"lookup1"}, {"lookup64"}, {"lookup8192"}, {"acquire8192"}, {"acr16"}};
  const std::vector<Trip> trips[kOps] = {LookupTrips(1), LookupTrips(64), LookupTrips(kLong), AcquireTrips(kLong),
                                         AllocCommitReleaseTrips(16)};
  // Untimed work after a timed operation (dropping the Acquire's references).
  auto after_kvtier = [&](int op) -> Status {
    if (op != 3) return Status::Ok();
    KVTIER_ASSIGN_OR_RETURN(auto released, c.Release(TierKind::kHost, {}, long_chain));
    (void)released;
    return Status::Ok();
  };
  auto run_kvtier = [&](int op) -> Status {
    switch (op) {
      case 0: {
        auto r = c.Lookup(one);
        if (!r.ok() || r->matched != 1) return Internal("lookup1 missed");
        return Status::Ok();
      }
      case 1: {
        auto r = c.Lookup(chain);
        if (!r.ok() || r->matched != 64) return Internal("lookup64 missed");
        return Status::Ok();
      }
      case 2: {
        auto r = c.Lookup(long_chain);
        if (!r.ok() || r->matched != kLong) return Internal("lookup8192 missed");
        return Status::Ok();
      }
      case 3: {
        KVTIER_ASSIGN_OR_RETURN(auto got, c.Acquire(long_chain));
        if (got.size() != kLong || !got.back().status.ok()) return Internal("acquire8192 missed");
        return Status::Ok();
      }
      default: {
        KVTIER_ASSIGN_OR_RETURN(auto pages, c.Allocate(TierKind::kHost, 16));
        auto hs = testing::HashChain(1'000'000 + seq++, 16);
        std::vector<CommitEntry> e;
        for (int i = 0; i < 16; ++i) e.push_back({pages[i], hs[i], {}});
        KVTIER_ASSIGN_OR_RETURN(auto committed, c.Commit(TierKind::kHost, e, /*retain=*/true));
        KVTIER_ASSIGN_OR_RETURN(auto released, c.Release(TierKind::kHost, {}, hs));
        (void)committed;
        (void)released;
        return Status::Ok();
      }
    }
  };

  auto selected = [&](int op) {
    return args.ops.empty() || std::find(args.ops.begin(), args.ops.end(), ops[op].name) != args.ops.end();
  };
  const int rounds = args.rounds;
  const int per_round = args.iterations / rounds;
  // Calls per round: the long chains move 128 KiB a request, a fortieth as many suffice.
  auto calls = [&](int op) {
    if (op == kAcr) return std::max(1, per_round / 4);
    if (op == 2 || op == 3) return std::max(10, per_round / 40);
    return per_round;
  };
  for (int warm = 0; warm < 200; ++warm) {
    for (int op = 0; op < kOps; ++op) {
      if (!selected(op) || (warm % 10 != 0 && (op == 2 || op == 3))) continue;
      (void)run_kvtier(op);
      (void)after_kvtier(op);
      for (const Trip& t : trips[op]) (void)echo.Trip(t);
    }
  }
  for (int round = 0; round < rounds; ++round) {
    for (int op = 0; op < kOps; ++op) {
      if (!selected(op)) continue;
      const int n = calls(op);
      for (int i = 0; i < n; ++i) {
        double t0 = NowUs();
        if (Status s = run_kvtier(op); !s.ok()) {
          std::fprintf(stderr, "kvtier-bench rpc: %s: %s\n", ops[op].name.c_str(), s.ToString().c_str());
          return 1;
        }
        ops[op].kvtier.Add(NowUs() - t0);
        if (Status s = after_kvtier(op); !s.ok()) {
          std::fprintf(stderr, "kvtier-bench rpc: %s: %s\n", ops[op].name.c_str(), s.ToString().c_str());
          return 1;
        }
      }
      for (int i = 0; i < n; ++i) {
        double t0 = NowUs();
        for (const Trip& t : trips[op]) {
          if (Status s = echo.Trip(t); !s.ok()) return 1;
        }
        ops[op].echo.Add(NowUs() - t0);
      }
    }
  }

  json j;
  for (const OpResult& o : ops) {
    if (o.kvtier.count() == 0) continue;
    const double p50 = o.kvtier.Percentile(50), p99 = o.kvtier.Percentile(99);
    const double e50 = o.echo.Percentile(50), e99 = o.echo.Percentile(99);
    j[o.name + "_p50_us"] = p50;
    j[o.name + "_p99_us"] = p99;
    j[o.name + "_ops_s"] = o.kvtier_ops_s();
    j["echo_" + o.name + "_p50_us"] = e50;
    j["echo_" + o.name + "_p99_us"] = e99;
    j["echo_" + o.name + "_ops_s"] = o.echo_ops_s();
    j[o.name + "_p50_ratio"] = e50 > 0 ? p50 / e50 : 0;
    j[o.name + "_p99_ratio"] = e99 > 0 ? p99 / e99 : 0;
    j[o.name + "_samples"] = o.kvtier.count();
  }
  if (ops[0].echo.count() > 0) j["echo_p50_us"] = ops[0].echo.Percentile(50);  // the lookup1-sized echo
  j["lookup1_request_bytes"] = trips[0][0].request;
  j["lookup1_response_bytes"] = trips[0][0].response;
  j["lookup8192_request_bytes"] = trips[2][0].request;
  j["lookup8192_response_bytes"] = trips[2][0].response;
  j["acquire8192_request_bytes"] = trips[3][0].request;
  j["acquire8192_response_bytes"] = trips[3][0].response;
  j["server_cpu"] = server_cpu;
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("kvtier-bench rpc: %d rounds, interleaved with a bare Unix-socket echo of the same sizes\n", rounds);
  if (server_cpu >= 0) {
    std::printf("placement: this client on one CPU, kvtierd and the echo server on CPU %d\n", server_cpu);
  }
  std::printf("\n");
  std::printf("%-12s %10s %10s %10s | %10s %10s %10s | %8s %8s\n", "op", "p50 us", "p99 us", "ops/s", "echo p50",
              "echo p99", "echo op/s", "p50 x", "p99 x");
  for (const OpResult& o : ops) {
    if (o.kvtier.count() == 0) continue;
    std::printf("%-12s %10.1f %10.1f %10.0f | %10.1f %10.1f %10.0f | %8.2f %8.2f\n", o.name.c_str(),
                o.kvtier.Percentile(50), o.kvtier.Percentile(99), o.kvtier_ops_s(), o.echo.Percentile(50),
                o.echo.Percentile(99), o.echo_ops_s(), o.kvtier.Percentile(50) / o.echo.Percentile(50),
                o.kvtier.Percentile(99) / o.echo.Percentile(99));
  }
  std::printf("\nacr16 = Allocate(16) + Commit(16) + Release(16): three round trips (echo: three too).\n");
  std::printf("acquire8192 = Acquire of the 8,192-block chain (its Release after each call is not timed).\n");
  return 0;
}

}  // namespace kvtier::bench
