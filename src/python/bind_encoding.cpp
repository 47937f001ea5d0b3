// Python bindings for the V4 / V4.1 prompt encoders: deepinfer.encode_messages(...).
#include <pybind11/pybind11.h>

#include <string>

#include "deepinfer/error.h"
#include "tokenizer/encoding.h"

namespace py = pybind11;

namespace deepinfer::python {

namespace {

// Python object -> ordered JSON through json.dumps (keeps dict order, like the reference sees it).
nlohmann::ordered_json to_json(const py::object& obj, const char* what) {
  if (obj.is_none()) return nullptr;
  // Not cached in a static: a py::object destroyed after interpreter finalisation aborts the process.
  py::object dumps = py::module_::import("json").attr("dumps");
  std::string text;
  try {
    text = py::cast<std::string>(dumps(obj, py::arg("ensure_ascii") = false));
  } catch (py::error_already_set& e) {
    throw py::value_error(std::string("encode_messages: ") + what + " is not JSON-serialisable: " + e.what());
  }
  auto parsed = nlohmann::ordered_json::parse(text, nullptr, false);
  if (parsed.is_discarded()) throw py::value_error(std::string("encode_messages: cannot convert ") + what);
  return parsed;
}

std::string encode(const py::object& messages, const std::string& family, bool thinking,
                   const py::object& reasoning_effort, const py::object& tools, const py::object& response_format,
                   bool drop_thinking, bool add_default_bos_token, const py::object& context,
                   const py::object& thinking_mode) {
  EncodeOptions opts;
  if (family == "v4")
    opts.family = EncodingFamily::kV4;
  else if (family == "v41" || family == "v4.1")
    opts.family = EncodingFamily::kV41;
  else
    throw py::value_error("encode_messages: family must be \"v4\" or \"v41\", got \"" + family + "\"");
  opts.thinking = thinking;
  if (!thinking_mode.is_none()) {
    auto mode = py::cast<std::string>(thinking_mode);
    if (mode != "thinking" && mode != "chat")
      throw py::value_error("encode_messages: invalid thinking_mode \"" + mode + "\" (\"chat\" or \"thinking\")");
    opts.thinking = mode == "thinking";
  }
  opts.reasoning_effort = to_json(reasoning_effort, "reasoning_effort");
  opts.tools = to_json(tools, "tools");
  opts.response_format = to_json(response_format, "response_format");
  opts.drop_thinking = drop_thinking;
  opts.add_default_bos_token = add_default_bos_token;
  opts.context = to_json(context, "context");
  auto msgs = to_json(messages, "messages");
  try {
    py::gil_scoped_release release;
    return encode_messages(msgs, opts);
  } catch (const Error& e) {
    throw py::value_error(e.what());
  }
}

}  // namespace

void bind_encoding(py::module_& m) {
  m.def("encode_messages", &encode, py::arg("messages"), py::kw_only(), py::arg("family") = "v41",
        py::arg("thinking") = true, py::arg("reasoning_effort") = py::none(), py::arg("tools") = py::none(),
        py::arg("response_format") = py::none(), py::arg("drop_thinking") = true,
        py::arg("add_default_bos_token") = true, py::arg("context") = py::none(), py::arg("thinking_mode") = py::none(),
        R"(Render OpenAI-format chat messages into the DeepSeek prompt string, byte-identical to
DeepSeek's reference encoders (family "v4": encoding_dsv4.py, "v41": encoding/encoding.py).

thinking / thinking_mode ("thinking" | "chat") pick the mode; reasoning_effort is None, "high",
"max" (V4) or None, "low", "high", "max", an int 1..100 (V4.1); tools / response_format are set
on messages[0] (as the reference's load_cases does); context holds earlier, already-encoded
messages; an assistant message with "wo_eos": True is left open (prefix continuation).
Raises ValueError for anything the reference rejects.)");
}

}  // namespace deepinfer::python
