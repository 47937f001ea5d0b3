// DeepSeek-V4 prompt encoder (mirrors encoding_dsv4.py: encode_messages / render_message).
#include <string>

#include "deepinfer/error.h"
#include "tokenizer/encoding_common.h"

namespace deepinfer {

namespace {

using enc::get;
using enc::Json;
using enc::Messages;
using enc::truthy;

constexpr std::string_view kReasoningEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

constexpr std::string_view kToolsTemplate = R"(## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{dsml_token}tool_calls>" block like the following:

<{dsml_token}tool_calls>
<{dsml_token}invoke name="$TOOL_NAME">
<{dsml_token}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml_token}parameter>
...
</{dsml_token}invoke>
<{dsml_token}invoke name="$TOOL_NAME2">
...
</{dsml_token}invoke>
</{dsml_token}tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {thinking_start_token}), you MUST output your complete reasoning inside {thinking_start_token}...{thinking_end_token} BEFORE any tool calls or final response.

Otherwise, output directly after {thinking_end_token} with tool calls or final response.

### Available Tool Schemas

{tool_schemas}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
)";

bool role_is(const Json& msg, std::string_view r) {
  const Json* role = get(msg, "role");
  return role && role->is_string() && role->get_ref<const std::string&>() == r;
}

std::string render_tools(const std::vector<Json>& tools) {
  std::string schemas;
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i) schemas += "\n";
    schemas += python_json_dumps(tools[i]);
  }
  return enc::format_template(kToolsTemplate, {{"tool_schemas", schemas},
                                               {"dsml_token", std::string(enc::kDsml)},
                                               {"thinking_start_token", std::string(enc::kThinkStart)},
                                               {"thinking_end_token", std::string(enc::kThinkEnd)}});
}

std::string encode_arguments_to_dsml(const enc::ToolCall& tc) {
  Json arguments;
  if (tc.arguments.is_string()) {
    arguments = Json::parse(tc.arguments.get_ref<const std::string&>(), nullptr, false);
    if (arguments.is_discarded()) arguments = Json{{"arguments", tc.arguments}};
  } else {
    // json.loads raises TypeError on a non-string: the reference wraps the value.
    arguments = Json{{"arguments", tc.arguments}};
  }
  if (!arguments.is_object())
    fail("prompt encoding (V4): tool call arguments must decode to a JSON object, got {}",
         python_json_dumps(arguments));
  std::string out;
  bool first = true;
  for (const auto& [k, v] : arguments.items()) {
    if (!first) out += "\n";
    first = false;
    out += "<｜DSML｜parameter name=\"" + k + "\" string=\"" + (v.is_string() ? "true" : "false") + "\">" +
           (v.is_string() ? v.get<std::string>() : python_json_dumps(v)) + "</｜DSML｜parameter>";
  }
  return out;
}

long find_last_user_index(const Messages& messages) {
  for (long idx = static_cast<long>(messages.size()) - 1; idx >= 0; --idx)
    if (role_is(messages[idx], "user") || role_is(messages[idx], "developer")) return idx;
  return -1;
}

