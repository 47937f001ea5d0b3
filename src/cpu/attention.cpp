// CPU sparse attention with a per-head sink (docs/v4-architecture.md §2.4): online softmax over
// an explicit index list, tiles of 64 entries, as DeepSeek's sparse_attn kernel does.
#include <cmath>
#include <vector>

#include "cpu/cpu_ops.h"
#include "deepinfer/error.h"

namespace deepinfer::cpu {

static constexpr int64_t kTile = 64;

Tensor sparse_attention(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale,
                        bool bf16_probs, bool round) {
  DI_CHECK(q.dim() == 3 && kv.dim() == 2 && idx.dim() == 2, "sparse_attention: q {} kv {} idx {}", q.describe(),
           kv.describe(), idx.describe());
  const int64_t D = q.size(2), N = kv.size(0);
  DI_CHECK(kv.size(1) == D, "sparse_attention: shapes q {} kv {}", q.describe(), kv.describe());
  std::vector<const float*> rows(static_cast<size_t>(N));
  for (int64_t j = 0; j < N; ++j) rows[j] = kv.data<float>() + j * D;
  return sparse_attention_rows(q, rows.data(), N, idx, sink, scale, bf16_probs, round);
}

Tensor sparse_attention_rows(const Tensor& q, const float* const* rows, int64_t N, const Tensor& idx,
                             const Tensor& sink, float scale, bool bf16_probs, bool round) {
  DI_CHECK(q.dim() == 3 && idx.dim() == 2, "sparse_attention: q {} idx {}", q.describe(), idx.describe());
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), K = idx.size(1);
  DI_CHECK(idx.size(0) == T && sink.numel() == H && idx.dtype() == DType::kI32,
           "sparse_attention: shapes q {} idx {} sink {}", q.describe(), idx.describe(), sink.describe());
  Tensor out = Tensor::empty({T, H, D}, DType::kF32);
  const float* qp = q.data<float>();
  const int32_t* ip = idx.data<int32_t>();
  const float* sk = sink.data<float>();
  float* op = out.data<float>();
  for (int64_t i = 0; i < T * K; ++i)  // validated here: nothing may throw inside the parallel loop
    DI_CHECK(ip[i] < N, "sparse_attention: index {} out of range ({} kv rows)", ip[i], N);
#pragma omp parallel for collapse(2) schedule(dynamic, 4)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* qv = qp + (t * H + h) * D;
      const int32_t* list = ip + t * K;
      std::vector<double> acc(D, 0.0);
      float m = -INFINITY, l = 0.0f;
      float s[kTile];
      for (int64_t base = 0; base < K; base += kTile) {
        const int64_t n = std::min(kTile, K - base);
        float tmax = -INFINITY;
        for (int64_t i = 0; i < n; ++i) {
          const int32_t j = list[base + i];
          if (j < 0) {
            s[i] = -INFINITY;
            continue;
          }
          const float* kr = rows[j];
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += qv[d] * kr[d];
          s[i] = dot * scale;
          tmax = std::max(tmax, s[i]);
        }
        const float m_new = std::max(m, tmax);
        if (m_new == -INFINITY) continue;  // nothing valid yet
        const float rescale = std::exp(m - m_new);
        float tsum = 0.0f;
        for (int64_t d = 0; d < D; ++d) acc[d] *= rescale;
        for (int64_t i = 0; i < n; ++i) {
          if (s[i] == -INFINITY) continue;
          const float p = std::exp(s[i] - m_new);
          tsum += p;
          const float pv = bf16_probs ? deepinfer::round_bf16(p) : p;
          const float* vr = rows[list[base + i]];
          for (int64_t d = 0; d < D; ++d) acc[d] += static_cast<double>(pv) * vr[d];
        }
        l = l * rescale + tsum;
        m = m_new;
      }
      float* o = op + (t * H + h) * D;
      if (m == -INFINITY) {  // no valid entry at all: the output is zero
        for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
        continue;
      }
      l += std::exp(sk[h] - m);
      for (int64_t d = 0; d < D; ++d) {
        const float v = static_cast<float>(acc[d]) / l;
        o[d] = round ? deepinfer::round_bf16(v) : v;
      }
    }
  return out;
}

}  // namespace deepinfer::cpu
