// DeepSeek-V4.1 prompt encoder (mirrors encoding/encoding.py: encode_messages, without image
// expansion: each image block renders as one <｜deepseek_image｜> placeholder, as the reference's
// prompt string does).
#include <string>

#include "deepinfer/error.h"
#include "tokenizer/encoding_common.h"

namespace deepinfer {

namespace {

using enc::get;
using enc::Json;
using enc::Messages;
using enc::truthy;

constexpr std::string_view kToolsTemplate = R"(## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{dsml_token}{tc_block_name}>" block like the following:

<{dsml_token}{tc_block_name}>
<{dsml_token}{tool_call_tag_name} name="$TOOL_NAME">
<{dsml_token}{tool_parameter_tag_name} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml_token}{tool_parameter_tag_name}>
...
</{dsml_token}{tool_call_tag_name}>
<{dsml_token}{tool_call_tag_name} name="$TOOL_NAME2">
...
</{dsml_token}{tool_call_tag_name}>
</{dsml_token}{tc_block_name}>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {thinking_start_token}), you MUST output your complete reasoning inside {thinking_start_token}...{thinking_end_token} BEFORE any tool calls or final response.

Otherwise, output directly after {thinking_end_token} with tool calls or final response.

### Available Tool Schemas

{tool_schemas}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
)";

bool is_str(const Json* v, std::string_view s) { return v && v->is_string() && v->get_ref<const std::string&>() == s; }
bool role_is(const Json& msg, std::string_view r) { return is_str(get(msg, "role"), r); }

std::string render_tools(const std::vector<Json>& tools) {
  std::string schemas;
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i) schemas += "\n";
    schemas += python_json_dumps(tools[i]);
  }
  return enc::format_template(kToolsTemplate, {{"tool_schemas", schemas},
                                               {"dsml_token", std::string(enc::kDsml)},
                                               {"tc_block_name", " calls"},
                                               {"tool_call_tag_name", " invoke"},
                                               {"tool_parameter_tag_name", " parameter"},
                                               {"thinking_start_token", std::string(enc::kThinkStart)},
                                               {"thinking_end_token", std::string(enc::kThinkEnd)}});
}

std::string encode_arguments_to_dsml(const enc::ToolCall& tc) {
  Json arguments = tc.arguments;
  if (!arguments.is_object()) {
    // Tolerate JSON strings, including double-encoded ones.
    for (int i = 0; i < 2; ++i) {
      if (!arguments.is_string()) break;
      Json parsed = Json::parse(arguments.get_ref<const std::string&>(), nullptr, false);
      if (parsed.is_discarded()) break;
      arguments = std::move(parsed);
    }
    if (!arguments.is_object()) arguments = Json{{"arguments", tc.arguments}};
  }
  std::string out;
  bool first = true;
  for (const auto& [k, v] : arguments.items()) {
    if (!first) out += "\n";
    first = false;
    out += "<｜DSML｜ parameter name=\"" + k + "\" string=\"" + (v.is_string() ? "true" : "false") + "\">" +
           (v.is_string() ? v.get<std::string>() : python_json_dumps(v)) + "</｜DSML｜ parameter>";
  }
  return out;
}

long find_last_user_index(const Messages& messages) {
  for (long idx = static_cast<long>(messages.size()) - 1; idx >= 0; --idx)
    if (role_is(messages[idx], "user") || (role_is(messages[idx], "system") && idx > 0)) return idx;
  return -1;
}

