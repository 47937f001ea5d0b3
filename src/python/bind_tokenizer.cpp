// Python bindings for the tokenizer (placeholder until it lands).
#include <pybind11/pybind11.h>

namespace deepinfer::python {
void bind_tokenizer(pybind11::module_& m) { (void)m; }
}  // namespace deepinfer::python
