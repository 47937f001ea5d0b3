// config.json -> ModelConfig for the DeepSeek-V4 family (v4-architecture.md §1.1, §1.2, §2.14).
//
// Two spellings of the same model are accepted:
//  * HF form (`model_type` present): deepseek_v4 keys at the top level; deepseek_v41 keeps them in
//    `text_config` with `quantization_config` at the top level.
//  * Flat form (no `model_type`; `dim` and `n_layers`): the reference's ModelArgs names
//    (inference/config.json).
// Keys whose absence has a documented default take it; size keys are required.
#include "deepinfer/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "deepinfer/error.h"

namespace deepinfer {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string brief(const json& j) {
  std::string s = j.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Typed access to one JSON object; `prefix` ("text_config.") makes error messages exact.
class Keys {
 public:
  Keys(const json& obj, const std::string& source, std::string prefix)
      : obj_(obj), source_(source), prefix_(std::move(prefix)) {}

  // nullptr when the key is absent or null.
  const json* find(const std::string& key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool has(const std::string& key) const { return find(key) != nullptr; }
  std::string label(const std::string& key) const { return prefix_ + key; }

  int64_t to_int(const json& v, const std::string& what) const {
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      DI_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
               "config {}: key '{}' = {} is out of range", source_, what, u);
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
      fail("config {}: key '{}' must be an integer, got {}", source_, what, brief(v));
    }
    fail("config {}: key '{}' must be an integer, got {} {}", source_, what, v.type_name(), brief(v));
  }
  double to_num(const json& v, const std::string& what) const {
    DI_CHECK(v.is_number(), "config {}: key '{}' must be a number, got {} {}", source_, what, v.type_name(), brief(v));
    return v.get<double>();
  }
  std::string to_str(const json& v, const std::string& what) const {
    DI_CHECK(v.is_string(), "config {}: key '{}' must be a string, got {} {}", source_, what, v.type_name(), brief(v));
    return v.get<std::string>();
  }

  int64_t req_int(const std::string& key) const { return to_int(req(key), label(key)); }
  int64_t get_int(const std::string& key, int64_t def) const {
    const json* v = find(key);
    return v ? to_int(*v, label(key)) : def;
  }
  double req_num(const std::string& key) const { return to_num(req(key), label(key)); }
  double get_num(const std::string& key, double def) const {
    const json* v = find(key);
    return v ? to_num(*v, label(key)) : def;
  }
  std::optional<std::string> get_str(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    return to_str(*v, label(key));
  }
  const json& req(const std::string& key) const {
    const json* v = find(key);
    DI_CHECK(v != nullptr, "config {}: missing required key '{}'", source_, label(key));
    return *v;
  }
  const json& list(const std::string& key) const {
    const json& v = req(key);
    DI_CHECK(v.is_array(), "config {}: key '{}' must be a list, got {} {}", source_, label(key), v.type_name(),
             brief(v));
    return v;
  }
  std::vector<int64_t> int_list(const std::string& key) const {
    std::vector<int64_t> out;
    const json& v = list(key);
    for (size_t i = 0; i < v.size(); ++i) out.push_back(to_int(v[i], fmt::format("{}[{}]", label(key), i)));
    return out;
  }
  // A nested object (absent/null -> nullopt).
  std::optional<Keys> object(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    DI_CHECK(v->is_object(), "config {}: key '{}' must be an object, got {} {}", source_, label(key), v->type_name(),
             brief(*v));
    return Keys(*v, source_, label(key) + ".");
  }

  const std::string& source() const { return source_; }

