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
#pragma once

#include <cstdint>

#include "deepinfer/tensor.h"
#include "ops/ops.h"

namespace deepinfer::cuda {

// x: contiguous float32 [T, ...] on kCUDA (T = size(0) rows of heads * head_width values).
void apply_rope(Tensor& x, int64_t head_width, int64_t rope_dim, const int64_t* positions, const ops::RopeFreqs& f,
                bool inverse, bool round);

// x: contiguous float32 on kCUDA, numel a multiple of n (a power of two, at most 8192).
void hadamard(Tensor& x, int64_t n, bool round);

}  // namespace deepinfer::cuda
