// ModelConfig: V4-Flash in both config.json forms (v4-architecture.md §1.1), V4.1 text_config, and
// every rejection (include/deepinfer/model_config.h).
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "deepinfer/error.h"
#include "deepinfer/model_config.h"
#include "st_writer.h"

using namespace deepinfer;
using namespace st_test;
using json = nlohmann::json;

namespace {

// V4-Flash config.json as published (§1.1).
const char* kFlashHF = R"({
  "architectures": ["DeepseekV4ForCausalLM"],
  "model_type": "deepseek_v4",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.57.1",
  "bos_token_id": 0,
  "eos_token_id": 1,
  "tie_word_embeddings": false,
  "vocab_size": 129280,
  "hidden_size": 4096,
  "num_hidden_layers": 43,
  "num_attention_heads": 64,
  "num_key_value_heads": 1,
  "head_dim": 512,
  "qk_rope_head_dim": 64,
  "q_lora_rank": 1024,
  "o_lora_rank": 1024,
  "o_groups": 8,
  "moe_intermediate_size": 2048,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "num_experts_per_tok": 6,
  "num_hash_layers": 3,
  "scoring_func": "sqrtsoftplus",
  "topk_method": "noaux_tc",
  "norm_topk_prob": true,
  "routed_scaling_factor": 1.5,
  "swiglu_limit": 10.0,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-6,
  "sliding_window": 128,
  "max_position_embeddings": 1048576,
  "rope_theta": 10000,
  "compress_rope_theta": 160000,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                   "beta_fast": 32, "beta_slow": 1},
  "index_n_heads": 64,
  "index_head_dim": 128,
  "index_topk": 512,
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "hc_eps": 1e-6,
  "num_nextn_predict_layers": 1,
  "expert_dtype": "fp4",
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                          "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                      4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0]
})";

// V4-Flash inference/config.json (ModelArgs names, §1.1).
const char* kFlashFlat = R"({
  "vocab_size": 129280,
  "dim": 4096,
  "moe_inter_dim": 2048,
  "n_layers": 43,
  "n_hash_layers": 3,
  "n_heads": 64,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "n_activated_experts": 6,
  "score_func": "sqrtsoftplus",
  "route_scale": 1.5,
  "swiglu_limit": 10.0,
  "q_lora_rank": 1024,
  "head_dim": 512,
  "rope_head_dim": 64,
  "o_groups": 8,
  "o_lora_rank": 1024,
  "window_size": 128,
  "original_seq_len": 65536,
  "rope_theta": 10000,
  "rope_factor": 16,
  "beta_fast": 32,
  "beta_slow": 1,
  "index_n_heads": 64,
  "index_head_dim": 128,
  "index_topk": 512,
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "dtype": "fp8",
  "scale_fmt": "ue8m0",
  "expert_dtype": "fp4",
  "compress_rope_theta": 160000,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                      4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0]
})";

// V4.1-Flash config.json (§1.2), trimmed to the keys that map onto ModelConfig plus a few others.
const char* kV41HF = R"({
  "architectures": ["DeepseekV41ForCausalLM"],
  "model_type": "deepseek_v41",
  "image_token_id": 129264,
  "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
                          "scale_fmt": "ue8m0", "expert_dtype": "fp4"},
  "text_config": {
    "model_type": "deepseek_v41_text",
    "vocab_size": 129280, "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 64,
    "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1280,
    "o_lora_rank": 1024, "o_groups": 8, "moe_intermediate_size": 2304, "n_routed_experts": 384,
    "n_shared_experts": 1, "num_experts_per_tok": 6, "scoring_func": "sqrtsoftplus",
    "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "rms_norm_eps": 1e-20, "tie_word_embeddings": false,
    "max_position_embeddings": 1048576, "rope_theta": 10000,
    "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                     "original_max_position_embeddings": 65536},
    "compress_rope_theta": 160000, "sliding_window": 128,
    "compress_ratios": [0, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
    "kv_source_layer_ids": [2, 8, 14, 20], "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512, "candidate_source_layer_id": 20,
    "candidate_topk_blocks": 2048, "candidate_block_size": 8,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "num_nextn_predict_layers": 3,
    "engram_layer_ids": [1, 14], "engram_num_embeddings": [384006168, 384016682], "engram_max_ngram_size": 4,
    "engram_vocab_size": 16000000, "engram_n_heads": 8, "engram_head_dim": 256, "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": 99092, "dspark_block_size": 5, "dspark_noise_token_id": 128799,
    "dspark_target_layer_ids": [37, 38, 39], "dspark_markov_rank": 256, "dspark_n_routed_experts": 128,
    "dspark_num_experts_per_tok": 3
  },
  "vision_config": {"model_type": "deepseek_v41_vision"}
})";

