// CUDA RoPE and Walsh-Hadamard transform. Contracts in rope.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/rope.cuh"

namespace deepinfer::cuda {

namespace {

void check_contiguous_f32(const Tensor& x, const char* op) {
  DI_CHECK(x.defined() && x.device() == Device::kCUDA && x.dtype() == DType::kF32 && x.is_contiguous(),
           "{}: expected a contiguous float32 CUDA tensor, got {}", op,
           x.defined() ? x.describe() : std::string("undefined"));
}

// One thread per (row, head, pair); rows' positions and tables as RopeRows. inverse: the conjugate rotation (-sin).
__global__ void rope_kernel(float* x, int64_t rows, int64_t heads, int64_t head_width, int64_t rope_dim, RopeRows t,
                            bool inverse, bool round) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t half = rope_dim / 2;
  const int64_t total = rows * heads * half;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e % half;
    const int64_t h = (e / half) % heads;
    const int64_t r = e / (half * heads);
    const int64_t p = rope_position(t, r);
    float* a = x + (r * heads + h) * head_width + (head_width - rope_dim);
    const float c = t.cs[p * half + i], s = inverse ? -t.sn[p * half + i] : t.sn[p * half + i];
    const float2 y = rope_rotate(a[2 * i], a[2 * i + 1], c, s, round);
    a[2 * i] = y.x;
    a[2 * i + 1] = y.y;
  }
}

// One block per segment of n values (n / 2 butterflies per stage, blockDim.x threads).
__global__ void hadamard_kernel(float* x, int64_t n, float scale, bool round) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float seg[];
  float* p = x + static_cast<int64_t>(blockIdx.x) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) seg[i] = p[i];
  __syncthreads();
  const int64_t pairs = n / 2;
  for (int64_t h = 1; h < n; h <<= 1) {
    for (int64_t q = threadIdx.x; q < pairs; q += blockDim.x) {
      const int64_t j = (q / h) * 2 * h + q % h;
      const float u = seg[j], v = seg[j + h];
      seg[j] = __fadd_rn(u, v);
      seg[j + h] = __fsub_rn(u, v);
    }
    __syncthreads();
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = __fmul_rn(seg[i], scale);
    p[i] = round ? round_to_bf16(v) : v;
  }
}

// The cos / sin tables of each distinct frequency list, on the device, for positions [0, rows), grown
// in steps of kTableStep positions on demand (never shrunk): computed on the host once, as the CPU op
// computes them, so a call uploads nothing unless it reaches past the table.
constexpr int64_t kTableStep = 4096;
struct PositionTable {
  std::vector<float> freq;
  Tensor cs, sn;  // [rows, half]
  int64_t rows = 0;
};
std::mutex g_table_mu;
std::vector<std::unique_ptr<PositionTable>> g_tables;

const PositionTable& position_table(const ops::RopeFreqs& f, int64_t need_rows) {
  PositionTable* t = nullptr;
  for (auto& e : g_tables)
    if (e->freq == f.freq) t = e.get();
  if (!t) {
    g_tables.push_back(std::make_unique<PositionTable>());
    t = g_tables.back().get();
    t->freq = f.freq;
  }
  if (t->rows >= need_rows) return *t;
  const int64_t half = static_cast<int64_t>(f.freq.size());
  const int64_t rows = (need_rows + kTableStep - 1) / kTableStep * kTableStep;
  // The CPU op's values, bit for bit: fp32 angle, double cos / sin rounded to fp32.
  std::vector<float> cs(static_cast<size_t>(rows * half)), sn(static_cast<size_t>(rows * half));
  for (int64_t r = 0; r < rows; ++r) {
    const float pos = static_cast<float>(r);
    for (int64_t i = 0; i < half; ++i) {
      const float ang = pos * f.freq[i];
      cs[r * half + i] = static_cast<float>(std::cos(static_cast<double>(ang)));
      sn[r * half + i] = static_cast<float>(std::sin(static_cast<double>(ang)));
    }
  }
  // New buffers (the old ones go back to the allocator; work on a reused block is stream-ordered after them).
  Tensor dcs = Tensor::empty({rows, half}, DType::kF32, Device::kCUDA);
  Tensor dsn = Tensor::empty({rows, half}, DType::kF32, Device::kCUDA);
  flush_deferred();
  DI_CUDA_CHECK(cudaMemcpy(dcs.raw(), cs.data(), cs.size() * sizeof(float), cudaMemcpyHostToDevice));
  DI_CUDA_CHECK(cudaMemcpy(dsn.raw(), sn.data(), sn.size() * sizeof(float), cudaMemcpyHostToDevice));
  t->cs = dcs;
  t->sn = dsn;
  t->rows = rows;
  bump_graph_epoch();  // captured kernels name the old tables
  return *t;
}

}  // namespace

