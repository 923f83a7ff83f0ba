// kvtier-bench soak: many engine sessions doing mixed operations against one kvtierd for a
// set time; it fails unless there were 0 errors, the daemon's memory and descriptors
// stayed bounded and every page came back when the sessions ended.
//
// Each session is an engine process of its own (forked), with its connection and
// mappings, looping over requests of an engine with a prefix cache: Lookup a prompt's
// chain, Acquire the cached prefix, check every byte, Release it, then Allocate + fill +
// Commit what missed (on the host tier, or the host-emulated GPU tier for one request in
// five). Between requests it sends Stats, Ping, Stats with sessions, now and then
// reconnects, and once in a while dies by SIGKILL with pages leased — the daemon must
// reclaim them — and a new engine process takes its place. The daemon has a small host
// tier over an NVMe tier, so demotions, spills, fetches and promotions run all the time.
// Popularity is skewed: hot prompts hit, the tail keeps the tiers evicting.
//
// Errors are failed calls and blocks that came back with other bytes. "Refused" (a full
// tier: RESOURCE_EXHAUSTED, UNAVAILABLE) and "raced" (a block evicted between Lookup and
// Acquire: NOT_FOUND) are the daemon's normal answers and are counted apart.
//
// Baseline, in the same run: the same number of threads doing round trips of a
// Ping-sized frame against a bare Unix-socket echo server (a forked process per
// connection); each operation's p99 is printed with its ratio to the echo's p99 under the
// same concurrency.
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "engine/tools/block_pattern.h"
#include "tests/bench/bench_main.h"
#include "tests/bench/bench_util.h"

namespace kvtier::bench {
namespace {

using json = nlohmann::json;

constexpr uint32_t kChain = 8;       // blocks per prompt
constexpr uint32_t kPrompts = 2048;  // distinct prompts: 1 GiB of blocks
constexpr uint64_t kEchoFrame = 64;  // bytes each way, about a Ping frame

// kAllocateGpu: the GPU tier's Allocates again, apart (they wait for GPU->host copies);
// not counted twice in the operation totals.
enum Op { kConnect, kLookup, kAcquire, kRelease, kAllocate, kCommit, kStats, kPing, kAllocateGpu, kOpCount };
constexpr const char* kOpNames[kOpCount] = {"connect", "lookup", "acquire", "release",     "allocate",
                                            "commit",  "stats",  "ping",    "allocate_gpu"};

struct Counts {
  uint64_t requests = 0, errors = 0, wrong_bytes = 0, refused = 0, raced = 0;
  uint64_t hit_blocks = 0, miss_blocks = 0, kills = 0, reconnects = 0;
};

struct SessionResult {
  std::vector<double> op[kOpCount];  // latencies, us
  Counts n;
  std::string first_error;
};

// A worker process hands its result to the parent through a file: the counts, the first
// error, then per operation a count and that many latencies.
Status WriteResult(const std::string& path, const SessionResult& r) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&r.n), sizeof(r.n));
  const uint64_t elen = r.first_error.size();
  out.write(reinterpret_cast<const char*>(&elen), sizeof(elen));
  out.write(r.first_error.data(), static_cast<std::streamsize>(elen));
  for (const auto& v : r.op) {
    const uint64_t n = v.size();
    out.write(reinterpret_cast<const char*>(&n), sizeof(n));
    out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n * sizeof(double)));
  }
  out.close();
  return out ? Status::Ok() : Internal("cannot write " + path);
}

Result<SessionResult> ReadResult(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SessionResult r;
  uint64_t elen = 0;
  in.read(reinterpret_cast<char*>(&r.n), sizeof(r.n));
  in.read(reinterpret_cast<char*>(&elen), sizeof(elen));
  if (!in || elen > 4096) return DataLoss("bad worker result " + path);
  r.first_error.resize(elen);
  in.read(r.first_error.data(), static_cast<std::streamsize>(elen));
  for (auto& v : r.op) {
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), sizeof(n));
    if (!in || n > (1ull << 28)) return DataLoss("bad worker result " + path);
    v.resize(n);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(double)));
  }
  if (!in) return DataLoss("truncated worker result " + path);
  return r;
}

