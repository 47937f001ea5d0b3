// The DEEPINFER_* table's integer and switch readers (src/core/env.h): defaults, set values, and a clear error for bad
// ones.
#include <gtest/gtest.h>

#include <cstdlib>
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

}  // namespace

TEST(Env, IntReadsTheDefaultAndSetValues) {
  unsetenv("DEEPINFER_CUDA_TC_GROUPED_ROWS");
  EXPECT_EQ(env_int("DEEPINFER_CUDA_TC_GROUPED_ROWS", 1), 32);  // the table's default
  ScopedEnv e("DEEPINFER_CUDA_TC_GROUPED_ROWS", "7");
  EXPECT_EQ(env_int("DEEPINFER_CUDA_TC_GROUPED_ROWS", 1), 7);
}

TEST(Env, IntRejectsWhatIsNotAWholeNumberInRange) {
  for (const char* bad : {"", "abc", "12x", "0", "-3", "1.5"}) {
    ScopedEnv e("DEEPINFER_CUDA_TC_GROUPED_ROWS", bad);
    try {
      (void)env_int("DEEPINFER_CUDA_TC_GROUPED_ROWS", 1);
      FAIL() << "accepted '" << bad << "'";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("DEEPINFER_CUDA_TC_GROUPED_ROWS must be a whole number >= 1"),
                std::string::npos)
          << err.what();
    }
  }
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
  for (const char* bad : {"", "3", "-1", "01", "on", "1 "}) {
    ScopedEnv e("DEEPINFER_CUDA_GRAPH_MIDDLES", bad);
    try {
      (void)env_switch("DEEPINFER_CUDA_GRAPH_MIDDLES", 2);
      FAIL() << "accepted '" << bad << "'";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("DEEPINFER_CUDA_GRAPH_MIDDLES must be a digit from 0 to 2"),
                std::string::npos)
          << err.what();
    }
  }
}
