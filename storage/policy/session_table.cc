#include "storage/policy/session_table.h"

#include <algorithm>

namespace kvtier {

SessionTable::Block& SessionTable::At(uint32_t block) {
  if (block >= blocks_.size()) blocks_.resize(block + 1);
  return blocks_[block];
}

Retention SessionTable::Class(uint32_t block) const {
  return block < blocks_.size() ? blocks_[block].r : Retention::kOrdinary;
}

int64_t SessionTable::ExpectedReturn(uint32_t block) const {
  return block < blocks_.size() ? blocks_[block].expected : 0;
}

void SessionTable::Recompute(uint32_t block) {
  Block& b = blocks_[block];
  Retention r = Retention::kOrdinary;
  int64_t expected = 0;
  if (b.live > 0) {
    r = Retention::kProtected;
    expected = INT64_MAX;
    for (uint32_t u : b.users) {
      if (sessions_[u].state == State::kLive) expected = std::min(expected, sessions_[u].until);
    }
  } else if (b.ended > 0 && b.lapsed == 0) {
    r = Retention::kExpendable;
  }
  if (r == b.r && (r != Retention::kProtected || expected == b.expected)) return;
  b.r = r;
  b.expected = expected;
  on_change_(block, r, expected, b.depth);
}

bool SessionTable::Request(std::string_view id, int64_t now, std::span<const uint32_t> blocks, int64_t ttl_ns,
                           bool end) {
  Expire(now);
  auto it = index_.find(std::string(id));
  if (it == index_.end()) {
    int64_t slot = -1;
    if (sessions_.size() >= options_.max_sessions) {
      slot = Recycle();
      if (slot < 0) return false;
    } else {
      slot = static_cast<int64_t>(sessions_.size());
      sessions_.emplace_back();
    }
    it = index_.emplace(std::string(id), static_cast<uint32_t>(slot)).first;
    sessions_[slot].id = std::string(id);
    ++live_;
  }
  const uint32_t s = it->second;
  Session& ses = sessions_[s];
  if (ses.state != State::kLive) {  // back after it ended or lapsed: live again
    ForEachBlock(ses, [&](uint32_t b) {
      Block& x = blocks_[b];
      --(ses.state == State::kEnded ? x.ended : x.lapsed);
      ++x.live;
    });
    ses.state = State::kLive;
    ++live_;
  }
  if (ttl_ns >= 0) {
    if (ttl_ns > options_.max_ttl_ns) ++clamped_;
    ses.ttl = std::min(ttl_ns, options_.max_ttl_ns);
  }
  ses.until = now + ses.ttl;
  ++ses.version;
  ++ses.requests;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const uint32_t b = blocks[i];
    Block& x = At(b);
    if (x.users.empty()) x.depth = static_cast<uint32_t>(i);
    if (std::find(x.users.begin(), x.users.end(), s) == x.users.end()) {
      x.users.push_back(s);
      ses.blocks.emplace_back(b, x.gen);
      ++x.live;
    }
  }
  if (end) {
    Leave(s, State::kEnded);
    return true;
  }
  deadlines_.emplace(ses.until, s, ses.version);
  ForEachBlock(ses, [&](uint32_t b) { Recompute(b); });
  return true;
}

void SessionTable::Forget(uint32_t block) {
  if (block >= blocks_.size()) return;
  Block& x = blocks_[block];
  const uint32_t gen = x.gen + 1;
  x = Block{};
  x.gen = gen;
}

void SessionTable::Leave(uint32_t s, State to) {
  Session& ses = sessions_[s];
  ses.state = to;
  --live_;
  left_.emplace_back(s, ses.version);
  ForEachBlock(ses, [&](uint32_t b) {
    Block& x = blocks_[b];
    --x.live;
    ++(to == State::kEnded ? x.ended : x.lapsed);
    Recompute(b);
  });
}

void SessionTable::CreditHits(std::string_view id, uint64_t tokens) {
  auto it = index_.find(std::string(id));
  if (it != index_.end()) sessions_[it->second].hit_tokens += tokens;
}

int64_t SessionTable::Recycle() {
  while (!left_.empty()) {
    const uint32_t s = left_.front().first;
    const uint64_t version = left_.front().second;
    left_.pop_front();
    Session& ses = sessions_[s];
    if (ses.state == State::kLive || ses.version != version) continue;  // back since it left
    const bool ended = ses.state == State::kEnded;
    ForEachBlock(ses, [&](uint32_t b) {
      Block& x = blocks_[b];
      x.users.erase(std::find(x.users.begin(), x.users.end(), s));
      --(ended ? x.ended : x.lapsed);
      Recompute(b);
    });
    index_.erase(ses.id);
    ses = Session{};
    ++recycled_;
    return s;
  }
  return -1;
}

void SessionTable::Expire(int64_t now) {
  while (!deadlines_.empty() && std::get<0>(deadlines_.top()) < now) {
    const auto [until, s, version] = deadlines_.top();
    deadlines_.pop();
    if (sessions_[s].state != State::kLive || sessions_[s].version != version) continue;  // stale
    ++expired_;
    Leave(s, State::kLapsed);
  }
}

}  // namespace kvtier
