#include "model/weights.h"

#include "deepinfer/error.h"

namespace deepinfer {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The three ways a checkpoint ships a linear weight; each also accepts its BF16 dequantisation.
enum class LinearKind { kFp8, kFp4, kBf16 };

struct Binder {
  Checkpoint& ckpt;
  const ModelConfig& cfg;

  Tensor take(const std::string& name, const Shape& shape, std::initializer_list<DType> dtypes) {
    return ckpt.take(name, shape, dtypes);
  }

  ops::QWeight linear(const std::string& prefix, int64_t out, int64_t in, LinearKind kind) {
    const std::string wname = prefix + ".weight", sname = prefix + ".scale";
    ops::QWeight q;
    DI_CHECK(ckpt.has(wname), "checkpoint {}: missing tensor {}", ckpt.dir(), wname);
    const DType dt = ckpt.info(wname).dtype;
    const bool dense = dt == DType::kBF16 || dt == DType::kF32;
    if (kind == LinearKind::kBf16 || dense) {
      q.w = take(wname, {out, in}, {DType::kBF16, DType::kF32});
      DI_CHECK(!ckpt.has(sname), "checkpoint {}: {} is dense ({}) but {} exists", ckpt.dir(), wname, dtype_name(dt),
               sname);
      return q;
    }
    if (kind == LinearKind::kFp8) {
      const int64_t b = cfg.fp8_block;
      q.w = take(wname, {out, in}, {DType::kE4M3});
      q.scale = take(sname, {ceil_div(out, b), ceil_div(in, b)}, {DType::kE8M0});
      q.block = b;
      return q;
    }
    // FP4 experts ship as I8 [out, in/2], two e2m1 codes per byte, with E8M0 scales per 32 along K.
    DI_CHECK(in % 32 == 0, "FP4 weight {} needs in_features divisible by 32, got {}", wname, in);
    Tensor packed = take(wname, {out, in / 2}, {DType::kI8, DType::kU8});
    q.w = packed.reinterpret(DType::kE2M1x2, {out, in});
    q.scale = take(sname, {out, in / 32}, {DType::kE8M0});
    return q;
  }

  CompressorWeights compressor(const std::string& p, int64_t ratio, int64_t d) {
    CompressorWeights c;
    c.ratio = ratio;
    c.head_dim = d;
    c.overlap = ratio == 4;
    const int64_t cd = (c.overlap ? 2 : 1) * d;
    c.wkv = linear(p + ".wkv", cd, cfg.dim, LinearKind::kBf16);
    c.wgate = linear(p + ".wgate", cd, cfg.dim, LinearKind::kBf16);
    c.ape = take(p + ".ape", {ratio, cd}, {DType::kF32});
    c.norm = take(p + ".norm.weight", {d}, {DType::kBF16, DType::kF32});
    return c;
  }

  ExpertWeights expert(const std::string& p, LinearKind kind) {
    ExpertWeights e;
    e.w1 = linear(p + ".w1", cfg.moe_inter_dim, cfg.dim, kind);
    e.w2 = linear(p + ".w2", cfg.dim, cfg.moe_inter_dim, kind);
    e.w3 = linear(p + ".w3", cfg.moe_inter_dim, cfg.dim, kind);
    return e;
  }

