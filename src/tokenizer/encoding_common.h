// Shared pieces of the V4 / V4.1 prompt encoders: Python value semantics over JSON values
// (truthiness, str(), repr(), json.dumps) and the preprocessing steps both references share.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/encoding.h"

namespace deepinfer::enc {

using Json = nlohmann::ordered_json;
using Messages = std::vector<Json>;

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kSystem = "<｜System｜>";
inline constexpr std::string_view kImage = "<｜deepseek_image｜>";

// msg.get(key): nullptr when the key is missing (the object must be an object).
const Json* get(const Json& obj, std::string_view key);
// Python truthiness of msg.get(key) / of a value (missing and null are falsy).
bool truthy(const Json* v);
bool truthy(const Json& v);
bool is_none(const Json* v);  // missing or null

// str(value) and repr(value) as Python prints the value json.loads would give.
std::string py_str(const Json& v);
std::string py_str(const Json* v);  // nullptr -> "None"
std::string py_repr(const Json& v);
std::string py_float_repr(double d);
// Python `a == b` for two JSON-born values (1 == 1.0 == True).
bool py_equal(const Json& a, const Json& b);

// "\n\n".join(parts): every part must be a string (else Python raises TypeError).
std::string join_strings(const std::vector<const Json*>& parts, std::string_view sep, std::string_view what);

// Checks that `messages` is a list of objects (the reference calls msg.get on each).
Messages to_message_list(const Json& messages, std::string_view what);

// The reference's `role in {...}` raises TypeError for an unhashable role.
void check_hashable_role(const Json* role);

// sort_tool_results_by_call_order(messages), in place (identical in V4 and V4.1).
void sort_tool_results_by_call_order(Messages& messages);

// _drop_thinking_messages with the family's last-user rule.
Messages drop_thinking_messages(const Messages& messages, const std::function<long(const Messages&)>& last_user_index);

// Renders a merged user message's content_blocks (tool results and text), joined by "\n\n".
std::string render_content_blocks(const Json& blocks);

// Task suffix: returns true when the message had a task (and appended its tokens).
bool append_task_tokens(std::string& prompt, const Json& msg, bool thinking);

// tools_from_openai_format: [tool["function"] for tool in tools].
std::vector<Json> tools_from_openai_format(const Json& tools);
struct ToolCall {
  Json name;
  Json arguments;
};
std::vector<ToolCall> tool_calls_from_openai_format(const Json& tool_calls);

// "## Response Format:..." block for a truthy response_format.
std::string render_response_format(const Json& response_format);

// Python str.replace-free template substitution helper: replaces each "{name}" in `tmpl`.
std::string format_template(std::string_view tmpl, const std::vector<std::pair<std::string_view, std::string>>& subs);

// Applies EncodeOptions::tools / response_format to messages[0] as the reference's load_cases.
Json apply_message_options(const Json& messages, const EncodeOptions& opts);

}  // namespace deepinfer::enc
