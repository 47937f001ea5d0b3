// linear_tc's decode path (linear_tc_gemv.cu): calls of up to 8 rows of x on E4M3 or packed FP4 weights, and grouped
// calls (a matrix per row of x), the same numbers as the tensor-core GEMM kernel of linear_tc.cu bit for bit
// (linear_tc.cuh's contract). Internal to the CUDA backend.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace deepinfer::cuda {

struct TcGemvArgs {
  const uint8_t* w;  // E4M3 [N, K] (row stride ldw bytes) or packed E2M1 [N, K / 2] (fp4)
  int64_t ldw;
  const uint8_t* sc;  // E8M0: E4M3 tile scales [ceil(N / B), ceil(K / B)], or FP4 scales [N, K / 32]; row stride lds
  int64_t lds;
  int B, N, K, M, act;  // tile (32 for FP4), shape, rows of x, act_quant_block
  int fsteps;           // k steps of 32 per fold block: gcd(act, B) / 32
  const float* x;       // [M, K] float32, row stride ldx
  int64_t ldx;
  float* y;  // [M, N] float32, contiguous
  bool round;
  bool fp4 = false;
  bool sc4 = false;  // every scale row 4-byte aligned (lds % 4 == 0 and the scale pointers): a word of 4 codes per load
  // Grouped rows (linear_tc_grouped): y row m (of M = lists x x_rows) is x row m % x_rows through expert
  // row_expert[m % x_rows] + (m / x_rows) * n_experts of the tables (w and sc unused); one row of x per matrix.
  const int32_t* row_expert = nullptr;
  const uint8_t* const* w_table = nullptr;
  const uint8_t* const* s_table = nullptr;
  int x_rows = 0, n_experts = 0;
};

// Whether the decode path takes the call (M <= 8 or grouped, act_quant_block 32, 64 or 128, 16-byte aligned x
// rows); the caller has checked linear_tc's own requirements.
bool tc_gemv_takes(const TcGemvArgs& a);
void tc_gemv_into(const TcGemvArgs& a, CUstream_st* stream);

// The one-row paths (linear_tc_stream.cu: the weight streamed through shared memory by a producer warp, the same
// bits): dense E4M3 calls with 32 x 32 tiles at M = 1 (the TMA), and grouped packed FP4 calls (one token's routed
// experts; cp.async); act_quant_block 32 / 64 / 128, K up to 16,384, and arrival counters for the call site (the
// weight, or the grouped call's expert table): their pool is made on the first call outside a stream capture.
// DEEPINFER_CUDA_TC_STREAM: 0 never, 1 (default) dense calls of ~26 MB and more (where bench_cuda_gemv measured it
// faster) and every grouped call, 2 every call it can take (the tests). Whether it takes the call, and the launch.
bool tc_stream_takes(const TcGemvArgs& a, CUstream_st* stream);
void tc_stream_into(const TcGemvArgs& a, CUstream_st* stream);
// Sets the mode above (0, 1, 2) for the calls that follow (tests, benchmarks); returns the previous one.
int tc_stream_set(int m);

}  // namespace deepinfer::cuda
