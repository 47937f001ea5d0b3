// The `deepinfer._deepinfer` extension module: each concern binds itself in its own file.
#include <pybind11/pybind11.h>

namespace deepinfer::python {
void bind_tokenizer(pybind11::module_& m);
void bind_encoding(pybind11::module_& m);
void bind_parsers(pybind11::module_& m);
void bind_engine(pybind11::module_& m);
void bind_structured(pybind11::module_& m);
}  // namespace deepinfer::python

PYBIND11_MODULE(_deepinfer, m) {
  m.doc() = "deepinfer native module (tokenizer, prompt encoding, output parsers, offline engine)";
  deepinfer::python::bind_tokenizer(m);
  deepinfer::python::bind_encoding(m);
  deepinfer::python::bind_parsers(m);
  deepinfer::python::bind_engine(m);
  deepinfer::python::bind_structured(m);
}