std::vector<int64_t> flash_ratios() {
  std::vector<int64_t> r = {0, 0};
  for (int i = 0; i < 20; ++i) {
    r.push_back(4);
    r.push_back(128);
  }
  r.push_back(4);
  r.push_back(0);
  return r;
}

void expect_flash(const ModelConfig& c) {
  EXPECT_EQ(c.family, ModelFamily::kV4);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.dim, 4096);
  EXPECT_EQ(c.n_layers, 43);
  EXPECT_EQ(c.n_mtp_layers, 1);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.rope_head_dim, 64);
  EXPECT_EQ(c.nope_head_dim(), 448);
  EXPECT_EQ(c.q_lora_rank, 1024);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.moe_inter_dim, 2048);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.n_activated_experts, 6);
  EXPECT_EQ(c.n_hash_layers, 3);
  EXPECT_TRUE(c.is_hash_layer(2));
  EXPECT_FALSE(c.is_hash_layer(3));
  EXPECT_EQ(c.score_func, "sqrtsoftplus");
  EXPECT_EQ(c.route_scale, 1.5f);
  EXPECT_EQ(c.swiglu_limit, 10.0f);
  EXPECT_EQ(c.window_size, 128);
  EXPECT_EQ(c.compress_ratios, flash_ratios());
  EXPECT_EQ(c.compress_ratios.size(), 44u);
  EXPECT_EQ(c.compress_ratio(0), 0);
  EXPECT_EQ(c.compress_ratio(2), 4);
  EXPECT_EQ(c.compress_ratio(3), 128);
  EXPECT_EQ(c.compress_ratio(42), 4);
  EXPECT_EQ(c.compress_ratio(43), 0);  // the MTP layer
  EXPECT_EQ(c.index_n_heads, 64);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_EQ(c.rope_factor, 16.0);
  EXPECT_EQ(c.original_seq_len, 65536);
  EXPECT_EQ(c.beta_fast, 32.0);
  EXPECT_EQ(c.beta_slow, 1.0);
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_EQ(c.hc_eps, 1e-6f);
  EXPECT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(c.fp8_block, 128);
  EXPECT_TRUE(c.weights_fp8);
  EXPECT_TRUE(c.expert_fp4);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);
}

// kFlashHF with `edit` applied (null removes a key).
std::string hf_with(const json& edit) {
  json j = json::parse(kFlashHF);
  j.merge_patch(edit);
  return j.dump();
}
std::string flat_with(const json& edit) {
  json j = json::parse(kFlashFlat);
  j.merge_patch(edit);
  return j.dump();
}

std::string parse_error(const std::string& text, const std::string& source = "cfg/config.json") {
  return error_of([&] { parse_model_config(text, source); });
}

}  // namespace

TEST(ModelConfig, V4FlashHF) {
  ModelConfig c = parse_model_config(kFlashHF, "flash/config.json");
  EXPECT_EQ(c.source, "flash/config.json");
  expect_flash(c);
}

TEST(ModelConfig, V4FlashFlat) {
  ModelConfig c = parse_model_config(kFlashFlat, "flash/inference/config.json");
  EXPECT_EQ(c.source, "flash/inference/config.json");
  expect_flash(c);  // n_mtp_layers, norm_eps, hc_eps, bos/eos come from the ModelArgs defaults
}

