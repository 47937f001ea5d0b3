#include "tokenizer/encoding_common.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "deepinfer/error.h"
#include "tokenizer/json_escape.h"

namespace deepinfer::enc {

namespace {

const char* type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "NoneType";
    case Json::value_t::boolean:
      return "bool";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "int";
    case Json::value_t::number_float:
      return "float";
    case Json::value_t::string:
      return "str";
    case Json::value_t::array:
      return "list";
    case Json::value_t::object:
      return "dict";
    default:
      return "value";
  }
}

// Decodes one UTF-8 code point at s[i]; advances i. Invalid bytes come back as themselves.
uint32_t next_cp(std::string_view s, size_t& i) {
  auto c = static_cast<unsigned char>(s[i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return c;
  }
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

// Approximation of Python's str.isprintable for one code point (categories Cc, Cf, Cs, Co, Zl,
// Zp and Zs other than space are not printable; unassigned code points are not covered).
bool py_printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if ((cp >= 0x600 && cp <= 0x605) || cp == 0x61C || cp == 0x6DD || cp == 0x70F || cp == 0x8E2 || cp == 0x180E ||
      cp == 0x1680)
    return false;
  if ((cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x205F && cp <= 0x2064) ||
      (cp >= 0x2066 && cp <= 0x206F) || cp == 0x3000)
    return false;
  if ((cp >= 0xD800 && cp <= 0xF8FF) || cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB)) return false;
  if (cp == 0x110BD || cp == 0x110CD || (cp >= 0x1BCA0 && cp <= 0x1BCA3) || (cp >= 0x1D173 && cp <= 0x1D17A) ||
      cp == 0xE0001 || (cp >= 0xE0020 && cp <= 0xE007F))
    return false;
  if (cp >= 0xF0000) return false;
  return true;
}

std::string hex(uint32_t v, int width) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%0*x", width, v);
  return buf;
}

std::string py_str_repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    uint32_t cp = next_cp(s, i);
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x20 || cp == 0x7F) {
      out += "\\x" + hex(cp, 2);
    } else if (cp < 0x7F) {
      out += static_cast<char>(cp);
    } else if (py_printable(cp)) {
      out.append(s.substr(start, i - start));
    } else if (cp <= 0xFF) {
      out += "\\x" + hex(cp, 2);
    } else if (cp <= 0xFFFF) {
      out += "\\u" + hex(cp, 4);
    } else {
      out += "\\U" + hex(cp, 8);
    }
  }
  out += quote;
  return out;
}

void dump_string(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) append_json_escaped(out, static_cast<unsigned char>(ch));
  out += '"';
}

void dump(std::string& out, const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      out += "null";
      break;
    case Json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case Json::value_t::number_integer:
      out += std::to_string(v.get<int64_t>());
      break;
    case Json::value_t::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      break;
    case Json::value_t::number_float: {
      double d = v.get<double>();
      if (std::isnan(d))
        out += "NaN";
      else if (std::isinf(d))
        out += d > 0 ? "Infinity" : "-Infinity";
      else
        out += py_float_repr(d);
      break;
    }
    case Json::value_t::string:
      dump_string(out, v.get_ref<const std::string&>());
      break;
    case Json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        dump(out, e);
      }
      out += ']';
      break;
    }
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.items()) {
        if (!first) out += ", ";
        first = false;
        dump_string(out, k);
        out += ": ";
        dump(out, e);
      }
      out += '}';
      break;
    }
    default:
      fail("prompt encoding: cannot serialise a binary JSON value");
  }
}

}  // namespace

const Json* get(const Json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(std::string(key));
  return it == obj.end() ? nullptr : &*it;
}

bool truthy(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return false;
    case Json::value_t::boolean:
      return v.get<bool>();
    case Json::value_t::number_integer:
      return v.get<int64_t>() != 0;
    case Json::value_t::number_unsigned:
      return v.get<uint64_t>() != 0;
    case Json::value_t::number_float:
      return v.get<double>() != 0.0;
    case Json::value_t::string:
      return !v.get_ref<const std::string&>().empty();
    case Json::value_t::array:
    case Json::value_t::object:
      return !v.empty();
    default:
      return true;
  }
}
bool truthy(const Json* v) { return v != nullptr && truthy(*v); }
bool is_none(const Json* v) { return v == nullptr || v->is_null(); }

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (!sci.empty() && sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  auto epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  int exp10 = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  int decpt = exp10 + 1;
  int nd = static_cast<int>(digits.size());
  if (exp10 < -4 || exp10 >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (nd > 1) out += "." + digits.substr(1);
    out += exp10 < 0 ? "e-" : "e+";
    int ae = std::abs(exp10);
    if (ae < 10) out += "0";
    out += std::to_string(ae);
    return out;
  }
  if (decpt <= 0) return sign + "0." + std::string(-decpt, '0') + digits;
  if (decpt >= nd) return sign + digits + std::string(decpt - nd, '0') + ".0";
  return sign + digits.substr(0, decpt) + "." + digits.substr(decpt);
}

