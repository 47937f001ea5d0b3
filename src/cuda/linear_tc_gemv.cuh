// linear_tc's decode path (linear_tc_gemv.cu): calls of up to 8 rows of x on E4M3 weights, the same numbers as the
// tensor-core GEMM kernel of linear_tc.cu bit for bit (linear_tc.cuh's contract). Internal to the CUDA backend.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace deepinfer::cuda {

struct TcGemvArgs {
  const uint8_t* w;  // E4M3 [N, K], row stride ldw bytes
  int64_t ldw;
  const uint8_t* sc;  // E8M0 tile scales [ceil(N / B), ceil(K / B)], row stride lds
  int64_t lds;
  int B, N, K, M, act;  // tile, shape, rows of x, act_quant_block
  int fsteps;           // k steps of 32 per fold block: gcd(act, B) / 32
  const float* x;       // [M, K] float32, row stride ldx
  int64_t ldx;
  float* y;  // [M, N] float32, contiguous
  bool round;
};

// Whether the decode path takes the call (M <= 8, act_quant_block 32, 64 or 128, 16-byte aligned x rows); the
// caller has checked linear_tc's own requirements.
bool tc_gemv_takes(const TcGemvArgs& a);
void tc_gemv_into(const TcGemvArgs& a, CUstream_st* stream);

}  // namespace deepinfer::cuda
