#include "server/async_engine.h"

#include <chrono>
#include <exception>

#include "core/logging.h"
#include "deepinfer/error.h"

namespace deepinfer::server {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

AsyncEngine::AsyncEngine(std::unique_ptr<EngineCore> engine, Metrics* metrics)
    : engine_(std::move(engine)), metrics_(metrics) {
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() { stop(); }

void AsyncEngine::submit(std::string request_id, std::vector<int32_t> prompt, SamplingParams params, Callback cb) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    in_flight_.fetch_add(1);
    incoming_.push_back(Pending{std::move(request_id), std::move(prompt), std::move(params), std::move(cb)});
  }
  cv_.notify_one();
}

void AsyncEngine::abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    aborts_.push_back(request_id);
  }
  cv_.notify_one();
}

void AsyncEngine::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void AsyncEngine::loop() {
  while (true) {
    std::deque<Pending> incoming;
    std::vector<std::string> aborts;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      const bool busy = engine_->has_unfinished();
      cv_.wait(lk, [&] { return stop_ || busy || !incoming_.empty() || !aborts_.empty(); });
      incoming.swap(incoming_);
      aborts.swap(aborts_);
      stopping = stop_;
    }
    for (Pending& p : incoming) {
      const double t = now_s();
      const size_t n_prompt = p.prompt.size();
      try {
        engine_->add_request(p.id, p.prompt, p.params);
      } catch (const std::exception& e) {
        RequestOutput out;
        out.request_id = p.id;
        out.prompt_token_ids = std::move(p.prompt);
        out.finished = true;
        out.error = e.what();
        p.cb(out);
        in_flight_.fetch_sub(1);
        continue;
      }
      metrics_->prompt_tokens += static_cast<int64_t>(n_prompt);
      live_[p.id] = Live{std::move(p.cb), t, 0, 0, 0};
    }
    for (const std::string& id : aborts) {
      auto it = live_.find(id);
      if (it == live_.end()) continue;
      engine_->abort_request(id);
      live_.erase(it);
      metrics_->count_finished("abort");
      in_flight_.fetch_sub(1);
    }
    if (stopping) {
      for (auto& [id, live] : live_) {
        engine_->abort_request(id);
        in_flight_.fetch_sub(1);
      }
      live_.clear();
      return;
    }
    if (!engine_->has_unfinished()) continue;
    std::vector<RequestOutput> outs;
    try {
      outs = engine_->step();
      metrics_->engine_steps += 1;
    } catch (const std::exception& e) {
      // An engine failure fails the requests in flight; the engine thread stays up for new ones.
      log_warn("serve: engine step failed: {}", e.what());
      for (auto& [id, live] : live_) {
        engine_->abort_request(id);
        RequestOutput out;
        out.request_id = id;
        out.finished = true;
        out.error = std::string("engine step failed: ") + e.what();
        live.cb(out);
        in_flight_.fetch_sub(1);
      }
      live_.clear();
      try {
        while (engine_->has_unfinished()) engine_->step();  // collect the aborted requests' finals
      } catch (const std::exception&) {
      }
      continue;
    }
    const double t = now_s();
    for (RequestOutput& out : outs) {
      auto it = live_.find(out.request_id);
      if (it == live_.end()) continue;  // aborted by its client
      Live& live = it->second;
      size_t tokens = 0;
      for (const CompletionOutput& c : out.outputs) tokens += c.token_ids.size();
      if (tokens > live.tokens) {
        metrics_->generation_tokens += static_cast<int64_t>(tokens - live.tokens);
        if (live.first_token == 0) {
          live.first_token = t;
          metrics_->ttft.observe(t - live.arrival);
        }
        live.last_token = t;
        live.tokens = tokens;
      }
      // Capacity is given back before the final output goes out: a client that sends its next
      // request on seeing the end must not find this one still counted.
      if (out.finished) in_flight_.fetch_sub(1);
      live.cb(out);
      if (out.finished) {
        metrics_->e2e.observe(t - live.arrival);
        if (live.tokens > 1 && live.first_token > 0)
          metrics_->tpot.observe((live.last_token - live.first_token) / static_cast<double>(live.tokens - 1));
        std::string reason = out.outputs.empty() ? "abort" : out.outputs[0].finish_reason.value_or("abort");
        metrics_->count_finished(reason);
        live_.erase(it);
      }
    }
    metrics_->num_running = static_cast<int64_t>(engine_->scheduler().num_running());
    metrics_->num_waiting = static_cast<int64_t>(engine_->scheduler().num_waiting());
  }
}

}  // namespace deepinfer::server