std::string py_repr(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "None";
    case Json::value_t::boolean:
      return v.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer:
      return std::to_string(v.get<int64_t>());
    case Json::value_t::number_unsigned:
      return std::to_string(v.get<uint64_t>());
    case Json::value_t::number_float:
      return py_float_repr(v.get<double>());
    case Json::value_t::string:
      return py_str_repr(v.get_ref<const std::string&>());
    case Json::value_t::array: {
      std::string out = "[";
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        out += py_repr(e);
      }
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, e] : v.items()) {
        if (!first) out += ", ";
        first = false;
        out += py_str_repr(k) + ": " + py_repr(e);
      }
      return out + "}";
    }
    default:
      return "<binary>";
  }
}

std::string py_str(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  return py_repr(v);
}
std::string py_str(const Json* v) { return v ? py_str(*v) : std::string("None"); }

bool py_equal(const Json& a, const Json& b) {
  auto numeric = [](const Json& x) { return x.is_number() || x.is_boolean(); };
  if (numeric(a) && numeric(b)) {
    auto as_double = [](const Json& x) { return x.is_boolean() ? (x.get<bool>() ? 1.0 : 0.0) : x.get<double>(); };
    if ((a.is_number_integer() || a.is_boolean()) && (b.is_number_integer() || b.is_boolean())) {
      auto as_int = [](const Json& x) -> long double {
        if (x.is_boolean()) return x.get<bool>() ? 1 : 0;
        if (x.is_number_unsigned()) return static_cast<long double>(x.get<uint64_t>());
        return static_cast<long double>(x.get<int64_t>());
      };
      return as_int(a) == as_int(b);
    }
    return as_double(a) == as_double(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!py_equal(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, e] : a.items()) {
      const Json* other = get(b, k);
      if (!other || !py_equal(e, *other)) return false;
    }
    return true;
  }
  return a == b;
}

std::string join_strings(const std::vector<const Json*>& parts, std::string_view sep, std::string_view what) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Json* p = parts[i];
    if (!p || !p->is_string())
      fail("prompt encoding: {} must be a string, got {} (the reference fails joining it)", what,
           p ? type_name(*p) : "NoneType");
    if (i) out += sep;
    out += p->get_ref<const std::string&>();
  }
  return out;
}

Messages to_message_list(const Json& messages, std::string_view what) {
  if (!messages.is_array()) fail("prompt encoding: {} must be a list of messages, got {}", what, type_name(messages));
  Messages out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object())
      fail("prompt encoding: {}[{}] must be an object (a message), got {}", what, i, type_name(messages[i]));
    out.push_back(messages[i]);
  }
  return out;
}

void check_hashable_role(const Json* role) {
  if (role && (role->is_array() || role->is_object()))
    fail("prompt encoding: a message role must be a string, got {}", type_name(*role));
}

namespace {
bool is_str(const Json* v, std::string_view s) { return v && v->is_string() && v->get_ref<const std::string&>() == s; }
void check_hashable(const Json& v, std::string_view what) {
  if (v.is_array() || v.is_object())
    fail("prompt encoding: {} must be a string id, got unhashable {}", what, type_name(v));
}
}  // namespace