// /proc/PID/status fields, in kB.
struct Memory {
  uint64_t rss_anon_kb = 0, rss_shmem_kb = 0, vm_rss_kb = 0;
  uint64_t index_kb = 0;  // what the NVMe tier says its index caches hold (bounded by config)
};

Memory ReadMemory(pid_t pid) {
  Memory m;
  m.rss_anon_kb = ProcStatusKb(pid, "RssAnon");
  m.rss_shmem_kb = ProcStatusKb(pid, "RssShmem");
  m.vm_rss_kb = ProcStatusKb(pid, "VmRSS");
  return m;
}

// Descriptors other than files (sockets, pidfds, eventfds, pipes): what a session holds.
// Files are left out: the index opens more table files as it grows.
int OpenNonFileFds(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[512];
    const ssize_t len = ::readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
    n += len > 0 && target[0] != '/';
  }
  ::closedir(d);
  return n;
}

// The value of an unlabelled metric from kvtierd's Prometheus endpoint (url
// "http://127.0.0.1:PORT/metrics"); -1 when it cannot be read.
double ScrapeMetric(const std::string& url, const std::string& name) {
  const std::string prefix = "http://127.0.0.1:";
  if (url.rfind(prefix, 0) != 0) return -1;
  const int port = std::atoi(url.c_str() + prefix.size());
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string body;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) body.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  const size_t at = body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::atof(body.c_str() + at + name.size() + 2);
}

// The pid of the process serving `socket` (for --socket runs).
pid_t PeerPid(const std::string& socket) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
  ucred cred{};
  socklen_t len = sizeof(cred);
  pid_t pid = -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    pid = cred.pid;
  }
  ::close(fd);
  return pid;
}

BlockHash PromptBlock(uint32_t prompt, uint32_t k) { return IndexHash(0x50a4, uint64_t{prompt} * kChain + k); }

class Session {
 public:
  Session(const std::string& socket, uint64_t seed, bool gpu, double deadline_us)
      : socket_(socket), gpu_(gpu), deadline_us_(deadline_us), rng_(0x5eed + seed) {}