TEST(ModelConfig, V41TextConfig) {
  ModelConfig c = parse_model_config(kV41HF, "v41/config.json");
  EXPECT_EQ(c.family, ModelFamily::kV41);
  EXPECT_EQ(c.dim, 5120);
  EXPECT_EQ(c.n_layers, 40);
  EXPECT_EQ(c.n_mtp_layers, 3);
  EXPECT_EQ(c.q_lora_rank, 1280);
  EXPECT_EQ(c.moe_inter_dim, 2304);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.norm_eps, 1e-20f);
  EXPECT_EQ(c.compress_ratios.size(), 43u);
  EXPECT_EQ(c.compress_ratio(2), 2);
  EXPECT_EQ(c.compress_ratio(20), 1);
  EXPECT_EQ(c.compress_ratio(42), 0);
  EXPECT_EQ(c.original_seq_len, 65536);
  EXPECT_EQ(c.rope_factor, 16.0);
  EXPECT_EQ(c.fp8_block, 32);
  EXPECT_TRUE(c.weights_fp8);
  EXPECT_TRUE(c.expert_fp4);
  EXPECT_EQ(c.n_hash_layers, 0);  // V4.1 has no hash-routed layers
  // Layer roles (§1.2 table).
  EXPECT_EQ(c.kv_source_layers, (std::vector<int64_t>{2, 8, 14, 20}));
  EXPECT_TRUE(c.is_kv_source(14) && !c.is_kv_source(15) && c.is_index_source(28) && !c.is_index_source(29));
  EXPECT_EQ(c.kv_source_of(7), 2);
  EXPECT_EQ(c.kv_source_of(39), 20);
  EXPECT_EQ(c.index_source_of(31), 28);
  EXPECT_EQ(c.index_source_of(21), 20);
  EXPECT_EQ(c.candidate_source_layer, 20);
  EXPECT_EQ(c.candidate_topk_blocks, 2048);
  EXPECT_EQ(c.candidate_block_size, 8);
  EXPECT_EQ(c.gate_temp, 1.0f);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.engram_layer_ids, (std::vector<int64_t>{1, 14}));
  EXPECT_EQ(c.engram_index(14), 1);
  EXPECT_EQ(c.engram_index(2), -1);
  EXPECT_EQ(c.engram_num_embeddings[1], 384016682);
  EXPECT_EQ(c.engram_compressed_vocab_size, 99092);
  EXPECT_EQ(c.engram_head_dim, 256);
  EXPECT_EQ(c.engram_pad_id, 2);
  const FamilyNumerics f = family_numerics(c.family);
  EXPECT_FALSE(f.q_head_renorm);
  EXPECT_TRUE(f.staggered_hc && f.window_quant_rope_dims);
  EXPECT_EQ(f.window_quant_block, 32);

  // Role rules: a kv source must index; a compressed layer needs a source of its ratio below it.
  auto v41_error = [](const std::function<void(json&)>& edit) {
    json j = json::parse(kV41HF);
    edit(j["text_config"]);
    return parse_error(j.dump(), "v41/config.json");
  };
  EXPECT_TRUE(has_all(v41_error([](json& t) {
                        t["index_source_layer_ids"] = {8, 14, 20};
                      }),
                      {"kv source layer 2", "index source"}));
  EXPECT_TRUE(has_all(v41_error([](json& t) { t["kv_source_layer_ids"] = {8, 14, 20}; }), {"layer 2", "no kv source"}));
  EXPECT_TRUE(has_all(v41_error([](json& t) { t["kv_source_layer_ids"] = {2, 8, 14}; }), {"layer 20", "ratio 2"}));
  EXPECT_TRUE(has_all(v41_error([](json& t) { t["kv_source_layer_ids"] = {2, 14, 8, 20}; }), {"ascending"}));
  EXPECT_TRUE(has_all(v41_error([](json& t) { t["index_source_layer_ids"] = {2, 8, 14, 20, 24, 40}; }),
                      {"index_source_layers[5]", "40"}));
  EXPECT_TRUE(has_all(v41_error([](json& t) { t["candidate_source_layer_id"] = 21; }), {"candidate_source_layer 21"}));
  EXPECT_TRUE(has_all(v41_error([](json& t) { t["engram_num_embeddings"] = {1}; }), {"engram_num_embeddings"}));
  EXPECT_TRUE(has_all(v41_error([](json& t) { t["engram_head_dim"] = 100; }), {"engram_head_dim 100"}));
  EXPECT_TRUE(has_all(v41_error([](json& t) { t.erase("engram_vocab_size"); }), {"engram_vocab_size"}));
  EXPECT_TRUE(has_all(v41_error([](json& t) { t["norm_topk_prob"] = 1; }), {"norm_topk_prob"}));

  json j = json::parse(kV41HF);
  j.erase("text_config");
  EXPECT_TRUE(has_all(parse_error(j.dump(), "v41/config.json"), {"v41/config.json", "text_config"}));
  j = json::parse(kV41HF);
  j["text_config"]["hidden_size"] = "5120";
  EXPECT_TRUE(has_all(parse_error(j.dump(), "v41/config.json"), {"v41/config.json", "text_config.hidden_size"}));
  j = json::parse(kV41HF);
  j["text_config"]["compress_ratios"][5] = 4;
  EXPECT_TRUE(has_all(parse_error(j.dump()), {"compress_ratios[5]", "V4.1"}));
}

