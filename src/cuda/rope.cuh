// CUDA RoPE and Walsh-Hadamard: the contracts of ops::apply_rope and ops::hadamard (src/ops/ops.h)
// on float32 tensors that live on kCUDA, bit for bit equal to the CPU ops (src/cpu/norm_rope.cpp).
//
// RoPE: the cos / sin table of every position is computed on the host exactly as the CPU op does
// (angle = float(pos) * freq in fp32, cos / sin in double, rounded to fp32) once per distinct
// frequency list and kept on the device, grown 4096 positions at a time (a growth is the only upload,
// synchronous); the kernel looks each row's position up (negated sine for the inverse). Positions
// that form an arithmetic progression (every call of the model) travel as kernel arguments, others
// are uploaded. The rotation itself is the CPU's fp32 x0*c - x1*s, x0*s + x1*c with explicit IEEE
// operations.
//
// Hadamard: one thread block per n-wide segment, the CPU's butterfly order (h = 1, 2, 4, ...) stage
// by stage in shared memory (each output is the same sequence of fp32 additions), then the n^-1/2
// scale and the optional bf16 rounding.
//
// The launchers are plain C++; the device part (rope_position, rope_rotate) compiles only under nvcc and is
// shared with fused kernels that apply the same rotation (attn_inputs.cu).
#pragma once

#include <cstdint>
#include <functional>

#include "deepinfer/tensor.h"
#include "ops/ops.h"

namespace deepinfer::cuda {

// x: contiguous float32 [T, ...] on kCUDA (T = size(0) rows of heads * head_width values).
void apply_rope(Tensor& x, int64_t head_width, int64_t rope_dim, const int64_t* positions, const ops::RopeFreqs& f,
                bool inverse, bool round);

// Where a RoPE kernel finds row r's cos / sin: the tables [positions, half] on the device, and the row's position
// pos[r] when pos is set (uploaded: not an arithmetic progression), else pos0 + r * stride.
struct RopeRows {
  const float* cs = nullptr;
  const float* sn = nullptr;
  const int64_t* pos = nullptr;
  int64_t pos0 = 0, stride = 0;
};
// apply_rope's position path, for any kernel that rotates rows [0, rows) (rows > 0, f non-empty): checks the host
// positions (in [0, 2^40); `op` names the caller in errors), grows f's table to reach them, uploads them unless
// they are an arithmetic progression, and calls `launch` under the tables' lock, so that neither the table nor the
// uploaded positions change before the kernel is queued.
void with_rope_rows(const ops::RopeFreqs& f, const int64_t* positions, int64_t rows, const char* op,
                    const std::function<void(const RopeRows&)>& launch);

// The forward's positions on the device (ops::DevicePositions): while bound on this thread, a call whose host
// positions are `host` with `rows` rows reads them from `device` (int64 [rows] on the GPU) instead. Returns the
// binding it replaces (to restore).
struct BoundPositions {
  const int64_t* host = nullptr;
  int64_t rows = 0;
  const int64_t* device = nullptr;
};
BoundPositions bind_positions(const BoundPositions& b);
// Grows f's table to cover positions [0, rows) now (ops::rope_reserve).
void rope_reserve(const ops::RopeFreqs& f, int64_t rows);

// x: contiguous float32 on kCUDA, numel a multiple of n (a power of two, at most 8192).
void hadamard(Tensor& x, int64_t n, bool round);

}  // namespace deepinfer::cuda

#ifdef __CUDACC__
#include "cuda/common.cuh"

namespace deepinfer::cuda {

__device__ __forceinline__ int64_t rope_position(const RopeRows& t, int64_t r) {
  return t.pos ? t.pos[r] : t.pos0 + r * t.stride;
}

// One pair (x0, x1) rotated by (c, s) as the CPU op: x0*c - x1*s, x0*s + x1*c in fp32 with explicit IEEE
// operations (no contraction), each rounded to bf16 if `round`.
__device__ __forceinline__ float2 rope_rotate(float x0, float x1, float c, float s, bool round) {
  float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  float y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  if (round) {
    y0 = round_to_bf16(y0);
    y1 = round_to_bf16(y1);
  }
  return make_float2(y0, y1);
}

}  // namespace deepinfer::cuda
#endif  // __CUDACC__
