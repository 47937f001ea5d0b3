// Weight binding for DeepSeek-V4.1 checkpoints (docs/v4-architecture.md §1.3): sources own the
// compressor and index-key projections, every layer has the V4.1 gate (bias, optional bias_vl),
// engram layers add the hash table (kept in the mapping, never copied) and its projections.
#include "core/progress.h"
#include "deepinfer/error.h"
#include "model/weight_binder.h"

namespace deepinfer {

namespace {

struct BinderV41 : WeightBinder {
  Tensor norm_weight(const std::string& name, int64_t n) { return take(name, {n}, {DType::kBF16, DType::kF32}); }

  AttentionWeightsV41 attention(int64_t l, const std::string& ap) {
    const LinearKind dense = cfg.weights_fp8 ? LinearKind::kFp8 : LinearKind::kBf16;
    AttentionWeightsV41 a;
    a.wq_a = linear(ap + ".wq_a", cfg.q_lora_rank, cfg.dim, dense);
    a.q_norm = norm_weight(ap + ".q_norm.weight", cfg.q_lora_rank);
    a.wq_b = linear(ap + ".wq_b", cfg.n_heads * cfg.head_dim, cfg.q_lora_rank, dense);
    a.wkv = linear(ap + ".wkv", cfg.head_dim, cfg.dim, dense);
    a.kv_norm = norm_weight(ap + ".kv_norm.weight", cfg.head_dim);
    a.wo_a = linear(ap + ".wo_a", cfg.o_groups * cfg.o_lora_rank, cfg.n_heads * cfg.head_dim / cfg.o_groups, dense);
    a.wo_b = linear(ap + ".wo_b", cfg.dim, cfg.o_groups * cfg.o_lora_rank, dense);
    a.attn_sink = take(ap + ".attn_sink", {cfg.n_heads}, {DType::kF32});
    a.kv_source = cfg.is_kv_source(l);
    a.index_source = cfg.is_index_source(l);
    if (a.kv_source) {
      CompressorWeightsV41& c = a.compressor;
      c.ratio = cfg.compress_ratio(l);
      c.wkv = linear(ap + ".compressor.wkv", cfg.head_dim, cfg.dim, LinearKind::kBf16);
      if (c.ratio > 1) c.wgate = linear(ap + ".compressor.wgate", cfg.head_dim, cfg.dim, LinearKind::kBf16);
      c.norm = norm_weight(ap + ".compressor.norm.weight", cfg.head_dim);
    }
    if (a.index_source) {
      IndexerWeightsV41& ix = a.indexer;
      const std::string ip = ap + ".indexer";
      ix.wq_b = linear(ip + ".wq_b", cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank, dense);
      ix.weights_proj = linear(ip + ".weights_proj", cfg.index_n_heads, cfg.dim, LinearKind::kBf16);
      ix.owns_keys = a.kv_source;
      if (ix.owns_keys) {
        ix.wk = linear(ip + ".wk", cfg.index_head_dim, cfg.head_dim, LinearKind::kBf16);
        ix.k_norm = norm_weight(ip + ".k_norm.weight", cfg.index_head_dim);
      }
    }
    return a;
  }

  EngramWeights engram(int64_t l, const std::string& p) {
    const int64_t e = cfg.engram_index(l), hd = cfg.engram_head_dim;
    const int64_t rows = cfg.engram_num_embeddings[e];
    const int64_t cols = (cfg.engram_max_ngram_size - 1) * cfg.engram_n_heads;
    EngramWeights w;
    const std::string tname = p + ".embed.weight", sname = p + ".embed.scale";
    DI_CHECK(ckpt.has(tname), "checkpoint {}: missing tensor {}", ckpt.dir(), tname);
    if (ckpt.info(tname).dtype == DType::kE4M3) {
      w.table = take(tname, {rows, hd}, {DType::kE4M3});
      w.table_scale = take(sname, {rows, hd / 32}, {DType::kE8M0});
    } else {
      w.table = take(tname, {rows, hd}, {DType::kBF16, DType::kF32});
    }
    const LinearKind dense = cfg.weights_fp8 ? LinearKind::kFp8 : LinearKind::kBf16;
    w.wkv = linear(p + ".wkv", cfg.dim * (cfg.hc_mult + 1), cols * hd, dense);
    w.q_weight = take(p + ".q_weight", {cfg.hc_mult, cfg.dim}, {DType::kBF16, DType::kF32});
    w.k_weight = take(p + ".k_weight", {cfg.hc_mult, cfg.dim}, {DType::kBF16, DType::kF32});
    return w;
  }

