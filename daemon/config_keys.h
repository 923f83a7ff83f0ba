#pragma once
// The table of config keys (config_keys.cc), shared by the parser (config.cc) and the
// tests that hold every key to its default; not part of the config's public interface.

#include <yaml-cpp/yaml.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config.h"

namespace kvtier {

// One config key: where it lives, its default (as YAML text), what it means, and how to
// store a parsed value. `set` is given the key's path (for its errors): each path is
// written once, in its row.
struct ConfigKey {
  std::string_view path;      // "tiers.host.capacity"
  std::string_view fallback;  // default, as written in the YAML
  std::string_view comment;
  std::function<Status(const std::string& key, const YAML::Node&, DaemonConfig*)> set;
};

// Every key, in the order DefaultConfigYaml prints them.
const std::vector<ConfigKey>& ConfigKeys();

}  // namespace kvtier
