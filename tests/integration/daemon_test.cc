// Two engine processes share bytes through a real kvtierd; a killed engine's pages come
// back; accounting stays exact.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>

#include "engine/tools/block_pattern.h"
#include "tests/integration/engine_process.h"

namespace kvtier::testing {
namespace {

constexpr int kBlocks = 6;

DaemonStats MustStats(const std::string& socket) {
  auto c = ControlClient::Connect(ControlOptions(socket));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  auto s = (*c)->Stats(true);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return *s;
}

const TierStatsInfo& Host(const DaemonStats& s) {
  for (const auto& t : s.tiers) {
    if (t.tier == TierKind::kHost) return t;
  }
  static TierStatsInfo none;
  ADD_FAILURE() << "no host tier";
  return none;
}

void ExpectAccountingExact(const TierStatsInfo& t) {
  EXPECT_EQ(t.free_pages + t.leased_pages + t.inflight_pages + t.cached_pages + t.referenced_pages, t.capacity_pages);
}

TEST(TwoEngines, OneWritesAndCommitsTheOtherReadsTheSameBytes) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok()) << daemon.Log();
  const auto chain = HashChain(42, kBlocks);
  Pipe committed, verified;

  EngineProcess writer([&]() -> int {
    auto c = Client::Connect(EngineOptions(daemon.socket_path(), "writer"));
    if (!c.ok()) return 10;
    auto pages = (*c)->Allocate(TierKind::kHost, kBlocks);
    if (!pages.ok() || pages->size() != kBlocks) return 11;
    std::vector<CommitEntry> entries;
    for (int i = 0; i < kBlocks; ++i) {
      auto bytes = (*c)->PageBytes(TierKind::kHost, (*pages)[i]);
      if (bytes.size() < TestLayout().block_bytes) return 12;
      FillBlockPattern(chain[i], bytes.first(TestLayout().block_bytes));
      entries.push_back({(*pages)[i], chain[i], i ? chain[i - 1] : BlockHash()});
    }
    auto r = (*c)->Commit(TierKind::kHost, entries);
    if (!r.ok()) return 13;
    for (const auto& e : *r) {
      if (!e.status.ok() || e.duplicate) return 14;
    }
    committed.Signal();
    // Stay connected while the reader works: the two sessions are alive at once.
    return verified.Wait() ? 0 : 15;
  });

  ASSERT_TRUE(committed.Wait()) << "writer died: " << daemon.Log();
  EngineProcess reader([&]() -> int {
    auto c = Client::Connect(EngineOptions(daemon.socket_path(), "reader"));
    if (!c.ok()) return 20;
    auto l = (*c)->Lookup(chain);
    if (!l.ok() || l->matched != kBlocks) return 21;
    auto a = (*c)->Acquire(chain);
    if (!a.ok()) return 22;
    for (int i = 0; i < kBlocks; ++i) {
      if (!(*a)[i].status.ok() || (*a)[i].tier != TierKind::kHost) return 23;
      auto bytes = (*c)->PageBytes(TierKind::kHost, (*a)[i].page);
      if (bytes.empty()) return 24;
      if (!CheckBlockPattern(chain[i], bytes.first(TestLayout().block_bytes))) return 25;
    }
    auto rel = (*c)->Release(TierKind::kHost, {}, chain);
    if (!rel.ok()) return 26;
    for (const Status& s : *rel) {
      if (!s.ok()) return 27;
    }
    return 0;
  });
  EXPECT_EQ(reader.Join(), 0) << daemon.Log();
  verified.Signal();
  EXPECT_EQ(writer.Join(), 0) << daemon.Log();

