#include "core/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace deepinfer {

ProgressBar::ProgressBar(std::string what, int64_t total) : what_(std::move(what)), total_(total) {
  const char* level = std::getenv("DEEPINFER_LOG_LEVEL");
  const bool quiet = level && (std::strcmp(level, "warn") == 0 || std::strcmp(level, "error") == 0);
  on_ = total_ > 0 && !quiet && isatty(STDERR_FILENO);
  draw();
}

ProgressBar::~ProgressBar() {
  if (on_) std::fputc('\n', stderr);
}

void ProgressBar::step(int64_t n) {
  done_ += n;
  draw();
}

void ProgressBar::draw() {
  if (!on_) return;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done_ / total_);
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : ' ';
  bar[kWidth] = '\0';
  std::fprintf(stderr, "\r%s [%s] %lld/%lld", what_.c_str(), bar, static_cast<long long>(done_),
               static_cast<long long>(total_));
  std::fflush(stderr);
}

}  // namespace deepinfer
