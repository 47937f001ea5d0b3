#include "engine/output_processor.h"

#include <algorithm>

#include "deepinfer/error.h"

namespace deepinfer {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "?";
}

void OutputProcessor::add_request(std::shared_ptr<const Request> request) {
  RequestState st;
  st.request = request;
  for (int i = 0; i < request->params.n; ++i) {
    Child c;
    c.out.index = i;
    if (tokenizer_)
      c.detok = std::make_unique<IncrementalDetokenizer>(*tokenizer_, request->params.skip_special_tokens);
    st.children.push_back(std::move(c));
  }
  requests_[request->request_id] = std::move(st);
}

bool OutputProcessor::append_text(const Request& request, Child& child, int32_t token) {
  if (!child.detok) return false;
  const size_t old_len = child.out.text.size();
  child.out.text += child.detok->push(token);
  const SamplingParams& p = request.params;
  if (p.stop.empty() || static_cast<int64_t>(child.out.token_ids.size()) <= p.min_tokens) return false;
  // Earliest stop string that ends in the new text (it may start in older text).
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (const std::string& s : p.stop) {
    if (s.empty()) continue;
    const size_t from = old_len >= s.size() - 1 ? old_len - (s.size() - 1) : 0;
    const size_t at = child.out.text.find(s, from);
    if (at != std::string::npos && at < best) {
      best = at;
      which = &s;
    }
  }
  if (!which) return false;
  child.out.text.resize(best);
  child.out.finish_reason = finish_reason_name(FinishReason::kStop);
  child.out.stop_reason = *which;
  return true;
}

void OutputProcessor::finish_text(Child& child) {
  if (child.detok) child.out.text += child.detok->flush();
}

OutputProcessor::Result OutputProcessor::process(const std::vector<SeqUpdate>& updates) {
  Result result;
  std::vector<std::string> touched;
  for (const SeqUpdate& u : updates) {
    auto it = requests_.find(u.request_id);
    if (it == requests_.end()) continue;
    RequestState& st = it->second;
    Child& child = st.children.at(static_cast<size_t>(u.child_index));
    if (child.out.finished()) continue;
    if (std::find(touched.begin(), touched.end(), u.request_id) == touched.end()) touched.push_back(u.request_id);
    bool stopped_by_string = false;
    if (u.token) {
      const SampledToken& t = *u.token;
      child.out.token_ids.push_back(t.token);
      child.out.cumulative_logprob += t.logprob;
      if (st.request->params.logprobs >= 0)
        child.out.logprobs.push_back(TokenLogprobs{t.token, t.logprob, t.top_logprobs});
      // A stop token (EOS, stop_token_ids) ends the sequence but adds no text (vLLM).
      const bool stop_token = u.finish_reason == FinishReason::kStop;
      if (!stop_token) stopped_by_string = append_text(*st.request, child, t.token);
      if (stopped_by_string) result.stopped_seq_ids.push_back(u.seq_id);
    }
    if (!stopped_by_string && u.finish_reason) {
      child.out.finish_reason = finish_reason_name(*u.finish_reason);
      if (u.stop_token) child.out.stop_reason = *u.stop_token;
      finish_text(child);
    }
    if (child.out.finished()) ++st.num_finished;
  }
  for (const std::string& id : touched) {
    auto it = requests_.find(id);
    result.outputs.push_back(snapshot(it->second));
    if (result.outputs.back().finished) requests_.erase(it);
  }
  return result;
}

RequestOutput OutputProcessor::snapshot(const RequestState& st) {
  RequestOutput o;
  o.request_id = st.request->request_id;
  o.prompt_token_ids = st.request->prompt_token_ids;
  for (const Child& c : st.children) o.outputs.push_back(c.out);
  o.finished = st.num_finished == static_cast<int>(st.children.size());
  return o;
}

}  // namespace deepinfer
