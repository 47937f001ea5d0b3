// The DEEPINFER_* table's integer and switch readers (src/core/env.h): defaults, set values, and a clear error for bad
// ones.
#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <string>

#include "core/env.h"
#include "deepinfer/error.h"

using namespace deepinfer;

namespace {

// Sets a variable for one scope and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// Each value of `bad` set in `name` makes read(name) throw an Error whose message contains `message`.
template <typename Read>
void expect_rejected(const char* name, std::initializer_list<const char*> bad, Read read, const std::string& message) {
  for (const char* v : bad) {
    ScopedEnv e(name, v);
    try {
      (void)read(name);
      ADD_FAILURE() << name << " accepted '" << v << "'";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(message), std::string::npos) << err.what();
    }
  }
}

}  // namespace

TEST(Env, IntReadsTheDefaultAndSetValues) {
  unsetenv("DEEPINFER_CUDA_TC_GROUPED_ROWS");
  EXPECT_EQ(env_int("DEEPINFER_CUDA_TC_GROUPED_ROWS", 1), 32);  // the table's default
  ScopedEnv e("DEEPINFER_CUDA_TC_GROUPED_ROWS", "7");
  EXPECT_EQ(env_int("DEEPINFER_CUDA_TC_GROUPED_ROWS", 1), 7);
}

TEST(Env, IntRejectsWhatIsNotAWholeNumberInRange) {
  expect_rejected(
      "DEEPINFER_CUDA_TC_GROUPED_ROWS", {"", "abc", "12x", "0", "-3", "1.5"},
      [](const char* name) { return env_int(name, 1); }, "DEEPINFER_CUDA_TC_GROUPED_ROWS must be a whole number >= 1");
  ScopedEnv zero("DEEPINFER_CUDA_GRAPH_MAX_BATCH", "0");
  EXPECT_EQ(env_int("DEEPINFER_CUDA_GRAPH_MAX_BATCH", 0), 0);
}

TEST(Env, SwitchReadsTheDefaultAndSetDigits) {
  unsetenv("DEEPINFER_CUDA_GRAPH_MIDDLES");
  EXPECT_EQ(env_switch("DEEPINFER_CUDA_GRAPH_MIDDLES", 2), 2);  // the table's default
  for (const char* v : {"0", "1", "2"}) {
    ScopedEnv e("DEEPINFER_CUDA_GRAPH_MIDDLES", v);
    EXPECT_EQ(env_switch("DEEPINFER_CUDA_GRAPH_MIDDLES", 2), v[0] - '0');
  }
}

TEST(Env, SwitchRejectsWhatIsNotADigitInRange) {
  expect_rejected(
      "DEEPINFER_CUDA_GRAPH_MIDDLES", {"", "3", "-1", "01", "on", "1 "},
      [](const char* name) { return env_switch(name, 2); }, "DEEPINFER_CUDA_GRAPH_MIDDLES must be a digit from 0 to 2");
}
