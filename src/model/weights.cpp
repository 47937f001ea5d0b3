#include "model/weights.h"

#include "core/progress.h"
#include "deepinfer/error.h"
#include "model/weight_binder.h"

namespace deepinfer {

namespace {

struct Binder : WeightBinder {
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
    for (int64_t e = 0; e < cfg.n_routed_experts; ++e)
      f.experts.push_back(expert(fp + ".experts." + std::to_string(e), ek));
    f.shared = expert(fp + ".shared_experts", dense);
    index_experts(f);
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
  Binder b{{ckpt, cfg}};
  ModelWeights w;
  const int64_t hc = cfg.hc_mult;
  w.embed = b.take("embed.weight", {cfg.vocab_size, cfg.dim}, {DType::kBF16, DType::kF32});
  w.head = b.take("head.weight", {cfg.vocab_size, cfg.dim}, {DType::kBF16, DType::kF32});
  w.norm = b.take("norm.weight", {cfg.dim}, {DType::kBF16, DType::kF32});
  w.hc_head_fn = b.take("hc_head_fn", {hc, hc * cfg.dim}, {DType::kF32});
  w.hc_head_base = b.take("hc_head_base", {hc}, {DType::kF32});
  w.hc_head_scale = b.take("hc_head_scale", {1}, {DType::kF32});
  w.layers.reserve(cfg.n_layers);
  ProgressBar bar("binding weights (layers)", cfg.n_layers);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    w.layers.push_back(b.layer(l));
    bar.step();
    if (cfg.is_hash_layer(l)) check_tid2eid(w.layers.back().ffn.tid2eid, cfg, l);
  }
  reject_unused(ckpt, cfg, "V4", {"mtp."});  // MTP: the speculative module
  return w;
}

void move_weight(Tensor& t, Device device) {
  if (t.defined()) t = t.to(device);
}

void move_weight(ops::QWeight& q, Device device) {
  move_weight(q.w, device);
  move_weight(q.scale, device);
}

namespace {
void move_expert(ExpertWeights& e, Device d) {
  move_weight(e.w1, d);
  move_weight(e.w2, d);
  move_weight(e.w3, d);
}
void move_compressor(CompressorWeights& c, Device d) {
  move_weight(c.wkv, d);
  move_weight(c.wgate, d);
  move_weight(c.ape, d);
  move_weight(c.norm, d);
}
}  // namespace

void move_moe(MoeWeights& m, Device d) {
  for (Tensor* t : {&m.gate_weight, &m.gate_bias, &m.gate_bias_vl, &m.tid2eid}) move_weight(*t, d);
  for (ExpertWeights& e : m.experts) move_expert(e, d);
  move_expert(m.shared, d);
  index_experts(m);
}

void index_experts(MoeWeights& m) {
  m.routed_w1.clear(), m.routed_w2.clear(), m.routed_w3.clear();
  for (const ExpertWeights& e : m.experts) {
    m.routed_w1.push_back(e.w1);
    m.routed_w2.push_back(e.w2);
    m.routed_w3.push_back(e.w3);
  }
  m.shared_w1.clear(), m.shared_w3.clear();
  m.shared_rows = Tensor();
  if (m.shared.w1.w.defined()) {
    m.shared_w1.push_back(m.shared.w1);
    m.shared_w3.push_back(m.shared.w3);
    m.shared_rows = Tensor::zeros({MoeWeights::kGroupedRowsMax}, DType::kI32, m.shared.w1.w.device());
  }
}

void stack_rows(ops::QWeight& a, ops::QWeight& b, ops::QWeight& out) {
  out = {};
  if (!a.w.defined() || !b.w.defined() || !a.w.is_contiguous() || !b.w.is_contiguous()) return;
  if (a.w.dtype() != b.w.dtype() || a.w.dtype() == DType::kE2M1x2 || a.w.device() != b.w.device()) return;
  if (a.in() != b.in() || a.block != b.block || a.scale.defined() != b.scale.defined()) return;
  const bool scaled = a.scale.defined();
  if (scaled && (a.block <= 0 || a.out() % a.block != 0 || a.scale.dtype() != b.scale.dtype() ||
                 a.scale.size(1) != b.scale.size(1) || !a.scale.is_contiguous() || !b.scale.is_contiguous()))
    return;
  auto stack = [](const Tensor& x, const Tensor& y) {
    Tensor s = Tensor::empty({x.size(0) + y.size(0), x.size(1)}, x.dtype(), x.device());
    copy_tensor(s.slice(0, 0, x.size(0)), x);
    copy_tensor(s.slice(0, x.size(0), s.size(0)), y);
    return s;
  };
  out.block = a.block;
  out.w = stack(a.w, b.w);
  const int64_t na = a.out();
  a.w = out.w.slice(0, 0, na);
  b.w = out.w.slice(0, na, out.w.size(0));
  if (scaled) {
    out.scale = stack(a.scale, b.scale);
    const int64_t sa = a.scale.size(0);
    a.scale = out.scale.slice(0, 0, sa);
    b.scale = out.scale.slice(0, sa, out.scale.size(0));
  }
}

void move_weights(ModelWeights& w, Device d) {
  if (d == Device::kCPU) return;
  for (Tensor* t : {&w.embed, &w.head, &w.norm, &w.hc_head_fn, &w.hc_head_base, &w.hc_head_scale}) move_weight(*t, d);
  for (LayerWeights& L : w.layers) {
    for (Tensor* t : {&L.hc_attn_fn, &L.hc_attn_base, &L.hc_attn_scale, &L.hc_ffn_fn, &L.hc_ffn_base, &L.hc_ffn_scale,
                      &L.attn_norm, &L.ffn_norm, &L.attn.q_norm, &L.attn.kv_norm, &L.attn.attn_sink})
      move_weight(*t, d);
    for (ops::QWeight* q : {&L.attn.wq_a, &L.attn.wq_b, &L.attn.wkv, &L.attn.wo_a, &L.attn.wo_b}) move_weight(*q, d);
    if (L.attn.has_compressor) move_compressor(L.attn.compressor, d);
    if (L.attn.has_indexer) {
      move_weight(L.attn.indexer.wq_b, d);
      move_weight(L.attn.indexer.weights_proj, d);
      move_compressor(L.attn.indexer.compressor, d);
    }
    move_moe(L.ffn, d);
  }
}

}  // namespace deepinfer