TEST(ModelConfig, HFDefaultsAndAlternateSpellings) {
  // No rope_scaling: no YaRN. No quantization_config / expert_dtype: BF16 weights, groups of 128.
  ModelConfig c = parse_model_config(hf_with({{"rope_scaling", nullptr},
                                              {"quantization_config", nullptr},
                                              {"expert_dtype", nullptr},
                                              {"num_hash_layers", nullptr},
                                              {"eos_token_id", {7, 8}}}),
                                     "x.json");
  EXPECT_EQ(c.original_seq_len, 0);
  EXPECT_EQ(c.rope_factor, 1.0);
  EXPECT_FALSE(c.weights_fp8);
  EXPECT_FALSE(c.expert_fp4);
  EXPECT_EQ(c.fp8_block, 128);
  EXPECT_EQ(c.n_hash_layers, 3);
  EXPECT_EQ(c.eos_token_id, 7);

  // layer_types instead of compress_ratios (cut to num_hidden_layers; MTP layers window-only).
  std::vector<std::string> types;
  for (int64_t r : flash_ratios()) {
    types.push_back(r == 0   ? "sliding_attention"
                    : r == 4 ? "compressed_sparse_attention"
                             : "heavily_compressed_attention");
  }
  types.resize(43);
  c = parse_model_config(hf_with({{"compress_ratios", nullptr}, {"layer_types", types}}), "x.json");
  EXPECT_EQ(c.compress_ratios, flash_ratios());

  // mlp_layer_types: leading hash_moe entries count.
  std::vector<std::string> mlp(43, "moe");
  mlp[0] = mlp[1] = "hash_moe";
  c = parse_model_config(hf_with({{"num_hash_layers", nullptr}, {"mlp_layer_types", mlp}}), "x.json");
  EXPECT_EQ(c.n_hash_layers, 2);
  EXPECT_TRUE(has_all(parse_error(hf_with({{"mlp_layer_types", mlp}})),
                      {"num_hash_layers", "mlp_layer_types", "cfg/config.json"}));

  // expert_dtype inside quantization_config; rope_type spelling.
  c = parse_model_config(hf_with({{"expert_dtype", nullptr},
                                  {"quantization_config", {{"expert_dtype", "fp4"}, {"weight_block_size", {64, 64}}}},
                                  {"rope_scaling", {{"type", nullptr}, {"rope_type", "yarn"}}}}),
                         "x.json");
  EXPECT_TRUE(c.expert_fp4);
  EXPECT_EQ(c.fp8_block, 64);
  EXPECT_EQ(c.original_seq_len, 65536);
}

TEST(ModelConfig, FlatDefaultsAndBf16) {
  ModelConfig c = parse_model_config(flat_with({{"dtype", "bf16"},
                                                {"expert_dtype", nullptr},
                                                {"original_seq_len", nullptr},
                                                {"rope_factor", nullptr},
                                                {"n_mtp_layers", 0},
                                                {"norm_eps", 1e-5}}),
                                     "x.json");
  EXPECT_FALSE(c.weights_fp8);
  EXPECT_FALSE(c.expert_fp4);
  EXPECT_EQ(c.fp8_block, 128);
  EXPECT_EQ(c.original_seq_len, 0);
  EXPECT_EQ(c.rope_factor, 1.0);
  EXPECT_EQ(c.n_mtp_layers, 0);
  EXPECT_EQ(c.norm_eps, 1e-5f);
  EXPECT_TRUE(has_all(parse_error(flat_with({{"dtype", "fp16"}})), {"cfg/config.json", "dtype", "fp16"}));
  EXPECT_TRUE(has_all(parse_error(flat_with({{"expert_dtype", "int4"}})), {"expert_dtype", "int4"}));
  EXPECT_TRUE(has_all(parse_error(flat_with({{"scale_fmt", "fp32"}})), {"scale_fmt", "ue8m0"}));
}

