#include "protocol/base/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace kvtier {

namespace {

// "1.5 GiB" -> 1.5 and "GiB" (spaces around either ignored); false without a number.
bool SplitQuantity(const std::string& s, double* value, std::string* suffix) {
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  size_t start = i;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == start) return false;
  const std::string number = s.substr(start, i - start);
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  *suffix = s.substr(i);
  while (!suffix->empty() && std::isspace(static_cast<unsigned char>(suffix->back()))) suffix->pop_back();
  char* end = nullptr;
  *value = std::strtod(number.c_str(), &end);
  return end != nullptr && *end == '\0';
}

}  // namespace

Result<uint64_t> ParseBytes(std::string_view text) {
  std::string s(text);
  double v = 0;
  std::string suffix;
  if (!SplitQuantity(s, &v, &suffix)) return InvalidArgument("'" + s + "' is not a byte size");

  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1.0},
      {"B", 1.0},
      {"K", 1024.0},
      {"KiB", 1024.0},
      {"kB", 1e3},
      {"KB", 1e3},
      {"M", 1048576.0},
      {"MiB", 1048576.0},
      {"MB", 1e6},
      {"G", 1073741824.0},
      {"GiB", 1073741824.0},
      {"GB", 1e9},
      {"T", 1099511627776.0},
      {"TiB", 1099511627776.0},
      {"TB", 1e12},
  };
  double mult = -1;
  for (const auto& [name, m] : kUnits) {
    if (suffix == name) mult = m;
  }
  if (mult < 0) return InvalidArgument("'" + s + "': unknown size suffix '" + suffix + "'");
  double bytes = v * mult;
  if (!(bytes >= 0) || bytes > 1.8e19) return InvalidArgument("'" + s + "' is out of range");
  if (bytes != std::floor(bytes)) return InvalidArgument("'" + s + "' is not a whole number of bytes");
  return static_cast<uint64_t>(bytes);
}

Result<int64_t> ParseDurationNanos(std::string_view text) {
  std::string s(text);
  double v = 0;
  std::string suffix;
  if (!SplitQuantity(s, &v, &suffix)) return InvalidArgument("'" + s + "' is not a duration");
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"ns", 1.0}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}, {"m", 60e9}, {"min", 60e9}, {"h", 3600e9},
  };
  double mult = -1;
  for (const auto& [name, m] : kUnits) {
    if (suffix == name) mult = m;
  }
  if (suffix.empty() && v == 0) mult = 1;  // "0" needs no unit
  if (mult < 0) return InvalidArgument("'" + s + "': a duration needs a unit (ms, s, m, h), not '" + suffix + "'");
  const double ns = v * mult;
  if (!(ns >= 0) || ns > 9.2e18) return InvalidArgument("'" + s + "' is out of range");
  return static_cast<int64_t>(ns);
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0 || v == std::floor(v)) {
    std::snprintf(buf, sizeof(buf), "%.0f %s", v, kNames[u]);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, kNames[u]);
  }
  return buf;
}

}  // namespace kvtier
