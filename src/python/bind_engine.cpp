// Python bindings of the offline engine: SamplingParams, the outputs, and a native Engine that
// python/deepinfer/llm.py wraps into vLLM's `LLM` shape.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>

#include "engine/engine_core.h"
#include "sampling/sampling_params.h"

namespace py = pybind11;

namespace deepinfer::python {

namespace {

// Python values -> JSON through the json module (keeps ints, floats, strings, lists, dicts exact).
nlohmann::json to_json(const py::handle& obj) {
  py::object dumps = py::module_::import("json").attr("dumps");
  return nlohmann::json::parse(py::cast<std::string>(dumps(obj)));
}

SamplingParams make_params(const py::kwargs& kw) {
  nlohmann::json j = nlohmann::json::object();
  for (auto item : kw) j[py::cast<std::string>(item.first)] = to_json(item.second);
  return SamplingParams::from_json(j);
}

EngineArgs make_args(const std::string& model, const py::kwargs& kw) {
  EngineArgs a;
  a.model = model;
  for (auto item : kw) {
    const std::string k = py::cast<std::string>(item.first);
    const py::handle v = item.second;
    if (k == "tokenizer")
      a.tokenizer = py::cast<std::string>(v);
    else if (k == "skip_tokenizer_init")
      a.skip_tokenizer_init = py::cast<bool>(v);
    else if (k == "max_num_batched_tokens")
      a.max_num_batched_tokens = py::cast<int64_t>(v);
    else if (k == "max_num_seqs")
      a.max_num_seqs = py::cast<int64_t>(v);
    else if (k == "max_model_len")
      a.max_model_len = py::cast<int64_t>(v);
    else if (k == "kv_cache_memory")
      a.kv_cache_memory = py::cast<int64_t>(v);
    else if (k == "seed")
      a.seed = py::cast<uint64_t>(v);
    else if (k == "enable_chunked_prefill")
      a.enable_chunked_prefill = py::cast<bool>(v);
    else if (k == "dtype")
      a.dtype = py::cast<std::string>(v);
    else if (k == "device")
      a.device = py::cast<std::string>(v);
    else if (k == "simulate_qat")
      a.simulate_qat = py::cast<bool>(v);
    else if (k == "async_scheduling")
      a.async_scheduling = py::cast<bool>(v);
    else if (k == "enforce_eager")
      a.enforce_eager = py::cast<bool>(v);
    else
      throw py::type_error("unknown engine argument '" + k + "'");
  }
  return a;
}

}  // namespace

void bind_engine(py::module_& m) {
  py::class_<SamplingParams>(m, "SamplingParams",
                             "Sampling parameters with vLLM's names (n, temperature, top_p, top_k, min_p, "
                             "presence/frequency/repetition_penalty, max_tokens, min_tokens, stop, stop_token_ids, "
                             "ignore_eos, logprobs, seed, skip_special_tokens) plus seq_seed and so_args.")
      .def(py::init([](py::kwargs kw) { return make_params(kw); }))
      .def_readonly("n", &SamplingParams::n)
      .def_readonly("temperature", &SamplingParams::temperature)
      .def_readonly("top_p", &SamplingParams::top_p)
      .def_readonly("top_k", &SamplingParams::top_k)
      .def_readonly("max_tokens", &SamplingParams::max_tokens)
      .def_readonly("seed", &SamplingParams::seed)
      .def_readonly("logprobs", &SamplingParams::logprobs);

  py::class_<TokenLogprobs>(m, "TokenLogprobs")
      .def_readonly("token", &TokenLogprobs::token)
      .def_readonly("logprob", &TokenLogprobs::logprob)
      .def_readonly("top", &TokenLogprobs::top);

  py::class_<CompletionOutput>(m, "CompletionOutput")
      .def_readonly("index", &CompletionOutput::index)
      .def_readonly("token_ids", &CompletionOutput::token_ids)
      .def_readonly("text", &CompletionOutput::text)
      .def_readonly("logprobs", &CompletionOutput::logprobs)
      .def_readonly("cumulative_logprob", &CompletionOutput::cumulative_logprob)
      .def_readonly("finish_reason", &CompletionOutput::finish_reason)
      .def_property_readonly("stop_reason", [](const CompletionOutput& c) -> py::object {
        if (std::holds_alternative<int32_t>(c.stop_reason)) return py::int_(std::get<int32_t>(c.stop_reason));
        if (std::holds_alternative<std::string>(c.stop_reason)) return py::str(std::get<std::string>(c.stop_reason));
        return py::none();
      });

  py::class_<RequestOutput>(m, "RequestOutput")
      .def_readonly("request_id", &RequestOutput::request_id)
      .def_readonly("prompt_token_ids", &RequestOutput::prompt_token_ids)
      .def_readonly("outputs", &RequestOutput::outputs)
      .def_readonly("finished", &RequestOutput::finished)
      .def_readonly("error", &RequestOutput::error)
      .def_readonly("prompt_logprobs", &RequestOutput::prompt_logprobs);

  py::class_<EngineCore>(m, "Engine", "The native offline engine (continuous batching on the CPU backend).")
      .def(py::init([](const std::string& model, py::kwargs kw) {
             EngineArgs a = make_args(model, kw);
             py::gil_scoped_release release;
             return std::make_unique<EngineCore>(a);
           }),
           py::arg("model"))
      .def("add_request", &EngineCore::add_request, py::arg("request_id"), py::arg("prompt_token_ids"),
           py::arg("params"))
      .def("abort_request", &EngineCore::abort_request, py::arg("request_id"))
      .def("step", &EngineCore::step, py::call_guard<py::gil_scoped_release>())
      .def("has_unfinished", &EngineCore::has_unfinished)
      .def("generate", &EngineCore::generate, py::arg("prompts"), py::arg("params"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("max_model_len", &EngineCore::max_model_len)
      .def("stats",
           [](const EngineCore& e) {
             const EngineStats& s = e.stats();
             py::dict d;
             d["schedule_s"] = s.schedule_s;
             d["model_s"] = s.model_s;
             d["sample_s"] = s.sample_s;
             d["output_s"] = s.output_s;
             d["steps"] = s.steps;
             d["tokens"] = s.tokens;
             return d;
           })
      .def("reset_stats", &EngineCore::reset_stats)
      .def_property_readonly("eos_token_id", [](const EngineCore& e) { return e.config().eos_token_id; })
      .def_property_readonly("vocab_size", [](const EngineCore& e) { return e.config().vocab_size; });
}

}  // namespace deepinfer::python
