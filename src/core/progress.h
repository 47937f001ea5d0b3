// A one-line progress bar on stderr for long start-up work (binding a checkpoint's layers). Drawn
// only when stderr is a terminal and DEEPINFER_LOG_LEVEL is not warn/error, so logs, pipes and tests
// stay clean.
#pragma once

#include <cstdint>
#include <string>

namespace deepinfer {

class ProgressBar {
 public:
  ProgressBar(std::string what, int64_t total);
  ~ProgressBar();  // finishes the line
  void step(int64_t n = 1);

 private:
  void draw();
  std::string what_;
  int64_t total_, done_ = 0;
  bool on_ = false;
};

}  // namespace deepinfer