  // Both sessions are gone; the blocks stay cached for the next engine.
  DaemonStats s = MustStats(daemon.socket_path());
  EXPECT_EQ(Host(s).cached_pages, static_cast<uint32_t>(kBlocks));
  EXPECT_EQ(Host(s).leased_pages, 0u);
  EXPECT_EQ(Host(s).referenced_pages, 0u);
  ExpectAccountingExact(Host(s));
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

TEST(EngineKill, Kill9ReturnsEveryLeasedPageAndReference) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok()) << daemon.Log();
  const auto chain = HashChain(7, 4);
  {
    // Some blocks a killed engine will hold references to.
    auto c = Client::Connect(EngineOptions(daemon.socket_path(), "seed"));
    ASSERT_TRUE(c.ok());
    auto pages = (*c)->Allocate(TierKind::kHost, 4);
    ASSERT_TRUE(pages.ok());
    std::vector<CommitEntry> e;
    for (int i = 0; i < 4; ++i) e.push_back({(*pages)[i], chain[i], {}});
    ASSERT_TRUE((*c)->Commit(TierKind::kHost, e).ok());
  }
  for (int round = 0; round < 3; ++round) {
    Pipe ready;
    EngineProcess victim([&]() -> int {
      auto c = Client::Connect(EngineOptions(daemon.socket_path(), "victim"));
      if (!c.ok()) return 10;
      if (!(*c)->Allocate(TierKind::kHost, 20).ok()) return 11;
      if (!(*c)->Acquire(chain).ok()) return 12;
      ready.Signal();
      ::pause();
      return 0;
    });
    ASSERT_TRUE(ready.Wait());
    DaemonStats before = MustStats(daemon.socket_path());
    EXPECT_EQ(Host(before).leased_pages, 20u);
    EXPECT_EQ(Host(before).referenced_pages, 4u);
    victim.Kill9();
    EXPECT_EQ(victim.Join(), 128 + SIGKILL);
    // The daemon sees EOF and reclaims; poll briefly for it.
    DaemonStats after;
    WaitUntil(
        [&] {
          after = MustStats(daemon.socket_path());
          return Host(after).leased_pages == 0 && Host(after).referenced_pages == 0;
        },
        std::chrono::seconds(2));
    EXPECT_EQ(Host(after).leased_pages, 0u);
    EXPECT_EQ(Host(after).referenced_pages, 0u);
    EXPECT_EQ(Host(after).cached_pages, 4u);
    EXPECT_EQ(Host(after).free_pages, Host(after).capacity_pages - 4);
    ExpectAccountingExact(Host(after));
  }
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

// The engine crash campaign: engines killed at random moments in the middle of leasing,
// writing, committing, acquiring and releasing. After every kill each page is reclaimed:
// nothing leased, referenced or quarantined is left, and the books balance. 20 kills in
// make test; tests/crash/run.sh runs 200 (KVTIER_CRASH_ITERATIONS).
TEST(EngineKill, Kill9MidTransferAtRandomMomentsReclaimsEveryPage) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok()) << daemon.Log();
  const char* env = std::getenv("KVTIER_CRASH_ITERATIONS");
  const int kills = env ? std::atoi(env) : 20;
  std::mt19937 rng(4242);
  for (int k = 0; k < kills; ++k) {
    Pipe ready;
    const uint64_t seed = 5000 + static_cast<uint64_t>(k);
    EngineProcess victim([&]() -> int {
      auto c = Client::Connect(EngineOptions(daemon.socket_path(), "victim"));
      if (!c.ok()) return 10;
      ready.Signal();
      for (uint64_t seq = 0;; ++seq) {
        const auto chain = HashChain(seed * 100000 + seq % 50, 4);  // a few repeat: hits too
        auto l = (*c)->Lookup(chain);
        if (l.ok() && l->matched > 0) {
          std::span<const BlockHash> got(chain.data(), l->matched);
          if ((*c)->Acquire(got).ok()) (void)(*c)->Release(TierKind::kHost, {}, got);
        }
        auto pages = (*c)->Allocate(TierKind::kHost, 4);
        if (!pages.ok()) continue;
        std::vector<CommitEntry> e;
        for (int i = 0; i < 4; ++i) {
          FillBlockPattern(chain[i], (*c)->PageBytes(TierKind::kHost, (*pages)[i]).first(64 << 10));
          e.push_back({(*pages)[i], chain[i], i ? chain[i - 1] : BlockHash()});
        }
        (void)(*c)->Commit(TierKind::kHost, e);
      }
    });
    ASSERT_TRUE(ready.Wait());
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    victim.Kill9();
    EXPECT_EQ(victim.Join(), 128 + SIGKILL);
    DaemonStats after;
    WaitUntil(
        [&] {
          after = MustStats(daemon.socket_path());
          const auto& h = Host(after);
          return h.leased_pages == 0 && h.referenced_pages == 0 && h.quarantined_pages == 0 && after.session_count == 1;
        },
        std::chrono::seconds(5));
    const auto& h = Host(after);
    ASSERT_EQ(h.leased_pages, 0u) << "kill " << k;
    ASSERT_EQ(h.referenced_pages, 0u) << "kill " << k;
    ASSERT_EQ(h.quarantined_pages, 0u) << "kill " << k;
    ExpectAccountingExact(h);
  }
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