 private:
  const json& obj_;
  const std::string& source_;
  std::string prefix_;
};

bool parse_expert_dtype(const Keys& k, const std::string& key) {
  auto s = k.get_str(key);
  if (!s) return false;
  if (*s == "fp4") return true;
  if (*s == "fp8") return false;
  fail("config {}: key '{}' is '{}', expected 'fp4' or 'fp8'", k.source(), k.label(key), *s);
}

void check_scale_fmt(const Keys& k) {
  auto s = k.get_str("scale_fmt");
  DI_CHECK(!s || *s == "ue8m0", "config {}: key '{}' is '{}'; only power-of-two (ue8m0) scales are supported",
           k.source(), k.label("scale_fmt"), s.value_or(""));
}

int64_t token_id(const Keys& k, const std::string& key, int64_t def) {
  const json* v = k.find(key);
  if (!v) return def;
  if (v->is_array()) {
    DI_CHECK(!v->empty(), "config {}: key '{}' is an empty list", k.source(), k.label(key));
    return k.to_int((*v)[0], k.label(key) + "[0]");
  }
  return k.to_int(*v, k.label(key));
}

// HF `layer_types` -> compress ratios.
std::vector<int64_t> ratios_from_layer_types(const Keys& k) {
  const json& v = k.list("layer_types");
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string what = fmt::format("{}[{}]", k.label("layer_types"), i);
    const std::string t = k.to_str(v[i], what);
    if (t == "sliding_attention") {
      out.push_back(0);
    } else if (t == "compressed_sparse_attention") {
      out.push_back(4);
    } else if (t == "heavily_compressed_attention") {
      out.push_back(128);
    } else {
      fail(
          "config {}: key '{}' is '{}', expected sliding_attention, compressed_sparse_attention or "
          "heavily_compressed_attention",
          k.source(), what, t);
    }
  }
  return out;
}

// The V4.1-only keys; the HF and flat spellings differ only in the four names in `names`
// (kv sources, index sources, candidate source, engram pad id).
struct V41Names {
  const char* kv_sources;
  const char* index_sources;
  const char* candidate_source;
  const char* engram_pad;
};
void parse_v41_keys(const Keys& k, ModelConfig& c, const V41Names& n) {
  c.kv_source_layers = k.has(n.kv_sources) ? k.int_list(n.kv_sources) : std::vector<int64_t>{};
  c.index_source_layers = k.has(n.index_sources) ? k.int_list(n.index_sources) : std::vector<int64_t>{};
  c.candidate_source_layer = k.get_int(n.candidate_source, -1);
  c.candidate_topk_blocks = k.get_int("candidate_topk_blocks", 0);
  c.candidate_block_size = k.get_int("candidate_block_size", 0);
  c.gate_temp = static_cast<float>(k.get_num("gate_temp", c.gate_temp));
  if (const json* v = k.find("norm_topk_prob")) {
    DI_CHECK(v->is_boolean(), "config {}: key '{}' must be true or false, got {}", k.source(),
             k.label("norm_topk_prob"), brief(*v));
    c.norm_topk_prob = v->get<bool>();
  }
  c.engram_layer_ids = k.has("engram_layer_ids") ? k.int_list("engram_layer_ids") : std::vector<int64_t>{};
  if (!c.engram_layer_ids.empty()) {
    c.engram_num_embeddings = k.int_list("engram_num_embeddings");
    c.engram_max_ngram_size = k.req_int("engram_max_ngram_size");
    c.engram_vocab_size = k.req_int("engram_vocab_size");
    c.engram_n_heads = k.req_int("engram_n_heads");
    c.engram_head_dim = k.req_int("engram_head_dim");
    c.engram_pad_id = k.get_int(n.engram_pad, c.engram_pad_id);
    c.engram_compressed_vocab_size = k.req_int("engram_compressed_vocab_size");
  }
}

