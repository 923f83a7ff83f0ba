// What a broken disk, a second daemon or a hostile local user could do to a running
// kvtierd, each reproduced against a real daemon: two daemons on one slot file, a full
// file system, a slot file truncated under a load, idle connections that never say Hello,
// half-sent scrapes.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "engine/tools/block_pattern.h"
#include "protocol/codec.h"
#include "protocol/framing.h"
#include "tests/integration/engine_process.h"

namespace kvtier::testing {
namespace {

namespace fs = std::filesystem;

DaemonProcess::Options NvmeOptions() {
  DaemonProcess::Options o;
  o.host_capacity = "8MiB";  // 64 pages of 128 KiB
  o.page_bytes = "128KiB";
  o.segment_bytes = "1MiB";
  o.nvme_capacity = "8MiB";
  o.nvme_yaml = "    durability: strict\n";
  o.log_level = "info";
  return o;
}

// kvtier-load against the daemon: 128 KiB blocks (llama3.1-8b at one token per block),
// every byte it reads back verified.
nlohmann::json Load(const DaemonProcess& d, double seconds) {
  CmdResult r =
      Sh("timeout 60 " + BinaryPath("kvtier-load") + " -s " + d.socket_path() +
         " --sessions 2 --prefixes 400 --depth 4 --tokens-per-block 1 --json --seconds " + std::to_string(seconds));
  const size_t brace = r.out.find('{');
  if (brace == std::string::npos) return nlohmann::json{{"output", r.out}};
  return nlohmann::json::parse(r.out.substr(brace), nullptr, false);
}

// ---- 1. one daemon per slot file ------------------------------------------------------

TEST(Hardening, ASecondDaemonOnAnotherDaemonsSlotFileIsRefused) {
  DaemonProcess a(NvmeOptions());
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  TempDir links;
  const std::string link = links.File("same");
  ASSERT_EQ(::symlink(a.slot_file().c_str(), link.c_str()), 0);
  for (const std::string& spelling : {a.slot_file(), link}) {
    DaemonProcess::Options o = NvmeOptions();
    o.nvme_file = spelling;  // another data_dir and socket, the same file
    DaemonProcess b(o);
    Status st = b.Start();
    EXPECT_FALSE(st.ok()) << "a second kvtierd started on " << spelling;
    EXPECT_NE(b.Log().find("in use by another kvtierd"), std::string::npos) << b.Log();
    EXPECT_FALSE(fs::exists(b.data_dir() + "/index")) << "the refused start left its index behind";
  }
  // The first daemon is unharmed and still serves its bytes.
  nlohmann::json r = Load(a, 1.0);
  EXPECT_EQ(r.value("corrupt", -1), 0) << r.dump();
  EXPECT_GT(r.value("requests", 0), 0) << r.dump();
  EXPECT_EQ(a.Stop(), 0) << a.Log();
}

TEST(Hardening, AnIndexNeverDescribesASlotFileRecreatedUnderTheSamePath) {
  DaemonProcess d(NvmeOptions());
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  nlohmann::json r = Load(d, 1.5);  // 128 KiB blocks through a 64-page host tier: spills
  ASSERT_EQ(r.value("corrupt", -1), 0) << r.dump();
  auto before = StatsOf(d.socket_path());
  ASSERT_TRUE(before.ok());
  uint64_t on_nvme = 0;
  for (const auto& t : before->tiers) on_nvme += t.tier == TierKind::kNvme ? t.blocks : 0;
  ASSERT_GT(on_nvme, 0u) << "nothing was spilled";
  ASSERT_EQ(d.Stop(), 0) << d.Log();
  // The operator replaces the file (same path, same size, fresh bytes).
  fs::remove(d.slot_file());
  { std::ofstream(d.slot_file()) << ""; }
  fs::resize_file(d.slot_file(), fs::file_size(d.slot_file()) + (8u << 20));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  EXPECT_NE(d.Log().find("does not describe these slot files"), std::string::npos) << d.Log();
  ASSERT_TRUE(WaitUntil([&] {
    auto s = StatsOf(d.socket_path());
    if (!s.ok()) return false;
    for (const auto& t : s->tiers) {
      if (t.tier == TierKind::kNvme) return t.ready && t.blocks == 0;
    }
    return false;
  })) << "the old index still lists blocks for the new file";
  r = Load(d, 1.0);
  EXPECT_EQ(r.value("corrupt", -1), 0) << r.dump();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// ---- 3. a slot file truncated while a load runs ---------------------------------------

TEST(Hardening, ASlotFileTruncatedUnderALoadIsNoticedAndNothingWrongIsServed) {
  DaemonProcess d(NvmeOptions());
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string url = MetricsUrl(d);
  ASSERT_FALSE(url.empty()) << d.Log();
  nlohmann::json during;
  std::thread load([&] { during = Load(d, 4.0); });
  // Truncated once blocks are on it, with the load going on.
  EXPECT_TRUE(WaitUntil([&] {
    auto s = StatsOf(d.socket_path());
    if (!s.ok()) return false;
    for (const auto& t : s->tiers) {
      if (t.tier == TierKind::kNvme && t.blocks > 0) return true;
    }
    return false;
  })) << d.Log();
  ASSERT_EQ(::truncate(d.slot_file().c_str(), 0), 0) << std::strerror(errno);
  load.join();
  EXPECT_EQ(during.value("corrupt", -1), 0) << during.dump();
  EXPECT_TRUE(WaitUntil([&] { return Metric(url, "kvtier_nvme_files_lost_total") == 1; }));
  EXPECT_GE(Metric(url, "kvtier_io_errors_total"), 1);
  EXPECT_NE(d.Log().find("was truncated"), std::string::npos) << d.Log();
  // Its blocks are gone from the index; its slots are out of use, and accounted.
  auto s = StatsOf(d.socket_path());
  ASSERT_TRUE(s.ok());
  for (const auto& t : s->tiers) {
    if (t.tier == TierKind::kNvme) {
      EXPECT_EQ(t.blocks, 0u);
    }
  }
  nlohmann::json after = Load(d, 1.0);  // served from memory
  EXPECT_EQ(after.value("corrupt", -1), 0) << after.dump();
  EXPECT_GT(after.value("requests", 0), 0) << after.dump();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
  // At restart the index, which described the old bytes, is discarded.
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  EXPECT_NE(d.Log().find("does not describe these slot files"), std::string::npos) << d.Log();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// ---- 2. a full file system -------------------------------------------------------------

// A small tmpfs mounted for the test (root only), unmounted at the end.
class SmallFileSystem {
 public:
  explicit SmallFileSystem(const std::string& size) {
    path_ = dir_.File("fs");
    fs::create_directories(path_);
    mounted_ = ::mount("tmpfs", path_.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
  }
  ~SmallFileSystem() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  // Writes zeros into `name` until the file system is full, or `bytes` are written.
  void Fill(const std::string& name, uint64_t bytes = ~0ull) const {
    std::ofstream out(File(name), std::ios::binary);
    std::vector<char> mib(1 << 20, 0);
    for (uint64_t n = 0; n < bytes && out.write(mib.data(), std::min<uint64_t>(mib.size(), bytes - n));
         n += mib.size()) {
    }
  }

 private:
  TempDir dir_;
  std::string path_;
  bool mounted_ = false;
};

TEST(Hardening, AFullFileSystemStopsSpillingAndTheDaemonKeepsServingFromMemory) {
  SmallFileSystem small("40m");
  if (!small.mounted()) GTEST_SKIP() << "mounting a tmpfs needs root";
  DaemonProcess::Options o = NvmeOptions();
  o.data_dir = small.File("data");
  o.nvme_file = small.File("slots");
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string url = MetricsUrl(d);
  ASSERT_EQ(Metric(url, "kvtier_nvme_index_writable"), 1);
  nlohmann::json r = Load(d, 1.0);
  ASSERT_EQ(r.value("corrupt", -1), 0) << r.dump();
  small.Fill("filler");
  // The next index write that needs a new page of the file system fails (the index does
  // not preallocate its log). Spills come with the load: bounded in time, not in rounds,
  // for sanitizer builds run several times slower.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(45);
  while (std::chrono::steady_clock::now() < deadline && Metric(url, "kvtier_nvme_index_writable") != 0) {
    r = Load(d, 1.5);
    EXPECT_EQ(r.value("corrupt", -1), 0) << r.dump();
    EXPECT_GT(r.value("requests", 0), 0) << r.dump();
  }
  EXPECT_EQ(Metric(url, "kvtier_nvme_index_writable"), 0) << d.Log();
  EXPECT_GE(Metric(url, "kvtier_nvme_index_errors_total"), 1);
  const std::string log = d.Log();
  EXPECT_NE(log.find("spilling to NVMe is stopped"), std::string::npos) << log;
  // One line for the failure, not one per batch.
  size_t lines = 0;
  for (size_t at = 0; (at = log.find("index write failed", at)) != std::string::npos; ++at) ++lines;
  EXPECT_EQ(lines, 1u) << log;
  // Room again: the index recovers on its own and spilling resumes.
  fs::remove(small.File("filler"));
  EXPECT_TRUE(WaitUntil([&] { return Metric(url, "kvtier_nvme_index_writable") == 1; }, std::chrono::seconds(15)))
      << d.Log();
  r = Load(d, 1.0);
  EXPECT_EQ(r.value("corrupt", -1), 0) << r.dump();
  EXPECT_EQ(d.Stop(), 0) << d.Log();  // clean exit, accounting exact
}

TEST(Hardening, AStartOnAFullFileSystemFailsClearlyAndLeavesNothingBehind) {
  SmallFileSystem small("24m");
  if (!small.mounted()) GTEST_SKIP() << "mounting a tmpfs needs root";
  DaemonProcess::Options o = NvmeOptions();
  o.nvme_capacity = "16MiB";
  o.data_dir = small.File("data");
  o.nvme_file = small.File("slots");
  // Almost full: not even room for the index.
  small.Fill("filler", 20u << 20);
  {
    DaemonProcess d(o);
    EXPECT_FALSE(d.Start().ok());
    EXPECT_NE(d.Log().find("file system is full"), std::string::npos) << d.Log();
  }
  EXPECT_FALSE(fs::exists(small.File("data"))) << "data_dir left behind";
  EXPECT_FALSE(fs::exists(small.File("slots"))) << "slot file left behind";
  // Room for the index but not for the slot file's 16 MiB.
  fs::resize_file(small.File("filler"), 10u << 20);
  {
    DaemonProcess d(o);
    EXPECT_FALSE(d.Start().ok());
    EXPECT_NE(d.Log().find("file system is full"), std::string::npos) << d.Log();
  }
  EXPECT_FALSE(fs::exists(small.File("data"))) << "data_dir (lock, index/) left behind";
  EXPECT_FALSE(fs::exists(small.File("slots"))) << "a partial slot file left behind";
}

// ---- 4. no lock-out by idle connections -----------------------------------------------

// The one frame the daemon sends before closing (within 5 s), as a status and message.
std::optional<std::pair<fb::Status, std::string>> ErrorFrameThenClose(int fd) {
  FrameAssembler in(1 << 20);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::optional<std::pair<fb::Status, std::string>> got;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    auto space = in.WritableSpace();
    ssize_t n = ::recv(fd, space.data(), space.size(), 0);
    if (n <= 0) return got;  // closed
    in.Produced(static_cast<size_t>(n));
    auto f = in.Next();
    if (f.ok() && f->has_value()) {
      auto r = VerifyResponseFrame((*f)->frame);
      if (r.ok()) got = {(*r)->status(), (*r)->message() ? (*r)->message()->str() : ""};
    }
  }
  return std::nullopt;  // never closed
}

void RaiseFdLimit() {
  rlimit l{};
  ::getrlimit(RLIMIT_NOFILE, &l);
  l.rlim_cur = l.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &l);
}

TEST(Hardening, ElevenHundredConnectionsWithoutHelloDoNotLockOutKvctlOrEngines) {
  RaiseFdLimit();
  rlimit l{};
  ::getrlimit(RLIMIT_NOFILE, &l);
  if (l.rlim_cur < 1300) GTEST_SKIP() << "needs 1,300 file descriptors";
  DaemonProcess::Options o;
  o.log_level = "info";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  std::vector<int> idle;
  for (int i = 0; i < 1100; ++i) {
    const int fd = RawConnect(d.socket_path());
    if (fd >= 0) idle.push_back(fd);
  }
  // kvctl and an engine get in at once: the oldest connections without Hello make way.
  CmdResult k = Sh("timeout 10 " + BinaryPath("kvctl") + " -s " + d.socket_path() + " status --json");
  EXPECT_EQ(k.code, 0) << k.out;
  auto engine = Client::Connect(EngineOptions(d.socket_path(), "engine"));
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto pages = (*engine)->Allocate(TierKind::kHost, 1);
  EXPECT_TRUE(pages.ok()) << pages.status().ToString();
  // Those closed to make way were told why.
  auto first = ErrorFrameThenClose(idle.front());
  ASSERT_TRUE(first.has_value()) << "the oldest idle connection was neither answered nor closed";
  EXPECT_NE(first->second.find("has not sent Hello"), std::string::npos) << first->second;
  // The log says it in a few lines, not one per connection.
  const std::string log = d.Log();
  size_t lines = 0;
  for (size_t at = 0; (at = log.find("refused", at)) != std::string::npos; ++at) ++lines;
  EXPECT_LE(lines, 3u);
  for (int fd : idle) ::close(fd);
  engine->reset();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(Hardening, AConnectionThatSendsNoHelloInTimeGetsAnErrorAndIsClosed) {
  DaemonProcess::Options o;
  o.extra_yaml = "protocol: {hello_timeout: 300ms}\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const int fd = RawConnect(d.socket_path());
  ASSERT_GE(fd, 0);
  auto e = ErrorFrameThenClose(fd);
  ASSERT_TRUE(e.has_value()) << "not closed within 5 s";
  EXPECT_EQ(e->first, fb::Status::FailedPrecondition);
  EXPECT_NE(e->second.find("hello_timeout"), std::string::npos) << e->second;
  ::close(fd);
  auto s = StatsOf(d.socket_path());  // a prompt client is unaffected
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(Hardening, AFullDaemonRefusesWithAnErrorFrameNotASilentClose) {
  // 4 sessions, 1 kept for admins; tests run as root (an admin), so fill it with engines
  // that have said Hello: nothing can make way.
  DaemonProcess::Options o;
  o.extra_yaml = "protocol: {max_sessions: 4, admin_sessions: 1}\n";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  std::vector<std::unique_ptr<Client>> engines;
  for (int i = 0; i < 4; ++i) {
    auto c = Client::Connect(EngineOptions(d.socket_path(), "e" + std::to_string(i)));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    engines.push_back(std::move(c).value());
  }
  // (A connection the daemon has not seen close yet — DaemonProcess's start probes — makes
  // way for a newcomer: try until none is left.)
  Result<std::unique_ptr<Client>> refused = Internal("not tried");
  for (int i = 0; i < 20; ++i) {
    refused = Client::Connect(EngineOptions(d.socket_path(), "one-too-many"));
    if (!refused.ok()) break;
  }
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("max_sessions"), std::string::npos) << refused.status().ToString();
  engines.pop_back();
  EXPECT_TRUE(WaitUntil([&] { return Client::Connect(EngineOptions(d.socket_path(), "later")).ok(); }));
  engines.clear();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// ---- 5. scrapes cannot be blocked -----------------------------------------------------

// 24 threads scrape /metrics as fast as they can: the control loop renders at most once a
// 250 ms (the scrapes between share it), and /healthz keeps its own connections.
TEST(Hardening, AScrapeFloodSharesRendersAndLeavesTheProbesAnswered) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string url = MetricsUrl(d);
  const int port = std::stoi(url.substr(url.rfind(':') + 1));
  auto renders = [&] {
    CmdResult r = Sh("curl -fsS -m 5 " + url + " | awk '$1 == \"kvtier_metrics_renders_total\" {print $2}'");
    return r.code == 0 && !r.out.empty() ? std::stod(r.out) : -1.0;
  };
  const double before = renders();
  ASSERT_GE(before, 0) << "no kvtier_metrics_renders_total";
  std::atomic<bool> stop{false};
  std::atomic<int> scraped{0};
  std::vector<std::thread> flood;
  for (int i = 0; i < 24; ++i) {
    flood.emplace_back([&] {
      while (!stop.load()) {
        if (HttpStatus(port, "/metrics") == "HTTP/1.1 200 OK") ++scraped;
      }
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  int probes = 0, answered = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {
    ++probes;
    answered += HttpStatus(port, "/healthz") == "HTTP/1.1 200 OK";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop = true;
  for (auto& t : flood) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double rendered = renders() - before - 1;  // less the read just now
  EXPECT_EQ(answered, probes) << "a /healthz probe went unanswered during the flood";
  EXPECT_GT(scraped.load(), 0);
  EXPECT_LE(rendered, seconds / 0.25 + 2) << scraped.load() << " scrapes";
  EXPECT_LT(rendered, scraped.load()) << "scrapes did not share renders";
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(Hardening, SeventyHalfSentRequestsDoNotBlockAScrape) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string url = MetricsUrl(d);
  const int port = std::stoi(url.substr(url.rfind(':') + 1));
  std::vector<int> half;
  for (int i = 0; i < 70; ++i) {  // more than the 64 connections admitted at once
    const int fd = TcpConnect(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, "GET /metr", 9, MSG_NOSIGNAL), 9);
    half.push_back(fd);
  }
  const auto t0 = std::chrono::steady_clock::now();
  CmdResult scrape = Sh("curl -fsS -m 5 " + url);
  EXPECT_EQ(scrape.code, 0) << scrape.out;
  EXPECT_NE(scrape.out.find("kvtier_build_info"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  // A half-sent request is answered 408, not reset.
  char buf[256] = {};
  pollfd p{half.back(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  ASSERT_GT(::recv(half.back(), buf, sizeof(buf) - 1, 0), 0);
  EXPECT_EQ(std::string(buf).rfind("HTTP/1.1 408", 0), 0u) << buf;
  for (int fd : half) ::close(fd);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// ---- 6. one engine cannot take a whole tier --------------------------------------------

// A hog (another user: the share is per tenant, a uid of its own here) leases pages one
// at a time and never commits; it stops at max_leased_share, and others are served.
TEST(Hardening, OneSessionCannotLeaseAWholeTierAndStarveTheNext) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run the hog as another user";
  constexpr gid_t kGroup = 41000;
  constexpr uid_t kHog = 41011;
  DaemonProcess::Options opts;  // 64 host pages of 1 MiB; security.max_leased_share 0.5 by default
  opts.socket_yaml = "  group: " + std::to_string(kGroup) + "\n";
  DaemonProcess d(opts);
  ASSERT_EQ(::chmod(d.dir().c_str(), 0755), 0);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ClientOptions o = EngineOptions(d.socket_path(), "hog");
  o.layout = TestLayout("hog-model", 64);  // 1 MiB blocks: the page
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  Pipe release;
  EngineProcess hog([&]() -> int {
    const gid_t groups[1] = {kGroup};
    if (::setgroups(1, groups) != 0 || ::setgid(kGroup) != 0 || ::setuid(kHog) != 0) return 20;
    auto c = Client::Connect(o);
    if (!c.ok()) return 21;
    int held = 0;
    std::string why;
    for (int i = 0; i < 64; ++i) {
      auto p = (*c)->Allocate(TierKind::kHost, 1);
      if (!p.ok()) {
        why = p.status().ToString();
        break;
      }
      ++held;
    }
    const std::string line = std::to_string(held) + " " + why;
    (void)!::write(report[1], line.data(), line.size());
    ::close(report[1]);
    release.Wait();  // holds its leases meanwhile
    return 0;
  });
  ::close(report[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = ::read(report[0], buf, sizeof(buf))) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(report[0]);
  EXPECT_EQ(got.substr(0, got.find(' ')), "32") << got;
  EXPECT_NE(got.find("RESOURCE_EXHAUSTED"), std::string::npos) << got;
  EXPECT_NE(got.find("max_leased_share"), std::string::npos) << got;
  // Another engine is served at once, and a 2 s load finishes with every byte right.
  ClientOptions other = EngineOptions(d.socket_path(), "other");
  other.layout = o.layout;
  auto c = Client::Connect(other);
  ASSERT_TRUE(c.ok());
  auto p = (*c)->Allocate(TierKind::kHost, 16);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  c->reset();
  CmdResult load = Sh("timeout 30 " + BinaryPath("kvtier-load") + " -s " + d.socket_path() +
                      " --sessions 2 --seconds 2 --tokens-per-block 8 --prefixes 50 --depth 4 --json");
  EXPECT_NE(load.code, 124) << "kvtier-load did not finish";
  const auto j = nlohmann::json::parse(load.out.substr(std::min(load.out.find('{'), load.out.size())), nullptr, false);
  EXPECT_GT(j.value("stored", 0), 0) << load.out;
  EXPECT_EQ(j.value("corrupt", -1), 0) << load.out;
  release.Signal();
  EXPECT_EQ(hog.Join(), 0);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(Hardening, KvtierLoadBacksOffWhenTheDaemonIsGoneAndReconnectsWhenItIsBack) {
  DaemonProcess::Options o;
  o.page_bytes = "128KiB";
  o.segment_bytes = "1MiB";
  DaemonProcess d(o);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  nlohmann::json r;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread load([&] { r = Load(d, 4.0); });
  EXPECT_TRUE(WaitForLookups(d, 20)) << d.Log();
  d.Kill();
  std::this_thread::sleep_for(std::chrono::seconds(1));  // a second with no daemon at all
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  load.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 6.0) << "kvtier-load ran past its deadline";
  EXPECT_EQ(r.value("corrupt", -1), 0) << r.dump();
  EXPECT_GE(r.value("disconnects", 0), 1) << r.dump();
  EXPECT_GE(r.value("reconnects", 0), 1) << r.dump();
  // Spinning would be thousands of failed calls a second; backing off, a handful.
  EXPECT_LT(r.value("errors", 1 << 30), 50) << r.dump();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// ---- 7. committed bytes stay as committed -----------------------------------------------

// In a child: a fault exits 77 (the sanitizers' own SEGV reports would abort instead).
constexpr int kFaulted = 77;
void ExitOnFault() {
  struct sigaction sa {};
  sa.sa_handler = [](int) { ::_exit(kFaulted); };
  ::sigaction(SIGSEGV, &sa, nullptr);
  ::sigaction(SIGBUS, &sa, nullptr);
}

TEST(Hardening, AWriteIntoACommittedOrAcquiredPageFaultsAndReadersSeeTheCommittedBytes) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const auto chain = HashChain(77, 1);
  const ModelLayout layout = TestLayout();
  // The writer commits a block, then writes into the page it committed: a fault.
  EngineProcess writer([&]() -> int {
    auto c = Client::Connect(EngineOptions(d.socket_path(), "writer"));
    if (!c.ok()) return 20;
    auto pages = (*c)->Allocate(TierKind::kHost, 1);
    if (!pages.ok()) return 21;
    auto bytes = (*c)->PageBytes(TierKind::kHost, (*pages)[0]);
    FillBlockPattern(chain[0], bytes.first(layout.block_bytes));  // leased: writable
    const std::vector<CommitEntry> e = {{(*pages)[0], chain[0], {}}};
    auto r = (*c)->Commit(TierKind::kHost, e);
    if (!r.ok() || !(*r)[0].status.ok()) return 22;
    ExitOnFault();
    volatile uint8_t* p = bytes.data();
    p[0] = static_cast<uint8_t>(p[0] + 1);  // must fault
    return 0;
  });
  EXPECT_EQ(writer.Join(), kFaulted) << "a write into a committed page did not fault";
  // A reader that acquired the block cannot write into it either.
  EngineProcess reader([&]() -> int {
    auto c = Client::Connect(EngineOptions(d.socket_path(), "reader"));
    if (!c.ok()) return 20;
    auto a = (*c)->Acquire(chain);
    if (!a.ok() || !(*a)[0].status.ok()) return 21;
    auto bytes = (*c)->PageBytes((*a)[0].tier, (*a)[0].page);
    if (!CheckBlockPattern(chain[0], bytes.first(layout.block_bytes))) return 22;
    ExitOnFault();
    volatile uint8_t* p = bytes.data();
    p[1] = static_cast<uint8_t>(p[1] + 1);  // must fault
    return 0;
  });
  EXPECT_EQ(reader.Join(), kFaulted) << "a write into an acquired page did not fault";
  // Everyone still reads the committed bytes.
  auto c = Client::Connect(EngineOptions(d.socket_path(), "check"));
  ASSERT_TRUE(c.ok());
  auto a = (*c)->Acquire(chain);
  ASSERT_TRUE(a.ok() && (*a)[0].status.ok());
  EXPECT_TRUE(CheckBlockPattern(chain[0], (*c)->PageBytes((*a)[0].tier, (*a)[0].page).first(layout.block_bytes)));
  c->reset();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// ---- 9. limits that agree ------------------------------------------------------------

TEST(Hardening, EveryPermittedRequestFitsAFrameAndAnOversizedOneIsAReadableError) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  ClientOptions o = EngineOptions(d.socket_path(), "limits");
  o.hash_bytes = 32;  // the largest entries
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const uint32_t max = (*c)->max_entries_per_request();
  EXPECT_EQ(max, MaxEntriesForFrame(kDefaultMaxFrameBytes));
  // As many hashes as permitted: served.
  auto chain = HashChain(7, max, 32);
  auto l = (*c)->Lookup(chain);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->matched, 0u);
  // One more: refused by the daemon with the limit's name, and the session lives on.
  chain = HashChain(7, max + 1, 32);
  l = (*c)->Lookup(chain);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find("max_entries_per_request"), std::string::npos) << l.status().ToString();
  EXPECT_TRUE((*c)->Ping().ok());
  // A request over the frame limit: a readable error before anything is sent, not a broken pipe.
  Status big = (*c)->Ping(2u << 20);
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument) << big.ToString();
  EXPECT_NE(big.message().find("max_frame_bytes"), std::string::npos) << big.ToString();
  EXPECT_TRUE((*c)->Ping().ok()) << "the connection broke";
  c->reset();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// kvtierd at its descriptor limit while this lives: the limit lowered to what it holds + 2
// and the last ones taken by control connections (8 more queue past it); then the
// connections closed and the limit restored.
class DescriptorLimit {
 public:
  explicit DescriptorLimit(const DaemonProcess& d) : pid_(d.pid()) {
    const std::string fd_dir = "/proc/" + std::to_string(pid_) + "/fd";
    const auto open_fds = std::distance(fs::directory_iterator(fd_dir), fs::directory_iterator());
    EXPECT_EQ(::prlimit(pid_, RLIMIT_NOFILE, nullptr, &was_), 0);
    rlimit tight = was_;
    tight.rlim_cur = static_cast<rlim_t>(open_fds + 2);
    EXPECT_EQ(::prlimit(pid_, RLIMIT_NOFILE, &tight, nullptr), 0);
    for (int i = 0; i < 8; ++i) held_.push_back(RawConnect(d.socket_path()));
  }
  ~DescriptorLimit() {
    for (int fd : held_) ::close(fd);
    EXPECT_EQ(::prlimit(pid_, RLIMIT_NOFILE, &was_, nullptr), 0);
  }
  DescriptorLimit(const DescriptorLimit&) = delete;
  DescriptorLimit& operator=(const DescriptorLimit&) = delete;

 private:
  pid_t pid_;
  rlimit was_{};
  std::vector<int> held_;
};

// Out of descriptors, kvtierd retries accepting with a backoff and says so once per 10 s
// (it logged 20 lines a second at 60-87 % CPU), and serves again once descriptors free up.
TEST(Hardening, OutOfDescriptorsAcceptBacksOffSaysSoOnceAndRecovers) {
  if (kSanitized) {
    // UBSan's vptr check opens a pipe to test memory it has not seen: at the descriptor
    // limit that fails and it reports an invalid vptr (seen here at shared_ptr's control
    // block), so this runs in the plain build only.
    GTEST_SKIP() << "the sanitizers' runtime needs descriptors of its own";
  }
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto limit = std::make_optional<DescriptorLimit>(d);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const std::string log = d.Log();
  size_t said = 0;
  for (size_t at = log.find("accept: "); at != std::string::npos; at = log.find("accept: ", at + 1)) ++said;
  EXPECT_EQ(said, 1u) << log;
  EXPECT_NE(log.find("raise LimitNOFILE"), std::string::npos) << log;
  limit.reset();
  EXPECT_TRUE(WaitUntil([&] { return Client::Connect(EngineOptions(d.socket_path())).ok(); }, std::chrono::seconds(10)))
      << d.Log();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// At the descriptor limit the metrics server keeps one descriptor in reserve for the
// connection a probe makes (it used to spin on accept's EMFILE, and the probe timed out
// with no answer), and it waits between tries instead of spinning.
TEST(Hardening, AtTheDescriptorLimitAProbeIsAnsweredOnTheReservedDescriptor) {
  if (kSanitized) GTEST_SKIP() << "the sanitizers' runtime needs descriptors of its own (as above)";
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string url = MetricsUrl(d);
  const int port = std::stoi(url.substr(url.rfind(':') + 1));
  auto limit = std::make_optional<DescriptorLimit>(d);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto cpu_ticks = [&] {
    std::ifstream in("/proc/" + std::to_string(d.pid()) + "/stat");
    std::string line;
    std::getline(in, line);
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::string field;
    uint64_t utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    return utime + stime;
  };
  for (int probe = 0; probe < 3; ++probe) {
    EXPECT_EQ(HttpStatus(port, "/healthz"), "HTTP/1.1 200 OK") << "probe " << probe << "\n" << d.Log();
  }
  const uint64_t before = cpu_ticks();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_LT(cpu_ticks() - before, static_cast<uint64_t>(::sysconf(_SC_CLK_TCK) / 4))
      << "kvtierd spent a quarter of a CPU-second in a second at the limit: accept spins";
  EXPECT_NE(d.Log().find("probes are answered on the one kept in reserve"), std::string::npos) << d.Log();
  limit.reset();
  EXPECT_EQ(HttpStatus(port, "/healthz"), "HTTP/1.1 200 OK");
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

}  // namespace
}  // namespace kvtier::testing