  // Until the deadline, or until this engine is to die with pages leased (`*die`).
  SessionResult Run(bool* die) {
    *die = false;
    while (NowUs() < deadline_us_) {
      if (!client_ && !Connect()) {
        ::usleep(10'000);
        continue;
      }
      const uint32_t dice = rng_() % 100;
      if (dice < 6) {
        Timed(kStats, [&] { return Stats(false); });
      } else if (dice < 12) {
        Timed(kPing, [&] { return client_->Ping(); });
      } else if (dice < 13) {
        Timed(kStats, [&] { return Stats(/*with_sessions=*/true); });
      } else if (dice < 14 && rng_() % 8 == 0) {
        if (LeaseSome()) {
          *die = true;
          break;
        }
      } else if (dice < 15) {
        client_.reset();  // a clean disconnect
        control_.reset();
        ++r_.n.reconnects;
      } else {
        Request();
      }
    }
    if (!*die) client_.reset();
    return std::move(r_);
  }

 private:
  // Stats from a control session of this engine process (engines' sessions have none).
  Status Stats(bool with_sessions) {
    if (!control_) {
      ControlClientOptions o;
      o.socket_path = socket_;
      o.name = "soak-stats";
      o.timeout_ms = 30'000;
      KVTIER_ASSIGN_OR_RETURN(control_, ControlClient::Connect(o));
    }
    Status st = control_->Stats(with_sessions).status();
    if (!st.ok()) control_.reset();
    return st;
  }

  bool Connect() {
    ClientOptions o;
    o.socket_path = socket_;
    o.engine_name = "soak";
    o.layout = testing::TestLayout("soak-model");
    o.device = "host-emulated";
    o.timeout_ms = 30'000;
    const double t0 = NowUs();
    auto c = Client::Connect(o);
    if (!c.ok()) {
      Error("connect", c.status());
      return false;
    }
    r_.op[kConnect].push_back(NowUs() - t0);
    client_ = std::move(*c);
    block_bytes_ = testing::TestLayout("soak-model").block_bytes;
    return true;
  }

  template <typename F>
  bool Timed(Op op, F&& f) {
    const double t0 = NowUs();
    Status s = f();
    r_.op[op].push_back(NowUs() - t0);
    if (!s.ok()) Error(kOpNames[op], s);
    return s.ok();
  }

  void Error(const char* what, const Status& s) {
    ++r_.n.errors;
    if (r_.first_error.empty()) r_.first_error = std::string(what) + ": " + s.ToString();
    client_.reset();  // a failed call leaves the connection closed
  }

  static bool Refusal(const Status& s) {
    return s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kUnavailable;
  }

  // Skewed popularity: a cubic transform of a uniform draw favours low prompt ids.
  uint32_t PickPrompt() {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    return static_cast<uint32_t>(u * u * u * kPrompts) % kPrompts;
  }

  void Note(const std::string& what) {
    ++r_.n.errors;
    if (r_.first_error.empty()) r_.first_error = what;
  }

  void Request() {
    ++r_.n.requests;
    const uint32_t prompt = PickPrompt();
    std::vector<BlockHash> chain;
    for (uint32_t k = 0; k < kChain; ++k) chain.push_back(PromptBlock(prompt, k));

    double t0 = NowUs();
    auto l = client_->Lookup(chain);
    r_.op[kLookup].push_back(NowUs() - t0);
    if (!l.ok()) return Error("lookup", l.status());
    size_t hit = 0;
    if (l->matched > 0) {
      const std::span<const BlockHash> prefix(chain.data(), l->matched);
      t0 = NowUs();
      auto a = client_->Acquire(prefix);
      r_.op[kAcquire].push_back(NowUs() - t0);
      if (!a.ok()) return Error("acquire", a.status());
      std::map<TierKind, std::vector<BlockHash>> held;
      bool in_prefix = true;
      for (size_t k = 0; k < a->size(); ++k) {
        const BlockResult& b = (*a)[k];
        if (!b.status.ok()) {
          in_prefix = false;
          if (b.status.code() == StatusCode::kNotFound)
            ++r_.n.raced;
          else if (Refusal(b.status))
            ++r_.n.refused;
          else
            Note("acquire block: " + b.status.ToString());
          continue;
        }
        held[b.tier].push_back(chain[k]);
        const auto bytes = client_->PageBytes(b.tier, b.page);
        if (bytes.size() < block_bytes_ || !CheckBlockPattern(chain[k], bytes.first(block_bytes_))) {
          ++r_.n.wrong_bytes;
          Note("a block came back with other bytes");
          in_prefix = false;
          continue;
        }
        if (in_prefix) ++hit;
      }
      for (const auto& [tier, hashes] : held) {
        t0 = NowUs();
        auto rel = client_->Release(tier, {}, hashes);
        r_.op[kRelease].push_back(NowUs() - t0);
        if (!rel.ok()) return Error("release", rel.status());
        for (const Status& s : *rel) {
          if (!s.ok()) Note("release block: " + s.ToString());
        }
      }
    }
    r_.n.hit_blocks += hit;
    r_.n.miss_blocks += kChain - hit;
    if (hit == kChain) return;
    const TierKind tier = gpu_ && rng_() % 5 == 0 ? TierKind::kGpu : TierKind::kHost;
    const auto n = static_cast<uint32_t>(kChain - hit);
    t0 = NowUs();
    auto pages = client_->Allocate(tier, n);
    r_.op[kAllocate].push_back(NowUs() - t0);
    if (tier == TierKind::kGpu) r_.op[kAllocateGpu].push_back(r_.op[kAllocate].back());
    if (!pages.ok()) {
      if (Refusal(pages.status())) {
        ++r_.n.refused;
        ::usleep(1000);
        return;
      }
      return Error("allocate", pages.status());
    }
    std::vector<CommitEntry> e;
    for (uint32_t i = 0; i < n; ++i) {
      const size_t k = hit + i;
      FillBlockPattern(chain[k], client_->PageBytes(tier, (*pages)[i]).first(block_bytes_));
      e.push_back({(*pages)[i], chain[k], k ? chain[k - 1] : BlockHash()});
    }
    t0 = NowUs();
    auto c = client_->Commit(tier, e);
    r_.op[kCommit].push_back(NowUs() - t0);
    if (!c.ok()) return Error("commit", c.status());
    for (const BlockResult& b : *c) {
      if (!b.status.ok() && !Refusal(b.status)) Note("commit block: " + b.status.ToString());
    }
  }

  // Leases pages and writes into them, as an engine killed mid-prefill had.
  bool LeaseSome() {
    auto pages = client_->Allocate(TierKind::kHost, 4);
    if (!pages.ok()) {
      if (!Refusal(pages.status())) Error("allocate", pages.status());
      return false;
    }
    for (PageId p : *pages) FillBlockPattern(PromptBlock(0, 0), client_->PageBytes(TierKind::kHost, p).first(64));
    ++r_.n.kills;
    return true;
  }

  std::string socket_;
  bool gpu_;
  double deadline_us_;
  std::mt19937_64 rng_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<ControlClient> control_;
  uint64_t block_bytes_ = 0;
  SessionResult r_;
};

// The baseline's server: accepts connections and forks a child per connection that
// echoes kEchoFrame-byte messages until EOF.
class EchoServer {
 public:
  ~EchoServer() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGKILL);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Status Start(const std::string& path, int backlog) {
    path_ = path;
    int l = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr = Addr();
    if (::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(l, backlog) != 0) {
      return ErrnoStatus(errno, "echo bind");
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::signal(SIGCHLD, SIG_IGN);  // children reap themselves
      for (;;) {
        int fd = ::accept(l, nullptr, nullptr);
        if (fd < 0) continue;
        if (::fork() == 0) {
          uint8_t buf[kEchoFrame];
          for (;;) {
            size_t got = 0;
            while (got < kEchoFrame) {
              ssize_t r = ::read(fd, buf + got, kEchoFrame - got);
              if (r <= 0) ::_exit(0);
              got += static_cast<size_t>(r);
            }
            if (::write(fd, buf, kEchoFrame) != static_cast<ssize_t>(kEchoFrame)) ::_exit(0);
          }
        }
        ::close(fd);
      }
    }
    ::close(l);
    return Status::Ok();
  }
  sockaddr_un Addr() const {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    return addr;
  }

