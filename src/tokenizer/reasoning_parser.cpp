// ReasoningParser: "<think>…</think>" reasoning vs content, streamed (rules in parsers.h).
#include <exception>

#include "tokenizer/parser_common.h"
#include "tokenizer/parsers.h"

namespace deepinfer::parsers {

using detail::ScanKind;

ReasoningParser::ReasoningParser(bool starts_in_reasoning, std::vector<std::string> implicit_end_markers)
    : in_reasoning_(starts_in_reasoning), implicit_end_(std::move(implicit_end_markers)) {}

ReasoningParser::Deltas ReasoningParser::feed(std::string_view chunk) {
  Deltas out;
  if (finished_ || stopped_) return out;
  try {
    buf_.append(chunk);
    process(out, false);
  } catch (const std::exception&) {
    (in_reasoning_ ? out.reasoning : out.content) += buf_;
    buf_.clear();
  }
  return out;
}

ReasoningParser::Deltas ReasoningParser::finish() {
  Deltas out;
  if (finished_) return out;
  try {
    process(out, true);
  } catch (const std::exception&) {
  }
  (in_reasoning_ ? out.reasoning : out.content) += buf_;
  buf_.clear();
  finished_ = true;
  return out;
}

void ReasoningParser::process(Deltas& out, bool at_end) {
  while (!stopped_) {
    if (at_start_) {
      if (buf_.empty()) return;
      if (detail::starts_with(buf_, kThinkStart)) {
        buf_.erase(0, kThinkStart.size());
        in_reasoning_ = true;
        at_start_ = false;
        continue;
      }
      if (!at_end && detail::starts_with(kThinkStart, buf_)) return;  // may still become "<think>"
      at_start_ = false;
    }
    std::vector<std::string_view> markers{kEos, kThinkEnd};
    if (in_reasoning_)
      for (const auto& m : implicit_end_) markers.emplace_back(m);
    auto r = detail::scan_markers(buf_, 0, markers, at_end);
    std::string& dst = in_reasoning_ ? out.reasoning : out.content;
    dst.append(buf_, 0, r.pos);
    if (r.kind != ScanKind::kMatch) {
      buf_.erase(0, r.pos);  // kNone: all emitted; kPartial: keep the possible marker
      return;
    }
    if (r.marker == 0) {  // EOS: the output ends here
      stopped_ = true;
      buf_.clear();
      return;
    }
    if (r.marker == 1) {
      if (in_reasoning_) {  // "</think>" ends reasoning
        buf_.erase(0, r.pos + kThinkEnd.size());
        in_reasoning_ = false;
      } else {  // a stray "</think>" in content stays content
        out.content.append(kThinkEnd);
        buf_.erase(0, r.pos + kThinkEnd.size());
      }
      continue;
    }
    buf_.erase(0, r.pos);  // implicit end: the marker itself stays for the content stream
    in_reasoning_ = false;
  }
  buf_.clear();
}

}  // namespace deepinfer::parsers
