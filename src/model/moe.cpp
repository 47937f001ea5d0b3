// MoE of both families (docs/v4-architecture.md §2.8): sqrt-softplus scores, hash or biased top-k routing,
// clamped SwiGLU experts with the routing weight applied before w2, FP32 accumulation in
// ascending expert order, then the shared expert.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/debug_dump.h"
#include "deepinfer/error.h"
#include "model/layers_v4.h"

namespace deepinfer {

namespace {

inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// h = silu(min(g, L)) * clamp(u, -L, L) [* weight], rounded to BF16 when bf16.
Tensor swiglu(const Tensor& g, const Tensor& u, const float* weights, float limit, bool bf16) {
  Tensor h = Tensor::empty(g.shape(), DType::kF32);
  const int64_t T = g.size(0), I = g.size(1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < I; ++i) {
      float gv = g.data<float>()[t * I + i], uv = u.data<float>()[t * I + i];
      if (limit > 0) {
        uv = std::min(std::max(uv, -limit), limit);
        gv = std::min(gv, limit);
      }
      float v = silu(gv) * uv;
      if (weights) v = weights[t] * v;
      h.data<float>()[t * I + i] = bf16 ? round_bf16(v) : v;
    }
  return h;
}

Tensor expert_forward(const ExpertWeights& e, const Tensor& x, const float* weights, const LayerCtx& c) {
  Tensor g = linear_q(x, e.w1, c), u = linear_q(x, e.w3, c);
  return linear_q(swiglu(g, u, weights, c.cfg.swiglu_limit, c.num.bf16), e.w2, c);
}

}  // namespace

Tensor moe(const MoeWeights& w, const Tensor& x, const std::vector<int32_t>& tokens, const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t T = x.size(0), E = cfg.n_routed_experts, K = cfg.n_activated_experts, dim = cfg.dim;
  DI_CHECK(cfg.score_func == "sqrtsoftplus", "score_func '{}' is not supported (V4 uses sqrtsoftplus)", cfg.score_func);
  ops::QWeight gate{w.gate_weight, {}, 0};
  Tensor logits = linear_f32(x, gate);  // [T, E]
  if (cfg.gate_temp != 1.0f)            // V4.1 gate temperature (1 in V4 configs)
    for (int64_t i = 0; i < logits.numel(); ++i) logits.data<float>()[i] /= cfg.gate_temp;
  const FamilyNumerics fam = family_numerics(cfg.family);
  const bool normalize = fam.moe_norm_switchable ? cfg.norm_topk_prob && K > 1 : true;
  std::vector<int32_t> idx(T * K);
  std::vector<float> wts(T * K);
  const bool hash = w.tid2eid.defined();
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> s(E), biased(E);
    for (int64_t e = 0; e < E; ++e) {
      s[e] = std::sqrt(softplus(logits.data<float>()[t * E + e]));
      biased[e] = hash ? s[e] : s[e] + w.gate_bias.data<float>()[e];
    }
    int32_t* ti = idx.data() + t * K;
    if (hash) {
      DI_CHECK(tokens[t] >= 0 && tokens[t] < cfg.vocab_size, "token id {} out of range (vocab {})", tokens[t],
               cfg.vocab_size);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t o = static_cast<int64_t>(tokens[t]) * K + k;
        ti[k] = static_cast<int32_t>(w.tid2eid.dtype() == DType::kI64 ? w.tid2eid.data<int64_t>()[o]
                                                                        : w.tid2eid.data<int32_t>()[o]);
      }
    } else {
      ops::topk(biased.data(), E, K, ti);
    }
    float sum = 0.0f;
    for (int64_t k = 0; k < K; ++k) sum += (wts[t * K + k] = s[ti[k]]);
    const float denom = sum + fam.moe_norm_eps;
    for (int64_t k = 0; k < K; ++k) {
      if (normalize) wts[t * K + k] /= denom;
      wts[t * K + k] *= cfg.route_scale;
    }
  }
  if (c.trace) {
    auto& rec = c.trace->experts[c.layer];
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> row(idx.begin() + t * K, idx.begin() + (t + 1) * K);
      std::sort(row.begin(), row.end());
      rec.insert(rec.end(), row.begin(), row.end());
    }
  }

  std::vector<float> acc(T * dim, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> rows;
    std::vector<float> rw;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k)
        if (idx[t * K + k] == e) {
          rows.push_back(t);
          rw.push_back(wts[t * K + k]);
        }
    if (rows.empty()) continue;
    Tensor xe = Tensor::empty({static_cast<int64_t>(rows.size()), dim}, DType::kF32);
    for (size_t i = 0; i < rows.size(); ++i)
      std::memcpy(xe.data<float>() + i * dim, x.data<float>() + rows[i] * dim, dim * sizeof(float));
    Tensor ye = expert_forward(w.experts[e], xe, rw.data(), c);
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t d = 0; d < dim; ++d) acc[rows[i] * dim + d] += ye.data<float>()[i * dim + d];
  }
  Tensor ys = expert_forward(w.shared, x, nullptr, c);
  dump("shared_out", c.layer, ys);
  Tensor out = Tensor::empty({T, dim}, DType::kF32);
  for (int64_t i = 0; i < T * dim; ++i) {
    const float v = acc[i] + ys.data<float>()[i];
    out.data<float>()[i] = c.num.bf16 ? round_bf16(v) : v;
  }
  return out;
}

}  // namespace deepinfer
