// Python bindings for the streaming output parsers: deepinfer.ReasoningParser, ToolCallParser,
// ChatOutputParser. feed() takes str or bytes; feed()/finish() return dicts of str. Each text stream
// passes through a Utf8Carry, so bytes split inside a character come out whole (invalid UTF-8 is
// decoded with U+FFFD replacement).
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "tokenizer/parsers.h"

namespace py = pybind11;
using namespace deepinfer::parsers;

namespace deepinfer::python {
namespace {

std::string chunk_bytes(const py::object& chunk) {
  if (py::isinstance<py::bytes>(chunk)) return chunk.cast<std::string>();
  if (py::isinstance<py::str>(chunk)) return chunk.cast<std::string>();
  throw py::type_error("feed() expects str or bytes");
}

py::str to_str(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::list calls_to_py(const std::vector<ToolCall>& calls) {
  py::list l;
  for (const auto& c : calls) {
    py::dict fn;
    fn["name"] = to_str(c.name);
    fn["arguments"] = to_str(c.arguments);
    py::dict d;
    d["index"] = c.index;
    d["id"] = to_str(c.id);
    d["type"] = "function";
    d["function"] = fn;
    l.append(d);
  }
  return l;
}

Family family_from(const std::string& f) {
  if (f == "v4" || f == "V4") return Family::kV4;
  if (f == "v4.1" || f == "v41" || f == "V4.1" || f == "V41") return Family::kV41;
  throw py::value_error("family must be 'v4' or 'v4.1'");
}

ToolCallParser::IdGenerator id_gen_from(const py::object& gen) {
  if (gen.is_none()) return {};
  py::function fn = gen;
  return [fn](std::size_t index) {
    py::gil_scoped_acquire g;
    return fn(index).cast<std::string>();
  };
}

struct PyReasoning {
  ReasoningParser p;
  Utf8Carry r, c;
  py::dict wrap(ReasoningParser::Deltas d, bool end) {
    py::dict o;
    o["reasoning"] = to_str(r.push(d.reasoning) + (end ? r.finish() : ""));
    o["content"] = to_str(c.push(d.content) + (end ? c.finish() : ""));
    return o;
  }
};

struct PyTools {
  ToolCallParser p;
  Utf8Carry c;
  py::dict wrap(ToolCallParser::Deltas d, bool end) {
    py::dict o;
    o["content"] = to_str(c.push(d.content) + (end ? c.finish() : ""));
    o["tool_calls"] = calls_to_py(d.tool_calls);
    return o;
  }
};

struct PyChat {
  ChatOutputParser p;
  Utf8Carry r, c;
  py::dict wrap(ChatOutputParser::Deltas d, bool end) {
    py::dict o;
    o["reasoning"] = to_str(r.push(d.reasoning) + (end ? r.finish() : ""));
    o["content"] = to_str(c.push(d.content) + (end ? c.finish() : ""));
    o["tool_calls"] = calls_to_py(d.tool_calls);
    return o;
  }
};

}  // namespace

void bind_parsers(py::module_& m) {
  py::class_<PyReasoning>(m, "ReasoningParser",
                          "Separates <think>…</think> reasoning from content, streamed. "
                          "starts_in_reasoning=True in thinking mode (the prompt ends with <think>).")
      .def(py::init([](bool starts_in_reasoning) {
             return new PyReasoning{ReasoningParser(starts_in_reasoning), {}, {}};
           }),
           py::arg("starts_in_reasoning") = true)
      .def(
          "feed", [](PyReasoning& s, const py::object& chunk) { return s.wrap(s.p.feed(chunk_bytes(chunk)), false); },
          "feed(chunk: str | bytes) -> {'reasoning': str, 'content': str}")
      .def("finish", [](PyReasoning& s) { return s.wrap(s.p.finish(), true); })
      .def_property_readonly("in_reasoning", [](const PyReasoning& s) { return s.p.in_reasoning(); });

  py::class_<PyTools>(m, "ToolCallParser",
                      "Parses DSML tool-call blocks out of content, streamed. family: 'v4' or 'v4.1'; "
                      "id_generator(index) -> str (default 'call_<index>').")
      .def(py::init([](const std::string& family, const py::object& gen) {
             return new PyTools{ToolCallParser(family_from(family), id_gen_from(gen)), {}};
           }),
           py::arg("family") = "v4", py::arg("id_generator") = py::none())
      .def(
          "feed", [](PyTools& s, const py::object& chunk) { return s.wrap(s.p.feed(chunk_bytes(chunk)), false); },
          "feed(chunk: str | bytes) -> {'content': str, 'tool_calls': [ {index, id, type, function: {name, arguments}} "
          "]}")
      .def("finish", [](PyTools& s) { return s.wrap(s.p.finish(), true); })
      .def_property_readonly("num_tool_calls", [](const PyTools& s) { return s.p.num_tool_calls(); });

  py::class_<PyChat>(m, "ChatOutputParser",
                     "Reasoning → content → DSML tool calls, as a server uses it. family: 'v4' or 'v4.1'.")
      .def(py::init([](const std::string& family, bool thinking, const py::object& gen) {
             return new PyChat{ChatOutputParser(family_from(family), thinking, id_gen_from(gen)), {}, {}};
           }),
           py::arg("family") = "v4", py::arg("thinking") = true, py::arg("id_generator") = py::none())
      .def(
          "feed", [](PyChat& s, const py::object& chunk) { return s.wrap(s.p.feed(chunk_bytes(chunk)), false); },
          "feed(chunk: str | bytes) -> {'reasoning': str, 'content': str, 'tool_calls': [...]}")
      .def("finish", [](PyChat& s) { return s.wrap(s.p.finish(), true); })
      .def_property_readonly("num_tool_calls", [](const PyChat& s) { return s.p.num_tool_calls(); });
}

}  // namespace deepinfer::python
