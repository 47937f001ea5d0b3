// Streaming output parsers for DeepSeek-V4 / V4.1 model text.
//
// Three layers, each usable on its own, each "chunk-boundary-proof": feeding a text in any split
// (down to one byte per call) and then calling finish() yields exactly the same concatenated output
// as feeding it in one piece. A marker (tag) split across chunks is held back until it can be told
// apart from plain text, so partial tag text never leaks into an output stream.
//
//   ReasoningParser  "<think>…</think>" reasoning vs content.
//   ToolCallParser   DSML tool-call blocks (V4 "<｜DSML｜tool_calls>", V4.1 "<｜DSML｜ calls>") vs content.
//   ChatOutputParser reasoning → content → tool calls, as a chat-completions server uses it.
//
// Nothing here throws on model text: malformed or truncated markup degrades to plain content, and
// arbitrary bytes (invalid UTF-8 included) pass through. Content and reasoning bytes are passed on
// verbatim (no UTF-8 repair); Utf8Carry helps a caller emit only whole characters per delta.
// Tool-call arguments are always valid UTF-8 JSON (invalid bytes become U+FFFD).
//
// Decisions on cases the reference decoders (encoding_dsv4.py / V4.1 encoding.py) reject with an
// exception are documented next to each parser below.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::parsers {

enum class Family { kV4, kV41 };

// Marker spellings (fullwidth bars U+FF5C, as in the tokenizer's special tokens).
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kEos =
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
inline constexpr std::string_view kDsml =
    "\xEF\xBD\x9C"
    "DSML\xEF\xBD\x9C";  // "｜DSML｜"

// Tag names of one DSML dialect: V4 `tool_calls`/`invoke`/`parameter`, V4.1 ` calls`/` invoke`/` parameter`.
struct DsmlDialect {
  std::string block_open;    // "<｜DSML｜tool_calls>"
  std::string block_close;   // "</｜DSML｜tool_calls>"
  std::string invoke_open;   // "<｜DSML｜invoke"      (attributes and '>' follow)
  std::string invoke_close;  // "</｜DSML｜invoke>"
  std::string param_open;    // "<｜DSML｜parameter"   (attributes and '>' follow)
  std::string param_close;   // "</｜DSML｜parameter>"
  static DsmlDialect for_family(Family f);
};

// ---------------------------------------------------------------------------------------------
// ReasoningParser
//
// Rules (both modes; `starts_in_reasoning` is true in thinking mode, where the prompt already ends
// with "<think>"):
//  * A "<think>" at the very first byte of the output is dropped and puts the parser in reasoning
//    (thinking mode: the model repeated the prompt's tag; chat mode: a tolerated leading
//    "<think>…</think>").
//  * In reasoning, "</think>" (dropped) ends reasoning; later text is content. Any other "<think>"
//    inside reasoning is kept as reasoning text.
//  * In reasoning, an "implicit end" marker (ChatOutputParser passes the DSML block opening) also
//    ends reasoning, but the marker itself and what follows go to content: a model that opens a
//    tool-call block without closing its thinking still gets its tool calls parsed.
//  * In content, everything is passed on verbatim (a stray "</think>" included: ChatOutputParser
//    drops it outside tool-call blocks, where it cannot be part of an argument value).
//  * "<｜end▁of▁sentence｜>" (if the caller decodes it) ends the output: it and everything after it
//    are dropped.
//  * finish(): held-back bytes (a possible partial marker) are flushed to the current stream. A
//    thinking-mode output without "</think>" is all reasoning.
// ---------------------------------------------------------------------------------------------
class ReasoningParser {
 public:
  struct Deltas {
    std::string reasoning;
    std::string content;
  };

  explicit ReasoningParser(bool starts_in_reasoning, std::vector<std::string> implicit_end_markers = {});

  Deltas feed(std::string_view chunk);
  Deltas finish();

  bool in_reasoning() const { return in_reasoning_; }
  bool finished() const { return finished_; }

 private:
  void process(Deltas& out, bool at_end);

  bool in_reasoning_;
  bool at_start_ = true;  // no output byte decided yet
  bool stopped_ = false;  // EOS seen
  bool finished_ = false;
  std::vector<std::string> implicit_end_;
  std::string buf_;
};