TEST(ModelConfig, LoadFromFileAndDirectory) {
  TempDir dir;
  write_text(dir / "config.json", kFlashHF);
  expect_flash(load_model_config(dir.str()));
  ModelConfig c = load_model_config((dir / "config.json").string());
  EXPECT_EQ(c.source, (dir / "config.json").string());
  expect_flash(c);

  TempDir empty;
  EXPECT_TRUE(has_all(error_of([&] { load_model_config(empty.str()); }), {empty.str(), "config.json"}));
  const std::string gone = (dir / "nope.json").string();
  EXPECT_TRUE(has_all(error_of([&] { load_model_config(gone); }), {gone, "does not exist"}));
  // Errors from a loaded file name it.
  write_text(dir / "bad.json", hf_with({{"hidden_size", 4000}}));
  EXPECT_TRUE(has_all(error_of([&] { load_model_config((dir / "bad.json").string()); }), {"bad.json", "dim"}));
}

TEST(ModelConfig, UnknownModelType) {
  EXPECT_EQ(parse_error(hf_with({{"model_type", "deepseek_v3"}}), "m/config.json"),
            "unknown model_type 'deepseek_v3' in m/config.json: expected deepseek_v4 or deepseek_v41");
  EXPECT_TRUE(has_all(parse_error(hf_with({{"model_type", 4}})), {"model_type", "string"}));
  EXPECT_TRUE(has_all(parse_error(R"({"vocab_size": 5})"), {"cfg/config.json", "model_type", "dim"}));
}

TEST(ModelConfig, MissingRequiredKeys) {
  for (const char* key : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                          "qk_rope_head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "moe_intermediate_size",
                          "n_routed_experts", "num_experts_per_tok", "index_n_heads", "index_head_dim", "index_topk"}) {
    EXPECT_TRUE(has_all(parse_error(hf_with({{key, nullptr}})),
                        {"cfg/config.json", std::string("missing required key '") + key + "'"}));
  }
  for (const char* key : {"vocab_size", "moe_inter_dim", "n_heads", "n_routed_experts", "n_activated_experts",
                          "q_lora_rank", "head_dim", "rope_head_dim", "o_groups", "o_lora_rank", "index_n_heads",
                          "index_head_dim", "index_topk", "compress_ratios"}) {
    EXPECT_TRUE(has_all(parse_error(flat_with({{key, nullptr}})),
                        {"cfg/config.json", std::string("missing required key '") + key + "'"}));
  }
  EXPECT_TRUE(has_all(parse_error(hf_with({{"compress_ratios", nullptr}})), {"compress_ratios", "layer_types"}));
  EXPECT_TRUE(has_all(parse_error(hf_with({{"rope_scaling", {{"original_max_position_embeddings", nullptr}}}})),
                      {"rope_scaling.original_max_position_embeddings"}));
}

TEST(ModelConfig, WrongTypes) {
  struct Case {
    json edit;
    std::string key;
  };
  const std::vector<Case> hf = {
      {{{"hidden_size", "4096"}}, "'hidden_size' must be an integer"},
      {{{"num_hidden_layers", 43.5}}, "'num_hidden_layers' must be an integer"},
      {{{"n_routed_experts", true}}, "'n_routed_experts' must be an integer"},
      {{{"rope_theta", "1e4"}}, "'rope_theta' must be a number"},
      {{{"scoring_func", 1}}, "'scoring_func' must be a string"},
      {{{"compress_ratios", "0,0,4"}}, "'compress_ratios' must be a list"},
      {{{"compress_ratios", {0, "4"}}}, "'compress_ratios[1]' must be an integer"},
      {{{"rope_scaling", "yarn"}}, "'rope_scaling' must be an object"},
      {{{"rope_scaling", {{"factor", "16"}}}}, "'rope_scaling.factor' must be a number"},
      {{{"quantization_config", {{"weight_block_size", {128, "128"}}}}},
       "'quantization_config.weight_block_size[1]' must be an integer"},
      {{{"eos_token_id", {"1"}}}, "'eos_token_id[0]' must be an integer"},
      {{{"layer_types", {1, 2}}}, "'layer_types[0]' must be a string"},
  };
  for (const auto& c : hf) {
    EXPECT_TRUE(has_all(parse_error(hf_with(c.edit)), {"cfg/config.json", c.key})) << c.edit.dump();
  }
  EXPECT_TRUE(has_all(parse_error(flat_with({{"dim", "4096"}})), {"cfg/config.json", "'dim' must be an integer"}));
  EXPECT_TRUE(has_all(parse_error(flat_with({{"route_scale", {1.5}}})), {"'route_scale' must be a number"}));
  // Integral floats are accepted for integer keys.
  EXPECT_EQ(parse_model_config(hf_with({{"hidden_size", 4096.0}}), "x").dim, 4096);
  // An unknown layer type.
  EXPECT_TRUE(has_all(parse_error(hf_with({{"compress_ratios", nullptr}, {"layer_types", {"full_attention"}}})),
                      {"layer_types[0]", "full_attention"}));
  EXPECT_TRUE(has_all(parse_error(hf_with({{"rope_scaling", {{"type", "linear"}}}})), {"rope_scaling", "linear"}));
  EXPECT_TRUE(has_all(parse_error(hf_with({{"quantization_config", {{"weight_block_size", {128, 64}}}}})),
                      {"weight_block_size", "[B, B]"}));
  EXPECT_TRUE(has_all(parse_error(hf_with({{"num_key_value_heads", 8}})), {"num_key_value_heads", "8"}));
}

