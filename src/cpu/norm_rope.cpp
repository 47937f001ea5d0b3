// CPU kernels: RMSNorm, Walsh-Hadamard, RoPE with YaRN (docs/v4-architecture.md §2.1).
#include <cmath>
#include <vector>

#include "cpu/cpu_ops.h"
#include "deepinfer/error.h"

namespace deepinfer::cpu {

namespace {
float weight_at(const Tensor& w, int64_t i) {
  if (w.dtype() == DType::kBF16) return bf16_to_f32(w.data<uint16_t>()[i]);
  return w.data<float>()[i];
}
void check_f32_2d(const Tensor& x, const char* op) {
  DI_CHECK(x.device() == Device::kCPU && x.dtype() == DType::kF32 && x.is_contiguous(),
           "{}: expected a contiguous float32 CPU tensor, got {}", op, x.describe());
}
}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& w, float eps, bool round) {
  // x: contiguous, or 2-D rows of any stride (a column slice of a wider output, as linear_q_pair's).
  const bool strided = x.dim() == 2 && x.strides()[1] == 1;
  DI_CHECK(x.device() == Device::kCPU && x.dtype() == DType::kF32 && (x.is_contiguous() || strided),
           "rms_norm: expected a float32 CPU tensor with dense rows, got {}", x.describe());
  const int64_t cols = x.size(-1), rows = x.numel() / cols, ldx = x.is_contiguous() ? cols : x.strides()[0];
  if (w.defined()) DI_CHECK(w.numel() == cols, "rms_norm: weight has {} values for rows of {}", w.numel(), cols);
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  std::vector<float> wf(cols, 1.0f);
  if (w.defined())
    for (int64_t c = 0; c < cols; ++c) wf[c] = weight_at(w, c);
#pragma omp parallel for if (rows > 8)
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = xp + r * ldx;
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) ss += static_cast<double>(a[c]) * a[c];
    const float var = static_cast<float>(ss / cols);
    const float inv = 1.0f / std::sqrt(var + eps);
    float* o = yp + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      float v = wf[c] * (a[c] * inv);
      o[c] = round ? deepinfer::round_bf16(v) : v;
    }
  }
  return y;
}

void hadamard(Tensor& x, int64_t n, bool round) {
  check_f32_2d(x, "hadamard");
  DI_CHECK(n > 0 && (n & (n - 1)) == 0, "hadamard: size {} is not a power of two", n);
  DI_CHECK(x.numel() % n == 0, "hadamard: {} values are not a multiple of {}", x.numel(), n);
  const int64_t segs = x.numel() / n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  float* p = x.data<float>();
#pragma omp parallel for if (segs > 64)
  for (int64_t s = 0; s < segs; ++s) {
    float* a = p + s * n;
    for (int64_t h = 1; h < n; h <<= 1)
      for (int64_t i = 0; i < n; i += 2 * h)
        for (int64_t j = i; j < i + h; ++j) {
          float u = a[j], v = a[j + h];
          a[j] = u + v;
          a[j + h] = u - v;
        }
    for (int64_t i = 0; i < n; ++i) {
      float v = a[i] * scale;
      a[i] = round ? deepinfer::round_bf16(v) : v;
    }
  }
}

// Follows the reference's FP32 evaluation order so tables agree bit for bit:
// freq_i = 1 / base^(2i/dim); with YaRN: freq = freq/factor * (1 - smooth) + freq * smooth,
// smooth = 1 - clamp((i - low) / (high - low), 0, 1).
RopeFreqs rope_freqs(int64_t rope_dim, double base, double factor, int64_t original_seq_len, double beta_fast,
                     double beta_slow) {
  DI_CHECK(rope_dim > 0 && rope_dim % 2 == 0, "rope dimension {} must be even", rope_dim);
  const int64_t half = rope_dim / 2;
  RopeFreqs f;
  f.freq.resize(half);
  for (int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(rope_dim);
    const float p =
        static_cast<float>(std::pow(static_cast<double>(static_cast<float>(base)), static_cast<double>(expo)));
    f.freq[i] = 1.0f / p;
  }
  if (original_seq_len > 0) {
    auto corr_dim = [&](double rot) {
      return rope_dim * std::log(original_seq_len / (rot * 2 * M_PI)) / (2 * std::log(base));
    };
    double low = std::max(std::floor(corr_dim(beta_fast)), 0.0);
    double high = std::min(std::ceil(corr_dim(beta_slow)), static_cast<double>(rope_dim - 1));
    if (low == high) high += 0.001;
    const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
    const float fac = static_cast<float>(factor);
    for (int64_t i = 0; i < half; ++i) {
      float ramp = (static_cast<float>(i) - lo) / span;
      ramp = std::min(std::max(ramp, 0.0f), 1.0f);
      const float smooth = 1.0f - ramp;
      const float a = f.freq[i] / fac * (1.0f - smooth);
      const float b = f.freq[i] * smooth;
      f.freq[i] = a + b;
    }
  }
  return f;
}

void apply_rope(Tensor& x, int64_t head_width, int64_t rope_dim, const int64_t* positions, const RopeFreqs& f,
                bool inverse, bool round) {
  check_f32_2d(x, "apply_rope");
  const int64_t rows = x.size(0);
  const int64_t width = x.numel() / rows;
  DI_CHECK(width % head_width == 0 && rope_dim <= head_width, "apply_rope: row width {} vs head width {}", width,
           head_width);
  DI_CHECK(static_cast<int64_t>(f.freq.size()) * 2 == rope_dim, "apply_rope: table is for {} dims, asked {}",
           f.freq.size() * 2, rope_dim);
  const int64_t heads = width / head_width, half = rope_dim / 2;
  float* p = x.data<float>();
#pragma omp parallel for if (rows > 4)
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> cs(half), sn(half);
    const float pos = static_cast<float>(positions[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float ang = pos * f.freq[i];
      cs[i] = static_cast<float>(std::cos(static_cast<double>(ang)));
      sn[i] = static_cast<float>(std::sin(static_cast<double>(ang)));
      if (inverse) sn[i] = -sn[i];
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* a = p + r * width + h * head_width + (head_width - rope_dim);
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = a[2 * i], x1 = a[2 * i + 1];
        float y0 = x0 * cs[i] - x1 * sn[i];
        float y1 = x0 * sn[i] + x1 * cs[i];
        if (round) {
          y0 = deepinfer::round_bf16(y0);
          y1 = deepinfer::round_bf16(y1);
        }
        a[2 * i] = y0;
        a[2 * i + 1] = y1;
      }
    }
  }
}

}  // namespace deepinfer::cpu