TEST(Pipelining, ManyRequestsInFlightAreAnsweredByTicket) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok()) << daemon.Log();
  auto c = Client::Connect(EngineOptions(daemon.socket_path()));
  ASSERT_TRUE(c.ok());
  const auto chain = HashChain(9, 8);
  auto pages = (*c)->Allocate(TierKind::kHost, 8);
  ASSERT_TRUE(pages.ok());
  std::vector<CommitEntry> e;
  for (int i = 0; i < 8; ++i) e.push_back({(*pages)[i], chain[i], {}});
  ASSERT_TRUE((*c)->Commit(TierKind::kHost, e).ok());
  std::vector<Ticket> tickets;
  for (size_t n = 1; n <= 8; ++n) {
    auto t = (*c)->StartLookup(std::span<const BlockHash>(chain).first(n));
    ASSERT_TRUE(t.ok());
    tickets.push_back(*t);
  }
  // Wait in reverse order: earlier responses are stashed, not lost.
  for (size_t i = tickets.size(); i-- > 0;) {
    auto r = (*c)->WaitLookup(tickets[i]);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->matched, i + 1);
  }
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

TEST(Pipelining, LookupsSentInOneWriteAreAnsweredEachByItsTicket) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok()) << daemon.Log();
  auto c = Client::Connect(EngineOptions(daemon.socket_path()));
  ASSERT_TRUE(c.ok());
  const auto chain = HashChain(11, 6);
  auto pages = (*c)->Allocate(TierKind::kHost, 6);
  ASSERT_TRUE(pages.ok());
  std::vector<CommitEntry> e;
  for (int i = 0; i < 6; ++i) e.push_back({(*pages)[i], chain[i], {}});
  ASSERT_TRUE((*c)->Commit(TierKind::kHost, e).ok());
  // 64 lookups of prefixes of 0..6 blocks plus a chain nobody stored, in one batch.
  std::vector<std::vector<BlockHash>> chains;
  for (int i = 0; i < 64; ++i) {
    if (i % 8 == 7) {
      chains.push_back(HashChain(12, 3));
    } else {
      chains.emplace_back(chain.begin(), chain.begin() + i % 7);
    }
  }
  auto tickets = (*c)->StartLookups(chains);
  ASSERT_TRUE(tickets.ok()) << tickets.status().ToString();
  ASSERT_EQ(tickets->size(), chains.size());
  for (size_t i = tickets->size(); i-- > 0;) {
    auto r = (*c)->WaitLookup((*tickets)[i]);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->matched, i % 8 == 7 ? 0u : i % 7) << "lookup " << i;
  }
  // A batch with a bad chain sends nothing: no stray response, the session goes on.
  std::vector<std::vector<BlockHash>> bad = {chain, {BlockHash(std::vector<uint8_t>(7, 1))}};
  EXPECT_EQ((*c)->StartLookups(bad).status().code(), StatusCode::kInvalidArgument);
  auto after = (*c)->Lookup(chain);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->matched, 6u);
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

TEST(Errors, PerBlockErrorsAreTypedAndTheSessionGoesOn) {
  DaemonProcess::Options o;
  o.extra_yaml = "security: {max_leased_share: 1}\n";  // this session may lease the whole pool
  DaemonProcess daemon(o);
  ASSERT_TRUE(daemon.Start().ok()) << daemon.Log();
  auto c = Client::Connect(EngineOptions(daemon.socket_path()));
  ASSERT_TRUE(c.ok());
  const auto chain = HashChain(10, 2);
  auto a = (*c)->Acquire(chain);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)[0].status.code(), StatusCode::kNotFound);
  // More than the pool holds: the request fails as a whole, nothing leaks.
  auto big = (*c)->Allocate(TierKind::kHost, 1000);
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  auto all = (*c)->Allocate(TierKind::kHost, 64);
  ASSERT_TRUE(all.ok());
  auto more = (*c)->Allocate(TierKind::kHost, 1);
  EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted);
  std::vector<PageId> never = {*std::max_element(all->begin(), all->end()) + 1000};
  auto rel = (*c)->Release(TierKind::kHost, never);
  ASSERT_TRUE(rel.ok());
  EXPECT_EQ((*rel)[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*c)->Ping().ok());
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

}  // namespace
}  // namespace kvtier::testing