TEST(ModelConfig, InvalidJson) {
  auto msg = parse_error("{\n  \"vocab_size\": 129280,\n  \"dim\": 4096,,\n}");
  EXPECT_TRUE(has_all(msg, {"cfg/config.json", "not valid JSON", "line 3"})) << msg;
  EXPECT_TRUE(has_all(parse_error("[1, 2]"), {"cfg/config.json", "object"}));
}

TEST(ModelConfig, InconsistentConfigs) {
  struct Case {
    json edit;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {{{"hidden_size", 0}}, {"dim must be positive"}},
      {{{"n_routed_experts", -4}}, {"n_routed_experts must be positive"}},
      {{{"compress_ratios", {0, 0, 4}}}, {"compress_ratios has 3 entries", "n_layers is 43"}},
      {{{"compress_ratios", json::array()}}, {"compress_ratios has 0 entries"}},
      {{{"qk_rope_head_dim", 512}}, {"head_dim 512 must exceed rope_head_dim 512"}},
      {{{"qk_rope_head_dim", 63}}, {"rope_head_dim 63 must be even"}},
      {{{"o_groups", 7}}, {"not divisible by o_groups 7"}},
      {{{"num_experts_per_tok", 300}}, {"n_activated_experts 300 exceeds n_routed_experts 256"}},
      {{{"num_hash_layers", 44}}, {"n_hash_layers 44 exceeds n_layers 43"}},
      {{{"hidden_size", 4000}}, {"dim = 4000", "FP8 block size 128"}},
      {{{"q_lora_rank", 1000}}, {"q_lora_rank = 1000"}},
      {{{"moe_intermediate_size", 2000}}, {"moe_inter_dim = 2000"}},
      {{{"o_lora_rank", 1000}}, {"o_groups * o_lora_rank = 8000"}},
      {{{"head_dim", 520}}, {"n_heads * head_dim / o_groups = 4160"}},
      {{{"index_head_dim", 96}}, {"index_head_dim 96 must be a power of two"}},
      {{{"sliding_window", 0}}, {"window_size must be positive"}},
      {{{"scoring_func", "relu"}}, {"score_func 'relu'"}},
      {{{"rms_norm_eps", 0}}, {"norm_eps"}},
      {{{"index_topk", 0}}, {"index_topk must be positive"}},
      {{{"quantization_config", {{"weight_block_size", {0, 0}}}}}, {"fp8_block"}},
  };
  for (const auto& c : cases) {
    auto msg = parse_error(hf_with(c.edit));
    EXPECT_TRUE(has_all(msg, {"cfg/config.json"})) << c.edit.dump();
    for (const auto& p : c.parts) EXPECT_TRUE(has_all(msg, {p})) << c.edit.dump();
  }
  // A bad ratio names its index.
  auto r = flash_ratios();
  r[7] = 16;
  EXPECT_TRUE(has_all(parse_error(hf_with({{"compress_ratios", r}})), {"compress_ratios[7] is 16", "0, 4 or 128"}));
  // Extra (MTP) entries are kept; exactly n_layers entries is also fine.
  r = flash_ratios();
  r.resize(43);
  EXPECT_EQ(parse_model_config(hf_with({{"compress_ratios", r}}), "x").compress_ratios.size(), 43u);

  // validate_model_config on its own.
  ModelConfig c = parse_model_config(kFlashHF, "direct.json");
  EXPECT_NO_THROW(validate_model_config(c));
  c.n_activated_experts = 0;
  EXPECT_TRUE(has_all(error_of([&] { validate_model_config(c); }), {"direct.json", "n_activated_experts"}));
}
