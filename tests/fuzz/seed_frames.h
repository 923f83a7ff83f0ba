#pragma once
// Valid request frames for the fuzz seed corpus (tests/fuzz/corpus) and the fuzz targets'
// canned Hello: one engine session's worth of each operation.

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::fuzz {

// An engine Hello for a small layout whose block fits the fuzz daemon's 64 KiB pages.
std::vector<uint8_t> EngineHelloFrame(uint64_t id = 1);

// Named request streams (concatenated frames), each a plausible session: hello + allocate
// + commit + lookup + acquire + release, stats, ping, a control session, ...
std::vector<std::pair<std::string, std::vector<uint8_t>>> SeedStreams();

}  // namespace kvtier::fuzz