// The HF keys of one model (top level for V4, text_config for V4.1).
void parse_hf_text(const Keys& k, ModelConfig& c) {
  c.vocab_size = k.req_int("vocab_size");
  c.dim = k.req_int("hidden_size");
  c.n_layers = k.req_int("num_hidden_layers");
  c.n_mtp_layers = k.get_int("num_nextn_predict_layers", 1);
  c.n_heads = k.req_int("num_attention_heads");
  const int64_t kv_heads = k.get_int("num_key_value_heads", 1);
  DI_CHECK(kv_heads == 1, "config {}: {} is {}, but V4 attention has one shared K=V head", c.source,
           k.label("num_key_value_heads"), kv_heads);
  c.head_dim = k.req_int("head_dim");
  c.rope_head_dim = k.req_int("qk_rope_head_dim");
  c.q_lora_rank = k.req_int("q_lora_rank");
  c.o_lora_rank = k.req_int("o_lora_rank");
  c.o_groups = k.req_int("o_groups");

  c.moe_inter_dim = k.req_int("moe_intermediate_size");
  c.n_routed_experts = k.req_int("n_routed_experts");
  c.n_shared_experts = k.get_int("n_shared_experts", c.n_shared_experts);
  c.n_activated_experts = k.req_int("num_experts_per_tok");
  // num_hash_layers, else the leading hash_moe entries of mlp_layer_types, else HF's default 3.
  std::optional<int64_t> hash_from_types;
  if (k.has("mlp_layer_types")) {
    const json& v = k.list("mlp_layer_types");
    int64_t n = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      if (k.to_str(v[i], fmt::format("{}[{}]", k.label("mlp_layer_types"), i)) != "hash_moe") break;
      ++n;
    }
    hash_from_types = n;
  }
  if (k.has("num_hash_layers")) {
    c.n_hash_layers = k.req_int("num_hash_layers");
    DI_CHECK(!hash_from_types || *hash_from_types == c.n_hash_layers,
             "config {}: {} is {} but {} starts with {} hash_moe layers", c.source, k.label("num_hash_layers"),
             c.n_hash_layers, k.label("mlp_layer_types"), *hash_from_types);
  } else {
    c.n_hash_layers = hash_from_types.value_or(c.family == ModelFamily::kV41 ? 0 : 3);  // V4.1 has none
  }
  c.score_func = k.get_str("scoring_func").value_or(c.score_func);
  c.route_scale = static_cast<float>(k.get_num("routed_scaling_factor", c.route_scale));
  c.swiglu_limit = static_cast<float>(k.get_num("swiglu_limit", c.swiglu_limit));

  c.window_size = k.get_int("sliding_window", c.window_size);
  if (k.has("compress_ratios")) {
    c.compress_ratios = k.int_list("compress_ratios");
    if (k.has("layer_types")) {
      const auto lt = ratios_from_layer_types(k);
      for (size_t i = 0; i < lt.size() && i < c.compress_ratios.size(); ++i) {
        DI_CHECK(lt[i] == c.compress_ratios[i], "config {}: {}[{}] (ratio {}) disagrees with {}[{}] = {}", c.source,
                 k.label("layer_types"), i, lt[i], k.label("compress_ratios"), i, c.compress_ratios[i]);
      }
    }
  } else if (k.has("layer_types")) {
    // HF cuts the list to num_hidden_layers; the MTP layers are window-only (ratio 0).
    c.compress_ratios = ratios_from_layer_types(k);
    if (static_cast<int64_t>(c.compress_ratios.size()) == c.n_layers) {
      c.compress_ratios.insert(c.compress_ratios.end(), static_cast<size_t>(std::max<int64_t>(c.n_mtp_layers, 0)), 0);
    }
  } else {
    fail("config {}: neither {} nor {} is set: the per-layer attention schedule must be explicit", c.source,
         k.label("compress_ratios"), k.label("layer_types"));
  }
  c.index_n_heads = k.req_int("index_n_heads");
  c.index_head_dim = k.req_int("index_head_dim");
  c.index_topk = k.req_int("index_topk");

  c.rope_theta = k.get_num("rope_theta", c.rope_theta);
  c.compress_rope_theta = k.get_num("compress_rope_theta", c.compress_rope_theta);
  if (auto rs = k.object("rope_scaling")) {
    auto type = rs->get_str("rope_type");
    if (!type) type = rs->get_str("type");
    DI_CHECK(type.has_value(), "config {}: {} has neither 'type' nor 'rope_type'", c.source, k.label("rope_scaling"));
    if (*type == "yarn") {
      c.rope_factor = rs->req_num("factor");
      c.original_seq_len = rs->req_int("original_max_position_embeddings");
      c.beta_fast = rs->get_num("beta_fast", c.beta_fast);
      c.beta_slow = rs->get_num("beta_slow", c.beta_slow);
    } else if (*type != "default") {
      fail("config {}: {} type '{}' is not supported (expected yarn)", c.source, k.label("rope_scaling"), *type);
    }
  }

  c.hc_mult = k.get_int("hc_mult", c.hc_mult);
  c.hc_sinkhorn_iters = k.get_int("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  c.hc_eps = static_cast<float>(k.get_num("hc_eps", c.hc_eps));
  c.norm_eps = static_cast<float>(k.get_num("rms_norm_eps", c.norm_eps));
  c.bos_token_id = token_id(k, "bos_token_id", c.bos_token_id);
  c.eos_token_id = token_id(k, "eos_token_id", c.eos_token_id);
  if (c.family == ModelFamily::kV41)
    parse_v41_keys(
        k, c, {"kv_source_layer_ids", "index_source_layer_ids", "candidate_source_layer_id", "engram_pad_token_id"});
}