 private:
  std::string path_;
  pid_t pid_ = -1;
};

// `threads` clients doing echo round trips for `seconds`.
Result<Latencies> EchoBaseline(int threads, double seconds) {
  testing::TempDir dir;
  EchoServer server;
  KVTIER_RETURN_IF_ERROR(server.Start(dir.path() + "/echo.sock", threads));
  std::vector<Latencies> lat(static_cast<size_t>(threads));
  std::atomic<int> failures{0};
  const double deadline = NowUs() + seconds * 1e6;
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; ++i) {
    ts.emplace_back([&, i] {
      int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un addr = server.Addr();
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        ++failures;
        ::close(fd);
        return;
      }
      uint8_t buf[kEchoFrame] = {};
      while (NowUs() < deadline) {
        const double t0 = NowUs();
        if (::write(fd, buf, kEchoFrame) != static_cast<ssize_t>(kEchoFrame)) break;
        size_t got = 0;
        while (got < kEchoFrame) {
          ssize_t r = ::read(fd, buf + got, kEchoFrame - got);
          if (r <= 0) break;
          got += static_cast<size_t>(r);
        }
        if (got < kEchoFrame) {
          ++failures;
          break;
        }
        lat[static_cast<size_t>(i)].Add(NowUs() - t0);
      }
      ::close(fd);
    });
  }
  for (auto& t : ts) t.join();
  if (failures > 0) return Internal("echo baseline: " + std::to_string(failures.load()) + " connections failed");
  Latencies all;
  for (const auto& l : lat) all.Append(l);
  return all;
}

}  // namespace

