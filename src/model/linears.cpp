// The three linear contracts of docs/v4-architecture.md §2.1, shared by every V4 sublayer.
#include "model/layers_v4.h"

namespace deepinfer {

Tensor linear_q(const Tensor& x, const ops::QWeight& w, const LayerCtx& c) {
  return ops::linear(x, w, {c.num.simulate_qat ? c.cfg.fp8_block : 0, c.num.bf16});
}
Tensor linear_bf16(const Tensor& x, const ops::QWeight& w, const LayerCtx& c) {
  return ops::linear(x, w, {0, c.num.bf16});
}
Tensor linear_f32(const Tensor& x, const ops::QWeight& w) { return ops::linear(x, w, {0, false}); }

}  // namespace deepinfer