  LayerWeightsV41 layer(int64_t l) {
    const std::string p = "layers." + std::to_string(l);
    const int64_t hc = cfg.hc_mult, mix = (2 + hc) * hc, hcd = hc * cfg.dim;
    LayerWeightsV41 w;
    w.hc_attn_fn = take(p + ".hc_attn_fn", {mix, hcd}, {DType::kF32});
    w.hc_attn_base = take(p + ".hc_attn_base", {mix}, {DType::kF32});
    w.hc_attn_scale = take(p + ".hc_attn_scale", {3}, {DType::kF32});
    w.hc_ffn_fn = take(p + ".hc_ffn_fn", {mix, hcd}, {DType::kF32});
    w.hc_ffn_base = take(p + ".hc_ffn_base", {mix}, {DType::kF32});
    w.hc_ffn_scale = take(p + ".hc_ffn_scale", {3}, {DType::kF32});
    w.attn_norm = norm_weight(p + ".attn_norm.weight", cfg.dim);
    w.ffn_norm = norm_weight(p + ".ffn_norm.weight", cfg.dim);
    w.attn = attention(l, p + ".attn");

    MoeWeights& f = w.ffn;
    const std::string fp = p + ".ffn";
    const LinearKind dense = cfg.weights_fp8 ? LinearKind::kFp8 : LinearKind::kBf16;
    f.gate_weight = take(fp + ".gate.weight", {cfg.n_routed_experts, cfg.dim}, {DType::kBF16, DType::kF32});
    f.gate_bias = take(fp + ".gate.bias", {cfg.n_routed_experts}, {DType::kF32});
    if (ckpt.has(fp + ".gate.bias_vl"))
      f.gate_bias_vl = take(fp + ".gate.bias_vl", {cfg.n_routed_experts}, {DType::kF32});
    const LinearKind ek = cfg.expert_fp4 ? LinearKind::kFp4 : dense;
    f.experts.reserve(cfg.n_routed_experts);
    for (int64_t e = 0; e < cfg.n_routed_experts; ++e)
      f.experts.push_back(expert(fp + ".experts." + std::to_string(e), ek));
    f.shared = expert(fp + ".shared_experts", dense);
    index_experts(f);

    if (cfg.engram_index(l) >= 0) {
      w.has_engram = true;
      w.engram = engram(l, p + ".engram");
    }
    return w;
  }
};

}  // namespace

ModelWeightsV41 load_weights_v41(Checkpoint& ckpt, const ModelConfig& cfg) {
  DI_CHECK(cfg.family == ModelFamily::kV41, "load_weights_v41: config {} is not a V4.1 model", cfg.source);
  BinderV41 b{{ckpt, cfg}};
  ModelWeightsV41 w;
  w.embed = b.take("embed.weight", {cfg.vocab_size, cfg.dim}, {DType::kBF16, DType::kF32});
  w.head = b.take("head.weight", {cfg.vocab_size, cfg.dim}, {DType::kBF16, DType::kF32});
  w.norm = b.norm_weight("norm.weight", cfg.dim);
  w.layers.reserve(cfg.n_layers);
  ProgressBar bar("binding weights (layers)", cfg.n_layers);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    w.layers.push_back(b.layer(l));
    bar.step();
  }
  // DSpark stages (mtp.*) are the speculative module; the vision tower (vision.*, aligner.*, image_*)
  // serves image inputs, which this engine does not take yet.
  reject_unused(ckpt, cfg, "V4.1", {"mtp.", "vision.", "aligner.", "image_start", "image_end", "image_newline"});
  return w;
}

void move_weights(ModelWeightsV41& w, Device d) {
  if (d == Device::kCPU) return;
  for (Tensor* t : {&w.embed, &w.head, &w.norm}) move_weight(*t, d);
  for (LayerWeightsV41& L : w.layers) {
    for (Tensor* t : {&L.hc_attn_fn, &L.hc_attn_base, &L.hc_attn_scale, &L.hc_ffn_fn, &L.hc_ffn_base, &L.hc_ffn_scale,
                      &L.attn_norm, &L.ffn_norm, &L.attn.q_norm, &L.attn.kv_norm, &L.attn.attn_sink})
      move_weight(*t, d);
    for (ops::QWeight* q : {&L.attn.wq_a, &L.attn.wq_b, &L.attn.wkv, &L.attn.wo_a, &L.attn.wo_b}) move_weight(*q, d);
    AttentionWeightsV41& a = L.attn;
    if (a.kv_source) {
      move_weight(a.compressor.wkv, d);
      move_weight(a.compressor.wgate, d);
      move_weight(a.compressor.norm, d);
    }
    if (a.index_source || a.indexer.owns_keys) {
      move_weight(a.indexer.wq_b, d);
      move_weight(a.indexer.weights_proj, d);
      move_weight(a.indexer.wk, d);
      move_weight(a.indexer.k_norm, d);
    }
    move_moe(L.ffn, d);
    // L.engram stays on the host: engram_forward runs there.
  }
}

}  // namespace deepinfer
