#pragma once
// The table of config keys (config_keys.cc), shared by the parser (config.cc) and the
// tests that hold every key to its default; not part of the config's public interface.

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdlib>
#include <functional>
#include <span>
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

// Every key, in the order DefaultConfigYaml prints them: the daemon's, then each lower
// tier's section (daemon/lower_tiers.h) in chain order.
const std::vector<ConfigKey>& ConfigKeys();

// A row's `set` for a key whose value is `expr_result` (a Result, which may use `key` and
// `n`) stored in the DaemonConfig field `field`.
#define KVTIER_CONFIG_SET(expr_result, field)                                  \
  [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status { \
    KVTIER_ASSIGN_OR_RETURN(c->field, expr_result);                            \
    return Status::Ok();                                                       \
  }

// The same for a field of a lower tier's section (DaemonConfig::lower).
#define KVTIER_SECTION_SET(Section, expr_result, field)                        \
  [](const std::string& key, const YAML::Node& n, DaemonConfig* c) -> Status { \
    KVTIER_ASSIGN_OR_RETURN(c->lower.Mutable<Section>().field, expr_result);   \
    return Status::Ok();                                                       \
  }

// The values keys take, each checked, its error naming the key (ConfigKeyError).
namespace config {

// "a", "a or b", "a, b or c" of a list of names.
std::string Alternatives(std::span<const std::string_view> names);
// One of `names`.
Result<std::string> Word(const std::string& key, const YAML::Node& n, std::span<const std::string_view> names);
Result<std::string> Scalar(std::string_view path, const YAML::Node& n);
// A non-empty scalar.
Result<std::string> Path(std::string_view path, const YAML::Node& n);
// A ZMQ endpoint kvtierd binds: tcp://HOST:PORT (PORT 1..65535, or * for any) or ipc://PATH.
Status CheckEndpoint(std::string_view path, const std::string& endpoint);
// A duration ("10s", "50ms") in [lo_ns, hi_ns], or 0 when `zero_ok`; `range` says the
// bounds in the error.
Result<int64_t> Duration(std::string_view path, const YAML::Node& n, int64_t lo_ns, int64_t hi_ns, bool zero_ok,
                         std::string_view range);
// A size ("64MiB") in [lo, hi].
Result<uint64_t> Bytes(std::string_view path, const YAML::Node& n, uint64_t lo, uint64_t hi);
Result<double> Real(std::string_view path, const YAML::Node& n);
// In (0, 1].
Result<double> Fraction(std::string_view path, const YAML::Node& n);
Result<double> Number(std::string_view path, const YAML::Node& n, double lo, double hi);
Result<bool> Boolean(std::string_view path, const YAML::Node& n);
// A list of uids or gids.
Result<std::vector<uint32_t>> IdList(const std::string& path, const YAML::Node& n);
// {host: 1GiB, nvme: 100GiB, ...}: a size per tier, keyed by the tier table's names.
Status TierBytesMap(const std::string& path, const YAML::Node& n, TierBytes* out);
bool ValidTenantName(const std::string& s);

// The words of an enum's (word, value) list, optionally after `first` (e.g. "none").
template <typename E, size_t N>
std::vector<std::string_view> WordsOf(const std::pair<std::string_view, E> (&names)[N], std::string_view first = {}) {
  std::vector<std::string_view> out;
  if (!first.empty()) out.push_back(first);
  for (const auto& [word, value] : names) out.push_back(word);
  return out;
}

// The value of `word`. REQUIRES: it is one of the list's words.
template <typename E, size_t N>
E ValueOf(std::string_view word, const std::pair<std::string_view, E> (&names)[N]) {
  for (const auto& [w, value] : names) {
    if (w == word) return value;
  }
  return names[0].second;
}

// One of the words an enum's owner exports for its values.
template <typename E, size_t N>
Result<E> Choice(const std::string& key, const YAML::Node& n, const std::pair<std::string_view, E> (&names)[N]) {
  KVTIER_ASSIGN_OR_RETURN(std::string s, Word(key, n, WordsOf(names)));
  return ValueOf(s, names);
}

template <class T>
Result<T> Integer(std::string_view path, const YAML::Node& n, long long lo, long long hi) {
  KVTIER_ASSIGN_OR_RETURN(std::string s, Scalar(path, n));
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 0);
  if (s.empty() || *end != '\0' || errno != 0) return ConfigKeyError(path, "'" + s + "' is not an integer");
  if (v < lo || v > hi) {
    return ConfigKeyError(
        path, std::to_string(v) + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return static_cast<T>(v);
}

}  // namespace config

}  // namespace kvtier
