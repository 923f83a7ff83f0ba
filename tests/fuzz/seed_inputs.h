#pragma once
// Seed inputs of the fuzz targets for untrusted parsers other than the protocol's
// (redis_reply, events, config), in each target's input form (see its header comment).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvtier::fuzz {

// The targets SeedInputs knows.
const std::vector<std::string>& InputTargets();
// Named inputs of `target`.
std::vector<std::pair<std::string, std::vector<uint8_t>>> SeedInputs(const std::string& target);

}  // namespace kvtier::fuzz
