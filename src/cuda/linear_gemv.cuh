// Decode GEMV: y[M, N] = x[M, K] . W^T for decode batches (up to 4 rows of x per pass over the weight; larger M
// takes several passes side by side, the later ones reading the weight from L2 when it is still there), and a
// grouped-rows mode (MoE experts at decode: row m of x against its own expert's weight), bit-identical to the CPU op
// ops::linear (the contract of linear.cuh: every product is exact in fp32, so only the order of the FP32 additions
// matters, and these kernels replay the CPU's order). Built for HBM bandwidth: weights go straight from
// global memory into registers (16-byte streaming loads, several in flight per thread, no shared-memory
// staging and no per-slab barriers), x is fake-quantised inside the kernel (one launch, no workspace).
//
// The order replayed (per output y[m][n]; chunk c = columns [32c, 32c + 32)):
//  * 32 chains v[j][l] (j = 0..3, l = 0..7) take element 32c + 8j + l of each chunk, v = fma(w, x, v)
//    from +0 (FP4: byte q of a chunk's 16 bytes holds element 2q in its low nibble, chain (q/8, q%8),
//    and element 2q+1 in its high nibble, chain (2 + q/8, q%8); the CPU's permuted x).
//  * E4M3: at the end of each scale tile (B columns) s[l] = ((v0 + v1) + v2) + v3, the chains restart,
//    and tot[l] = fma(s[l], 2^(e-119), tot[l]) in tile order (codes are decoded to e4m3 * 2^-8).
//    BF16 / FP4: the chains run over all of K and tot[l] = fma(s[l], 1, 0).
//  * y = ((tot0 + tot4) + (tot2 + tot6)) + ((tot1 + tot5) + (tot3 + tot7)) + 0, optionally rounded to
//    bf16. An E4M3 NaN code anywhere in W's row n makes y[., n] NaN.
//  * x: with act_quant_block A > 0 each row is first quantised per A columns as the CPU's
//    fake_quant_fp8 (amax, ue8m0 scale of max(amax, 1e-4) / 448, e4m3_rne(x / s) * s).
//
// Kernel shapes (details in linear_gemv.cu):
//  * E4M3: tiles are independent until the tot fold, so K is split across the block: a warp owns 16
//    consecutive tiles (a 512-byte window of every row for B = 32), two lanes per tile, and walks the
//    rows of its block with its window of x in registers; the tile sums s[l] go to shared memory and
//    8 threads per (row, x row) fold them in tile order. Up to 4/(B/32) rows per step, the next step's
//    rows in flight while the current one is computed and folded.
//  * BF16 (and FP4, old kernel): the chains are sequential over K, so 4 lanes own a row's 32 chains (BF16:
//    lane j the chains (j, 0..7); FP4: lane t the bytes 4t..4t+3 of every chunk, after a per-warp
//    shared-memory transpose) and walk the whole row in 64-byte steps with 8 steps in flight; x lives in
//    shared memory (quantised once per block) and is read as warp-wide broadcasts; a block of 4 or 8 warps
//    owns 32 or 64 rows at a time.
//  * FP4, default for the calls it takes (no act quant, K % 128 == 0, one x row or grouped: the model's routed experts
//    at decode): fp4_mma_gemv (linear_gemv_fp4_mma.cuh), each product formed exactly by an mma against a diagonal B
//    built from x, the chains' FMAs then scaled by powers of two; fp4_pair_gemv for the other calls.
//  * FP4 (fp4_pair_gemv): 2 lanes per row, lane h owning the 16 chains of bytes 8h..8h+7 of
//    every chunk (one shuffle pair per 32 bytes, no shared-memory transpose); weights decoded through exact
//    fp16 arithmetic for scale codes 104..127 (the exact fp32 decode otherwise); 128 bytes per lane in
//    flight; blocks of 1, 2 or 4 warps (16 rows each) sized to spread the rows evenly over the SMs.
//    The first FP4 kernel (chain_gemv) stays for comparison: tests and benchmarks switch with
//    gemv_set_fp4_variant.
//  * E4M3, second kernel (fp8_walk_gemv, gemv_set_fp8_variant): a warp owns 4 / MT rows and walks the whole
//    row in segments of 16 tiles (two lanes per tile as above), with 16 loads per lane in flight; it folds its
//    own tile sums through a per-warp shared buffer (lane = (row, x row, l)), so no block barrier after the
//    x prologue. Details in linear_gemv_fp8.cu.
//  * BF16, second kernel (bf16_tile_gemv, gemv_set_bf16_variant; by default from 5 rows of x): dense calls
//    without act quant (the head at decode batches), a lane owning 4 chains of 4 weight rows for 4 x rows, so
//    each x value read from shared memory feeds 4 rows. Details in linear_gemv_bf16.cu.
// Blocks are persistent (each loops over row groups), so x is staged once per block.
// Known gap (as linear.cu): an E4M3 tile scale code above 246 takes the CPU's scalar path, not replayed.
#pragma once