// quantization_config (top level) and expert_dtype (in quantization_config or at either level).
void parse_hf_quant(const Keys& top, const Keys& text, ModelConfig& c) {
  c.weights_fp8 = false;
  c.expert_fp4 = false;
  if (auto q = top.object("quantization_config")) {
    auto method = q->get_str("quant_method");
    DI_CHECK(!method || *method == "fp8", "config {}: {} is '{}'; only fp8 checkpoints are supported", c.source,
             q->label("quant_method"), method.value_or(""));
    check_scale_fmt(*q);
    c.weights_fp8 = true;
    if (q->has("weight_block_size")) {
      const auto b = q->int_list("weight_block_size");
      DI_CHECK(b.size() == 2 && b[0] == b[1], "config {}: {} must be [B, B], got {}", c.source,
               q->label("weight_block_size"), brief(q->req("weight_block_size")));
      c.fp8_block = b[0];
    }
    if (q->has("expert_dtype")) c.expert_fp4 = parse_expert_dtype(*q, "expert_dtype");
  }
  if (text.has("expert_dtype")) {
    c.expert_fp4 = parse_expert_dtype(text, "expert_dtype");
  } else if (top.has("expert_dtype")) {
    c.expert_fp4 = parse_expert_dtype(top, "expert_dtype");
  }
}

ModelConfig parse_hf(const json& j, const std::string& source) {
  ModelConfig c;
  c.source = source;
  Keys top(j, source, "");
  const std::string type = top.to_str(j.at("model_type"), "model_type");
  if (type == "deepseek_v4") {
    c.family = ModelFamily::kV4;
    parse_hf_text(top, c);
    parse_hf_quant(top, top, c);
  } else if (type == "deepseek_v41") {
    c.family = ModelFamily::kV41;
    auto text = top.object("text_config");
    DI_CHECK(text.has_value(), "config {}: model_type deepseek_v41 needs a text_config object", source);
    c.fp8_block = 32;  // V4.1 fixes its FP8 tiles and activation groups at 32 (§1.2)
    parse_hf_text(*text, c);
    parse_hf_quant(top, *text, c);
  } else {
    fail("unknown model_type '{}' in {}: expected deepseek_v4 or deepseek_v41", type, source);
  }
  return c;
}

