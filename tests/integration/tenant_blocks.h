#pragma once
// Blocks of a tenant through a real kvtierd, shared by the tests of identity and isolation
// (security_test.cc) and of liveness (liveness_test.cc): each writer salts its bytes with
// who it is, so a block served to anyone else shows.
#include <vector>

#include "engine/client.h"
#include "engine/tools/block_pattern.h"
#include "tests/integration/device_pages.h"
#include "tests/integration/engine_process.h"

namespace kvtier::testing {

inline const uint64_t kBlock = TestLayout().block_bytes;  // 64 KiB

// Each tenant writes its own bytes for the same hashes, so a block served across tenants
// would show.
inline BlockHash Salted(const BlockHash& h, uid_t who) { return ChainHash(h, std::vector<uint32_t>{who}); }

inline Status Store(Client& c, TierKind tier, const std::vector<BlockHash>& chain, uid_t who) {
  for (size_t from = 0; from < chain.size(); from += 8) {
    const size_t n = std::min<size_t>(8, chain.size() - from);
    KVTIER_ASSIGN_OR_RETURN(auto pages, c.Allocate(tier, static_cast<uint32_t>(n)));
    std::vector<CommitEntry> e;
    for (size_t i = 0; i < n; ++i) {
      KVTIER_RETURN_IF_ERROR(FillPage(c, tier, pages[i], Salted(chain[from + i], who), kBlock));
      const size_t k = from + i;
      e.push_back({pages[i], chain[k], k ? chain[k - 1] : BlockHash()});
    }
    KVTIER_ASSIGN_OR_RETURN(auto r, c.Commit(tier, e));
    for (const auto& x : r) KVTIER_RETURN_IF_ERROR(x.status);
  }
  return Status::Ok();
}

// Prefix hits whose bytes are `who`'s, and the tiers they came from (bit per TierIndex);
// a hit with anyone else's bytes counts in *foreign.
struct Hits {
  size_t verified = 0, foreign = 0;
  unsigned tiers = 0;
};
inline Hits Probe(Client& c, const std::vector<BlockHash>& chain, uid_t who) {
  Hits h;
  auto l = c.Lookup(chain);
  if (!l.ok() || l->matched == 0) return h;
  for (size_t i = 0; i < l->matched; ++i) h.tiers |= 1u << TierIndex(l->tiers[i]);
  auto acq = c.Acquire(std::span<const BlockHash>(chain.data(), l->matched));
  if (!acq.ok()) return h;
  std::vector<BlockHash> held;
  for (size_t i = 0; i < acq->size(); ++i) {
    const BlockResult& r = (*acq)[i];
    if (!r.status.ok()) continue;
    held.push_back(chain[i]);
    if (CheckPage(c, r.tier, r.page, Salted(chain[i], who), kBlock))
      ++h.verified;
    else
      ++h.foreign;
  }
  (void)c.Release(TierKind::kHost, {}, held);
  return h;
}

}  // namespace kvtier::testing