#include <cstdint>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace deepinfer::cuda {

struct GemvArgs {
  int fmt = 0;                 // 0 = E4M3 (block-scaled), 1 = packed E2M1 (FP4, E8M0 per 32 along K), 2 = BF16
  const uint8_t* w = nullptr;  // weight rows (dense mode), row stride ldw bytes, 16-byte aligned
  int64_t ldw = 0;
  const uint8_t* scale = nullptr;  // E8M0 codes (fp8: [ceil(N/B), ceil(K/B)], fp4: [N, K/32]), row stride lds bytes
  int64_t lds = 0;
  int B = 0;                 // E4M3 tile size (multiple of 32); 0 otherwise
  int N = 0, K = 0;          // K % 32 == 0
  const float* x = nullptr;  // M rows of fp32 x, row stride ldx floats (raw: not yet fake-quantised)
  int64_t ldx = 0;
  int M = 0;
  int64_t act_quant_block = 0;  // > 0: fake-quantise x rows to FP8 per this many columns first
  bool round = false;           // round y to bf16
  float* y = nullptr;           // [M, N] contiguous fp32
  // Grouped rows: when row_expert != nullptr, row m uses weight w_table[row_expert[m]] and scale
  // s_table[row_expert[m]] (w and scale above are ignored). All experts share N, K, ldw, lds, B, fmt.
  // row_expert, w_table and s_table live on the device (they may be written by the previous kernel).
  const int32_t* row_expert = nullptr;
  const uint8_t* const* w_table = nullptr;
  const uint8_t* const* s_table = nullptr;
  // Grouped rows over several lists of the same experts (w1 and w3 of the routed experts in one launch):
  // with x_rows > 0, M = lists * x_rows rows, row m reads x row m % x_rows and its weight is entry
  // (m / x_rows) * n_experts + row_expert[m % x_rows] of the tables (row_expert has x_rows entries).
  int x_rows = 0;
  int n_experts = 0;
  // Grouped rows sorted by expert within each list (moe_group's order), FP4 only (fp4_pair_gemv; the other
  // kernels ignore it): tile_rows > 1 lets one block serve up to tile_rows (at most 4) consecutive rows of one
  // expert, so that their pass over the expert's weight is shared. The same bits either way.
  int tile_rows = 0;
  // Grouped rows whose experts repeat with this period (row_expert[r] == row_expert[r % row_period] for every x row r,
  // x rows a multiple of it; 0: not known): wo_a's groups (row i against group i mod 8), the shared expert's w1 / w3
  // (period 1: every row against matrix 0). The x rows that share a matrix are then known on the host, so
  // fp8_rows_gemv can serve several of them per pass over it. The same bits either way.
  int row_period = 0;
};

// True when gemv_into handles this call: dense mode or grouped mode (any M >= 1),
// K % 32 == 0 and 32 <= K <= 16384 (E4M3 tile 32 or 64: K <= 8192; tile 128: K <= 16384), 16-byte
// aligned x rows and weight rows, act_quant_block 0 or with at most 512 groups per row. M == 0 or N == 0
// is a no-op.
bool gemv_supported(const GemvArgs& a);

// Launches the GEMV on `stream` (one kernel, programmatic dependent launch: in dense mode it starts
// streaming the weights while the previous kernel on the stream finishes, so dense weights and scales
// must not be written by that kernel; x, row_expert and the tables are read only after it completed).
// Bit-identical to the CPU op. Preconditions: gemv_supported(a) (checked; throws deepinfer::Error
// otherwise); grouped mode: every table entry 16-byte aligned, row_expert[m] a valid index. No
// workspace, no synchronisation, safe to capture in a CUDA graph (after a first eager call, which
// sets the kernel's shared-memory limit and caches its occupancy).
void gemv_into(const GemvArgs& a, CUstream_st* stream);

