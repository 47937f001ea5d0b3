// StepWorker: one persistent thread that runs a job while the caller does something else (async
// scheduling: it processes step N-1's outputs and computes step N's grammar masks while the engine
// thread runs step N's model). Persistent, so that no thread is created per step. An exception thrown
// by the job is rethrown by wait().
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace deepinfer {

class StepWorker {
 public:
  StepWorker() : thread_([this] { loop(); }) {}
  ~StepWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  StepWorker(const StepWorker&) = delete;
  StepWorker& operator=(const StepWorker&) = delete;

  // Starts `job` on the worker; one job at a time (call wait() before the next submit()).
  void submit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = std::move(job);
      done_ = false;
      error_ = nullptr;
    }
    cv_.notify_all();
  }
  // Blocks until the submitted job has finished; rethrows its exception.
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || job_ != nullptr; });
      if (stop_) return;
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      lock.unlock();
      std::exception_ptr err;
      try {
        job();
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      error_ = err;
      done_ = true;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool done_ = true, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started after the fields it uses
};

}  // namespace deepinfer