std::string render_reasoning_effort(size_t index, bool thinking, const Json& effort_in) {
  Json effort = effort_in.is_null() ? Json("high") : effort_in;
  long budget = 0;
  if (effort.is_number_integer()) {
    bool in_range = effort.is_number_unsigned() ? effort.get<uint64_t>() <= 100
                                                : (effort.get<int64_t>() >= 1 && effort.get<int64_t>() <= 100);
    if (in_range) budget = effort.get<long>();
  } else if (effort == "low") {
    budget = 50;
  } else if (effort == "high") {
    budget = 75;
  } else if (effort == "max") {
    budget = 100;
  }
  if (budget < 1)
    fail(
        "prompt encoding (V4.1): invalid reasoning effort {}; it must be an integer within [1, 100] "
        "or one of \"low\", \"high\", \"max\"",
        python_json_dumps(effort));
  if (index == 0 && thinking)
    return "Reasoning Effort: " + std::to_string(budget) +
           " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
  return "";
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

  std::string effort_prompt = render_reasoning_effort(index, thinking, reasoning_effort);
  std::string prompt;
  if (index == 0 && (!effort_prompt.empty() || role_is(msg, "system"))) prompt += enc::kSystem;
  prompt += effort_prompt;

  if (role_is(msg, "system")) {
    if (index > 0) prompt += enc::kSystem;
    prompt += truthy(content) ? enc::py_str(*content) : "";
    if (!tools.empty()) prompt += "\n\n" + render_tools(tools);
    if (truthy(response_format)) prompt += "\n\n" + enc::render_response_format(*response_format);
  } else if (role_is(msg, "user")) {
    prompt += enc::kUser;
    const Json* blocks = get(msg, "content_blocks");
    if (truthy(blocks)) {
      prompt += enc::render_content_blocks(*blocks);
    } else if (truthy(content)) {
      if (!content->is_string()) fail("prompt encoding (V4.1): a user message's content must be a string");
      prompt += content->get<std::string>();
    }
  } else if (role_is(msg, "latest_reminder")) {
    prompt += std::string(enc::kLatestReminder) + enc::py_str(content);
  } else if (role_is(msg, "tool")) {
    fail("prompt encoding (V4.1): tool messages must be merged into user messages first");
  } else if (role_is(msg, "assistant")) {
    std::string tc_content;
    if (!tool_calls.empty()) {
      std::string list;
      for (size_t i = 0; i < tool_calls.size(); ++i) {
        if (i) list += "\n";
        list += "<｜DSML｜ invoke name=\"" + enc::py_str(tool_calls[i].name) + "\">\n" +
                encode_arguments_to_dsml(tool_calls[i]) + "\n</｜DSML｜ invoke>";
      }
      tc_content = "\n\n<｜DSML｜ calls>\n" + list + "\n</｜DSML｜ calls>";
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
    fail("prompt encoding (V4.1): unknown role {} (V4.1 has no developer role)", enc::py_repr(role ? *role : Json()));
  }

  if (index + 1 < messages.size() && !role_is(messages[index + 1], "assistant") &&
      !role_is(messages[index + 1], "latest_reminder"))
    return prompt;

  if (enc::append_task_tokens(prompt, msg, thinking)) return prompt;
  if (role_is(msg, "user") || (role_is(msg, "system") && index > 0)) {
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
    if (role_is(msg, "tool")) {
      const Json* id = get(msg, "tool_call_id");
      const Json* content = get(msg, "content");
      Json block = {
          {"type", "tool_result"}, {"tool_use_id", id ? *id : Json("")}, {"content", content ? *content : Json("")}};
      if (!merged.empty() && role_is(merged.back(), "user") && merged.back().contains("content_blocks")) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        merged.push_back(Json{{"role", "user"}, {"content_blocks", Json::array({std::move(block)})}});
      }
    } else if (role_is(msg, "user")) {
      const Json* cb = get(msg, "content_blocks");
      Json blocks;
      if (enc::is_none(cb)) {
        const Json* content = get(msg, "content");
        blocks = Json::array({Json{{"type", "text"}, {"text", content ? *content : Json("")}}});
      } else {
        if (!cb->is_array()) fail("prompt encoding (V4.1): content_blocks must be a list");
        blocks = *cb;
      }
      if (!merged.empty() && role_is(merged.back(), "user") && merged.back().contains("content_blocks") &&
          enc::is_none(get(merged.back(), "task"))) {
        Json& prev = merged.back()["content_blocks"];
        if (!prev.is_array()) fail("prompt encoding (V4.1): content_blocks must be a list");
        for (auto& b : blocks) prev.push_back(std::move(b));
      } else {
        Json m = msg;
        m["content_blocks"] = std::move(blocks);
        merged.push_back(std::move(m));
      }
    } else {
      merged.push_back(msg);
    }
  }
  return merged;
}

// ---- image blocks (process_image_messages) ----

bool is_image_block(const Json& b) {
  return b.is_object() && (is_str(get(b, "type"), "image") || is_str(get(b, "type"), "image_url"));
}

