// CPU kernels for manifold-constrained hyper-connections (docs/v4-architecture.md §2.3).
#include <cmath>
#include <vector>

#include "cpu/cpu_ops.h"
#include "deepinfer/error.h"

namespace deepinfer::cpu {

namespace {
inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// mixes[t, m] = (fn[m] . flat(stream[t])) * rsqrt(mean(flat^2) + norm_eps), FP32.
std::vector<float> project(const Tensor& stream, const Tensor& fn, float norm_eps) {
  const int64_t T = stream.size(0), width = T > 0 ? stream.numel() / T : 0, M = fn.size(0);
  DI_CHECK(fn.size(1) == width && fn.dtype() == DType::kF32, "hc: fn {} does not match stream rows of {}",
           fn.describe(), width);
  std::vector<float> mixes(T * M);
  const float* s = stream.data<float>();
  const float* w = fn.data<float>();
#pragma omp parallel for if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    const float* x = s + t * width;
    double ss = 0;
    for (int64_t i = 0; i < width; ++i) ss += static_cast<double>(x[i]) * x[i];
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / width) + norm_eps);
    for (int64_t m = 0; m < M; ++m) {
      const float* wr = w + m * width;
      double acc = 0;
      for (int64_t i = 0; i < width; ++i) acc += static_cast<double>(wr[i]) * x[i];
      mixes[t * M + m] = static_cast<float>(acc) * r;
    }
  }
  return mixes;
}
}  // namespace

HcMix hc_mixes(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, int64_t hc,
               int64_t sinkhorn_iters, float hc_eps, float norm_eps) {
  const int64_t T = stream.size(0), M = (2 + hc) * hc;
  DI_CHECK(fn.size(0) == M && base.numel() == M && scale.numel() == 3, "hc_mixes: fn/base/scale sizes for hc={}", hc);
  std::vector<float> mixes = project(stream, fn, norm_eps);
  const float* sc = scale.data<float>();
  const float* b = base.data<float>();
  HcMix out{Tensor::empty({T, hc}, DType::kF32), Tensor::empty({T, hc}, DType::kF32),
            Tensor::empty({T, hc, hc}, DType::kF32)};
  for (int64_t t = 0; t < T; ++t) {
    const float* mx = mixes.data() + t * M;
    float* pre = out.pre.data<float>() + t * hc;
    float* post = out.post.data<float>() + t * hc;
    float* c = out.comb.data<float>() + t * hc * hc;
    for (int64_t j = 0; j < hc; ++j) pre[j] = sigmoidf(mx[j] * sc[0] + b[j]) + hc_eps;
    for (int64_t j = 0; j < hc; ++j) post[j] = 2.0f * sigmoidf(mx[hc + j] * sc[1] + b[hc + j]);
    for (int64_t j = 0; j < hc * hc; ++j) c[j] = mx[2 * hc + j] * sc[2] + b[2 * hc + j];
    // Row softmax + eps, then column normalisation, then (iters - 1) row/column rounds.
    for (int64_t j = 0; j < hc; ++j) {
      float mxv = -INFINITY;
      for (int64_t k = 0; k < hc; ++k) mxv = std::max(mxv, c[j * hc + k]);
      float sum = 0;
      for (int64_t k = 0; k < hc; ++k) sum += (c[j * hc + k] = std::exp(c[j * hc + k] - mxv));
      for (int64_t k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / sum + hc_eps;
    }
    auto cols = [&] {
      for (int64_t k = 0; k < hc; ++k) {
        float sum = 0;
        for (int64_t j = 0; j < hc; ++j) sum += c[j * hc + k];
        for (int64_t j = 0; j < hc; ++j) c[j * hc + k] = c[j * hc + k] / (sum + hc_eps);
      }
    };
    cols();
    for (int64_t it = 0; it < sinkhorn_iters - 1; ++it) {
      for (int64_t j = 0; j < hc; ++j) {
        float sum = 0;
        for (int64_t k = 0; k < hc; ++k) sum += c[j * hc + k];
        for (int64_t k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / (sum + hc_eps);
      }
      cols();
    }
  }
  return out;
}

Tensor hc_collapse(const Tensor& stream, const Tensor& pre, bool round) {
  const int64_t T = stream.size(0), hc = stream.size(1), dim = stream.size(2);
  Tensor y = Tensor::empty({T, dim}, DType::kF32);
  const float* s = stream.data<float>();
  const float* p = pre.data<float>();
  float* o = y.data<float>();
#pragma omp parallel for if (T > 1)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < dim; ++d) {
      float acc = 0;
      for (int64_t j = 0; j < hc; ++j) acc += p[t * hc + j] * s[(t * hc + j) * dim + d];
      o[t * dim + d] = round ? deepinfer::round_bf16(acc) : acc;
    }
  return y;
}

Tensor hc_expand(const Tensor& y, const Tensor& stream, const Tensor& post, const Tensor& comb, bool round) {
  const int64_t T = stream.size(0), hc = stream.size(1), dim = stream.size(2);
  Tensor out = Tensor::empty({T, hc, dim}, DType::kF32);
  const float* s = stream.data<float>();
  const float* yv = y.data<float>();
  const float* po = post.data<float>();
  const float* c = comb.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for if (T > 1)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < hc; ++k)
      for (int64_t d = 0; d < dim; ++d) {
        float acc = 0;
        for (int64_t j = 0; j < hc; ++j) acc += c[(t * hc + j) * hc + k] * s[(t * hc + j) * dim + d];
        float v = po[t * hc + k] * yv[t * dim + d] + acc;
        o[(t * hc + k) * dim + d] = round ? deepinfer::round_bf16(v) : v;
      }
  return out;
}

Tensor hc_head(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, float hc_eps,
               float norm_eps, bool round) {
  const int64_t T = stream.size(0), hc = stream.size(1);
  std::vector<float> mixes = project(stream, fn, norm_eps);
  Tensor pre = Tensor::empty({T, hc}, DType::kF32);
  const float sc = scale.data<float>()[0];
  const float* b = base.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < hc; ++j) pre.data<float>()[t * hc + j] = sigmoidf(mixes[t * hc + j] * sc + b[j]) + hc_eps;
  return hc_collapse(stream, pre, round);
}

}  // namespace deepinfer::cpu