void sort_tool_results_by_call_order(Messages& messages) {
  std::vector<std::pair<Json, long>> order;  // last_tool_call_order, insertion-ordered
  for (auto& msg : messages) {
    const Json* role = get(msg, "role");
    if (is_str(role, "assistant") && truthy(get(msg, "tool_calls"))) {
      order.clear();
      const Json& tcs = msg["tool_calls"];
      if (!tcs.is_array()) fail("prompt encoding: assistant tool_calls must be a list, got {}", type_name(tcs));
      for (size_t idx = 0; idx < tcs.size(); ++idx) {
        const Json& tc = tcs[idx];
        if (!tc.is_object()) fail("prompt encoding: tool_calls[{}] must be an object, got {}", idx, type_name(tc));
        Json tc_id;
        const Json* id = get(tc, "id");
        if (truthy(id)) {
          tc_id = *id;
        } else {
          const Json* fn = get(tc, "function");
          if (fn == nullptr) {
            tc_id = "";
          } else {
            if (!fn->is_object())
              fail("prompt encoding: tool_calls[{}].function must be an object, got {}", idx, type_name(*fn));
            const Json* fid = get(*fn, "id");
            tc_id = fid ? *fid : Json("");
          }
        }
        if (truthy(tc_id)) {
          check_hashable(tc_id, "a tool call id");
          auto it = std::find_if(order.begin(), order.end(), [&](const auto& p) { return py_equal(p.first, tc_id); });
          if (it != order.end())
            it->second = static_cast<long>(idx);
          else
            order.emplace_back(tc_id, static_cast<long>(idx));
        }
      }
    } else if (is_str(role, "user") && truthy(get(msg, "content_blocks"))) {
      Json& blocks = msg["content_blocks"];
      if (!blocks.is_array()) fail("prompt encoding: content_blocks must be a list, got {}", type_name(blocks));
      std::vector<Json> tool_blocks;
      for (const auto& b : blocks) {
        if (!b.is_object()) fail("prompt encoding: a user content block must be an object, got {}", type_name(b));
        if (is_str(get(b, "type"), "tool_result")) tool_blocks.push_back(b);
      }
      if (tool_blocks.size() > 1 && !order.empty()) {
        auto key = [&](const Json& b) -> long {
          const Json* id = get(b, "tool_use_id");
          Json k = id ? *id : Json("");
          check_hashable(k, "a tool result's tool_call_id");
          for (const auto& [oid, idx] : order)
            if (py_equal(oid, k)) return idx;
          return 0;
        };
        std::vector<std::pair<long, size_t>> keyed;
        for (size_t i = 0; i < tool_blocks.size(); ++i) keyed.emplace_back(key(tool_blocks[i]), i);
        std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        size_t sorted_idx = 0;
        Json new_blocks = Json::array();
        for (const auto& b : blocks) {
          if (is_str(get(b, "type"), "tool_result"))
            new_blocks.push_back(tool_blocks[keyed[sorted_idx++].second]);
          else
            new_blocks.push_back(b);
        }
        blocks = std::move(new_blocks);
      }
    }
  }
}

Messages drop_thinking_messages(const Messages& messages, const std::function<long(const Messages&)>& last_user_index) {
  long last_user = last_user_index(messages);
  Messages result;
  for (size_t idx = 0; idx < messages.size(); ++idx) {
    const Json& msg = messages[idx];
    const Json* role = get(msg, "role");
    check_hashable_role(role);
    bool keep_role = role && role->is_string() &&
                     (*role == "user" || *role == "system" || *role == "tool" || *role == "latest_reminder" ||
                      *role == "direct_search_results");
    if (keep_role || static_cast<long>(idx) >= last_user) {
      result.push_back(msg);
    } else if (is_str(role, "assistant")) {
      Json copy = msg;
      copy.erase("reasoning_content");
      result.push_back(std::move(copy));
    }
  }
  return result;
}

std::string render_content_blocks(const Json& blocks) {
  std::vector<std::string> parts;
  for (const auto& block : blocks) {
    if (!block.is_object()) fail("prompt encoding: a content block must be an object, got {}", type_name(block));
    const Json* type = get(block, "type");
    if (is_str(type, "text")) {
      const Json* text = get(block, "text");
      Json empty = "";
      parts.push_back(join_strings({text ? text : &empty}, "", "a text block's text"));
    } else if (is_str(type, "tool_result")) {
      const Json* content = get(block, "content");
      std::string tool_content;
      if (content && content->is_array()) {
        std::vector<Json> text_parts;
        for (const auto& b : *content) {
          if (!b.is_object())
            fail("prompt encoding: a tool result content part must be an object, got {}", type_name(b));
          const Json* bt = get(b, "type");
          if (is_str(bt, "text")) {
            const Json* t = get(b, "text");
            text_parts.push_back(t ? *t : Json(""));
          } else {
            text_parts.push_back("[Unsupported " + py_str(bt) + "]");
          }
        }
        std::vector<const Json*> ptrs;
        for (const auto& t : text_parts) ptrs.push_back(&t);
        tool_content = join_strings(ptrs, "\n\n", "a tool result's text part");
      } else {
        tool_content = content ? py_str(*content) : std::string();
      }
      parts.push_back("<tool_result>" + tool_content + "</tool_result>");
    } else {
      parts.push_back("[Unsupported " + py_str(type) + "]");
    }
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += "\n\n";
    out += parts[i];
  }
  return out;
}

