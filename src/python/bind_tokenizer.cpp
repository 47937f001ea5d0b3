// Python bindings for the tokenizer: deepinfer.Tokenizer and deepinfer.IncrementalDetokenizer.
#include <deepinfer/error.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "tokenizer/tokenizer.h"

namespace py = pybind11;

namespace deepinfer::python {

namespace {
// Strings longer than this are encoded with the GIL released.
constexpr size_t kReleaseGilBytes = 4096;

std::vector<int32_t> encode_view(const Tokenizer& t, std::string_view text, bool add_special) {
  if (text.size() >= kReleaseGilBytes) {
    py::gil_scoped_release release;
    return t.encode(text, add_special);
  }
  return t.encode(text, add_special);
}
}  // namespace

void bind_tokenizer(py::module_& m) {
  // deepinfer::Error surfaces as deepinfer.Error (a ValueError subclass).
  static py::exception<Error> error_type(m, "Error", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(error_type.ptr(), e.what());
    }
  });

  py::class_<Tokenizer>(m, "Tokenizer", "Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json.")
      .def_static("from_file", &Tokenizer::from_file, py::arg("path"), "Load a tokenizer.json file.")
      .def_static("from_pretrained", &Tokenizer::from_pretrained, py::arg("dir"),
                  "Load dir/tokenizer.json and dir/tokenizer_config.json (bos/eos, add_bos_token).")
      .def_static(
          "from_json_string", [](const std::string& s) { return Tokenizer::from_json_string(s); }, py::arg("json"))
      .def(
          "encode",
          [](const Tokenizer& t, py::str text, bool add_special) {
            Py_ssize_t n = 0;
            const char* data = PyUnicode_AsUTF8AndSize(text.ptr(), &n);
            if (!data) {
              PyErr_Clear();
              throw Error(
                  "tokenizer: the text cannot be encoded as UTF-8 (it holds a lone surrogate); "
                  "pass valid Unicode text");
            }
            return encode_view(t, std::string_view(data, size_t(n)), add_special);
          },
          py::arg("text"), py::arg("add_special_tokens") = false, "Token ids of text (a list of int).")
      .def(
          "encode_bytes",
          [](const Tokenizer& t, py::bytes data, bool add_special) {
            char* buf = nullptr;
            Py_ssize_t n = 0;
            PyBytes_AsStringAndSize(data.ptr(), &buf, &n);
            return encode_view(t, std::string_view(buf, size_t(n)), add_special);
          },
          py::arg("data"), py::arg("add_special_tokens") = false,
          "Token ids of UTF-8 bytes; invalid UTF-8 raises deepinfer.Error naming the byte offset.")
      .def("decode", &Tokenizer::decode, py::arg("ids"), py::arg("skip_special_tokens") = false)
      .def("token_to_id", &Tokenizer::token_to_id, py::arg("token"))
      .def("id_to_token", &Tokenizer::id_to_token, py::arg("id"))
      .def(
          "token_bytes", [](const Tokenizer& t, int32_t id) { return py::bytes(t.token_bytes(id)); }, py::arg("id"))
      .def("is_special", &Tokenizer::is_special, py::arg("id"))
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def_property_readonly("bos_id", &Tokenizer::bos_id)
      .def_property_readonly("eos_id", &Tokenizer::eos_id)
      .def_property_readonly("add_bos_token", &Tokenizer::add_bos_token);

  py::class_<IncrementalDetokenizer>(m, "IncrementalDetokenizer",
                                     "Streams text as token ids arrive (never half a UTF-8 character).")
      .def(py::init<const Tokenizer&, bool>(), py::arg("tokenizer"), py::arg("skip_special_tokens") = false,
           py::keep_alive<1, 2>())
      .def("push", &IncrementalDetokenizer::push, py::arg("id"), "Newly completed text for one more id.")
      .def(
          "push_many",
          [](IncrementalDetokenizer& d, const std::vector<int32_t>& ids) {
            std::string out;
            for (int32_t id : ids) out += d.push(id);
            return out;
          },
          py::arg("ids"))
      .def("flush", &IncrementalDetokenizer::flush, "The remaining text (an incomplete tail becomes U+FFFD).")
      .def_property_readonly("pending_bytes", &IncrementalDetokenizer::pending_bytes);
}

}  // namespace deepinfer::python
