// The three linear contracts of docs/v4-architecture.md §2.1 and the attention output projection,
// shared by the sublayers of both families.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/debug_dump.h"
#include "model/layers_v4.h"

namespace deepinfer {

Tensor linear_q(const Tensor& x, const ops::QWeight& w, const LayerCtx& c) {
  return ops::linear(x, w, {c.num.simulate_qat ? c.cfg.fp8_block : 0, c.num.bf16});
}
Tensor linear_bf16(const Tensor& x, const ops::QWeight& w, const LayerCtx& c) {
  return ops::linear(x, w, {0, c.num.bf16});
}
Tensor linear_f32(const Tensor& x, const ops::QWeight& w) { return ops::linear(x, w, {0, false}); }

Tensor pages_tensor(const RowPages& pages) {
  const int64_t n = pages.rows(), w = pages.width();
  Tensor t = Tensor::empty({n, w}, DType::kF32);
  for (int64_t r = 0; r < n; r += RowPages::kRowsPerPage)
    std::memcpy(t.data<float>() + r * w, pages.row(r), std::min(RowPages::kRowsPerPage, n - r) * w * sizeof(float));
  return t;
}

Tensor attend_and_project(const Tensor& q, const Tensor& table, const Tensor& idx, const Tensor& kv, const Tensor& sink,
                          int64_t start_pos, WindowRing& ring, const ops::QWeight& wo_a, const ops::QWeight& wo_b,
                          const int64_t* positions, const ops::RopeFreqs& rope, const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t T = q.size(0), H = cfg.n_heads, D = cfg.head_dim, W = cfg.window_size;
  const bool bf = c.num.bf16;
  Tensor o = ops::sparse_attention(q.view({T, H, D}), table, idx, sink, 1.0f / std::sqrt(static_cast<float>(D)), bf, bf)
                 .view({T, H * D});
  // Slide the window ring forward over this chunk.
  for (int64_t p = std::max(start_pos, start_pos + T - W); p < start_pos + T; ++p)
    std::memcpy(ring.slot(p), kv.data<float>() + (p - start_pos) * D, D * sizeof(float));
  dump("o", c.layer, o);
  ops::apply_rope(o, D, cfg.rope_head_dim, positions, rope, true, bf);
  dump("o_derot", c.layer, o);
  // wo_a is block-diagonal over groups: group g projects only its own heads' outputs.
  const int64_t G = cfg.o_groups, gin = H * D / G, R = cfg.o_lora_rank;
  Tensor z = Tensor::empty({T, G * R}, DType::kF32);
  for (int64_t g = 0; g < G; ++g) {
    Tensor og = o.view({T, G, gin}).select(1, g).contiguous();
    ops::QWeight wg = wo_a;
    wg.w = wo_a.w.slice(0, g * R, (g + 1) * R);
    if (wo_a.scale.defined()) wg.scale = wo_a.scale.slice(0, g * R / wo_a.block, (g + 1) * R / wo_a.block);
    Tensor zg = linear_bf16(og, wg, c);
    for (int64_t t = 0; t < T; ++t) std::memcpy(z.data<float>() + t * G * R + g * R, zg.data<float>() + t * R, R * sizeof(float));
  }
  dump("z", c.layer, z);
  return linear_q(z, wo_b, c);
}

}  // namespace deepinfer