ModelConfig parse_flat(const json& j, const std::string& source) {
  ModelConfig c;
  c.source = source;
  Keys k(j, source, "");
  // V4.1's ModelArgs carry the shared-KV / Engram source keys that V4's do not have.
  const bool v41 = k.has("kv_source_layers") || k.has("index_source_layers") || k.has("candidate_source_layer") ||
                   k.has("engram_layer_ids");
  c.family = v41 ? ModelFamily::kV41 : ModelFamily::kV4;

  c.vocab_size = k.req_int("vocab_size");
  c.dim = k.req_int("dim");
  c.n_layers = k.req_int("n_layers");
  c.n_mtp_layers = k.get_int("n_mtp_layers", 1);
  c.n_heads = k.req_int("n_heads");
  c.head_dim = k.req_int("head_dim");
  c.rope_head_dim = k.req_int("rope_head_dim");
  c.q_lora_rank = k.req_int("q_lora_rank");
  c.o_lora_rank = k.req_int("o_lora_rank");
  c.o_groups = k.req_int("o_groups");

  c.moe_inter_dim = k.req_int("moe_inter_dim");
  c.n_routed_experts = k.req_int("n_routed_experts");
  c.n_shared_experts = k.get_int("n_shared_experts", c.n_shared_experts);
  c.n_activated_experts = k.req_int("n_activated_experts");
  c.n_hash_layers = k.get_int("n_hash_layers", c.n_hash_layers);
  c.score_func = k.get_str("score_func").value_or(c.score_func);
  c.route_scale = static_cast<float>(k.get_num("route_scale", c.route_scale));
  c.swiglu_limit = static_cast<float>(k.get_num("swiglu_limit", c.swiglu_limit));

  c.window_size = k.get_int("window_size", c.window_size);
  c.compress_ratios = k.int_list("compress_ratios");
  c.index_n_heads = k.req_int("index_n_heads");
  c.index_head_dim = k.req_int("index_head_dim");
  c.index_topk = k.req_int("index_topk");

  c.rope_theta = k.get_num("rope_theta", c.rope_theta);
  c.compress_rope_theta = k.get_num("compress_rope_theta", c.compress_rope_theta);
  c.original_seq_len = k.get_int("original_seq_len", c.original_seq_len);
  c.rope_factor = k.get_num("rope_factor", c.rope_factor);
  c.beta_fast = k.get_num("beta_fast", c.beta_fast);
  c.beta_slow = k.get_num("beta_slow", c.beta_slow);

  c.hc_mult = k.get_int("hc_mult", c.hc_mult);
  c.hc_sinkhorn_iters = k.get_int("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  c.hc_eps = static_cast<float>(k.get_num("hc_eps", c.hc_eps));
  c.norm_eps = static_cast<float>(k.get_num("norm_eps", c.norm_eps));

  const std::string dtype = k.get_str("dtype").value_or("bf16");
  DI_CHECK(dtype == "fp8" || dtype == "bf16", "config {}: key 'dtype' is '{}', expected 'fp8' or 'bf16'", source,
           dtype);
  c.weights_fp8 = dtype == "fp8";
  c.expert_fp4 = parse_expert_dtype(k, "expert_dtype");
  check_scale_fmt(k);
  // V4 ModelArgs use 128x128 weight tiles / per-128 activation groups; V4.1 fixes both at 32.
  c.fp8_block = v41 ? 32 : 128;
  c.bos_token_id = token_id(k, "bos_token_id", c.bos_token_id);
  c.eos_token_id = token_id(k, "eos_token_id", c.eos_token_id);
  if (v41) parse_v41_keys(k, c, {"kv_source_layers", "index_source_layers", "candidate_source_layer", "engram_pad_id"});
  return c;
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// A strictly ascending list of layer ids inside [0, n_layers).
void check_layer_list(const ModelConfig& c, const std::vector<int64_t>& v, const char* name) {
  for (size_t i = 0; i < v.size(); ++i) {
    DI_CHECK(v[i] >= 0 && v[i] < c.n_layers, "config {}: {}[{}] = {} is not a layer (n_layers {})", c.source, name, i,
             v[i], c.n_layers);
    DI_CHECK(i == 0 || v[i] > v[i - 1], "config {}: {} must be strictly ascending, got {} after {}", c.source, name,
             v[i], v[i - 1]);
  }
}

// The V4.1 layer-role rules the forward relies on (§1.2, §2.6).
void validate_v41(const ModelConfig& c) {
  const std::string& src = c.source;
  DI_CHECK(c.fp8_block == 32, "config {}: V4.1 uses 32x32 FP8 tiles, got weight_block_size {}", src, c.fp8_block);
  DI_CHECK(c.n_hash_layers == 0, "config {}: V4.1 has no hash-routed layers, got {}", src, c.n_hash_layers);
  DI_CHECK(c.head_dim % 32 == 0, "config {}: head_dim {} must be a multiple of 32 (window-KV FP8 blocks)", src,
           c.head_dim);
  DI_CHECK(c.index_head_dim % 32 == 0, "config {}: index_head_dim {} must be a multiple of 32 (FP4 blocks)", src,
           c.index_head_dim);
  check_layer_list(c, c.kv_source_layers, "kv_source_layers");
  check_layer_list(c, c.index_source_layers, "index_source_layers");
  for (int64_t l : c.kv_source_layers) {
    DI_CHECK(c.compress_ratio(l) > 0, "config {}: kv source layer {} has compress ratio 0", src, l);
    DI_CHECK(c.is_index_source(l),
             "config {}: kv source layer {} must also be an index source (it owns the index keys)", src, l);
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const int64_t r = c.compress_ratio(l);
    if (r == 0) {
      DI_CHECK(!c.is_kv_source(l) && !c.is_index_source(l), "config {}: layer {} is a source but has compress ratio 0",
               src, l);
      continue;
    }
    const int64_t kv = c.kv_source_of(l), ix = c.index_source_of(l);
    DI_CHECK(kv >= 0, "config {}: layer {} has compress ratio {} but no kv source at or below it", src, l, r);
    DI_CHECK(c.compress_ratio(kv) == r, "config {}: layer {} (ratio {}) would read kv source {} of ratio {}", src, l, r,
             kv, c.compress_ratio(kv));
    DI_CHECK(ix >= kv, "config {}: layer {} would reuse index source {} from before its kv source {}", src, l, ix, kv);
  }
  if (c.candidate_source_layer >= 0) {
    DI_CHECK(c.is_index_source(c.candidate_source_layer), "config {}: candidate_source_layer {} is not an index source",
             src, c.candidate_source_layer);
    DI_CHECK(c.candidate_topk_blocks > 0 && c.candidate_block_size > 0,
             "config {}: candidate_topk_blocks ({}) and candidate_block_size ({}) must be positive", src,
             c.candidate_topk_blocks, c.candidate_block_size);
  }
  DI_CHECK(c.gate_temp > 0, "config {}: gate_temp must be positive, got {}", src, c.gate_temp);
  if (c.engram_layer_ids.empty()) return;
  check_layer_list(c, c.engram_layer_ids, "engram_layer_ids");
  DI_CHECK(c.engram_num_embeddings.size() == c.engram_layer_ids.size(),
           "config {}: engram_num_embeddings has {} entries for {} engram layers", src, c.engram_num_embeddings.size(),
           c.engram_layer_ids.size());
  DI_CHECK(c.engram_max_ngram_size >= 2 && c.engram_max_ngram_size <= 16,
           "config {}: engram_max_ngram_size must be in [2, 16], got {}", src, c.engram_max_ngram_size);
  DI_CHECK(c.engram_n_heads > 0 && c.engram_vocab_size > 0 && c.engram_compressed_vocab_size > 0,
           "config {}: engram_n_heads, engram_vocab_size and engram_compressed_vocab_size must be positive", src);
  DI_CHECK(c.engram_head_dim > 0 && c.engram_head_dim % 32 == 0,
           "config {}: engram_head_dim {} must be a positive multiple of 32 (FP8 row scales)", src, c.engram_head_dim);
  DI_CHECK(c.engram_pad_id >= 0 && c.engram_pad_id < c.vocab_size,
           "config {}: engram pad id {} is outside the vocabulary", src, c.engram_pad_id);
  for (int64_t rows : c.engram_num_embeddings)
    DI_CHECK(rows > 0, "config {}: engram_num_embeddings must be positive, got {}", src, rows);
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    fail("config {} is not valid JSON (byte {}): {}", source, e.byte, e.what());
  }
  DI_CHECK(j.is_object(), "config {}: expected a JSON object at the top level, got {}", source, j.type_name());
  ModelConfig c;
  if (j.contains("model_type")) {
    c = parse_hf(j, source);
  } else if (j.contains("dim") && j.contains("n_layers")) {
    c = parse_flat(j, source);
  } else {
    fail(
        "config {}: neither 'model_type' (Hugging Face config.json) nor 'dim' and 'n_layers' (flat "
        "inference/config.json) is present",
        source);
  }
  validate_model_config(c);
  return c;
}

void validate_model_config(const ModelConfig& c) {
  const std::string& src = c.source;
  auto positive = [&](int64_t v, const char* name) {
    DI_CHECK(v > 0, "config {}: {} must be positive, got {}", src, name, v);
  };
  auto non_negative = [&](int64_t v, const char* name) {
    DI_CHECK(v >= 0, "config {}: {} must not be negative, got {}", src, name, v);
  };
  positive(c.vocab_size, "vocab_size");
  positive(c.dim, "dim");
  positive(c.n_layers, "n_layers");
  non_negative(c.n_mtp_layers, "n_mtp_layers");
  positive(c.n_heads, "n_heads");
  positive(c.head_dim, "head_dim");
  positive(c.rope_head_dim, "rope_head_dim");
  positive(c.q_lora_rank, "q_lora_rank");
  positive(c.o_lora_rank, "o_lora_rank");
  positive(c.o_groups, "o_groups");
  positive(c.moe_inter_dim, "moe_inter_dim");
  positive(c.n_routed_experts, "n_routed_experts");
  non_negative(c.n_shared_experts, "n_shared_experts");
  positive(c.n_activated_experts, "n_activated_experts");
  non_negative(c.n_hash_layers, "n_hash_layers");
  positive(c.window_size, "window_size");
  positive(c.index_n_heads, "index_n_heads");
  positive(c.index_head_dim, "index_head_dim");
  positive(c.index_topk, "index_topk");
  non_negative(c.original_seq_len, "original_seq_len");
  positive(c.hc_mult, "hc_mult");
  positive(c.hc_sinkhorn_iters, "hc_sinkhorn_iters");
  positive(c.fp8_block, "fp8_block (quantization block size)");

  DI_CHECK(c.score_func == "sqrtsoftplus" || c.score_func == "softmax" || c.score_func == "sigmoid",
           "config {}: score_func '{}' is not one of sqrtsoftplus, softmax, sigmoid", src, c.score_func);
  DI_CHECK(c.route_scale > 0, "config {}: route_scale must be positive, got {}", src, c.route_scale);
  DI_CHECK(c.swiglu_limit >= 0, "config {}: swiglu_limit must not be negative, got {}", src, c.swiglu_limit);
  DI_CHECK(c.rope_theta > 0 && c.compress_rope_theta > 0,
           "config {}: rope_theta ({}) and compress_rope_theta ({}) must be positive", src, c.rope_theta,
           c.compress_rope_theta);
  DI_CHECK(c.rope_factor > 0, "config {}: rope_factor must be positive, got {}", src, c.rope_factor);
  DI_CHECK(c.norm_eps > 0 && c.hc_eps > 0, "config {}: norm_eps ({}) and hc_eps ({}) must be positive", src, c.norm_eps,
           c.hc_eps);

  DI_CHECK(static_cast<int64_t>(c.compress_ratios.size()) >= c.n_layers,
           "config {}: compress_ratios has {} entries but n_layers is {} (one entry per layer needed)", src,
           c.compress_ratios.size(), c.n_layers);
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    const int64_t r = c.compress_ratios[i];
    if (c.family == ModelFamily::kV4) {
      DI_CHECK(r == 0 || r == 4 || r == 128, "config {}: compress_ratios[{}] is {}; V4 layers use 0, 4 or 128", src, i,
               r);
    } else {
      DI_CHECK(r == 0 || r == 1 || r == 2, "config {}: compress_ratios[{}] is {}; V4.1 layers use 0, 1 or 2", src, i,
               r);
    }
  }

  DI_CHECK(c.head_dim > c.rope_head_dim, "config {}: head_dim {} must exceed rope_head_dim {}", src, c.head_dim,
           c.rope_head_dim);
  DI_CHECK(c.rope_head_dim % 2 == 0, "config {}: rope_head_dim {} must be even (RoPE rotates pairs)", src,
           c.rope_head_dim);
  DI_CHECK((c.n_heads * c.head_dim) % c.o_groups == 0,
           "config {}: n_heads * head_dim = {} * {} = {} is not divisible by o_groups {}", src, c.n_heads, c.head_dim,
           c.n_heads * c.head_dim, c.o_groups);
  DI_CHECK(c.n_activated_experts <= c.n_routed_experts, "config {}: n_activated_experts {} exceeds n_routed_experts {}",
           src, c.n_activated_experts, c.n_routed_experts);
  DI_CHECK(c.n_hash_layers <= c.n_layers, "config {}: n_hash_layers {} exceeds n_layers {}", src, c.n_hash_layers,
           c.n_layers);
  if (c.family == ModelFamily::kV4) {
    DI_CHECK(is_pow2(c.index_head_dim), "config {}: index_head_dim {} must be a power of two (Hadamard transform)", src,
             c.index_head_dim);
  } else {
    validate_v41(c);
  }
  DI_CHECK(c.index_head_dim >= c.rope_head_dim, "config {}: index_head_dim {} is smaller than rope_head_dim {}", src,
           c.index_head_dim, c.rope_head_dim);

  // FP8 activation quantization groups of fp8_block along every FP8 GEMM's input dimension.
  auto block_multiple = [&](int64_t v, const std::string& what) {
    DI_CHECK(v % c.fp8_block == 0,
             "config {}: {} = {} is not a multiple of the FP8 block size {} (activation quantization groups)", src,
             what, v, c.fp8_block);
  };
  block_multiple(c.dim, "dim");
  block_multiple(c.q_lora_rank, "q_lora_rank");
  block_multiple(c.moe_inter_dim, "moe_inter_dim");
  block_multiple(c.o_groups * c.o_lora_rank, "o_groups * o_lora_rank");
  block_multiple(c.n_heads * c.head_dim / c.o_groups, "n_heads * head_dim / o_groups");
  if (c.expert_fp4) {
    DI_CHECK(c.dim % 32 == 0 && c.moe_inter_dim % 32 == 0,
             "config {}: FP4 experts need dim ({}) and moe_inter_dim ({}) to be multiples of 32", src, c.dim,
             c.moe_inter_dim);
  }
}

