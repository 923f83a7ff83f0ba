// kvtier-load: a synthetic engine load against a running kvtierd, for demos and soak.
//
// N engine processes (sessions) each loop over requests: a request is a chain of blocks,
// the first depth-1 shared by every request of its prefix (a system prompt, a document)
// and the last one unique. Lookup the chain; acquire the hits and verify their bytes (the
// pattern of each block's hash: a mismatch is corruption); store the misses (allocate,
// write the pattern, commit). Prefixes are drawn Zipf-like, so some are hot. A refused
// call waits (exponential back-off with jitter) and a lost daemon is reconnected to, until
// --seconds is up. With --abandon-every N, every Nth request that stores ends its session
// with the pages leased and reconnects, while the process keeps its mappings and writes
// over those pages after its next request: a stale engine, as one whose session timed out.
// The daemon must not lease the pages again while the process lives, or readers count
// the blocks they land in as corrupt.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "engine/client.h"
#include "engine/tools/backoff.h"
#include "engine/tools/block_pattern.h"
#include "protocol/base/model_presets.h"

namespace {

using namespace kvtier;

struct Args {
  std::string socket;
  int sessions = 4;
  double seconds = 5;
  std::string model = "llama3.1-8b";
  std::string dtype = "bf16";
  uint32_t tokens_per_block = 16;
  int prefixes = 64;
  int depth = 8;
  int abandon_every = 0;
  bool json = false;
};

struct Totals {
  uint64_t requests = 0, blocks = 0, hits = 0, stored = 0, duplicates = 0, corrupt = 0, refused = 0, errors = 0;
  uint64_t disconnects = 0, reconnects = 0, abandoned = 0;
  double lookup_us = 0;
  void Add(const Totals& o) {
    abandoned += o.abandoned;
    disconnects += o.disconnects;
    reconnects += o.reconnects;
    requests += o.requests;
    blocks += o.blocks;
    hits += o.hits;
    stored += o.stored;
    duplicates += o.duplicates;
    corrupt += o.corrupt;
    refused += o.refused;
    errors += o.errors;
    lookup_us += o.lookup_us;
  }
};

std::vector<BlockHash> Chain(int prefix, int depth, uint64_t unique) {
  std::vector<BlockHash> out;
  BlockHash parent;
  for (int i = 0; i < depth; ++i) {
    const bool last = i == depth - 1;
    const uint32_t tokens[4] = {static_cast<uint32_t>(prefix), static_cast<uint32_t>(i),
                                last ? static_cast<uint32_t>(unique) : 0u,
                                last ? static_cast<uint32_t>(unique >> 32) : 0u};
    parent = ChainHash(parent, tokens);
    out.push_back(parent);
  }
  return out;
}

Totals RunSession(const Args& a, const ModelLayout& layout, int index) {
  Totals t;
  ClientOptions o;
  o.socket_path = a.socket;
  o.engine_name = "kvtier-load-" + std::to_string(index);
  o.layout = layout;
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(a.seconds));
  // Refused or disconnected, a session waits (exponential, jittered) and tries again
  // until the deadline, as an engine would: it never spins on a daemon that is gone.
  Backoff backoff(std::chrono::milliseconds(1), std::chrono::milliseconds(500), 1000 + index);
  std::unique_ptr<Client> client;
  Status last_connect_error;
  auto connect = [&]() -> bool {
    for (;;) {
      auto c = Client::Connect(o);
      if (c.ok()) {
        client = std::move(c).value();
        backoff.Reset();
        return true;
      }
      last_connect_error = c.status();
      if (!backoff.Wait(deadline)) return false;
    }
  };
  if (!connect()) {
    std::fprintf(stderr, "kvtier-load: session %d: %s\n", index, last_connect_error.ToString().c_str());
    t.errors = 1;
    return t;
  }
  // A failed call: counted; the session reconnects when the daemon is gone, else waits.
  auto failed = [&](const Status& st) {
    ++(st.code() == StatusCode::kResourceExhausted ? t.refused : t.errors);
    if (DaemonGone(st)) {
      client.reset();
      ++t.disconnects;
    } else {
      (void)backoff.Wait(deadline);
    }
  };
  // A session ended with pages leased, its mappings kept for the stale writes.
  struct Stale {
    std::unique_ptr<Client> client;
    std::vector<PageId> pages;
  };
  std::optional<Stale> stale;
  auto write_stale = [&] {
    if (!stale) return;
    for (PageId p : stale->pages) {
      auto bytes = stale->client->PageBytes(TierKind::kHost, p);
      std::fill(bytes.begin(), bytes.end(), uint8_t{0x41});
    }
    stale.reset();  // unmaps
  };
  std::mt19937_64 rng(1000 + index);
  // Zipf(1.0) over prefixes by inverse CDF on precomputed weights.
  std::vector<double> cdf(a.prefixes);
  double sum = 0;
  for (int p = 0; p < a.prefixes; ++p) cdf[p] = (sum += 1.0 / (p + 1));
  while (std::chrono::steady_clock::now() < deadline) {
    if (!client) {
      if (!connect()) break;
      ++t.reconnects;
    }
    const double u = std::uniform_real_distribution<double>(0, sum)(rng);
    const int prefix = static_cast<int>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    const auto chain = Chain(prefix, a.depth, rng());
    write_stale();  // the last request's abandoned pages, written late
    ++t.requests;
    t.blocks += chain.size();
    const auto t0 = std::chrono::steady_clock::now();
    auto l = client->Lookup(chain);
    t.lookup_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (!l.ok()) {
      failed(l.status());
      continue;
    }
    size_t hit = l->matched;
    if (hit > 0) {
      std::span<const BlockHash> hits(chain.data(), hit);
      auto acq = client->Acquire(hits);
      if (!acq.ok()) {
        failed(acq.status());
        continue;
      }
      std::vector<BlockHash> held;
      size_t prefix = hit;
      for (size_t i = 0; i < hit; ++i) {
        const BlockResult& r = (*acq)[i];
        if (!r.status.ok()) {  // evicted between lookup and acquire: a miss from here on
          prefix = std::min(prefix, i);
          continue;
        }
        held.push_back(chain[i]);
        auto bytes = client->PageBytes(r.tier, r.page);
        if (bytes.size() < layout.block_bytes || !CheckBlockPattern(chain[i], bytes.first(layout.block_bytes))) {
          ++t.corrupt;
        }
      }
      hit = prefix;
      t.hits += hit;
      if (!held.empty()) {
        if (auto rel = client->Release(TierKind::kHost, {}, held); !rel.ok()) {
          failed(rel.status());
          continue;
        }
      }
    }
    const size_t miss = chain.size() - hit;
    if (miss == 0) {
      backoff.Reset();
      continue;
    }
    auto pages = client->Allocate(TierKind::kHost, static_cast<uint32_t>(miss));
    if (!pages.ok()) {
      failed(pages.status());
      continue;
    }
    if (a.abandon_every > 0 && t.requests % a.abandon_every == 0 && !stale) {
      client->Close();  // the session ends; the process and its mappings live on
      stale = Stale{std::move(client), std::move(*pages)};
      ++t.abandoned;
      continue;  // reconnects at the next request
    }
    std::vector<CommitEntry> entries;
    for (size_t i = 0; i < miss; ++i) {
      const size_t b = hit + i;
      auto bytes = client->PageBytes(TierKind::kHost, (*pages)[i]);
      FillBlockPattern(chain[b], bytes.first(layout.block_bytes));
      entries.push_back({(*pages)[i], chain[b], b ? chain[b - 1] : BlockHash()});
    }
    auto r = client->Commit(TierKind::kHost, entries);
    if (!r.ok()) {
      failed(r.status());
      continue;
    }
    for (const BlockResult& e : *r) ++(e.duplicate ? t.duplicates : t.stored);
    backoff.Reset();
  }
  write_stale();
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"kvtier-load: synthetic engine sessions against kvtierd, verifying every byte read"};
  app.add_option("-s,--socket", a.socket, "kvtierd socket (default: $KVTIER_SOCKET or ./var/kvtierd.sock)");
  app.add_option("--sessions", a.sessions, "Engine processes")->check(CLI::Range(1, 1024));
  app.add_option("--seconds", a.seconds, "How long to run")->check(CLI::Range(0.1, 86400.0));
  app.add_option("--model", a.model, "Model preset (llama3.1-8b, qwen2.5-7b, mistral-7b, ...)");
  app.add_option("--dtype", a.dtype, "KV dtype: bf16, fp16, fp8");
  app.add_option("--tokens-per-block", a.tokens_per_block, "Tokens per block")->check(CLI::Range(1, 65536));
  app.add_option("--prefixes", a.prefixes, "Distinct shared prefixes")->check(CLI::Range(1, 1'000'000));
  app.add_option("--depth", a.depth, "Blocks per request (the last one unique)")->check(CLI::Range(1, 4096));
  app.add_option("--abandon-every", a.abandon_every,
                 "End the session of every Nth storing request with its pages leased, reconnect, and write over "
                 "those pages from the old mappings (a stale engine); 0: never")
      ->check(CLI::Range(0, 1'000'000));
  app.add_flag("--json", a.json, "Print one JSON object");
  CLI11_PARSE(app, argc, argv);

  const ModelPreset* preset = FindModelPreset(a.model);
  DType dtype;
  if (!preset || !ParseDType(a.dtype, &dtype)) {
    std::fprintf(stderr, "kvtier-load: unknown model '%s' or dtype '%s'\n", a.model.c_str(), a.dtype.c_str());
    return 2;
  }
  const ModelLayout layout = preset->Layout(dtype, a.tokens_per_block);

  std::vector<std::pair<pid_t, int>> children;
  for (int i = 0; i < a.sessions; ++i) {
    int fds[2];
    if (::pipe(fds) != 0) return 1;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      Totals t = RunSession(a, layout, i);
      (void)!::write(fds[1], &t, sizeof(t));
      ::_exit(0);
    }
    ::close(fds[1]);
    children.emplace_back(pid, fds[0]);
  }
  Totals all;
  int failed_sessions = 0;
  for (auto [pid, fd] : children) {
    Totals t;
    if (::read(fd, &t, sizeof(t)) == sizeof(t))
      all.Add(t);
    else
      ++failed_sessions;
    ::close(fd);
    ::waitpid(pid, nullptr, 0);
  }
  const double ratio = all.blocks ? static_cast<double>(all.hits) / all.blocks : 0;
  if (a.json) {
    nlohmann::json j{{"sessions", a.sessions},
                     {"seconds", a.seconds},
                     {"model", layout.ToString()},
                     {"requests", all.requests},
                     {"blocks", all.blocks},
                     {"hit_blocks", all.hits},
                     {"hit_ratio", ratio},
                     {"stored", all.stored},
                     {"duplicates", all.duplicates},
                     {"corrupt", all.corrupt},
                     {"refused", all.refused},
                     {"errors", all.errors},
                     {"disconnects", all.disconnects},
                     {"reconnects", all.reconnects},
                     {"abandoned_sessions", all.abandoned},
                     {"mean_lookup_us", all.requests ? all.lookup_us / all.requests : 0}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("kvtier-load: %d sessions x %.1f s, %s\n", a.sessions, a.seconds, layout.ToString().c_str());
    std::printf("  requests %llu, blocks %llu, hits %llu (%.1f%%), stored %llu, duplicates %llu\n",
                (unsigned long long)all.requests, (unsigned long long)all.blocks, (unsigned long long)all.hits,
                100 * ratio, (unsigned long long)all.stored, (unsigned long long)all.duplicates);
    std::printf("  corrupt %llu, refused (tier full) %llu, errors %llu, mean lookup %.1f us\n",
                (unsigned long long)all.corrupt, (unsigned long long)all.refused, (unsigned long long)all.errors,
                all.requests ? all.lookup_us / all.requests : 0.0);
    if (all.abandoned > 0) {
      std::printf("  %llu sessions abandoned with pages leased, then written over\n",
                  (unsigned long long)all.abandoned);
    }
    if (all.disconnects > 0) {
      std::printf("  daemon gone %llu times; %llu reconnects\n", (unsigned long long)all.disconnects,
                  (unsigned long long)all.reconnects);
    }
  }
  return (all.corrupt || all.errors || failed_sessions) ? 1 : 0;
}
