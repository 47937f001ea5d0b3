// Python hook into the structured-output matcher (src/structured), for tests and bench/structured.py:
// compile so_args against a tokenizer's vocabulary, sample outputs uniformly over each step's allowed
// tokens ("the grammar decides"), and time the token masks along a given token sequence.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "structured/structured.h"
#include "structured/token_matcher.h"
#include "tokenizer/tokenizer.h"

namespace py = pybind11;

namespace deepinfer::python {

namespace {
using Clock = std::chrono::steady_clock;
using structured::CompiledGrammar;
using structured::GrammarMatcher;
using structured::TokenVocab;

struct PyVocab {
  std::shared_ptr<const TokenVocab> v;
};

struct PyGrammar {
  std::shared_ptr<const TokenVocab> vocab;
  std::shared_ptr<CompiledGrammar> g;
  double compile_seconds = 0;
  PyGrammar(const PyVocab& pv, const std::string& so_args) : vocab(pv.v) {
    const auto t0 = Clock::now();
    auto spec = structured::compile_so_args(nlohmann::json::parse(so_args));
    g = std::make_shared<CompiledGrammar>(spec.grammar, vocab);
    compile_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  // Uniform over the allowed tokens of each step; returns (ids without EOS, ended by EOS).
  std::pair<std::vector<int32_t>, bool> sample(uint64_t seed, int64_t max_tokens) {
    py::gil_scoped_release release;
    std::mt19937_64 rng(seed);
    GrammarMatcher m(g);
    std::vector<int32_t> out;
    while (static_cast<int64_t>(out.size()) < max_tokens) {
      const std::vector<uint32_t>& mask = m.next_token_bitmask();
      int64_t n = 0;
      for (uint32_t w : mask) n += __builtin_popcount(w);
      if (n == 0) break;
      int64_t r = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
      int32_t id = -1;
      for (size_t i = 0; i < mask.size(); ++i) {
        const int c = __builtin_popcount(mask[i]);
        if (r >= c) {
          r -= c;
          continue;
        }
        uint32_t w = mask[i];
        for (; r > 0; --r) w &= w - 1;
        id = static_cast<int32_t>(i * 32 + static_cast<size_t>(__builtin_ctz(w)));
        break;
      }
      if (!m.accept_token(id)) throw std::runtime_error("structured: a token of the mask was rejected");
      if (id == vocab->eos_id()) return {out, true};
      out.push_back(id);
    }
    return {out, false};
  }
  // Steps a fresh matcher over ids (then EOS when `eos`), timing each next_token_bitmask (seconds).
  std::vector<double> time_masks(const std::vector<int32_t>& ids, bool eos) {
    py::gil_scoped_release release;
    GrammarMatcher m(g);
    std::vector<double> t;
    t.reserve(ids.size() + 1);
    auto step = [&](int32_t id) {
      const auto t0 = Clock::now();
      const std::vector<uint32_t>& mask = m.next_token_bitmask();
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      if (!((mask[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1) || !m.accept_token(id))
        throw std::runtime_error("structured: token " + std::to_string(id) + " is not allowed at step " +
                                 std::to_string(t.size() - 1));
    };
    for (int32_t id : ids) step(id);
    if (eos) step(vocab->eos_id());
    return t;
  }
};
}  // namespace

void bind_structured(py::module_& m) {
  py::class_<PyVocab>(m, "StructuredVocab", "A tokenizer's vocabulary for the structured-output matcher.")
      .def(py::init([](const Tokenizer& tok, int64_t vocab_size, int32_t eos_id) {
             return PyVocab{TokenVocab::from_tokenizer(tok, vocab_size, eos_id)};
           }),
           py::arg("tokenizer"), py::arg("vocab_size"), py::arg("eos_id"))
      .def_property_readonly("size", [](const PyVocab& v) { return v.v->size(); });
  py::class_<PyGrammar>(m, "StructuredGrammar",
                        "so_args (JSON text) compiled against a StructuredVocab; masks are cached per state.")
      .def(py::init<const PyVocab&, const std::string&>(), py::arg("vocab"), py::arg("so_args"))
      .def_readonly("compile_seconds", &PyGrammar::compile_seconds)
      .def("sample", &PyGrammar::sample, py::arg("seed"), py::arg("max_tokens"),
           "(ids, ended): each step picks uniformly among the allowed tokens.")
      .def("time_masks", &PyGrammar::time_masks, py::arg("ids"), py::arg("eos") = true,
           "Seconds per next_token_bitmask along ids (and EOS).")
      .def_property_readonly("stats", [](const PyGrammar& p) {
        return py::dict(py::arg("masks") = p.g->stats.masks, py::arg("cache_hits") = p.g->stats.cache_hits,
                        py::arg("bytes_advanced") = p.g->stats.bytes_advanced,
                        py::arg("full_walks") = p.g->stats.full_walks, py::arg("stack_walks") = p.g->stats.stack_walks,
                        py::arg("loop_groups") = p.g->stats.loop_groups);
      });
  m.def("structured_clear_shared_cache", &structured::clear_shared_loop_cache,
        "Drops the process-wide repetition-loop mask entries (benchmarks of cold starts).");
}

}  // namespace deepinfer::python