  LayerWeights layer(int64_t l) {
    const std::string p = "layers." + std::to_string(l);
    const int64_t hc = cfg.hc_mult, mix = (2 + hc) * hc, hcd = hc * cfg.dim;
    LayerWeights w;
    w.hc_attn_fn = take(p + ".hc_attn_fn", {mix, hcd}, {DType::kF32});
    w.hc_attn_base = take(p + ".hc_attn_base", {mix}, {DType::kF32});
    w.hc_attn_scale = take(p + ".hc_attn_scale", {3}, {DType::kF32});
    w.hc_ffn_fn = take(p + ".hc_ffn_fn", {mix, hcd}, {DType::kF32});
    w.hc_ffn_base = take(p + ".hc_ffn_base", {mix}, {DType::kF32});
    w.hc_ffn_scale = take(p + ".hc_ffn_scale", {3}, {DType::kF32});
    w.attn_norm = take(p + ".attn_norm.weight", {cfg.dim}, {DType::kBF16, DType::kF32});
    w.ffn_norm = take(p + ".ffn_norm.weight", {cfg.dim}, {DType::kBF16, DType::kF32});

    AttentionWeights& a = w.attn;
    const std::string ap = p + ".attn";
    const LinearKind dense = cfg.weights_fp8 ? LinearKind::kFp8 : LinearKind::kBf16;
    a.wq_a = linear(ap + ".wq_a", cfg.q_lora_rank, cfg.dim, dense);
    a.q_norm = take(ap + ".q_norm.weight", {cfg.q_lora_rank}, {DType::kBF16, DType::kF32});
    a.wq_b = linear(ap + ".wq_b", cfg.n_heads * cfg.head_dim, cfg.q_lora_rank, dense);
    a.wkv = linear(ap + ".wkv", cfg.head_dim, cfg.dim, dense);
    a.kv_norm = take(ap + ".kv_norm.weight", {cfg.head_dim}, {DType::kBF16, DType::kF32});
    a.wo_a = linear(ap + ".wo_a", cfg.o_groups * cfg.o_lora_rank, cfg.n_heads * cfg.head_dim / cfg.o_groups, dense);
    a.wo_b = linear(ap + ".wo_b", cfg.dim, cfg.o_groups * cfg.o_lora_rank, dense);
    a.attn_sink = take(ap + ".attn_sink", {cfg.n_heads}, {DType::kF32});
    const int64_t ratio = cfg.compress_ratio(l);
    if (ratio > 0) {
      a.has_compressor = true;
      a.compressor = compressor(ap + ".compressor", ratio, cfg.head_dim);
      if (ratio == 4) {
        a.has_indexer = true;
        a.indexer.wq_b = linear(ap + ".indexer.wq_b", cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank, dense);
        a.indexer.weights_proj = linear(ap + ".indexer.weights_proj", cfg.index_n_heads, cfg.dim, LinearKind::kBf16);
        a.indexer.compressor = compressor(ap + ".indexer.compressor", ratio, cfg.index_head_dim);
      }
    }

    MoeWeights& f = w.ffn;
    const std::string fp = p + ".ffn";
    f.gate_weight = take(fp + ".gate.weight", {cfg.n_routed_experts, cfg.dim}, {DType::kBF16, DType::kF32});
    if (cfg.is_hash_layer(l)) {
      f.tid2eid = take(fp + ".gate.tid2eid", {cfg.vocab_size, cfg.n_activated_experts}, {DType::kI64, DType::kI32});
    } else {
      f.gate_bias = take(fp + ".gate.bias", {cfg.n_routed_experts}, {DType::kF32});
    }
    const LinearKind ek = cfg.expert_fp4 ? LinearKind::kFp4 : dense;
    f.experts.reserve(cfg.n_routed_experts);
    for (int64_t e = 0; e < cfg.n_routed_experts; ++e) f.experts.push_back(expert(fp + ".experts." + std::to_string(e), ek));
    f.shared = expert(fp + ".shared_experts", dense);
    return w;
  }
};

void check_tid2eid(const Tensor& t, const ModelConfig& cfg, int64_t layer) {
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = t.dtype() == DType::kI64 ? t.data<int64_t>()[i] : t.data<int32_t>()[i];
    DI_CHECK(e >= 0 && e < cfg.n_routed_experts, "layers.{}.ffn.gate.tid2eid holds expert id {} (n_routed_experts {})",
             layer, e, cfg.n_routed_experts);
  }
}

}  // namespace

ModelWeights load_weights_v4(Checkpoint& ckpt, const ModelConfig& cfg) {
  DI_CHECK(cfg.family == ModelFamily::kV4, "load_weights_v4: config {} is not a V4 model", cfg.source);
  Binder b{ckpt, cfg};
  ModelWeights w;
  const int64_t hc = cfg.hc_mult;
  w.embed = b.take("embed.weight", {cfg.vocab_size, cfg.dim}, {DType::kBF16, DType::kF32});
  w.head = b.take("head.weight", {cfg.vocab_size, cfg.dim}, {DType::kBF16, DType::kF32});
  w.norm = b.take("norm.weight", {cfg.dim}, {DType::kBF16, DType::kF32});
  w.hc_head_fn = b.take("hc_head_fn", {hc, hc * cfg.dim}, {DType::kF32});
  w.hc_head_base = b.take("hc_head_base", {hc}, {DType::kF32});
  w.hc_head_scale = b.take("hc_head_scale", {1}, {DType::kF32});
  w.layers.reserve(cfg.n_layers);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    w.layers.push_back(b.layer(l));
    if (cfg.is_hash_layer(l)) check_tid2eid(w.layers.back().ffn.tid2eid, cfg, l);
  }
  // MTP / DSpark tensors belong to the speculative module, loaded separately.
  std::vector<std::string> extra;
  for (const auto& n : ckpt.unused())
    if (n.rfind("mtp.", 0) != 0) extra.push_back(n);
  if (!extra.empty()) {
    std::string list;
    for (size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + extra[i];
    fail("checkpoint {}: {} unexpected tensor(s) not used by a {}-layer V4 model: {}{}", ckpt.dir(), extra.size(),
         cfg.n_layers, list, extra.size() > 8 ? ", ..." : "");
  }
  return w;
}

}  // namespace deepinfer
