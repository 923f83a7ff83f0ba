#pragma once
// SessionTable: what agentic sessions' hints say of each block, as a retention class
// (retention_policy.h). A session is a chain of requests of one client (a session id); its
// hints are how long it expects to be away after a request (a TTL, clamped to max_ttl) and
// that it has ended. A block used by a live session (within its TTL) is kProtected, with an
// expected return of the earliest live user's (last request + TTL); a block whose users all
// ended is kExpendable; otherwise kOrdinary. Shared prefixes (a system prompt, a subagent's
// parent context) stay protected while any session using them lives; a session that outlives
// its TTL lapses by itself (Expire). Blocks are the owner's keys (dense small integers); time
// is the owner's clock (ns).
//
// Not thread-safe.

#include <cstdint>
#include <deque>
#include <functional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "storage/policy/retention_policy.h"

namespace kvtier {

class SessionTable {
 public:
  struct Options {
    int64_t max_ttl_ns = 3600'000'000'000;  // TTLs above it are clamped
    // Sessions held. At the bound a new session takes the place of the one that ended or
    // lapsed first (its blocks lose the class it gave them); where every session held is
    // live it is refused (Request returns false).
    size_t max_sessions = 1 << 20;
  };
  // Called for each block whose class changes (its expected return, for kProtected), with
  // its depth (position in the first chain that held it).
  using OnChange = std::function<void(uint32_t block, Retention r, int64_t expected_return, uint32_t depth)>;

  explicit SessionTable(Options options, OnChange on_change) : options_(options), on_change_(std::move(on_change)) {}

  // Session `id` sent a request at `now` over `blocks` (its whole context); it expects to be
  // back within `ttl_ns` (< 0: no hint, the session's last TTL stands; 0: not at all), and
  // `end` says it has ended. False (and nothing changes) for a new session where
  // max_sessions are held and all live.
  bool Request(std::string_view id, int64_t now, std::span<const uint32_t> blocks, int64_t ttl_ns, bool end);
  // Tokens the session's requests loaded from the cache (as its engine reports them).
  void CreditHits(std::string_view id, uint64_t tokens);
  // Sessions whose TTL ran out by `now` lapse: their blocks lose the protection they gave.
  void Expire(int64_t now);
  // The block is gone (its key may name another block next): forgotten by every session.
  void Forget(uint32_t block);
  // A block's class and expected return now.
  Retention Class(uint32_t block) const;
  int64_t ExpectedReturn(uint32_t block) const;
  uint32_t Depth(uint32_t block) const { return block < blocks_.size() ? blocks_[block].depth : 0; }

  // What a listing shows of each session held (kvctl agents).
  struct View {
    std::string_view id;
    std::string_view state;  // "live", "ended" or "lapsed"
    int64_t until = 0;       // live: when its TTL runs out
    uint64_t requests = 0, hit_tokens = 0;
  };
  // fn(view, blocks): each session held, with the blocks it names now.
  template <class Fn>
  void ForEachSession(Fn fn) const {
    static constexpr std::string_view kStates[] = {"live", "ended", "lapsed"};
    std::vector<uint32_t> blocks;
    for (const Session& s : sessions_) {
      if (s.id.empty()) continue;
      blocks.clear();
      for (const auto& [b, gen] : s.blocks) {
        if (blocks_[b].gen == gen) blocks.push_back(b);
      }
      fn(View{s.id, kStates[static_cast<int>(s.state)], s.until, s.requests, s.hit_tokens}, blocks);
    }
  }

  size_t live_sessions() const { return live_; }
  size_t sessions() const { return sessions_.size(); }
  uint64_t expired() const { return expired_; }
  uint64_t clamped() const { return clamped_; }
  uint64_t recycled() const { return recycled_; }

 private:
  enum class State : uint8_t { kLive, kEnded, kLapsed };
  struct Session {
    std::string id;
    State state = State::kLive;
    int64_t until = 0;  // last request + TTL
    int64_t ttl = 0;
    uint64_t version = 0;  // bumps with every request (stale heap entries)
    uint64_t requests = 0, hit_tokens = 0;
    std::vector<std::pair<uint32_t, uint32_t>> blocks;  // (block, its generation then)
  };
  struct Block {
    std::vector<uint32_t> users;  // sessions that used it (indexes)
    uint32_t live = 0, ended = 0, lapsed = 0;
    Retention r = Retention::kOrdinary;
    int64_t expected = 0;
    uint32_t depth = 0;
    uint32_t gen = 0;  // bumps when forgotten: sessions' entries of an older one are stale
  };
  // The session's entries that still name their block.
  template <class Fn>
  void ForEachBlock(Session& s, Fn fn) {
    for (const auto& [b, gen] : s.blocks) {
      if (blocks_[b].gen == gen) fn(b);
    }
  }
  void Recompute(uint32_t block);
  void Leave(uint32_t session, State to);
  // The slot of the session that ended or lapsed first, forgotten; or -1 where none did.
  int64_t Recycle();
  Block& At(uint32_t block);

  Options options_;
  OnChange on_change_;
  std::unordered_map<std::string, uint32_t> index_;
  std::vector<Session> sessions_;
  std::vector<Block> blocks_;
  // (until, session, version): when a live session lapses, earliest first.
  std::priority_queue<std::tuple<int64_t, uint32_t, uint64_t>, std::vector<std::tuple<int64_t, uint32_t, uint64_t>>,
                      std::greater<>>
      deadlines_;
  std::deque<std::pair<uint32_t, uint64_t>> left_;  // (session, version) in the order they left
  size_t live_ = 0;
  uint64_t expired_ = 0, clamped_ = 0, recycled_ = 0;
};

}  // namespace kvtier
