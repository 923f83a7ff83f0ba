// libFuzzer target: what reaches the KV event publisher from outside — replay requests
// (any multipart message a peer sends the ROUTER socket) and the state file a previous run
// left (ParseAnnouncedState; a damaged file must cost nothing but the retraction). The
// first byte picks the path; for requests the input is cut into parts at 0xff bytes.
// What must hold: no crash, no sanitizer report; a request is accepted only as three
// parts with an 8-byte sequence; a state that parses encodes and parses back to itself.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/events/kv_events.h"

using namespace kvtier;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    std::vector<std::string_view> parts;
    size_t from = 0;
    for (size_t i = 0; i <= in.size(); ++i) {
      if (i == in.size() || static_cast<uint8_t>(in[i]) == 0xff) {
        parts.push_back(in.substr(from, i - from));
        from = i + 1;
      }
    }
    const auto start = ParseReplayRequest(parts);
    if (start && (parts.size() != 3 || parts[2].size() != 8)) std::abort();
    return 0;
  }
  size_t hashes = 0;
  const AnnouncedStates states = ParseAnnouncedState(in, &hashes);
  size_t again_hashes = 0;
  const AnnouncedStates again = ParseAnnouncedState(EncodeAnnouncedState(states), &again_hashes);
  // Topics whose names are not UTF-8 are written with replacements: compare counts only.
  size_t kept = 0;
  for (const auto& [key, s] : states) {
    for (const auto& [tier, set] : s.hashes) kept += set.size();
  }
  if (again_hashes > kept) std::abort();
  return 0;
}
