// ToolCallParser: DSML tool-call blocks (V4 / V4.1) vs content, streamed (grammar in parsers.h).
#include <exception>
#include <nlohmann/json.hpp>

#include "tokenizer/parser_common.h"
#include "tokenizer/parsers.h"

namespace deepinfer::parsers {

namespace {

using detail::is_ws;
using detail::ScanKind;
using detail::starts_with;

constexpr std::size_t kMaxHeader = 4096;  // bytes of attributes before '>' in an opening tag

void skip_ws(std::string_view s, std::size_t& i) {
  while (i < s.size() && is_ws(s[i])) ++i;
}

// Parses `attr="value"` at s[i] (after optional whitespace); advances i past the closing quote.
bool parse_attr(std::string_view s, std::size_t& i, std::string_view attr, std::string& value) {
  skip_ws(s, i);
  if (!starts_with(s.substr(i), attr)) return false;
  i += attr.size();
  if (!starts_with(s.substr(i), "=\"")) return false;
  i += 2;
  std::size_t q = s.find('"', i);
  if (q == std::string_view::npos) return false;
  value.assign(s.substr(i, q - i));
  i = q + 1;
  return true;
}

bool at_end_after_ws(std::string_view s, std::size_t i) {
  skip_ws(s, i);
  return i == s.size();
}

}  // namespace

ToolCallParser::ToolCallParser(Family family, IdGenerator id_gen, std::vector<std::string> drop_in_content)
    : d_(DsmlDialect::for_family(family)), id_gen_(std::move(id_gen)), drop_(std::move(drop_in_content)) {}

ToolCallParser::Deltas ToolCallParser::feed(std::string_view chunk) {
  Deltas out;
  try {
    buf_.append(chunk);
    process(out, false);
  } catch (const std::exception&) {
    // Should not happen (bad_alloc at worst): give up structure, keep the text.
    out.content += raw_;
    out.content.append(buf_, pos_);
    raw_.clear();
    buf_.clear();
    pos_ = search_from_ = 0;
    state_ = State::kContent;
  }
  return out;
}

ToolCallParser::Deltas ToolCallParser::finish() {
  Deltas out;
  try {
    process(out, true);
  } catch (const std::exception&) {
  }
  if (state_ != State::kContent) abandon_block(out);
  out.content.append(buf_, std::min(pos_, buf_.size()));
  buf_.clear();
  pos_ = search_from_ = 0;
  return out;
}

void ToolCallParser::consume(std::size_t n) {
  raw_.append(buf_, pos_, n);
  pos_ += n;
}

void ToolCallParser::abandon_block(Deltas& out) {
  out.content += raw_;
  raw_.clear();
  state_ = State::kContent;
}

void ToolCallParser::process(Deltas& out, bool at_end) {
  const std::string lead_block = "\n\n" + d_.block_open;
  for (;;) {
    std::string_view rest = std::string_view(buf_).substr(pos_);
    bool wait = false;
    switch (state_) {
      case State::kContent: {
        std::vector<std::string_view> markers{lead_block, d_.block_open};
        for (const auto& m : drop_) markers.emplace_back(m);
        auto r = detail::scan_markers(buf_, pos_, markers, at_end);
        out.content.append(buf_, pos_, r.pos - pos_);
        pos_ = r.pos;
        if (r.kind != ScanKind::kMatch) {
          wait = true;
          break;
        }
        if (r.marker >= 2) {  // a marker dropped from content
          pos_ += markers[r.marker].size();
          break;
        }
        raw_.clear();
        consume(r.marker == 0 ? lead_block.size() : d_.block_open.size());
        state_ = State::kBlockBody;
        break;
      }
      case State::kBlockBody:
      case State::kInvokeBody: {
        std::size_t i = 0;
        skip_ws(rest, i);
        consume(i);
        rest.remove_prefix(i);
        const bool block = state_ == State::kBlockBody;
        const std::string& open = block ? d_.invoke_open : d_.param_open;
        const std::string& close = block ? d_.block_close : d_.invoke_close;
        if (starts_with(rest, close)) {
          consume(close.size());
          if (block) {
            raw_.clear();
            state_ = State::kContent;
          } else {
            ToolCall tc;
            tc.index = next_index_++;
            if (id_gen_) {
              try {
                tc.id = id_gen_(tc.index);
              } catch (...) {
                tc.id.clear();
              }
            }
            if (tc.id.empty()) tc.id = "call_" + std::to_string(tc.index);
            tc.name = std::move(name_);
            tc.arguments = "{";
            for (std::size_t k = 0; k < args_.size(); ++k) {
              if (k) tc.arguments += ", ";
              tc.arguments += json_quote(args_[k].first);
              tc.arguments += ": ";
              tc.arguments += args_[k].second;
            }
            tc.arguments += "}";
            out.tool_calls.push_back(std::move(tc));
            name_.clear();
            args_.clear();
            raw_.clear();  // committed: this invoke's text never falls back to content
            state_ = State::kBlockBody;
          }
        } else if (starts_with(rest, open)) {
          consume(open.size());
          state_ = block ? State::kInvokeHeader : State::kParamHeader;
          if (block) {
            name_.clear();
            args_.clear();
          }
        } else if (!at_end && (rest.empty() || (rest.size() < close.size() && starts_with(close, rest)) ||
                               (rest.size() < open.size() && starts_with(open, rest)))) {
          wait = true;
        } else {
          abandon_block(out);
        }
        break;
      }
      case State::kInvokeHeader:
      case State::kParamHeader: {
        std::size_t gt = rest.substr(0, kMaxHeader + 1).find('>');
        if (gt == std::string_view::npos) {
          if (!at_end && rest.size() <= kMaxHeader) {
            wait = true;
          } else {
            abandon_block(out);
          }
          break;
        }
        std::string_view h = rest.substr(0, gt);
        std::size_t i = 0;
        bool ok;
        if (state_ == State::kInvokeHeader) {
          ok = parse_attr(h, i, "name", name_) && !name_.empty() && at_end_after_ws(h, i);
        } else {
          std::string flag;
          ok = parse_attr(h, i, "name", key_) && parse_attr(h, i, "string", flag) &&
               (flag == "true" || flag == "false") && at_end_after_ws(h, i);
          key_is_string_ = flag == "true";
        }
        if (!ok) {
          abandon_block(out);
          break;
        }
        consume(gt + 1);
        if (state_ == State::kInvokeHeader) {
          state_ = State::kInvokeBody;
        } else {
          state_ = State::kParamValue;
          search_from_ = pos_;
        }
        break;
      }
      case State::kParamValue: {
        std::size_t f = buf_.find(d_.param_close, std::max(search_from_, pos_));
        if (f == std::string::npos) {
          if (at_end) {
            abandon_block(out);
          } else {
            std::size_t keep = d_.param_close.size() - 1;
            search_from_ = std::max(pos_, buf_.size() > keep ? buf_.size() - keep : 0);
            wait = true;
          }
          break;
        }
        std::string_view value = std::string_view(buf_).substr(pos_, f - pos_);
        std::string json;
        if (!key_is_string_ && nlohmann::json::accept(value)) {
          json.assign(value);
        } else {
          json = json_quote(value);
        }
        bool replaced = false;
        for (auto& kv : args_) {
          if (kv.first == key_) {
            kv.second = std::move(json);
            replaced = true;
            break;
          }
        }
        if (!replaced) args_.emplace_back(std::move(key_), std::move(json));
        key_.clear();
        consume(f - pos_ + d_.param_close.size());
        state_ = State::kInvokeBody;
        break;
      }
    }
    if (wait) break;
  }
  // Compact: drop the bytes already consumed or emitted.
  if (pos_ > 0) {
    buf_.erase(0, pos_);
    search_from_ = search_from_ > pos_ ? search_from_ - pos_ : 0;
    pos_ = 0;
  }
}

}  // namespace deepinfer::parsers
