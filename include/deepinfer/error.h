// deepinfer::Error — the one exception type. Every message says what was wrong and, where it
// helps, what to do. Bad input never aborts the process; it throws this.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace deepinfer {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace deepinfer

// DI_CHECK(cond, "fmt {}", args...): throws deepinfer::Error with the formatted message.
#define DI_CHECK(cond, ...)                      \
  do {                                           \
    if (!(cond)) ::deepinfer::fail(__VA_ARGS__); \
  } while (0)