// ---------------------------------------------------------------------------------------------
// ToolCallParser
//
// Grammar accepted (D = "｜DSML｜"; V4 names shown; V4.1 spells them " calls", " invoke", " parameter"):
//   block  := ["\n\n"] "<D tool_calls>" ws (invoke ws)* "</D tool_calls>"
//   invoke := "<D invoke" ws 'name="' NAME '"' ws ">" ws (param ws)* "</D invoke>"
//   param  := "<D parameter" ws 'name="' KEY '"' ws 'string="' ("true"|"false) '"' ws ">" VALUE "</D parameter>"
// ws is any run of ASCII whitespace (the templates write exactly "\n"); VALUE is raw text up to the
// first "</D parameter>". The "\n\n" the template puts before the block is not content. NAME must be
// non-empty; NAME and KEY end at the first '"'. The family picks one dialect; the other one is content.
//
// Arguments: '{"k": v, ...}' in parameter order, spelled like the reference (json.dumps,
// ensure_ascii=False, ", " and ": " separators). string="true" values become JSON strings;
// string="false" values are inserted verbatim when they are valid JSON, otherwise encoded as a JSON
// string (decision: never emit invalid JSON arguments). A repeated key keeps its first position and
// takes the last value.
//
// Malformed markup (unknown tag inside a block, bad attributes, header over 4 KiB): the block is
// abandoned; its uncommitted raw text becomes content and scanning resumes after it. Each invoke is
// committed (emitted as a completed tool call) when its "</D invoke>" is parsed, so calls that
// completed before the damage are kept. finish() inside a block: the uncommitted raw text becomes
// content. Text after a closed block is content (further blocks are parsed too).
// ---------------------------------------------------------------------------------------------
struct ToolCall {
  std::size_t index = 0;  // 0-based position among this output's tool calls
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, as a string
};

class ToolCallParser {
 public:
  using IdGenerator = std::function<std::string(std::size_t index)>;

  struct Deltas {
    std::string content;
    std::vector<ToolCall> tool_calls;  // calls completed during this feed/finish
  };

  // Default ids are "call_<index>"; a server should pass a generator of unique ids.
  // `drop_in_content`: markers deleted from content outside blocks (ChatOutputParser: "</think>").
  explicit ToolCallParser(Family family, IdGenerator id_gen = {}, std::vector<std::string> drop_in_content = {});

  Deltas feed(std::string_view chunk);
  Deltas finish();

  std::size_t num_tool_calls() const { return next_index_; }
  bool in_block() const { return state_ != State::kContent; }

 private:
  enum class State { kContent, kBlockBody, kInvokeHeader, kInvokeBody, kParamHeader, kParamValue };
  void process(Deltas& out, bool at_end);
  void abandon_block(Deltas& out);
  void consume(std::size_t n);  // move n bytes of buf_ (from pos_) into raw_

  DsmlDialect d_;
  IdGenerator id_gen_;
  std::vector<std::string> drop_;
  State state_ = State::kContent;
  std::string buf_;
  std::size_t pos_ = 0;          // parse position in buf_
  std::size_t search_from_ = 0;  // resume point for the value terminator search
  std::string raw_;              // raw text of the current block since its last committed invoke
  std::string name_;             // current invoke
  std::vector<std::pair<std::string, std::string>> args_;  // key → JSON value text
  std::string key_;
  bool key_is_string_ = true;
  std::size_t next_index_ = 0;
};

// ---------------------------------------------------------------------------------------------
// ChatOutputParser: ReasoningParser → ToolCallParser on the content stream.
// Tool-call blocks are only parsed in content (a block opened inside reasoning ends the reasoning).
// A stray "</think>" in content outside tool-call blocks is dropped (as deepseek-recipe does).
// ---------------------------------------------------------------------------------------------
class ChatOutputParser {
 public:
  struct Deltas {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> tool_calls;
    bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  };

  ChatOutputParser(Family family, bool thinking, ToolCallParser::IdGenerator id_gen = {});

  Deltas feed(std::string_view chunk);
  Deltas finish();

  std::size_t num_tool_calls() const { return tools_.num_tool_calls(); }

 private:
  ReasoningParser reasoning_;
  ToolCallParser tools_;
};

// Holds back an incomplete UTF-8 sequence at the end of a stream so each emitted piece ends on a
// character boundary (invalid bytes are passed through unchanged; finish() flushes the rest).
class Utf8Carry {
 public:
  std::string push(std::string_view s);
  std::string finish();

 private:
  std::string pending_;
};

// JSON string literal of raw bytes, spelled as Python's json.dumps(ensure_ascii=False) does;
// invalid UTF-8 bytes become U+FFFD.
std::string json_quote(std::string_view s);

}  // namespace deepinfer::parsers
