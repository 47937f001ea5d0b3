// Prompt encoders for the DeepSeek-V4 family: OpenAI-style messages -> the prompt string the model
// was trained on. Byte-identical to DeepSeek's reference scripts: `encoding_dsv4.py` (V4) and
// `encoding/encoding.py` (V4.1); see v4-architecture.md §4.2-4.3. The prompt is tokenized with
// special tokens recognised (add_special_tokens=False: the BOS is already in the string).
//
// Messages are JSON values in the reference's own format (OpenAI chat format plus DeepSeek's
// extensions): roles system, developer (V4 only), user, assistant (content, reasoning_content,
// tool_calls, wo_eos), tool (tool_call_id, content), latest_reminder; message keys tools,
// response_format, task (action|query|authority|domain|title|read_url). V4.1 also accepts content
// lists (text, image_url/image, tool_result blocks); images render as one `<｜deepseek_image｜>`
// placeholder each, unexpanded (expansion to the image's token span is the image processor's job).
//
// Key order matters (tool schemas and arguments are re-serialised as the reference's
// json.dumps does), so the encoders take `nlohmann::ordered_json`. Everything the reference
// rejects (an assert, a ValueError, or a Python TypeError/KeyError on malformed input) throws
// deepinfer::Error.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace deepinfer {

enum class EncodingFamily { kV4, kV41 };

struct EncodeOptions {
  EncodingFamily family = EncodingFamily::kV41;
  // thinking_mode: "thinking" when true, "chat" when false.
  bool thinking = true;
  // V4: null | "high" | "max". V4.1: null (= "high") | "low" | "high" | "max" | integer 1..100.
  nlohmann::ordered_json reasoning_effort = nullptr;
  // Drop reasoning_content of assistant turns before the last user turn (thinking mode only;
  // the reference forces it off when any message carries tools).
  bool drop_thinking = true;
  // Prepend <｜begin▁of▁sentence｜> (only when there is no context).
  bool add_default_bos_token = true;
  // Messages already encoded earlier (null or an array): they are not rendered, but they steer the
  // rendering of `messages` (tool-result order, last-user index, thinking drop). This is how the
  // reference continues a prompt incrementally.
  nlohmann::ordered_json context = nullptr;
  // Convenience, as the reference's `load_cases` does: when not null, set as messages[0]["tools"]
  // (an OpenAI tools list). Rendered only when messages[0] is a system (or V4 developer) message.
  nlohmann::ordered_json tools = nullptr;
  // Convenience: when not null, set as messages[0]["response_format"] (rendered on system and
  // V4 developer messages).
  nlohmann::ordered_json response_format = nullptr;
};

// Continuation of a partial assistant message ("prefix" completion) is expressed as in the
// reference: give the last assistant message `"wo_eos": true` and it is rendered without EOS.

std::string encode_messages(const nlohmann::ordered_json& messages, const EncodeOptions& opts);

// Same, with plain (key-sorted) nlohmann::json; prefer the ordered overload when key order of
// tool schemas or arguments matters.
std::string encode_messages(const nlohmann::json& messages, const EncodeOptions& opts);

// Messages as a JSON text (an array); keeps the key order of the text.
std::string encode_messages_json(std::string_view messages_json, const EncodeOptions& opts);

std::string encode_messages_v4(const nlohmann::ordered_json& messages, const EncodeOptions& opts);
std::string encode_messages_v41(const nlohmann::ordered_json& messages, const EncodeOptions& opts);

// Python's json.dumps(value, ensure_ascii=False) with default separators, as the reference
// serialises tool schemas, non-string arguments and response formats.
std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace deepinfer
