// Python bindings for the encoding (placeholder until it lands).
#include <pybind11/pybind11.h>

namespace deepinfer::python {
void bind_encoding(pybind11::module_& m) { (void)m; }
}  // namespace deepinfer::python