int RunSoakBench(const BenchArgs& args) {
  const int sessions = args.sessions;
  const double seconds = args.seconds;
  testing::DaemonProcess::Options opts;
  opts.host_capacity = args.host_capacity;  // default 1024 pages of 64 KiB: the tail keeps it evicting
  opts.page_bytes = "64KiB";
  opts.segment_bytes = "4MiB";
  opts.nvme_capacity = args.nvme_capacity;
  opts.gpu_capacity = "32MiB";
  opts.gpu_segment_bytes = "4MiB";
  auto daemon = BenchDaemon::Start(args.socket, opts);
  if (!daemon.ok()) {
    std::fprintf(stderr, "kvtier-bench soak: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  const std::string socket = (*daemon)->socket();
  const pid_t pid = (*daemon)->pid() > 0 ? (*daemon)->pid() : PeerPid(socket);
  bool gpu = false;
  std::string metrics_url;
  {
    ControlClientOptions o;
    o.socket_path = socket;
    auto c = ControlClient::Connect(o);
    if (!c.ok()) {
      std::fprintf(stderr, "kvtier-bench soak: %s\n", c.status().ToString().c_str());
      return 1;
    }
    auto s = (*c)->Stats();
    if (s.ok()) {
      for (const auto& t : s->tiers) gpu |= t.tier == TierKind::kGpu && t.capacity_pages > 0;
      metrics_url = s->metrics_url;
    }
  }
  // The daemon closes a finished connection's socket and pidfd when it reads the EOF, a
  // moment after the client has gone: count once the number settles.
  auto settled_fds = [pid](int at_most) {
    int n = OpenNonFileFds(pid);
    for (int i = 0; i < 60 && (n > at_most || n != OpenNonFileFds(pid)); ++i) {
      ::usleep(50'000);
      n = OpenNonFileFds(pid);
    }
    return n;
  };
  const int fds_before = settled_fds(INT32_MAX);

  // Engine processes, forked while this process is single-threaded; one that died by
  // SIGKILL (with pages leased) is replaced by a new one until the deadline. Memory is
  // sampled every 250 ms meanwhile.
  testing::TempDir results_dir;
  std::vector<std::pair<double, Memory>> samples;
  const double t0 = NowUs();
  const double deadline = t0 + seconds * 1e6;
  uint64_t spawned = 0;
  std::map<pid_t, std::string> workers;  // pid -> its result file
  auto spawn = [&]() -> bool {
    const uint64_t seed = spawned++;
    const std::string path = results_dir.File("worker-" + std::to_string(seed));
    const pid_t child = ::fork();
    if (child < 0) return false;
    if (child == 0) {
      bool die = false;
      SessionResult r = Session(socket, seed, gpu, deadline).Run(&die);
      const bool written = WriteResult(path, r).ok();
      if (die) ::raise(SIGKILL);  // mid-lease, as a crashed engine
      ::_exit(written ? 0 : 3);
    }
    workers[child] = path;
    return true;
  };
  for (int i = 0; i < sessions; ++i) {
    if (!spawn()) {
      std::fprintf(stderr, "kvtier-bench soak: fork: %s\n", std::strerror(errno));
      return 1;
    }
  }
  std::vector<std::string> finished;
  uint64_t worker_failures = 0;
  double next_sample = t0;
  while (!workers.empty()) {
    if (NowUs() >= next_sample) {
      Memory m = ReadMemory(pid);
      m.index_kb = static_cast<uint64_t>(std::max(0.0, ScrapeMetric(metrics_url, "kvtier_nvme_memory_bytes")) / 1024);
      samples.emplace_back((NowUs() - t0) * 1e-6, m);
      next_sample += 250'000;
    }
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done <= 0) {
      ::usleep(5'000);
      continue;
    }
    auto it = workers.find(done);
    if (it == workers.end()) continue;
    const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    if (killed || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      finished.push_back(it->second);
    } else {
      ++worker_failures;
    }
    workers.erase(it);
    if (killed && NowUs() < deadline) (void)spawn();
  }
  const double ran_s = (NowUs() - t0) * 1e-6;

  SessionResult total;
  for (const std::string& f : finished) {
    auto r = ReadResult(f);
    if (!r.ok()) {
      ++worker_failures;
      continue;
    }
    for (int op = 0; op < kOpCount; ++op) total.op[op].insert(total.op[op].end(), r->op[op].begin(), r->op[op].end());
    const Counts& n = r->n;
    total.n.requests += n.requests;
    total.n.errors += n.errors;
    total.n.wrong_bytes += n.wrong_bytes;
    total.n.refused += n.refused;
    total.n.raced += n.raced;
    total.n.hit_blocks += n.hit_blocks;
    total.n.miss_blocks += n.miss_blocks;
    total.n.kills += n.kills;
    total.n.reconnects += n.reconnects;
    if (total.first_error.empty()) total.first_error = r->first_error;
  }
  total.n.errors += worker_failures;
  if (worker_failures > 0 && total.first_error.empty()) total.first_error = "an engine process failed";
  Latencies lat[kOpCount];
  for (int op = 0; op < kOpCount; ++op) {
    for (double us : total.op[op]) lat[op].Add(us);
  }

  // Every page back once the engines are gone (the daemon notices deaths asynchronously),
  // and no block that failed its checksum or I/O that failed on a healthy disk.
  bool drained = false;
  uint64_t checksum_failures = 0, io_errors = 0;
  json tiers = json::array();
  {
    ControlClientOptions o;
    o.socket_path = socket;
    auto c = ControlClient::Connect(o);
    for (int i = 0; c.ok() && i < 500 && !drained; ++i) {
      auto s = (*c)->Stats();
      if (!s.ok()) break;
      drained = s->session_count <= 1;
      checksum_failures = s->checksum_failures;
      io_errors = s->io_errors;
      tiers = json::array();
      for (const auto& t : s->tiers) {
        drained &= t.leased_pages == 0 && t.referenced_pages == 0 && t.quarantined_pages == 0 &&
                   (t.tier == TierKind::kNvme || t.inflight_pages == 0);
        tiers.push_back({{"tier", t.name},
                         {"capacity_pages", t.capacity_pages},
                         {"free_pages", t.free_pages},
                         {"cached_pages", t.cached_pages},
                         {"leased_pages", t.leased_pages},
                         {"referenced_pages", t.referenced_pages},
                         {"quarantined_pages", t.quarantined_pages},
                         {"evictions", t.evictions}});
      }
      if (!drained) ::usleep(10'000);
    }
  }
  const int fds_after = settled_fds(fds_before);
  // How many Allocates the daemon made wait for room (a demotion, a spill, a release).
  const double allocate_waits = ScrapeMetric(metrics_url, "kvtier_allocate_waits_total");

  // RSS bounded: the peak of the last quarter of the run against the peak of its second
  // quarter (after warm-up: pools touched), not counting the index's caches and memtables,
  // which fill towards their configured sizes as the index grows. Their estimate drops at
  // each memtable flush while the process keeps the freed memory for reuse (malloc does
  // not hand every free back at once), so what is not counted is the most they have held
  // so far, not what they hold at the sample. Growth beyond 15% and 8 MiB would be a leak
  // in a steady load.
  uint64_t warm_peak = 0, late_peak = 0, anon_peak = 0, index_peak = 0;
  for (const auto& [t, m] : samples) {
    anon_peak = std::max(anon_peak, m.rss_anon_kb);
    index_peak = std::max(index_peak, m.index_kb);
    const uint64_t own = m.rss_anon_kb > index_peak ? m.rss_anon_kb - index_peak : 0;
    if (t >= seconds * 0.25 && t < seconds * 0.5) warm_peak = std::max(warm_peak, own);
    if (t >= seconds * 0.75) late_peak = std::max(late_peak, own);
  }
  const double growth_kb = static_cast<double>(late_peak) - static_cast<double>(warm_peak);
  const bool rss_bounded = warm_peak > 0 && late_peak > 0 && (growth_kb <= 8192 || growth_kb <= 0.15 * warm_peak);
  const bool fds_bounded = fds_after >= 0 && fds_after <= fds_before;
  json rss_curve = json::array();  // anonymous RSS, kB, one sample per ~tenth of the run
  for (size_t i = 0; i < samples.size(); i += std::max<size_t>(1, samples.size() / 10)) {
    rss_curve.push_back({{"t_s", samples[i].first},
                         {"rss_anon_kb", samples[i].second.rss_anon_kb},
                         {"index_kb", samples[i].second.index_kb}});
  }

  auto echo = EchoBaseline(sessions, std::clamp(seconds / 6, 2.0, 10.0));
  if (!echo.ok()) {
    std::fprintf(stderr, "kvtier-bench soak: %s\n", echo.status().ToString().c_str());
    return 1;
  }
  const double echo_p50 = echo->Percentile(50), echo_p99 = echo->Percentile(99);
  uint64_t ops = 0;
  for (int op = 0; op < kOpCount; ++op) ops += op == kAllocateGpu ? 0 : lat[op].count();

  const bool pass = total.n.errors == 0 && checksum_failures == 0 && io_errors == 0 &&
                    (rss_bounded || !args.check_rss) && fds_bounded && drained;
  json j{{"sessions", sessions},
         {"seconds", ran_s},
         {"gpu_tier", gpu},
         {"engine_processes", spawned},
         {"requests", total.n.requests},
         {"operations", ops},
         {"ops_per_s", ops / ran_s},
         {"errors", total.n.errors},
         {"wrong_bytes", total.n.wrong_bytes},
         {"refused", total.n.refused},
         {"raced", total.n.raced},
         {"hit_blocks", total.n.hit_blocks},
         {"miss_blocks", total.n.miss_blocks},
         {"killed_with_leases", total.n.kills},
         {"checksum_failures", checksum_failures},
         {"io_errors", io_errors},
         {"reconnects", total.n.reconnects},
         {"allocate_waits", allocate_waits},
         {"rss_anon_less_index_warm_peak_kb", warm_peak},
         {"rss_anon_less_index_late_peak_kb", late_peak},
         {"rss_anon_peak_kb", anon_peak},
         {"rss_bounded", rss_bounded},
         {"rss_anon_curve", rss_curve},
         {"non_file_fds_before", fds_before},
         {"non_file_fds_after", fds_after},
         {"all_pages_returned", drained},
         {"tiers", tiers},
         {"echo_p50_us", echo_p50},
         {"echo_p99_us", echo_p99},
         {"pass", pass}};
  if (!total.first_error.empty()) j["first_error"] = total.first_error;
  for (int op = 0; op < kOpCount; ++op) {
    const Latencies& l = lat[op];
    // The headline ratios, at the top level: Allocate's tail (waits for a demotion or
    // spill to free a page) and Lookup's.
    const std::string name = kOpNames[op];
    if (name == "allocate" || name == "lookup") {
      j[name + "_p99_over_echo_p99"] = echo_p99 > 0 ? l.Percentile(99) / echo_p99 : 0;
    }
    j["ops"][kOpNames[op]] = {{"count", l.count()},
                              {"p50_us", l.Percentile(50)},
                              {"p99_us", l.Percentile(99)},
                              {"p99_vs_echo_p99", echo_p99 > 0 ? l.Percentile(99) / echo_p99 : 0}};
  }
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return pass ? 0 : 1;
  }
  auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf(
      "kvtier-bench soak: %d engine sessions for %.1f s (%llu processes), %llu requests, %llu operations "
      "(%.0f/s)%s\n",
      sessions, ran_s, u(spawned), u(total.n.requests), u(ops), ops / ran_s,
      gpu ? ", host-emulated GPU tier in the mix" : "");
  std::printf("  errors %llu (wrong bytes %llu); daemon checksum failures %llu, I/O errors %llu\n", u(total.n.errors),
              u(total.n.wrong_bytes), u(checksum_failures), u(io_errors));
  std::printf("  refused %llu, raced %llu; blocks hit %llu, missed %llu; Allocates the daemon made wait %.0f\n",
              u(total.n.refused), u(total.n.raced), u(total.n.hit_blocks), u(total.n.miss_blocks), allocate_waits);
  if (!total.first_error.empty()) std::printf("  first error: %s\n", total.first_error.c_str());
  std::printf("  reconnects %llu, engines killed with pages leased %llu; every page returned after: %s\n",
              u(total.n.reconnects), u(total.n.kills), drained ? "yes" : "NO");
  std::printf(
      "  daemon anonymous RSS less index caches: peak %llu kB in the 2nd quarter, %llu kB in the last (%s); "
      "fds %d -> %d\n",
      static_cast<unsigned long long>(warm_peak), static_cast<unsigned long long>(late_peak),
      rss_bounded ? "bounded" : "GROWING", fds_before, fds_after);
  std::printf("  (fds: sockets, pidfds, eventfds and pipes, before the run and after the engines ended)\n");
  std::printf("\n%-12s %10s %10s %10s %14s\n", "op", "count", "p50 us", "p99 us", "p99 / echo p99");
  for (int op = 0; op < kOpCount; ++op) {
    const Latencies& l = lat[op];
    std::printf("%-12s %10zu %10.1f %10.1f %14.2f\n", kOpNames[op], l.count(), l.Percentile(50), l.Percentile(99),
                echo_p99 > 0 ? l.Percentile(99) / echo_p99 : 0);
  }
  std::printf("%-12s %10zu %10.1f %10.1f %14.2f   (bare Unix-socket echo, %d threads)\n", "echo", echo->count(),
              echo_p50, echo_p99, 1.0, sessions);
  std::printf("\n%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace kvtier::bench
