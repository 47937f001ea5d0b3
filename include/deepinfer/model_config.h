// ModelConfig: every size and switch of a DeepSeek-V4-family model, read from config.json
// (HF form with `model_type`, or the flat `inference/config.json` ModelArgs form). Nothing here is
// assumed from Flash: defaults are only those the reference's ModelArgs documents as defaults.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer {

enum class ModelFamily : uint8_t { kV4, kV41 };

struct ModelConfig {
  ModelFamily family = ModelFamily::kV4;
  std::string source;  // file the config came from, for error messages

  int64_t vocab_size = 0;
  int64_t dim = 0;
  int64_t n_layers = 0;
  int64_t n_mtp_layers = 0;
  int64_t n_heads = 0;
  int64_t head_dim = 0;       // 512: shared K=V latent width
  int64_t rope_head_dim = 0;  // 64: the rotated tail of each head
  int64_t q_lora_rank = 0;
  int64_t o_lora_rank = 0;
  int64_t o_groups = 0;

  // MoE
  int64_t moe_inter_dim = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 1;
  int64_t n_activated_experts = 0;
  int64_t n_hash_layers = 0;
  std::string score_func = "sqrtsoftplus";
  float route_scale = 1.0f;
  float swiglu_limit = 0.0f;

  // attention layout
  int64_t window_size = 128;
  std::vector<int64_t> compress_ratios;  // one per layer incl. MTP layers (extra entries ignored)
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;

  // RoPE / YaRN
  double rope_theta = 10000.0;
  double compress_rope_theta = 10000.0;
  double rope_factor = 1.0;
  int64_t original_seq_len = 0;  // 0 disables YaRN
  double beta_fast = 32.0;
  double beta_slow = 1.0;

  // hyper-connections and norms
  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;

  // quantisation: dense weights are FP8 in `fp8_block` x `fp8_block` tiles (0 = BF16 weights);
  // routed experts FP4 with per-32 scales when expert_fp4; activation quant groups follow fp8_block.
  int64_t fp8_block = 128;
  bool weights_fp8 = true;
  bool expert_fp4 = true;

  int64_t bos_token_id = 0;
  int64_t eos_token_id = 1;

  int64_t compress_ratio(int64_t layer) const { return compress_ratios.at(static_cast<size_t>(layer)); }
  bool is_hash_layer(int64_t layer) const { return layer < n_hash_layers; }
  int64_t nope_head_dim() const { return head_dim - rope_head_dim; }
};

// Reads `path` (a config.json file, or a directory holding config.json) and validates it.
// Throws deepinfer::Error naming the file and the offending key.
ModelConfig load_model_config(const std::string& path);
// Parses JSON text (the same rules); `source` names it in errors.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
// Consistency checks (positive sizes, divisibility, ratio list length...); throws on failure.
void validate_model_config(const ModelConfig& cfg);

}  // namespace deepinfer