bool append_task_tokens(std::string& prompt, const Json& msg, bool thinking) {
  const Json* task = get(msg, "task");
  if (is_none(task)) return false;
  static const std::pair<std::string_view, std::string_view> kTasks[] = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};
  std::string_view token;
  if (task->is_string())
    for (const auto& [name, tok] : kTasks)
      if (task->get_ref<const std::string&>() == name) token = tok;
  if (token.empty())
    fail("prompt encoding: invalid task '{}'; valid tasks are action, query, authority, domain, title, read_url",
         py_str(*task));
  if (*task != "action") {
    prompt += token;
  } else {
    prompt += kAssistant;
    prompt += thinking ? kThinkStart : kThinkEnd;
    prompt += token;
  }
  return true;
}

std::vector<Json> tools_from_openai_format(const Json& tools) {
  if (!tools.is_array()) fail("prompt encoding: tools must be a list of OpenAI tools, got {}", type_name(tools));
  std::vector<Json> out;
  for (const auto& t : tools) {
    const Json* fn = get(t, "function");
    if (!fn) fail("prompt encoding: each tool must be an object with a \"function\" key (OpenAI format)");
    out.push_back(*fn);
  }
  return out;
}

std::vector<ToolCall> tool_calls_from_openai_format(const Json& tool_calls) {
  if (!tool_calls.is_array()) fail("prompt encoding: tool_calls must be a list, got {}", type_name(tool_calls));
  std::vector<ToolCall> out;
  for (const auto& tc : tool_calls) {
    const Json* fn = get(tc, "function");
    if (!fn || !fn->is_object()) fail("prompt encoding: each tool call needs a \"function\" object (OpenAI format)");
    const Json* name = get(*fn, "name");
    const Json* args = get(*fn, "arguments");
    if (!name) fail("prompt encoding: a tool call's function has no \"name\"");
    if (!args) fail("prompt encoding: a tool call's function has no \"arguments\"");
    out.push_back({*name, *args});
  }
  return out;
}

std::string render_response_format(const Json& response_format) {
  return "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
         python_json_dumps(response_format);
}

std::string format_template(std::string_view tmpl, const std::vector<std::pair<std::string_view, std::string>>& subs) {
  std::string out;
  size_t i = 0;
  while (i < tmpl.size()) {
    if (tmpl[i] == '{') {
      auto close = tmpl.find('}', i);
      if (close != std::string_view::npos) {
        auto name = tmpl.substr(i + 1, close - i - 1);
        bool done = false;
        for (const auto& [k, v] : subs)
          if (k == name) {
            out += v;
            done = true;
            break;
          }
        if (done) {
          i = close + 1;
          continue;
        }
      }
    }
    out += tmpl[i++];
  }
  return out;
}

Json apply_message_options(const Json& messages, const EncodeOptions& opts) {
  if (opts.tools.is_null() && opts.response_format.is_null()) return messages;
  if (!messages.is_array() || messages.empty())
    fail("prompt encoding: tools / response_format options need at least one message to attach to");
  if (!messages[0].is_object()) fail("prompt encoding: messages[0] must be an object");
  Json out = messages;
  if (!opts.tools.is_null()) out[0]["tools"] = opts.tools;
  if (!opts.response_format.is_null()) out[0]["response_format"] = opts.response_format;
  return out;
}

}  // namespace deepinfer::enc

namespace deepinfer {

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  enc::dump(out, value);
  return out;
}

std::string encode_messages(const nlohmann::ordered_json& messages, const EncodeOptions& opts) {
  return opts.family == EncodingFamily::kV4 ? encode_messages_v4(messages, opts) : encode_messages_v41(messages, opts);
}

std::string encode_messages(const nlohmann::json& messages, const EncodeOptions& opts) {
  return encode_messages(nlohmann::ordered_json::parse(messages.dump()), opts);
}

std::string encode_messages_json(std::string_view messages_json, const EncodeOptions& opts) {
  auto parsed = nlohmann::ordered_json::parse(messages_json, nullptr, false);
  if (parsed.is_discarded()) fail("prompt encoding: the messages are not valid JSON");
  return encode_messages(parsed, opts);
}

}  // namespace deepinfer
