// EngineArgs: the engine's options, in vLLM's names (`--max-num-batched-tokens` ...).
#pragma once

#include <cstdint>
#include <string>

#include "core/env.h"
#include "ops/ops.h"

namespace deepinfer {

// "cuda" / "cpu" / "auto" (or empty: cuda when this build has the CUDA backend and a GPU is visible,
// else cpu) -> the device; throws deepinfer::Error on anything else or on "cuda" without a GPU.
Device resolve_device(const std::string& name);

struct EngineArgs {
  std::string model;                      // checkpoint directory (config.json + safetensors)
  std::string tokenizer;                  // directory with tokenizer.json; empty: the model directory, if it has one
  bool skip_tokenizer_init = false;       // no tokenizer: no text, no stop strings
  int64_t max_num_batched_tokens = 2048;  // token budget of one step
  int64_t max_num_seqs = 64;              // sequences in one step
  int64_t max_model_len = 0;              // prompt + output tokens; 0: the config's max_position_embeddings
  int64_t kv_cache_memory = int64_t{4} << 30;  // bytes of per-sequence state (CPU)
  uint64_t seed = 0;                           // draws the seeds of requests that bring none
  bool enable_chunked_prefill = true;
  std::string device = env_value("DEEPINFER_DEVICE");  // "auto", "cuda" or "cpu"
  std::string dtype = "bfloat16";  // "bfloat16": round activations where the reference does; "float32"
  bool simulate_qat = true;        // FP8/FP4 fake-quantisation sites
  bool async_scheduling = true;    // overlap output processing of step N-1 with the model of step N
  bool enforce_eager = false;      // no CUDA graphs: every decode kernel launched one by one (same logits)
  // V4.1 SWA bounded replay (DeepInfer's DEEPINFER_YOCO_PREFILL_* switches): "compact" runs the
  // decoder layers of a prefill only over its last prefill_keep_tokens tokens; "off" is exact.
  std::string prefill_truncation = env_value("DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE");
  std::string prefill_keep_tokens = env_value("DEEPINFER_YOCO_PREFILL_KEEP_TOKENS");

  // Throws deepinfer::Error naming the field: 0 when bounded replay is off, else the kept tokens.
  int64_t replay_keep_tokens() const;

  // Throws deepinfer::Error naming the field.
  ops::Numerics numerics() const;
  Device resolved_device() const { return resolve_device(device); }
};

// max_position_embeddings (HF form) or max_seq_len (flat form) of `model_dir`/config.json; 0 when
// neither is there.
int64_t read_max_position_embeddings(const std::string& model_dir);

}  // namespace deepinfer
