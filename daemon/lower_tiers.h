#pragma once
// The tiers below NVMe kvtierd can open, a row each, in chain order (the order lookups and
// acquires ask them). A row owns its tier's config section — its keys (tiers.<name>.*),
// which join the config's table, and its struct, kept in DaemonConfig::lower by type — and
// opens the tier from it. The daemon loops over the rows; nothing else in it names a lower
// tier. Adding one: docs/architecture.md, "Adding a tier".

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "daemon/cache/cache_manager.h"
#include "daemon/config.h"
#include "daemon/config_keys.h"
#include "daemon/metrics.h"
#include "protocol/base/post.h"
#include "protocol/base/status.h"
#include "storage/remote/remote_tier.h"

namespace kvtier {

// The remote tier: a Redis Cluster (or one Redis) shared by the kvtierd nodes of a fleet.
// The tier's and its mover's own option structs, as the config sets them; the daemon
// adds what is not a key (the password and secret read from their files, the largest
// value a reply may announce).
struct RemoteTierConfig {
  RemoteTierOptions tier;         // tier.cluster.seeds: none means no remote tier
  LowerTierMover::Options mover;  // write policy, puts in flight
  std::string password_file;      // the Redis password's file; empty: no AUTH
  std::string secret_file;        // the fleet secret's file; empty: unkeyed values
  bool enabled() const { return !tier.cluster.seeds.empty(); }
  bool operator==(const RemoteTierConfig&) const = default;
};

// What a row is given to open its tier.
struct LowerTierContext {
  const DaemonConfig& config;
  Post post;  // onto the control loop
  MetricsRegistry* metrics;
  // Records a secret file read at start (its key, path, and a digest of its bytes): a
  // reload that finds it changed says a restart is needed.
  std::function<void(const std::string& key, const std::string& path, uint64_t digest)> secret_read;
};

struct LowerTierRow {
  TierKind kind;
  // Its section's keys, in the order the default config prints them; the first is the one
  // that turns it on.
  const std::vector<ConfigKey>& (*keys)();
  // Whether its section turns it on.
  bool (*enabled)(const DaemonConfig&);
  // What only the machine can say about its section (files, secrets): an error naming the
  // key, or warnings; called by CheckConfigOnHost whether or not the tier is on.
  Status (*check_on_host)(const DaemonConfig&, std::vector<std::string>* warnings);
  // The tier and its mover's options. REQUIRES: enabled(context.config).
  Result<CacheManager::LowerTierSpec> (*open)(const LowerTierContext&);
};

std::span<const LowerTierRow> LowerTierRows();

}  // namespace kvtier