void apply_rope(Tensor& x, int64_t head_width, int64_t rope_dim, const int64_t* positions, const ops::RopeFreqs& f,
                bool inverse, bool round) {
  const char* op = "cuda::apply_rope";
  check_contiguous_f32(x, op);
  DI_CHECK(x.dim() >= 1, "{}: expected [T, ...], got {}", op, x.describe());
  const int64_t rows = x.size(0);
  if (rows == 0 || x.numel() == 0) return;
  const int64_t width = x.numel() / rows;
  DI_CHECK(head_width > 0 && width % head_width == 0 && rope_dim <= head_width && rope_dim % 2 == 0,
           "{}: row width {} vs head width {} and rope dim {}", op, width, head_width, rope_dim);
  DI_CHECK(static_cast<int64_t>(f.freq.size()) * 2 == rope_dim, "{}: table is for {} dims, asked {}", op,
           f.freq.size() * 2, rope_dim);
  const int64_t heads = width / head_width, half = rope_dim / 2;
  if (half == 0) return;
  constexpr int kThreads = 256;
  const int64_t total = rows * heads * half;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t{1} << 20);
  with_rope_rows(f, positions, rows, op, [&](const RopeRows& t) {
    launch_pdl(rope_kernel, static_cast<unsigned>(blocks), kThreads, 0, nullptr, x.data<float>(), rows, heads,
               head_width, rope_dim, t, inverse, round);
    DI_CUDA_CHECK(cudaGetLastError());
  });
}

namespace {
thread_local BoundPositions t_bound;  // bind_positions'
}  // namespace

BoundPositions bind_positions(const BoundPositions& b) {
  const BoundPositions prev = t_bound;
  t_bound = b;
  return prev;
}

void rope_reserve(const ops::RopeFreqs& f, int64_t rows) {
  if (f.freq.empty() || rows <= 0) return;
  std::lock_guard<std::mutex> lock(g_table_mu);
  position_table(f, rows);
}

void with_rope_rows(const ops::RopeFreqs& f, const int64_t* positions, int64_t rows, const char* op,
                    const std::function<void(const RopeRows&)>& launch) {
  // Positions in [0, 2^40) (the fp32 angle of larger ones is meaningless anyway); an arithmetic
  // progression (every call of the model: consecutive tokens, compressed groups) needs no upload.
  int64_t max_pos = 0;
  bool arithmetic = true;
  const int64_t stride = rows > 1 ? positions[1] - positions[0] : 0;
  for (int64_t r = 0; r < rows; ++r) {
    DI_CHECK(positions[r] >= 0 && positions[r] < (int64_t{1} << 40), "{}: position {} out of range", op, positions[r]);
    max_pos = std::max(max_pos, positions[r]);
    arithmetic = arithmetic && positions[r] == positions[0] + r * stride;
  }
  std::lock_guard<std::mutex> lock(g_table_mu);
  const PositionTable& table = position_table(f, max_pos + 1);
  // Other positions (a decode batch: each sequence its own) go up as a fresh buffer by an asynchronous copy: a
  // synchronous cudaMemcpy into one shared buffer drained the GPU before every such RoPE (3 or 4 per layer at decode
  // batches), so the host could not run ahead. The buffer lives until the launch is queued; the allocator hands it
  // out again only to work queued after it on the same stream.
  Tensor dev_positions;
  const int64_t* dpos = nullptr;
  if (positions != nullptr && positions == t_bound.host && rows == t_bound.rows) {
    dpos = t_bound.device;  // already on the device (and what a replayed graph reads)
  } else if (!arithmetic) {
    Tensor host = Tensor::empty({rows}, DType::kI64);
    std::copy_n(positions, rows, host.data<int64_t>());
    dev_positions = host.to(Device::kCUDA);
    dpos = dev_positions.data<int64_t>();
  }
  RopeRows t;
  t.cs = table.cs.data<float>();
  t.sn = table.sn.data<float>();
  t.pos = dpos;
  t.pos0 = positions[0];
  t.stride = stride;
  launch(t);
}

void hadamard(Tensor& x, int64_t n, bool round) {
  const char* op = "cuda::hadamard";
  check_contiguous_f32(x, op);
  DI_CHECK(n > 0 && (n & (n - 1)) == 0 && n <= 8192, "{}: size {} is not a power of two in [1, 8192]", op, n);
  DI_CHECK(x.numel() % n == 0, "{}: {} values are not a multiple of {}", op, x.numel(), n);
  const int64_t segs = x.numel() / n;
  if (segs == 0) return;
  DI_CHECK(segs < (int64_t{1} << 31), "{}: {} segments is too many for one launch", op, segs);
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));  // as the CPU op
  const int threads = threads_for(std::max<int64_t>(n / 2, 1), 512);
  launch_pdl(hadamard_kernel, static_cast<unsigned>(segs), threads, static_cast<size_t>(n) * sizeof(float), nullptr,
             x.data<float>(), n, scale, round);
  DI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace deepinfer::cuda
