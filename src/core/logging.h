// Minimal leveled logging to stderr. Level from DEEPINFER_LOG_LEVEL (debug|info|warn|error),
// default info.
#pragma once

#include <fmt/format.h>

namespace deepinfer {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };
LogLevel log_level();
void log_line(LogLevel level, const std::string& msg);

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... a) {
  if (log_level() <= LogLevel::kInfo) log_line(LogLevel::kInfo, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... a) {
  if (log_level() <= LogLevel::kWarn) log_line(LogLevel::kWarn, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... a) {
  if (log_level() <= LogLevel::kDebug) log_line(LogLevel::kDebug, fmt::format(f, std::forward<Args>(a)...));
}

}  // namespace deepinfer
