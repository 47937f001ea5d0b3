// Helpers shared by the structured-output tests (test_structured.cpp, test_dsml_tools.cpp).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "deepinfer/error.h"
#include "structured/structured.h"

namespace deepinfer::structured::test_util {

// True when the byte-level matcher accepts exactly `s` as a sentence of `g`.
inline bool M(const Grammar& g, std::string_view s) {
  PdaMatcher m(std::make_shared<const Grammar>(g));
  return m.matches(s);
}

// The message of the deepinfer::Error `f` throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace deepinfer::structured::test_util
