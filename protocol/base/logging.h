#pragma once
// Logging to stderr with sd-daemon priority prefixes ("<3>" error ... "<7>" debug), which
// journald turns into syslog priorities. One write(2) per message, so lines from several
// threads never interleave. Thread-safe.
//
//   KVTIER_LOG(INFO) << "listening on " << path;
//   KVTIER_CHECK(n <= capacity) << "accounting broken";   // logs and aborts when false

#include <sstream>
#include <string_view>

namespace kvtier {

enum class LogLevel : int { kError = 3, kWarning = 4, kNotice = 5, kInfo = 6, kDebug = 7 };

// Messages above `level` are dropped. Default: kInfo. Thread-safe.
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "error", "warning", "notice", "info", "debug".
bool ParseLogLevel(std::string_view name, LogLevel* level);
// Tag printed after the priority ("kvtierd: ..."). Default: program_invocation_short_name.
void SetLogTag(std::string_view tag);

namespace internal {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line, bool fatal);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  bool fatal_;
  std::ostringstream stream_;
};
struct LogVoidify {
  void operator&(std::ostream&) {}
};
bool LogEnabled(LogLevel level);
}  // namespace internal

}  // namespace kvtier

#define KVTIER_LOG_LEVEL_ERROR ::kvtier::LogLevel::kError
#define KVTIER_LOG_LEVEL_WARNING ::kvtier::LogLevel::kWarning
#define KVTIER_LOG_LEVEL_NOTICE ::kvtier::LogLevel::kNotice
#define KVTIER_LOG_LEVEL_INFO ::kvtier::LogLevel::kInfo
#define KVTIER_LOG_LEVEL_DEBUG ::kvtier::LogLevel::kDebug

#define KVTIER_LOG(level)                                   \
  !::kvtier::internal::LogEnabled(KVTIER_LOG_LEVEL_##level) \
      ? (void)0                                             \
      : ::kvtier::internal::LogVoidify() &                  \
            ::kvtier::internal::LogMessage(KVTIER_LOG_LEVEL_##level, __FILE__, __LINE__, false).stream()

// A broken invariant is a bug: log it and abort (systemd restarts the daemon).
#define KVTIER_CHECK(cond)                                                                                   \
  (cond) ? (void)0                                                                                           \
         : ::kvtier::internal::LogVoidify() &                                                                \
               ::kvtier::internal::LogMessage(::kvtier::LogLevel::kError, __FILE__, __LINE__, true).stream() \
                   << "check failed: " #cond " "
