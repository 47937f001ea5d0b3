// Deterministic top-k: (score desc, index asc); -inf never selected.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "cpu/cpu_ops.h"
#include "deepinfer/error.h"

namespace deepinfer::cpu {

int64_t topk(const float* scores, int64_t n, int64_t k, int32_t* out) {
  std::vector<int32_t> cand;
  cand.reserve(n);
  for (int64_t i = 0; i < n; ++i)
    if (scores[i] != -INFINITY) cand.push_back(static_cast<int32_t>(i));
  const int64_t m = std::min<int64_t>(k, static_cast<int64_t>(cand.size()));
  auto better = [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
  std::partial_sort(cand.begin(), cand.begin() + m, cand.end(), better);
  std::copy(cand.begin(), cand.begin() + m, out);
  return m;
}

Tensor topk_rows(const Tensor& scores, int64_t k, bool sort_by_index) {
  DI_CHECK(scores.defined() && scores.device() == Device::kCPU && scores.dtype() == DType::kF32 && scores.dim() == 2 &&
               (scores.size(1) <= 1 || scores.strides()[1] == 1),
           "topk_rows: expected float32 [T, n] on the CPU with dense rows, got {}",
           scores.defined() ? scores.describe() : std::string("undefined"));
  DI_CHECK(k >= 0, "topk_rows: k = {} is negative", k);
  const int64_t T = scores.size(0), n = scores.size(1);
  Tensor out = Tensor::empty({T, k}, DType::kI32);
  const float* sp = scores.data<float>();
  int32_t* op = out.data<int32_t>();
#pragma omp parallel for schedule(dynamic, 1) if (T > 1)
  for (int64_t t = 0; t < T; ++t) {
    int32_t* o = op + t * k;
    const int64_t m = topk(sp + t * scores.strides()[0], n, k, o);
    if (sort_by_index) std::sort(o, o + m);
    std::fill(o + m, o + k, -1);
  }
  return out;
}

}  // namespace deepinfer::cpu
