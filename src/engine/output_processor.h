// OutputProcessor: turns per-sequence updates into RequestOutputs (vLLM v1 `output_processor.py`):
// appends tokens and logprobs, detokenizes incrementally when a tokenizer is attached, finds stop
// strings (the text is cut before them) and reports the sequences they end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/request.h"
#include "engine/scheduler_output.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

class OutputProcessor {
 public:
  explicit OutputProcessor(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}

  void add_request(std::shared_ptr<const Request> request);

  struct Result {
    std::vector<RequestOutput> outputs;    // a cumulative snapshot of every request updated
    std::vector<int64_t> stopped_seq_ids;  // ended by a stop string: finish them in the scheduler
  };
  // Requests that finish here are forgotten after their final output.
  Result process(const std::vector<SeqUpdate>& updates);

  size_t num_requests() const { return requests_.size(); }

 private:
  struct Child {
    CompletionOutput out;
    std::unique_ptr<IncrementalDetokenizer> detok;
  };
  struct RequestState {
    std::shared_ptr<const Request> request;
    std::vector<Child> children;
    int num_finished = 0;
  };
  // Appends the token's text; returns true when a stop string ended the child.
  bool append_text(const Request& request, Child& child, int32_t token);
  void finish_text(Child& child);
  static RequestOutput snapshot(const RequestState& st);

  const Tokenizer* tokenizer_;
  std::unordered_map<std::string, RequestState> requests_;
};

}  // namespace deepinfer
