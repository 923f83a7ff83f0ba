#include "protocol/base/defaults.h"

#include <cstdlib>

namespace kvtier {

const char* ResolveSocketPath(const char* flag) {
  if (flag != nullptr && flag[0] != '\0') return flag;
  const char* env = std::getenv(kSocketEnvVar);
  if (env != nullptr && env[0] != '\0') return env;
  return kDefaultSocketPath;
}

}  // namespace kvtier