std::string render_message(size_t index, const Messages& messages, bool thinking, bool drop_thinking,
                           const Json& reasoning_effort) {
  const Json& msg = messages[index];
  long last_user_idx = find_last_user_index(messages);

  const Json* role = get(msg, "role");
  const Json* content = get(msg, "content");
  const Json* tools_v = get(msg, "tools");
  const Json* response_format = get(msg, "response_format");
  const Json* tool_calls_v = get(msg, "tool_calls");
  const Json* reasoning_content = get(msg, "reasoning_content");
  bool wo_eos = truthy(get(msg, "wo_eos"));

  std::vector<Json> tools;
  if (truthy(tools_v)) tools = enc::tools_from_openai_format(*tools_v);
  std::vector<enc::ToolCall> tool_calls;
  if (truthy(tool_calls_v)) tool_calls = enc::tool_calls_from_openai_format(*tool_calls_v);

  bool effort_ok = reasoning_effort.is_null() || reasoning_effort == "max" || reasoning_effort == "high";
  if (!effort_ok)
    fail("prompt encoding (V4): invalid reasoning effort {}; V4 accepts \"max\", \"high\" or none",
         python_json_dumps(reasoning_effort));

  std::string prompt;
  if (index == 0 && thinking && reasoning_effort == "max") prompt += kReasoningEffortMax;

  if (role_is(msg, "system")) {
    prompt += truthy(content) ? enc::py_str(*content) : "";
    if (!tools.empty()) prompt += "\n\n" + render_tools(tools);
    if (truthy(response_format)) prompt += "\n\n" + enc::render_response_format(*response_format);
  } else if (role_is(msg, "developer")) {
    if (!truthy(content)) fail("prompt encoding (V4): a developer message needs non-empty content");
    if (!content->is_string()) fail("prompt encoding (V4): a developer message's content must be a string");
    std::string dev = std::string(enc::kUser) + content->get<std::string>();
    if (!tools.empty()) dev += "\n\n" + render_tools(tools);
    if (truthy(response_format)) dev += "\n\n" + enc::render_response_format(*response_format);
    prompt += dev;
  } else if (role_is(msg, "user")) {
    prompt += enc::kUser;
    const Json* blocks = get(msg, "content_blocks");
    if (truthy(blocks)) {
      prompt += enc::render_content_blocks(*blocks);
    } else if (truthy(content)) {
      if (!content->is_string()) fail("prompt encoding (V4): a user message's content must be a string");
      prompt += content->get<std::string>();
    }
  } else if (role_is(msg, "latest_reminder")) {
    prompt += std::string(enc::kLatestReminder) + enc::py_str(content);
  } else if (role_is(msg, "tool")) {
    fail("prompt encoding (V4): tool messages must be merged into user messages first");
  } else if (role_is(msg, "assistant")) {
    std::string tc_content;
    if (!tool_calls.empty()) {
      std::string list;
      for (size_t i = 0; i < tool_calls.size(); ++i) {
        if (i) list += "\n";
        list += "<｜DSML｜invoke name=\"" + enc::py_str(tool_calls[i].name) + "\">\n" +
                encode_arguments_to_dsml(tool_calls[i]) + "\n</｜DSML｜invoke>";
      }
      tc_content = "\n\n<｜DSML｜tool_calls>\n" + list + "\n</｜DSML｜tool_calls>";
    }
    std::string summary = truthy(content) ? enc::py_str(*content) : "";
    std::string rc = truthy(reasoning_content) ? enc::py_str(*reasoning_content) : "";
    bool prev_has_task = index >= 1 && !enc::is_none(get(messages[index - 1], "task"));
    std::string thinking_part;
    if (thinking && !prev_has_task && (!drop_thinking || static_cast<long>(index) > last_user_idx))
      thinking_part = rc + std::string(enc::kThinkEnd);
    prompt += thinking_part + summary + tc_content;
    if (!wo_eos) prompt += enc::kEos;
  } else {
    fail("prompt encoding (V4): unknown role {}", enc::py_repr(role ? *role : Json()));
  }

  if (index + 1 < messages.size() && !role_is(messages[index + 1], "assistant") &&
      !role_is(messages[index + 1], "latest_reminder"))
    return prompt;

  if (enc::append_task_tokens(prompt, msg, thinking)) return prompt;
  if (role_is(msg, "user") || role_is(msg, "developer")) {
    prompt += enc::kAssistant;
    if (!drop_thinking && thinking)
      prompt += enc::kThinkStart;
    else if (drop_thinking && thinking && static_cast<long>(index) >= last_user_idx)
      prompt += enc::kThinkStart;
    else
      prompt += enc::kThinkEnd;
  }
  return prompt;
}

Messages merge_tool_messages(const Messages& messages) {
  Messages merged;
  for (const auto& msg : messages) {
    const Json* content = get(msg, "content");
    if (role_is(msg, "tool")) {
      const Json* id = get(msg, "tool_call_id");
      Json block = {
          {"type", "tool_result"}, {"tool_use_id", id ? *id : Json("")}, {"content", content ? *content : Json("")}};
      if (!merged.empty() && role_is(merged.back(), "user") && merged.back().contains("content_blocks")) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        merged.push_back(Json{{"role", "user"}, {"content_blocks", Json::array({std::move(block)})}});
      }
    } else if (role_is(msg, "user")) {
      Json text = content ? *content : Json("");
      Json block = {{"type", "text"}, {"text", text}};
      if (!merged.empty() && role_is(merged.back(), "user") && merged.back().contains("content_blocks") &&
          enc::is_none(get(merged.back(), "task"))) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        Json m = {{"role", "user"}, {"content", text}, {"content_blocks", Json::array({std::move(block)})}};
        for (const char* key : {"task", "wo_eos", "mask"})
          if (const Json* v = get(msg, key)) m[key] = *v;
        merged.push_back(std::move(m));
      }
    } else {
      merged.push_back(msg);
    }
  }
  return merged;
}

}  // namespace

std::string encode_messages_v4(const nlohmann::ordered_json& messages_in, const EncodeOptions& opts) {
  Messages messages = enc::to_message_list(enc::apply_message_options(messages_in, opts), "messages");
  Messages context;
  if (truthy(opts.context)) context = enc::to_message_list(opts.context, "context");

  messages = merge_tool_messages(messages);
  {
    Messages combined = context;
    combined.insert(combined.end(), messages.begin(), messages.end());
    enc::sort_tool_results_by_call_order(combined);
    messages.assign(combined.begin() + static_cast<long>(context.size()), combined.end());
  }
  if (!context.empty()) {
    context = merge_tool_messages(context);
    enc::sort_tool_results_by_call_order(context);
  }
  Messages full = context;
  full.insert(full.end(), messages.begin(), messages.end());

  std::string prompt = opts.add_default_bos_token && context.empty() ? std::string(enc::kBos) : "";

  bool drop = opts.drop_thinking;
  for (const auto& m : full)
    if (truthy(get(m, "tools"))) drop = false;

  long num_to_render, context_len;
  if (opts.thinking && drop) {
    full = enc::drop_thinking_messages(full, find_last_user_index);
    num_to_render = static_cast<long>(full.size()) -
                    static_cast<long>(enc::drop_thinking_messages(context, find_last_user_index).size());
    context_len = static_cast<long>(full.size()) - num_to_render;
  } else {
    num_to_render = static_cast<long>(messages.size());
    context_len = static_cast<long>(context.size());
  }
  for (long idx = 0; idx < num_to_render; ++idx)
    prompt += render_message(static_cast<size_t>(idx + context_len), full, opts.thinking, drop, opts.reasoning_effort);
  return prompt;
}

}  // namespace deepinfer
