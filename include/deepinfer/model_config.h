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

  // V4.1 CSA2 (§2.6): only kv sources own a compressor, compressed KV and index keys; only index
  // sources run an indexer; the candidate source publishes level-1 candidate blocks that later
  // index sources re-score inside. Other compressed layers read the latest source at or below them.
  std::vector<int64_t> kv_source_layers, index_source_layers;
  int64_t candidate_source_layer = -1;  // < 0: no two-level selection
  int64_t candidate_topk_blocks = 0;
  int64_t candidate_block_size = 0;
  float gate_temp = 1.0f;      // V4.1 MoE gate: logits / gate_temp
  bool norm_topk_prob = true;  // V4.1 MoE gate: normalise the top-k weights

  // V4.1 Engram (§2.9): n-gram hash lookups added to the stream before these layers.
  std::vector<int64_t> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;  // table rows per engram layer
  int64_t engram_max_ngram_size = 0;
  int64_t engram_vocab_size = 0;  // primes are searched from here
  int64_t engram_n_heads = 0;
  int64_t engram_head_dim = 0;
  int64_t engram_pad_id = 2;
  int64_t engram_compressed_vocab_size = 0;

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

  // V4.1 layer roles (§1.2 table). -1 when there is none.
  bool is_kv_source(int64_t layer) const;
  bool is_index_source(int64_t layer) const;
  int64_t kv_source_of(int64_t layer) const;     // latest kv source <= layer
  int64_t index_source_of(int64_t layer) const;  // latest index source <= layer
  int64_t engram_index(int64_t layer) const;     // position in engram_layer_ids, or -1
};

// The numerics that differ between the families (v4-architecture.md §2.0), in one place; model
// code asks these instead of testing the family.
struct FamilyNumerics {
  bool q_head_renorm;           // V4: weightless per-head RMS of q
  int64_t window_quant_block;   // FP8 fake-quant block of window KV
  bool window_quant_rope_dims;  // V4.1 quantises the RoPE tail too
  bool staggered_hc;            // V4.1: a sublayer collapses with the previous one's pre-mix
  bool hc_head;                 // V4: separate hc_head_* final collapse
  float moe_norm_eps;           // added to the top-k weight sum (V4: none; V4.1: 1e-20)
  bool moe_norm_switchable;     // V4.1 normalises only with norm_topk_prob and top-k > 1
};
FamilyNumerics family_numerics(ModelFamily f);

// Reads `path` (a config.json file, or a directory holding config.json) and validates it.
// Throws deepinfer::Error naming the file and the offending key.
ModelConfig load_model_config(const std::string& path);
// Parses JSON text (the same rules); `source` names it in errors.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
// Consistency checks (positive sizes, divisibility, ratio list length...); throws on failure.
void validate_model_config(const ModelConfig& cfg);

}  // namespace deepinfer
