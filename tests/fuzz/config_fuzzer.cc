// libFuzzer target: the YAML config (ParseConfig), which operators write by hand and
// tools generate. What must hold: no crash, no sanitizer report, no exception out of it;
// an error names a key or says the YAML is invalid; a config that parses prints (as the
// daemon logs it) without failing.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "daemon/config.h"

using namespace kvtier;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;  // a config is small; deep YAML nesting is yaml-cpp's to bound
  auto c = ParseConfig(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!c.ok() && c.status().code() != StatusCode::kInvalidArgument) std::abort();
  if (!c.ok() && c.status().message().empty()) std::abort();
  return 0;
}
