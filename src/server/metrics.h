// Server metrics, rendered as Prometheus text at GET /metrics (vLLM-style names, prefix "deepinfer:").
// Updated from the engine thread (token counts, latencies, queue sizes) and the I/O threads (HTTP
// request counts); every member is safe to touch from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace deepinfer::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Prometheus text of a histogram named `name` with labels `labels` ("" or `model_name="x"`).
  std::string render(const std::string& name, const std::string& help, const std::string& labels) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct Metrics {
  Metrics();
  std::atomic<int64_t> prompt_tokens{0};
  std::atomic<int64_t> generation_tokens{0};
  std::atomic<int64_t> num_running{0};
  std::atomic<int64_t> num_waiting{0};
  std::atomic<int64_t> engine_steps{0};
  Histogram ttft;  // arrival -> first output token (seconds)
  Histogram tpot;  // mean time per output token after the first (seconds)
  Histogram e2e;   // arrival -> finished (seconds)

  void count_http(const std::string& route, int status);
  void count_finished(const std::string& finish_reason);
  std::string render(const std::string& model_name) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> http_;
  std::map<std::string, int64_t> finished_;
};

}  // namespace deepinfer::server
