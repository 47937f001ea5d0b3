#include "server/metrics.h"

#include <fmt/format.h>

namespace deepinfer::server {

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> lk(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help, const std::string& labels) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string s = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  const std::string sep = labels.empty() ? "" : ",";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    s += fmt::format("{}_bucket{{{}{}le=\"{}\"}} {}\n", name, labels, sep, bounds_[i], cum);
  }
  cum += counts_.back();
  s += fmt::format("{}_bucket{{{}{}le=\"+Inf\"}} {}\n", name, labels, sep, cum);
  s += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, sum_, name, labels, count_);
  return s;
}

Metrics::Metrics()
    : ttft({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
            80.0}),
      tpot({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0}),
      e2e({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0}) {}

void Metrics::count_http(const std::string& route, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++http_[{route, status}];
}

void Metrics::count_finished(const std::string& finish_reason) {
  std::lock_guard<std::mutex> lk(mu_);
  ++finished_[finish_reason];
}

std::string Metrics::render(const std::string& model_name) const {
  const std::string lab = fmt::format("model_name=\"{}\"", model_name);
  std::string s;
  auto gauge = [&](const char* name, const char* type, const char* help, int64_t v) {
    s += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{{}}} {}\n", name, help, name, type, name, lab, v);
  };
  gauge("deepinfer:num_requests_running", "gauge", "Requests in the running set of the scheduler.", num_running.load());
  gauge("deepinfer:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", num_waiting.load());
  gauge("deepinfer:prompt_tokens_total", "counter", "Prompt tokens of the requests accepted by the engine.",
        prompt_tokens.load());
  gauge("deepinfer:generation_tokens_total", "counter", "Generated tokens.", generation_tokens.load());
  gauge("deepinfer:engine_steps_total", "counter", "Engine steps run.", engine_steps.load());
  {
    std::lock_guard<std::mutex> lk(mu_);
    s += "# HELP deepinfer:request_success_total Finished requests by finish reason.\n"
         "# TYPE deepinfer:request_success_total counter\n";
    for (const auto& [reason, n] : finished_)
      s += fmt::format("deepinfer:request_success_total{{{},finished_reason=\"{}\"}} {}\n", lab, reason, n);
    s += "# HELP deepinfer:http_requests_total HTTP requests by route and status.\n"
         "# TYPE deepinfer:http_requests_total counter\n";
    for (const auto& [key, n] : http_)
      s += fmt::format("deepinfer:http_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
  }
  s += ttft.render("deepinfer:time_to_first_token_seconds", "Time from arrival to the first output token.", lab);
  s += tpot.render("deepinfer:time_per_output_token_seconds", "Mean time per output token after the first.", lab);
  s += e2e.render("deepinfer:e2e_request_latency_seconds", "Time from arrival to the final output.", lab);
  return s;
}

}  // namespace deepinfer::server