// Tests and benchmarks: the FP4 kernel of the following gemv_into calls, 1 = chain_gemv (the first
// design: 4 lanes per row and a shared-memory transpose), 2 = fp4_pair_gemv (2 lanes per row, fp16x2
// decode), 3 = fp4_mma_gemv (products on the tensor cores, linear_gemv_fp4_mma.cuh) for the calls it takes of up to 42
// x rows per list (decode at one to seven tokens, where it measured faster) and fp4_pair_gemv for the others (the
// default), 4 = fp4_mma_gemv wherever it takes the call, 0 = the default again. Returns the variant in force before
// the call.
int gemv_set_fp4_variant(int v);

// Tests, benchmarks and the dispatch in linear.cu: the E4M3 kernel of the following gemv_into calls,
// 1 = fp8_gemv (K split across a block, tile sums folded after a block barrier), 2 = fp8_walk_gemv
// (linear_gemv_fp8.cu: each warp walks whole rows and folds its own tile sums, a deeper load pipeline),
// 3 = by shape (the default: fp8_walk_gemv for grouped calls, N >= 1280 and M >= 2, where it measured faster;
// fp8_gemv otherwise), 4 = fp8_mma_gemv (products on the tensor cores, linear_gemv_fp8_mma.cuh) for the calls it takes
// and 3's choice for the others, 5 = 3's choice but fp8_mma_gemv for the dense calls where it measured faster (N >=
// 16,384 at 1 or 3-64 rows of x, N >= 4,096 at 5-6 rows; the default), 6 = fp8_rows_gemv wherever it takes the call, 7
// = fp8_wgmma_gemv (linear_gemv_fp8_wgmma.cuh: TMA and wgmma, dense calls of 1-4 rows of x) wherever it takes the call,
// 8 = fp8_bmma_gemv (linear_gemv_fp8_bmma.cuh: the weights as the mma's B operand, 8 rows a warp) wherever it takes the
// call (and under 5 with DEEPINFER_CUDA_BMMA=1, the calls that read each weight row once), 0 = the default again.
// gemv_set_fp8_variant returns the variant in force before the call; gemv_fp8_variant the one in force;
// gemv_fp8_uses_walk whether a call of this shape (grouped or dense with N weight rows and M rows of x) runs
// fp8_walk_gemv under it.
int gemv_set_fp8_variant(int v);
// Tests and benchmarks: the form of fp8_walk_gemv in the following gemv_into calls, 1 = the pair form (two lanes per
// 32-column tile, a shuffle exchange per 32 bytes), 2 = the whole-chunk form (a lane per tile and weight row, two
// 16-byte loads through L1) where it applies (tiles of 32, every weight row read by one x row; the pair form
// elsewhere), 3 = the whole-chunk form with its weights brought by bulk copies into a shared-memory ring where it
// applies and fits, 0 = DEEPINFER_CUDA_WALK_WHOLE (1, the default: the whole-chunk form; 0: the pair form) and
// DEEPINFER_CUDA_WALK_BULK (0, the default; 1: the bulk ring). The same bits either way. Returns the form set before
// the call.
int gemv_set_fp8_walk_form(int form);
// Tests and benchmarks: the bulk ring's item stages per warp in the following calls that take it, 2 .. 8 (fewer where
// they do not fit shared memory), 0 = DEEPINFER_CUDA_WALK_BULK_STAGES (4 by default; there 0 means as many as fit, at
// most 8). The same bits either way. Returns the setting before the call.
int gemv_set_fp8_walk_bulk_stages(int stages);
// Tests and benchmarks: the BF16 kernel of the following gemv_into calls, 1 = chain_gemv, 2 = bf16_lane_gemv (a lane
// per chain: one x row on narrow weights) or bf16_tile_gemv (4 weight rows x 4 x rows per lane) for the dense calls
// without act quant they take (linear_gemv_bf16.cuh; chain_gemv for the others), 3 = bf16_lane_gemv where it takes
// the call, bf16_tile_gemv from 5 rows of x (the default), 0 = the default again. Returns the variant in force
// before the call.
int gemv_set_bf16_variant(int v);
int gemv_fp8_variant();
bool gemv_fp8_uses_walk(bool grouped, int64_t N, int64_t M = 1);

}  // namespace deepinfer::cuda