void check_image_source(const Json& block) {
  Json record = Json::object();
  if (is_str(get(block, "type"), "image_url")) {
    const Json* iu = get(block, "image_url");
    if (iu && iu->is_string()) {
      record["url"] = *iu;
    } else if (!truthy(iu)) {
      record["url"] = "";
    } else {
      if (!iu->is_object()) fail("prompt encoding (V4.1): image_url must be a string or an object with \"url\"");
      const Json* url = get(*iu, "url");
      record["url"] = url ? *url : Json("");
    }
  } else {
    for (const char* key : {"source", "url", "data"})
      if (const Json* v = get(block, key)) record[key] = *v;
  }
  bool any = false;
  for (const char* key : {"source", "url", "data"}) any = any || truthy(get(record, key));
  if (!any) fail("prompt encoding (V4.1): image block does not contain a valid source");
}

Json process_image_blocks(const Json& blocks) {
  Json out = Json::array();
  for (const auto& block : blocks) {
    if (!block.is_object()) {
      out.push_back(block);
      continue;
    }
    const Json* type = get(block, "type");
    const Json* bc = get(block, "content");
    if (is_image_block(block)) {
      check_image_source(block);
      out.push_back(Json{{"type", "text"}, {"text", std::string(enc::kImage)}});
    } else if (is_str(type, "tool_result") && bc && bc->is_array()) {
      Json copy = block;
      copy["content"] = process_image_blocks(*bc);
      out.push_back(std::move(copy));
    } else if (is_str(type, "text")) {
      const Json* text = get(block, "text");
      if (truthy(text)) {
        bool contains = false;
        if (text->is_string()) {
          contains = text->get_ref<const std::string&>().find(enc::kImage) != std::string::npos;
        } else if (text->is_array()) {
          for (const auto& e : *text) contains = contains || e == std::string(enc::kImage);
        } else if (text->is_object()) {
          contains = text->contains(std::string(enc::kImage));
        } else {
          fail("prompt encoding (V4.1): a text block's text must be a string");
        }
        if (contains)
          fail(
              "prompt encoding (V4.1): text block contains the image placeholder '{}'; images must be "
              "separate content blocks",
              enc::kImage);
      }
      out.push_back(block);
    } else {
      out.push_back(block);
    }
  }
  return out;
}

Messages process_image_messages(const Messages& messages) {
  Messages out;
  for (Json msg : messages) {
    const Json* content = get(msg, "content");
    if (content && content->is_string() &&
        content->get_ref<const std::string&>().find(enc::kImage) != std::string::npos)
      fail(
          "prompt encoding (V4.1): message content contains the image special token '{}'; images must "
          "be given as image content blocks",
          enc::kImage);
    const Json* rc = get(msg, "reasoning_content");
    if (rc && rc->is_string() && rc->get_ref<const std::string&>().find(enc::kImage) != std::string::npos)
      fail("prompt encoding (V4.1): reasoning_content contains the image special token '{}'", enc::kImage);

    if (content && content->is_array() && !msg.contains("content_blocks")) {
      msg["content_blocks"] = *content;
      msg.erase("content");
    }
    if (truthy(get(msg, "content_blocks"))) {
      if (!msg["content_blocks"].is_array()) fail("prompt encoding (V4.1): content_blocks must be a list");
      msg["content_blocks"] = process_image_blocks(msg["content_blocks"]);
      const Json* c = get(msg, "content");
      if (!(c && c->is_string())) {
        std::vector<Json> texts;
        for (const auto& b : msg["content_blocks"])
          if (b.is_object() && is_str(get(b, "type"), "text")) {
            const Json* t = get(b, "text");
            texts.push_back(t ? *t : Json(""));
          }
        std::vector<const Json*> ptrs;
        for (const auto& t : texts) ptrs.push_back(&t);
        msg["content"] = enc::join_strings(ptrs, "\n\n", "a text block's text");
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace

std::string encode_messages_v41(const nlohmann::ordered_json& messages_in, const EncodeOptions& opts) {
  Messages raw = enc::to_message_list(enc::apply_message_options(messages_in, opts), "messages");
  Messages context;
  if (truthy(opts.context)) context = process_image_messages(enc::to_message_list(opts.context, "context"));
  Messages messages = process_image_messages(raw);

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
