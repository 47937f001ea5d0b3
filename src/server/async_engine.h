// AsyncEngine: owns an EngineCore on one engine thread and lets any thread feed it requests and
// receive their outputs. Requests and aborts go in through locked queues; the engine thread runs
// EngineCore::step() while there is work and hands each RequestOutput snapshot to the callback the
// request was submitted with (called on the engine thread: keep it short, e.g. post to an I/O
// executor). A request the engine rejects gets one final output with `error` set.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine_core.h"
#include "server/metrics.h"

namespace deepinfer::server {

class AsyncEngine {
 public:
  using Callback = std::function<void(const RequestOutput&)>;

  // Takes ownership of `engine` and starts the engine thread.
  explicit AsyncEngine(std::unique_ptr<EngineCore> engine, Metrics* metrics);
  ~AsyncEngine();  // stop() + join

  // Queues a request; `cb` receives every snapshot, the last one with finished = true.
  void submit(std::string request_id, std::vector<int32_t> prompt, SamplingParams params, Callback cb);
  // Aborts a live request (its callback is dropped: no more outputs are delivered). Unknown ids are ignored.
  void abort(const std::string& request_id);
  // Requests submitted and not yet finished (or aborted).
  int64_t num_in_flight() const { return in_flight_.load(); }
  // Stops the engine thread after aborting what is left.
  void stop();

  const EngineCore& core() const { return *engine_; }  // immutable parts only (config, tokenizer, max_model_len)

 private:
  struct Pending {
    std::string id;
    std::vector<int32_t> prompt;
    SamplingParams params;
    Callback cb;
  };
  void loop();

  std::unique_ptr<EngineCore> engine_;
  Metrics* metrics_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> incoming_;
  std::vector<std::string> aborts_;
  bool stop_ = false;
  std::atomic<int64_t> in_flight_{0};
  // Engine-thread only.
  struct Live {
    Callback cb;
    double arrival = 0;
    double first_token = 0;
    double last_token = 0;
    size_t tokens = 0;
  };
  std::unordered_map<std::string, Live> live_;
  std::thread thread_;
};

}  // namespace deepinfer::server
