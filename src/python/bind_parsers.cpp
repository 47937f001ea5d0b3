// Python bindings for the parsers (placeholder until it lands).
#include <pybind11/pybind11.h>

namespace deepinfer::python {
void bind_parsers(pybind11::module_& m) { (void)m; }
}  // namespace deepinfer::python