namespace {
bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }
int64_t latest_at_or_below(const std::vector<int64_t>& v, int64_t layer) {
  int64_t best = -1;
  for (int64_t s : v)
    if (s <= layer) best = std::max(best, s);
  return best;
}
}  // namespace

bool ModelConfig::is_kv_source(int64_t layer) const { return contains(kv_source_layers, layer); }
bool ModelConfig::is_index_source(int64_t layer) const { return contains(index_source_layers, layer); }
int64_t ModelConfig::kv_source_of(int64_t layer) const { return latest_at_or_below(kv_source_layers, layer); }
int64_t ModelConfig::index_source_of(int64_t layer) const { return latest_at_or_below(index_source_layers, layer); }
int64_t ModelConfig::engram_index(int64_t layer) const {
  auto it = std::find(engram_layer_ids.begin(), engram_layer_ids.end(), layer);
  return it == engram_layer_ids.end() ? -1 : static_cast<int64_t>(it - engram_layer_ids.begin());
}

FamilyNumerics family_numerics(ModelFamily f) {
  if (f == ModelFamily::kV4) return {true, 64, false, false, true, 0.0f, false};
  return {false, 32, true, true, false, 1e-20f, true};
}

ModelConfig load_model_config(const std::string& path) {
  std::error_code ec;
  fs::path p(path);
  if (fs::is_directory(p, ec)) {
    p /= "config.json";
    DI_CHECK(fs::exists(p, ec), "no config.json in directory {}", path);
  } else {
    DI_CHECK(fs::exists(p, ec), "config file {} does not exist", path);
  }
  std::ifstream in(p, std::ios::binary);
  DI_CHECK(in.good(), "cannot read config file {}", p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), p.string());
}

}  // namespace deepinfer
