#include "core/logging.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace deepinfer {

LogLevel log_level() {
  static const LogLevel level = [] {
    const char* v = std::getenv("DEEPINFER_LOG_LEVEL");
    if (!v) return LogLevel::kInfo;
    if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
    if (!std::strcmp(v, "warn")) return LogLevel::kWarn;
    if (!std::strcmp(v, "error")) return LogLevel::kError;
    return LogLevel::kInfo;
  }();
  return level;
}

void log_line(LogLevel level, const std::string& msg) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::fprintf(stderr, "[deepinfer %s] %s\n", names[static_cast<int>(level)], msg.c_str());
}

}  // namespace deepinfer