namespace kvtier::testing {
namespace {

TEST(Client, APrefixAcquireTakesOnlyTheChainsPresentPrefixAndAPlainOneEveryHash) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok()) << daemon.Log();
  auto c = Client::Connect(EngineOptions(daemon.socket_path()));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const auto chain = HashChain(11, 6);
  const std::vector<size_t> cached = {0, 1, 2, 4, 5};  // block 3 is not
  auto pages = (*c)->Allocate(TierKind::kHost, static_cast<uint32_t>(cached.size()));
  ASSERT_TRUE(pages.ok()) << pages.status().ToString();
  std::vector<CommitEntry> entries;
  std::vector<BlockHash> present;
  for (size_t k = 0; k < cached.size(); ++k) {
    const size_t i = cached[k];
    entries.push_back({(*pages)[k], chain[i], i ? chain[i - 1] : BlockHash()});
    present.push_back(chain[i]);
  }
  ASSERT_TRUE((*c)->Commit(TierKind::kHost, entries).ok());
  // A plain Acquire (as clients before protocol minor 5 send it): an entry per hash.
  auto all = (*c)->Acquire(chain);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), chain.size());
  for (size_t i = 0; i < chain.size(); ++i) {
    EXPECT_EQ((*all)[i].status.code(), i == 3 ? StatusCode::kNotFound : StatusCode::kOk) << i;
  }
  ASSERT_TRUE((*c)->Release(TierKind::kHost, {}, present).ok());
  // A prefix Acquire: the leading run only, nothing past the first miss referenced.
  auto prefix = (*c)->AcquirePrefix(chain);
  ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
  ASSERT_EQ(prefix->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE((*prefix)[i].status.ok()) << i;
    EXPECT_EQ((*prefix)[i].page, (*all)[i].page) << i;
  }
  EXPECT_EQ(Host(MustStats(daemon.socket_path())).referenced_pages, 3u);
  // Released without waiting: a later request of the session comes after it.
  ASSERT_TRUE((*c)->ReleaseUnwaited(std::span<const BlockHash>(chain).first(3)).ok());
  auto l = (*c)->Lookup(chain);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->matched, 3u);
  EXPECT_EQ(Host(MustStats(daemon.socket_path())).referenced_pages, 0u);
  // A chain whose head is not cached: nothing.
  auto none = (*c)->AcquirePrefix(HashChain(99, 3));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

TEST(Client, WaitingOnATicketNotOutstandingFailsAtOnce) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start().ok()) << daemon.Log();
  ClientOptions o = EngineOptions(daemon.socket_path());
  o.timeout_ms = 0;  // wait forever: a hang would hang the test, not time out
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const auto chain = HashChain(7, 2);
  auto t = (*c)->StartLookup(chain);
  ASSERT_TRUE(t.ok());
  const auto start = std::chrono::steady_clock::now();
  // Never issued.
  auto never = (*c)->WaitLookup(*t + 1000);
  EXPECT_EQ(never.status().code(), StatusCode::kInvalidArgument) << never.status().ToString();
  std::vector<Ticket> mixed = {*t, *t + 1000};
  EXPECT_EQ((*c)->WaitAny(mixed).status().code(), StatusCode::kInvalidArgument);
  // Issued, waited for once: fine; a second wait is an error, not a hang.
  auto first = (*c)->WaitLookup(*t);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto again = (*c)->WaitLookup(*t);
  EXPECT_EQ(again.status().code(), StatusCode::kInvalidArgument);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // The session still works.
  EXPECT_TRUE((*c)->Lookup(chain).ok());
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

}  // namespace
}  // namespace kvtier::testing
