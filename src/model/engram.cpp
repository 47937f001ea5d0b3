// Engram (docs/v4-architecture.md §2.9): each token's 24 hashed table rows, dequantised per lookup
// straight from the checkpoint mapping, projected by wkv into one key per hc copy plus a shared
// value; each copy adds the value gated by a normalised dot product of the copy with its key.
#include <cmath>
#include <cstring>

#include "core/debug_dump.h"
#include "deepinfer/error.h"
#include "model/layers_v41.h"

namespace deepinfer {

namespace {

// The concatenated embedding rows of every token, [T, n_cols * head_dim] (exact in BF16).
Tensor gather_rows(const EngramWeights& w, const std::vector<int64_t>& rows, int64_t n_cols) {
  const int64_t hd = w.table.size(1), n_rows = w.table.size(0);
  const int64_t T = static_cast<int64_t>(rows.size()) / n_cols;
  Tensor e = Tensor::empty({T, n_cols * hd}, DType::kF32);
  float* out = e.data<float>();
  for (int64_t i = 0; i < T * n_cols; ++i) {
    const int64_t r = rows[i];
    DI_CHECK(r >= 0 && r < n_rows, "engram row {} outside the table of {} rows", r, n_rows);
    float* dst = out + i * hd;
    switch (w.table.dtype()) {
      case DType::kE4M3: {
        const uint8_t* codes = w.table.data<uint8_t>() + r * hd;
        const uint8_t* scales = w.table_scale.data<uint8_t>() + r * (hd / 32);
        for (int64_t d = 0; d < hd; ++d) dst[d] = e4m3_to_f32(codes[d]) * e8m0_to_f32(scales[d / 32]);
        break;
      }
      case DType::kBF16:
        for (int64_t d = 0; d < hd; ++d) dst[d] = bf16_to_f32(w.table.data<uint16_t>()[r * hd + d]);
        break;
      default:
        std::memcpy(dst, w.table.data<float>() + r * hd, hd * sizeof(float));
    }
  }
  return e;
}

float weight_at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kBF16 ? bf16_to_f32(t.data<uint16_t>()[i]) : t.data<float>()[i];
}

}  // namespace

Tensor engram_forward(const EngramWeights& w, const Tensor& stream, const std::vector<int64_t>& rows, int64_t n_cols,
                      const LayerCtx& c) {
  // The tables and projections stay on the host (Model::load does not move them): a device stream
  // makes the round trip.
  if (stream.device() != Device::kCPU)
    return engram_forward(w, stream.to(Device::kCPU), rows, n_cols, c).to(stream.device());
  const ModelConfig& cfg = c.cfg;
  const int64_t T = stream.size(0), hc = cfg.hc_mult, dim = cfg.dim;
  Tensor e = gather_rows(w, rows, n_cols);
  Tensor kv = linear_q(e, w.wkv, c);  // [T, (hc+1)*dim]: hc keys, then the value
  dump("engram_kv", c.layer, kv);
  // q_weight * k_weight is only ever used as a product, formed in FP32 first.
  std::vector<float> wqk(hc * dim);
  for (int64_t i = 0; i < hc * dim; ++i) wqk[i] = weight_at(w.q_weight, i) * weight_at(w.k_weight, i);
  const float eps = cfg.norm_eps, scale = static_cast<float>(std::pow(static_cast<double>(dim), -0.5));
  Tensor out = Tensor::empty(stream.shape(), DType::kF32);
#pragma omp parallel for if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    const float* kvt = kv.data<float>() + t * (hc + 1) * dim;
    const float* value = kvt + hc * dim;
    for (int64_t j = 0; j < hc; ++j) {
      const float* h = stream.data<float>() + (t * hc + j) * dim;
      const float* key = kvt + j * dim;
      const float* wj = wqk.data() + j * dim;
      double hh = 0, kk = 0, dot = 0;
      for (int64_t d = 0; d < dim; ++d) {
        hh += static_cast<double>(h[d]) * h[d];
        kk += static_cast<double>(key[d]) * key[d];
        dot += static_cast<double>(h[d] * wj[d] * key[d]);
      }
      // Normalised per (token, copy) over dim, not jointly over the copies.
      const float rstd = (1.0f / std::sqrt(static_cast<float>(hh / dim) + eps)) *
                         (1.0f / std::sqrt(static_cast<float>(kk / dim) + eps));
      const float s = static_cast<float>(dot) * rstd * scale;
      // Signed square root before the sigmoid; copysign keeps the sign of a zero dot product.
      const float g = 1.0f / (1.0f + std::exp(-std::copysign(std::sqrt(std::max(std::fabs(s), 1e-6f)), s)));
      float* o = out.data<float>() + (t * hc + j) * dim;
      for (int64_t d = 0; d < dim; ++d) {
        const float v = h[d] + g * value[d];
        o[d] = c.num.bf16 ? round_bf16(v) : v;
      }
    }
  }
  return out;
}

}  // namespace deepinfer
