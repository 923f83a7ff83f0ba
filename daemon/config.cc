#include "daemon/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <set>
#include <sstream>
#include <vector>

#include "daemon/config_keys.h"
#include "protocol/base/units.h"

namespace kvtier {

Status ConfigKeyError(std::string_view path, const std::string& why) {
  return InvalidArgument("config key '" + std::string(path) + "': " + why);
}

Status CheckNodeName(std::string_view name) {
  if (name.empty() || name.size() > 253) return InvalidArgument("a node name has 1 to 253 characters");
  for (char ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-' && ch != '_') {
      return InvalidArgument("'" + std::string(name) + "' is not a node name (letters, digits, '.', '-', '_')");
    }
  }
  return Status::Ok();
}

std::string NodeName(const DaemonConfig& config) {
  if (!config.node_name.empty()) return config.node_name;
  char name[HOST_NAME_MAX + 1] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 ? name : "unknown-host";
}

namespace {

const ConfigKey* FindKey(std::string_view path) {
  for (const ConfigKey& k : ConfigKeys()) {
    if (k.path == path) return &k;
  }
  return nullptr;
}

bool IsSection(std::string_view path) {
  const std::string prefix = std::string(path) + ".";
  for (const ConfigKey& k : ConfigKeys()) {
    if (k.path.substr(0, prefix.size()) == prefix) return true;
  }
  return false;
}

// YAML lets a mapping name a key twice and yaml-cpp keeps the last; a config that does is
// refused instead (the operator meant one of them), anywhere in the document.
Status RefuseDuplicateKeys(const YAML::Node& node, const std::string& prefix) {
  if (node.IsMap()) {
    std::set<std::string> seen;
    for (const auto& kv : node) {
      const std::string name = kv.first.IsScalar() ? kv.first.Scalar() : std::string("?");
      const std::string path = prefix.empty() ? name : prefix + "." + name;
      if (!seen.insert(name).second) return InvalidArgument("config key '" + path + "' is given twice");
      KVTIER_RETURN_IF_ERROR(RefuseDuplicateKeys(kv.second, path));
    }
  } else if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      KVTIER_RETURN_IF_ERROR(RefuseDuplicateKeys(node[i], prefix + "[" + std::to_string(i) + "]"));
    }
  }
  return Status::Ok();
}

Status Walk(const YAML::Node& node, const std::string& prefix, DaemonConfig* config) {
  if (!node.IsMap()) {
    return InvalidArgument(prefix.empty() ? std::string("config must be a YAML mapping")
                                          : "config key '" + prefix + "' must be a mapping");
  }
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) return InvalidArgument("config has a non-scalar key under '" + prefix + "'");
    const std::string path = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
    if (const ConfigKey* k = FindKey(path)) {
      KVTIER_RETURN_IF_ERROR(k->set(std::string(k->path), kv.second, config));
    } else if (IsSection(path)) {
      if (kv.second.IsNull()) continue;  // an empty section keeps its defaults
      KVTIER_RETURN_IF_ERROR(Walk(kv.second, path, config));
    } else {
      return InvalidArgument("config key '" + path + "' is unknown");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<DaemonConfig> ParseConfig(std::string_view yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return InvalidArgument(std::string("config is not valid YAML: ") + e.what());
  }
  DaemonConfig config;
  if (!root.IsNull()) {
    try {
      KVTIER_RETURN_IF_ERROR(RefuseDuplicateKeys(root, ""));
      KVTIER_RETURN_IF_ERROR(Walk(root, "", &config));
    } catch (const YAML::Exception& e) {
      return InvalidArgument(std::string("config: ") + e.what());
    }
  }
  if (config.max_entries_auto) config.max_entries_per_request = MaxEntriesForFrame(config.server.max_frame_bytes);
  // An events section means events, unless it says otherwise.
  if (root.IsMap() && static_cast<const YAML::Node&>(root)["events"] && !config.events.enabled_given) {
    config.events.enabled = true;
  }
  KVTIER_RETURN_IF_ERROR(ValidateConfig(config));
  return config;
}

Result<std::string> ReadConfigFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("cannot read config file " + path + ": " + std::strerror(errno));
  struct stat st {};
  std::string text;
  Status status = Status::Ok();
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    status = InvalidArgument("config file " + path + " is not a regular file" +
                             (S_ISDIR(st.st_mode) ? " but a directory (a ConfigMap mounted without subPath?)" : ""));
  } else if (st.st_size > (16 << 20)) {
    status = InvalidArgument("config file " + path + " is larger than 16 MiB");
  } else {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) status = ErrnoStatus(errno, "read config file " + path);
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  if (!status.ok()) return status;
  return text;
}

std::string DefaultConfigYaml() {
  std::string out =
      "# kvtierd configuration: every key with its default value.\n"
      "# Sizes take B, KiB, MiB, GiB, TiB (or K, M, G, T) and kB, MB, GB, TB.\n";
  std::vector<std::string_view> open;  // sections currently open
  for (const ConfigKey& k : ConfigKeys()) {
    std::vector<std::string_view> parts;
    std::string_view p = k.path;
    for (size_t dot; (dot = p.find('.')) != std::string_view::npos; p.remove_prefix(dot + 1)) {
      parts.push_back(p.substr(0, dot));
    }
    const std::string_view leaf = p;
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common]) ++common;
    open.resize(common);
    if (common == 0 && !parts.empty()) out += "\n";
    for (size_t i = common; i < parts.size(); ++i) {
      out += std::string(2 * i, ' ') + std::string(parts[i]) + ":\n";
      open.push_back(parts[i]);
    }
    const std::string indent(2 * parts.size(), ' ');
    // Comments wrapped at about 90 columns.
    std::string_view rest = k.comment;
    while (!rest.empty()) {
      size_t cut = rest.size();
      const size_t width = 88 - indent.size();
      if (cut > width) {
        cut = rest.rfind(' ', width);
        if (cut == std::string_view::npos || cut == 0) cut = width;
      }
      out += indent + "# " + std::string(rest.substr(0, cut)) + "\n";
      rest.remove_prefix(cut);
      while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    }
    out += indent + std::string(leaf) + ": " + std::string(k.fallback) + "\n";
  }
  return out;
}

}  // namespace kvtier
