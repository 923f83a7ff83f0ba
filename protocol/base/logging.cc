#include "protocol/base/logging.h"

#include <errno.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "protocol/base/mutex.h"

namespace kvtier {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
Mutex g_tag_mu;
std::string g_tag KVTIER_GUARDED_BY(g_tag_mu) = program_invocation_short_name;
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

bool ParseLogLevel(std::string_view name, LogLevel* level) {
  static constexpr std::pair<std::string_view, LogLevel> kNames[] = {{"error", LogLevel::kError},
                                                                     {"warning", LogLevel::kWarning},
                                                                     {"notice", LogLevel::kNotice},
                                                                     {"info", LogLevel::kInfo},
                                                                     {"debug", LogLevel::kDebug}};
  for (const auto& [n, l] : kNames) {
    if (n == name) {
      *level = l;
      return true;
    }
  }
  return false;
}

void SetLogTag(std::string_view tag) {
  MutexLock lock(&g_tag_mu);
  g_tag = tag;
}

namespace internal {

bool LogEnabled(LogLevel level) { return static_cast<int>(level) <= g_level.load(); }

LogMessage::LogMessage(LogLevel level, const char* file, int line, bool fatal) : level_(level), fatal_(fatal) {
  std::string tag;
  {
    MutexLock lock(&g_tag_mu);
    tag = g_tag;
  }
  stream_ << '<' << static_cast<int>(level_) << '>' << tag << ": ";
  if (fatal_ || level_ == LogLevel::kDebug) {
    const char* base = std::strrchr(file, '/');
    stream_ << (base ? base + 1 : file) << ':' << line << ": ";
  }
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string s = stream_.str();
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(STDERR_FILENO, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  if (fatal_) std::abort();
}

}  // namespace internal
}  // namespace kvtier
