// fp8_walk_gemv: the E4M3 decode GEMV built for HBM bandwidth at the V4.1 decode shapes, bit-identical to
// fp8_gemv and the CPU op (the order replayed is linear_gemv.cuh's). Why a second kernel: fp8_gemv splits K
// across the warps of a block, so every step of R rows ends in a block barrier after which only R*MT*8
// threads fold the T tile sums in sequence while the rest wait, with one step in flight.
//
// Thread mapping. A warp owns a "row group" of R = 4 / MT weight rows (MT x rows, so 4 (row, x row) pairs:
// the 4 "fold rows"; or R = 2 at one x row, 2 fold rows, when that gives every group a warp) and walks the whole of K
// in segments of 16 tiles; a warp's row groups are g = gw, gw + stride, ... (gw its global warp index within its x-row
// group). Within a segment, lanes 2p and 2p+1 (h = 0, 1) own tile 16 seg + p and load, per row and per 32-column chunk
// of the tile, the 16 bytes [16h, 16h + 16) (a warp's load instruction: 512 contiguous bytes for B = 32). Two shuffles
// per chunk give lane h the codes of elements 8j + 4h + i (j, i = 0..3) (fp8_gemv's exchange), so the lane runs the
// chains v[j][l], l = 4h + i, of its tile and forms s[l] = ((v0 + v1) + v2) + v3 itself. The 4 x 8 tile sums
// of each fold row go to a per-warp shared buffer with the 16 tile factors; after a __syncwarp, lane
// 8 f + l (fold row f, chain l) folds tot = fma(s, fac, tot) over the 16 tiles in order (4 + 4 float4
// loads, 16 FMAs), so the whole warp folds, every warp independently: no block barrier after the prologue.
// After the last segment of a row group, 8-lane shuffles form the CPU's hsum and lane l = 0 stores y.
//
// The whole-chunk form (kWhole; tiles of 32 at one x row per block, R = 2 or 4, where every weight row is read by one
// x row: DEEPINFER_CUDA_WALK_WHOLE): lane h of pair pp takes rows 2k + h of the group (k < R / 2) and loads both
// 16-byte halves of its tile of each, so its words 2j + e hold elements 8j + 4e + i, all 8 chains of the tile: no
// shuffles and no selects (2 SHFL + 6 SEL per 16 bytes in the pair form), for twice the x loads per item (8 float4,
// shared by the lane's R / 2 rows). Same loads in flight per item (R per lane), same s buffer and fold (the two lanes
// of a tile store rows 2k, 2k + 1: kFoldRow is 16 banks off). Its loads go through L1 (ldg_stream<true>), since a
// sector's halves come in two instructions. The batch-1 fast loop's SASS (R = 4, 128 weights a lane per pass): 658
// instructions against the pair form's 761 (798 before the high e4m3 pair was converted in place, e4m3x2_hi).
//
// Pipeline. Each lane keeps a ring of D items (item = one segment of the row group: R x G 16-byte loads and
// the tile's scale code), up to 16 loads (256 bytes per lane, 8 KB per warp) in flight (8 for MT > 1 and for 4-row
// groups at one x row; D <= 4, as the unrolled pass's code must stay in the instruction cache: WalkShape). Slot d is
// refilled as soon as it is computed, with the item D ahead in the warp's sequence, which runs on across row groups (no
// drain at the end of a row). The loader walks a pointer per row by a segment per item (recomputed at a new row group
// only). Dense mode issues the first D items before griddepcontrol.wait.
//
// Arithmetic (per 16 weight bytes and x row: 8 cvt.rn.f16x2.e4m3x2, 16 f16 -> f32, 16 FMAs). The codes
// are decoded through the hardware e4m3x2 -> f16x2 conversion, exact, NaN codes to NaN (which then
// propagates to y, as the contract wants, with no separate NaN test). The contract's weight is
// e4m3 * 2^-8 (tile factor 2^(e-119)); when the block's x qualifies ("fast" x, checked once per block) the
// 2^-8 moves to x instead (x * 2^-8 is exact, so every product is the same real number) and, for B = 32 where
// each chain holds one product, s = ((p0 + p1) + p2) + p3 becomes fma(w3, x3, fma(w2, x2, fma(w1, x1,
// fma(w0, x0, 0)))): equal bit for bit because every product is exact. Fast x: with act quant, every group
// scale below 2^91 (x_q has 4 significant bits and |x_q| < 2^100); without, every x is 0, not finite, or has
// at most 20 significant bits and 2^-100 <= |x| < 2^100. Otherwise (raw fp32 x, extreme values) the slow
// path multiplies the f16 codes by 2^-8 (exact) and forms the products and sums one by one as the CPU.
//
// The bulk-ring form (kBulk; the whole-chunk form's calls, DEEPINFER_CUDA_WALK_BULK, off by default until measured):
// the weights come by bulk copies (cp.async.bulk, the TMA's 1-D form) into a ring of p.bstages item stages per warp
// in shared memory instead of the lanes' register ring: one elected lane issues an item's R row pieces (512 bytes each,
// the last segment's valid bytes only) with the arrive that makes the stage's mbarrier expect their bytes, the lanes
// read their 2 x 16 bytes of rows 2 k + h from the stage, and the stage is refilled with the item p.bstages ahead
// once every lane has read it. The loader's position, stages and row pointers are warp-uniform in the compiler's eyes
// (the warp index comes from a shuffle, hopper.cuh's bulk_pieces_elect), so an item's issue is ~40 SASS instructions
// (~96 with lane 0 issuing each piece).
// Why: ncu gives the walk's warps long_scoreboard as their first stall (bench/RESULTS.md, sixty-first session), so too
// few bytes are in flight, and the register ring cannot hold more (I-cache and registers); a bulk copy in flight holds
// neither a register nor an L1 miss slot. The tile scale codes keep the register ring (scale rows need not be 16-byte
// aligned); tiles past T read zeros, not the stage's stale bytes. The same loads in the same order feed the same
// arithmetic, so the same bits.
//
// x staging: the block's MT x rows go to shared memory, swizzled so that the float4 reads of a quarter warp (4 tiles x
// 2 lanes) hit 8 distinct bank groups, fake-quantised (linear_gemv.cu's arithmetic: group amax, ue8m0 scale,
// e4m3_rne(x * (1 / s)) * s) and, for fast x, scaled by 2^-8: in one pass through registers with one block barrier
// for act-quant groups of 32 and for raw x (fp8_stage_quantise_x: the group amax by shuffles), else by cp.async and
// then in place (group amax by integer atomicMax, three more barriers). The one pass took wo_b [5120, 8192] at one row
// of x from 19.1 to 17.2 us (bench/RESULTS.md, thirtieth session): the prologue runs after griddepcontrol.wait, so
// every barrier of it is on the critical path.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <type_traits>

#include "core/env.h"
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/gemv_fp8_x.cuh"
#include "cuda/hopper.cuh"
#include "cuda/linear_gemv_fp8.cuh"
#include "cuda/quant.cuh"

namespace deepinfer::cuda {

namespace {

struct WalkParams : GemvCall {
  int mtiles;   // x-row groups of MT rows (grouped: M, one row each)
  int groups;   // row groups of R weight rows: ceil(N / R)
  int T, S;     // tiles per row, segments (16 tiles) per row
  int xcols;    // x columns staged per row: 16 S B (zeros beyond K)
  int bstages;  // the bulk-ring form's item stages per warp (walk_bulk_stages)
};

constexpr int kSegTiles = 16;  // tiles per segment (one per lane pair)
constexpr int kLStride = 20;   // floats between the chains l of a fold row: conflict free
// Floats per fold row of the s buffer: 16 banks past a multiple of 32, so that the whole-chunk form's two lanes of a
// tile (rows 2k and 2k + 1) store into different banks.
constexpr int kFoldRow = 8 * kLStride + 16;
constexpr int kWarpFloats = 4 * kFoldRow + kSegTiles;  // a warp's s buffer [4][kFoldRow] and tile factors [16]
constexpr int kMaxWarps = 16;                          // one block per SM (128 registers per thread)
// The bulk-ring form's most item stages per warp (its default, DEEPINFER_CUDA_WALK_BULK_STAGES, is 4: 16 warps x 4 x 2
// KB, 128 KB an SM, 8 KB a warp in flight against the register ring's 4).
constexpr int kBulkMaxStages = 8;
constexpr int kBulkPiece = 512;  // bytes of one row per item: 16 tiles of 32
// Bytes between two rows of a stage: a piece and 16 bytes, so that a quarter warp's 16-byte reads (lanes 2 pp + h, rows
// 2 k + h at 32 pp) fall in 8 distinct bank groups; with rows 512 bytes apart, h = 0 and 1 hit the same banks (2-way).
constexpr int kBulkRow = kBulkPiece + 16;

// The bulk-ring form's shared memory after walk_smem_floats' floats, in bytes: per warp `stages` stages of R rows of
// an item, then per warp `stages` mbarriers, then 32 zero bytes (what a lane reads for a tile past T).
__host__ __device__ inline int64_t walk_bulk_bytes(int R, int warps, int stages) {
  return static_cast<int64_t>(warps) * stages * (R * kBulkRow + 8) + 32;
}

// R weight rows per row group: 4 / MT (the 4 fold rows), or fewer when the groups of 4 would leave warps idle.
template <int MT, int G, int R, bool kWhole = false>
struct WalkShape {
  static_assert(R * MT <= 4 && 4 % (R * MT) == 0, "at most 4 fold rows");
  static_assert(!kWhole || (MT == 1 && G == 1 && R % 2 == 0), "the whole-chunk form: one x row, tiles of 32");
  static constexpr int kRows = kWhole ? R / 2 : R;  // weight rows per lane
  static constexpr int kLoads = kWhole ? 2 : G;     // 16-byte loads per row and item
  static constexpr int kSlots = MT == 1 ? 16 : 8;   // 16-byte loads in flight per lane, at most
  static constexpr int kItem = R * G;               // 16-byte loads per item
  static constexpr int kFit = kSlots / kItem > 0 ? kSlots / kItem : 1;
  // Items in the ring: 4 at most, 2 for groups of 4 rows at one x row (8 loads per lane in flight): the unrolled
  // pass's code must stay in the instruction cache (ncu: "no instruction" was the walk's largest stall reason). A
  // ring of 2 measured wq_b 17.4 -> 16.5 us, wo_b 19.9 -> 19.3, the shared w2 8.9 -> 8.1, and the V4.1 batch-1 step
  // 1.48 / 1.54 -> 1.41 / 1.42 ms; groups of 2 rows lost with it (wq_a [1280, 5120] 8.8 -> 9.8), so they keep 4.
  static constexpr int kDmax = MT == 1 && R == 4 && G == 1 ? 2 : 4;
  static constexpr int kD = kFit < kDmax ? kFit : kDmax;
};

// Float4 slot of float4 F of a staged x row: bits 1-2 (the chain j) XOR the tile's low 2 bits, so that the
// 4 tiles x 2 lanes of a quarter warp read 8 distinct 16-byte bank groups (a permutation within each
// 32-column chunk).
template <int G>
__device__ __forceinline__ int x_slot(int F) {
  constexpr int kShift = 3 + (G == 1 ? 0 : G == 2 ? 1 : 2);
  return F ^ (((F >> kShift) & 3) << 1);
}

__device__ __forceinline__ int64_t walk_x_row(const WalkParams& p, int m) { return p.x_rows > 0 ? m % p.x_rows : m; }

// Shared memory of fp8_walk_gemv, in floats (the host sizes the launch with the same function).
__host__ __device__ inline int64_t walk_smem_floats(int MT, int xcols, int warps, int ng) {
  return static_cast<int64_t>(MT) * xcols + static_cast<int64_t>(warps) * kWarpFloats + 2 * ((MT * ng + 3) & ~3);
}

template <int MT, int G, int R, bool kWhole, bool kBulk = false>
__global__ void __launch_bounds__(32 * kMaxWarps, 1) fp8_walk_gemv(WalkParams p) {
  static_assert(!kBulk || kWhole, "the bulk ring feeds the whole-chunk form");
  using Shape = WalkShape<MT, G, R, kWhole>;
  constexpr int D = Shape::kD, B = 32 * G, RL = Shape::kRows, NL = Shape::kLoads;
  extern __shared__ __align__(16) float smem_walk[];
  pdl_launch_dependents();
  const int tid = static_cast<int>(threadIdx.x), nthreads = static_cast<int>(blockDim.x);
  const int lane = tid & 31, warp = tid >> 5, nw = nthreads >> 5;
  const int h = lane & 1, pp = lane >> 1;  // lane pair pp owns tile 16 seg + pp of every segment
  const int N = p.N, K = p.K, T = p.T, S = p.S;
  float* xs = smem_walk;                                                               // [MT][xcols], swizzled (x_slot)
  float* sb = xs + MT * p.xcols + warp * kWarpFloats;                                  // this warp's s [4][8][kLStride]
  float* sfac = sb + 4 * kFoldRow;                                                     // and tile factors [16]
  uint32_t* gmax = reinterpret_cast<uint32_t*>(xs + MT * p.xcols + nw * kWarpFloats);  // [MT][ng]
  float* ginv = reinterpret_cast<float*>(gmax + ((MT * p.ng + 3) & ~3));               // [MT][ng]
  // The bulk ring (kBulk): this warp's stages and their mbarriers (shared-space byte addresses), after the floats.
  // uwarp is the warp index as a shuffle from lane 0, which the compiler knows to be warp-uniform, and so is everything
  // the bulk ring's loader derives from it (its position, its stages, its row pointers): the bulk copies then take
  // their operands from uniform registers, where a possibly divergent operand costs a per-lane loop of R2UR moves
  // around each copy (an item's issue: ~96 SASS instructions, against ~40).
  [[maybe_unused]] const int uwarp = kBulk ? __shfl_sync(0xffffffffu, warp, 0) : warp;
  uint32_t bstage = 0, bbar = 0, bzero = 0;
  if constexpr (kBulk) {
    uint8_t* const bbase = reinterpret_cast<uint8_t*>(ginv + ((MT * p.ng + 3) & ~3));
    const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(bbase));
    const int nst = p.bstages, zoff = nw * nst * (R * kBulkRow + 8);
    bstage = base + static_cast<uint32_t>(uwarp * nst * R * kBulkRow);
    bbar = base + static_cast<uint32_t>(nw * nst * R * kBulkRow + uwarp * nst * 8);
    bzero = base + static_cast<uint32_t>(zoff);
    if (tid < 8) reinterpret_cast<uint32_t*>(bbase + zoff)[tid] = 0u;  // read after the prologue's block barrier
    if (lane == 0)
      for (int st = 0; st < p.bstages; ++st) mbar_init(bbar + 8 * st, 1);
    mbar_init_fence();
    __syncwarp();
  }

  // Row groups go to warps interleaved over the blocks (warp w of block b: groups w nb + b + j nb nw), so that
  // every block holds the same number of row groups, to one: the host launches a whole number of blocks per SM.
  const int mt = static_cast<int>(blockIdx.x) % p.mtiles;
  const int nb = static_cast<int>(gridDim.x) / p.mtiles;
  const int gw = uwarp * nb + static_cast<int>(blockIdx.x) / p.mtiles;  // uwarp: the walk's loops are then uniform
  const int gstride = nb * nw;
  const int m0 = mt * MT, mrows = min(MT, p.M - m0);
  const uint8_t* W = p.w;
  const uint8_t* SC = p.sc;

  // The ring: item (row group lg, segment lseg) of the loader; slot d holds rows [lg R, lg R + R) (clamped
  // to N - 1) of this lane's tile half, chunk by chunk (the whole-chunk form: rows lg R + 2 k + h, k < R / 2, both
  // halves of the tile), zeros beyond the row, and the tile's scale code.
  // The loader keeps a pointer per row (and one to the scale codes) at its tile of the segment and advances them
  // by a segment per item; they are recomputed only when it moves to its next row group.
  uint4 ring[D][RL][NL];
  uint32_t ring_e[D];
  int lg = gw, lseg = 0;
  bool lv = lg < p.groups;
  const int tlast = T - kSegTiles * (S - 1);  // tiles of the last segment, 1 .. 16
  const int lastch = (K - (T - 1) * B) >> 5;  // chunks of the last tile, 1 .. G
  const uint8_t* lp[RL];
  const uint8_t* ls = nullptr;
  auto set_rows = [&]() {
    const int n0 = lg * R;
#pragma unroll
    for (int r = 0; r < RL; ++r) {
      if constexpr (kWhole)
        lp[r] = W + static_cast<int64_t>(min(n0 + 2 * r + h, N - 1)) * p.ldw + pp * B;
      else
        lp[r] = W + static_cast<int64_t>(min(n0 + r, N - 1)) * p.ldw + pp * B + 16 * h;
    }
    ls = SC + static_cast<int64_t>(n0 / B) * p.lds + pp;  // rows n0 .. n0 + R - 1 share a scale row: R divides B
  };
  auto load_item = [&](int d) {
    const bool tv = lv && (lseg < S - 1 || pp < tlast);
    const int nch = G == 1 ? 1 : lseg * kSegTiles + pp == T - 1 ? lastch : G;
    if constexpr (!kBulk) {  // the bulk ring brings the weights itself (issue_bulk)
#pragma unroll
      for (int r = 0; r < RL; ++r)
#pragma unroll
        for (int c = 0; c < NL; ++c)
          // The whole-chunk form reads a sector's two halves in two instructions: through L1, so that the second
          // finds it there (with ldg_stream<false>, which asks L2 for the sector twice, the shared w2 took 7.3 us
          // against the pair form's 6.8; through L1 6.6; bench/RESULTS.md, fifty-first session).
          ring[d][r][c] = tv && (kWhole || c < nch) ? ldg_stream<kWhole>(lp[r] + (kWhole ? 16 : 32) * c)
                                                    : make_uint4(0u, 0u, 0u, 0u);
    }
    ring_e[d] = tv ? static_cast<uint32_t>(__ldg(ls)) : 0u;
#pragma unroll
    for (int r = 0; r < RL; ++r) lp[r] += kSegTiles * B;
    ls += kSegTiles;
    if (++lseg == S) {
      lseg = 0, lg += gstride, lv = lg < p.groups;
      if (lv) set_rows();
    }
  };
  // The bulk ring's own loader (its items run p.bstages ahead of the walk, the scale codes' D): item (bg, bseg) of
  // the warp's sequence into stage bslot, by one elected lane; every lane keeps the same (uniform) position, and the
  // row pointers of group bg (brow, recomputed only when the loader moves to its next group).
  int bg = gw, bseg = 0, bslot = 0;
  [[maybe_unused]] const uint8_t* brow[R];
  // Bytes of a row's last piece (a multiple of 32: K % 32 == 0); every other piece is kBulkPiece.
  [[maybe_unused]] const uint32_t blast = static_cast<uint32_t>(K - (S - 1) * kBulkPiece);
  auto bulk_rows = [&]() {
#pragma unroll
    for (int r = 0; r < R; ++r) brow[r] = W + static_cast<int64_t>(min(bg * R + r, N - 1)) * p.ldw;
  };
  auto issue_bulk = [&]() {
    if (bg >= p.groups) return;  // the warp's sequence has ended: nothing more will be waited for
    if constexpr (kBulk) {       // the pieces complete the stage's phase; a row's last piece may be shorter
      const uint32_t bar = bbar + 8 * bslot, dst = bstage + static_cast<uint32_t>(bslot * R * kBulkRow);
      const int64_t off = static_cast<int64_t>(bseg) * kBulkPiece;
      const void* src[R];
#pragma unroll
      for (int r = 0; r < R; ++r) src[r] = brow[r] + off;
      if (bseg != S - 1)
        bulk_pieces_elect<R, kBulkPiece>(dst, kBulkRow, src, kBulkPiece, bar);
      else
        bulk_pieces_elect<R>(dst, kBulkRow, src, blast, bar);
    }
    if (++bslot == p.bstages) bslot = 0;
    if (++bseg == S) {
      bseg = 0, bg += gstride;
      if (bg < p.groups) bulk_rows();
    }
  };
  auto prime = [&]() {
    if (lv) set_rows();
#pragma unroll
    for (int d = 0; d < D; ++d) load_item(d);
    if constexpr (kBulk) {
      if (bg < p.groups) bulk_rows();
      for (int i = 0; i < p.bstages; ++i) issue_bulk();
    }
  };

  const bool grouped = p.row_expert != nullptr;
  if (!grouped) prime();
  const bool one_pass = fp8_one_pass_x(p.A, p.xcols);
  if (!one_pass)
    for (int i = tid; i < MT * p.ng; i += nthreads) gmax[i] = 0u;
  pdl_wait();

  // x rows [m0, m0 + mrows) into xs (zeros beyond K and for rows >= mrows), quantised: in one pass without act quant
  // or with groups of 32 (fp8_stage_quantise_x), else raw, all in flight at once, then quantised in place.
  auto slot = [](int c) { return x_slot<G>(c); };
  auto x_row = [&](int m) { return walk_x_row(p, m0 + m); };
  auto expert = [&]() {  // the expert of x row m0 (as linear_gemv.cu's expert_of)
    const int e = __ldcg(p.row_expert + walk_x_row(p, m0)) + (p.x_rows > 0 ? m0 / p.x_rows * p.n_experts : 0);
    W = reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(p.w_table + e)));
    SC = reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(p.s_table + e)));
    if constexpr (kBulk)  // the bulk copies' row pointers: uniform (uwarp) where the compiler knows W to be
      W = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(W), 0));
    prime();
  };
  bool fast;
  if (one_pass) {
    if (grouped) expert();
    fast = fp8_stage_quantise_x<MT>(xs, p.xcols, p.x, p.ldx, mrows, K, p.A, x_row, slot);
  } else {
    fp8_stage_x<MT>(xs, p.xcols, p.x, p.ldx, mrows, K, x_row, slot);
    if (grouped) expert();  // while x is in flight
    cp_async_wait_all();
    __syncthreads();  // raw x complete, gmax zeroed
    fast = fp8_quantise_x<MT>(xs, p.xcols, gmax, ginv, p.A, p.ng, mrows, K, slot);
  }

  // The walk: item after item (segment seg of row group cg), D slots of the ring per pass.
  const int f = lane >> 3, l = lane & 7;  // this lane's fold row and chain
  // x of (tile t, chunk c, j) for this lane: float4 x_slot<G>(8 (t G + c) + 2 j + h) = 8 (t G + c) + 2 (j ^ (t & 3)) +
  // h of a staged row, where t & 3 = pp & 3 (t = 16 seg + pp): a lane offset per j, plus 512 G floats per segment.
  int xoff[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) xoff[j] = 4 * (8 * pp * G + 2 * (j ^ (pp & 3)) + h);
  // The whole-chunk form's x: float4 pointers to (j, e = 0) of this lane's tile in segment 0 (e = 1 is the next
  // float4), so that an item's 8 loads cost 4 address adds (the float offsets cost a multiply and a shift each).
  const float4* xq[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) xq[j] = reinterpret_cast<const float4*>(xs + xoff[j] - 4 * h);
  auto walk = [&](auto fast_tag) {
    constexpr bool kFast = decltype(fast_tag)::value;
    float tot = 0.0f;
    int cg = gw, cseg = 0;
    // The bulk ring: the stage of the walk's item and the parity of that stage's current phase.
    [[maybe_unused]] int cslot = 0;
    [[maybe_unused]] uint32_t cphase = 0;
    while (cg < p.groups) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        if (cg >= p.groups) break;  // uniform over the warp
        const int t = cseg * kSegTiles + pp;
        // x of chunk c of this lane's tile: xw[m][j] = x[m0 + m][32 (t G + c) + 8 j + 4 h .. + 3].
        const float* xseg = xs + 512 * G * cseg;
        auto load_x = [&](int c, float4(&xw)[MT][4]) {
#pragma unroll
          for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int j = 0; j < 4; ++j)
              xw[m][j] = *reinterpret_cast<const float4*>(xseg + m * p.xcols + 32 * c + xoff[j]);
        };
        if constexpr (kWhole) {
          // This lane's whole tile of rows 2 r + h: x as xa[j][e] = x[32 t + 8 j + 4 e .. + 3] (float4 8 t + 2 j + e,
          // at its x_slot), shared by the lane's R / 2 rows; word 2 j + e of a row's chunk holds the codes of elements
          // 8 j + 4 e + i, i.e. of chains l = 4 e + i, so the lane runs all 8 chains of its rows: no exchange.
          float4 xa[4][2];
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) xa[j][e] = xq[j][128 * cseg + e];
          if constexpr (kBulk) mbar_wait(bbar + 8 * cslot, cphase);
#pragma unroll
          for (int r = 0; r < RL; ++r) {
            uint4 q0, q1;
            if constexpr (kBulk) {
              // Rows 2 r + h, this lane's tile pp: 32 bytes of the stage, or for a tile past T the zero block's (zeros,
              // not the stage's stale bytes; an address select where zeroed registers and a branch cost 4 CS2R a row).
              const uint32_t a =
                  t < T ? bstage + static_cast<uint32_t>(cslot * R * kBulkRow + (2 * r + h) * kBulkRow + 32 * pp)
                        : bzero;
              q0 = lds128(a), q1 = lds128(a + 16);
            } else {
              q0 = ring[d][r][0], q1 = ring[d][r][1];
            }
            const uint32_t wd[4][2] = {{q0.x, q0.y}, {q0.z, q0.w}, {q1.x, q1.y}, {q1.z, q1.w}};
            // Fast x: the chain sum fused (exact products, see the top); else each product rounded, then s = ((v0 +
            // v1) + v2) + v3.
            float s[2][4], v[4][2][4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                float wf[4];
                decode4<!kFast>(wd[j][e], wf);
                const float xv[4] = {xa[j][e].x, xa[j][e].y, xa[j][e].z, xa[j][e].w};
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                  if constexpr (kFast)
                    s[e][i] = __fmaf_rn(wf[i], xv[i], j == 0 ? 0.0f : s[e][i]);
                  else
                    v[j][e][i] = __fmaf_rn(wf[i], xv[i], 0.0f);
                }
              }
            if constexpr (!kFast) {
#pragma unroll
              for (int e = 0; e < 2; ++e)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                  s[e][i] = __fadd_rn(__fadd_rn(__fadd_rn(v[0][e][i], v[1][e][i]), v[2][e][i]), v[3][e][i]);
            }
#pragma unroll
            for (int e = 0; e < 2; ++e)
#pragma unroll
              for (int i = 0; i < 4; ++i) sb[(2 * r + h) * kFoldRow + (4 * e + i) * kLStride + pp] = s[e][i];
          }
        } else {
          float4 xw[MT][4];
          if constexpr (G == 1) load_x(0, xw);  // shared by the R rows
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float v[MT][4][4];  // the chains v[j][4h + i] of each x row
#pragma unroll
            for (int c = 0; c < G; ++c) {
              const uint4 q = ring[d][r][c];
              uint32_t wj[4];  // lane 0 loaded bytes 0..15 of the chunk, lane 1 bytes 16..31
              pair_words(q, h, wj);
              float wf[4][4];
#pragma unroll
              for (int j = 0; j < 4; ++j) decode4<!kFast>(wj[j], wf[j]);
              if constexpr (G > 1) load_x(c, xw);
#pragma unroll
              for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                  const float xv[4] = {xw[m][j].x, xw[m][j].y, xw[m][j].z, xw[m][j].w};
#pragma unroll
                  for (int i = 0; i < 4; ++i) {
                    if constexpr (G == 1 && kFast)  // exact products: the chain sum fused (see the top)
                      v[m][0][i] = __fmaf_rn(wf[j][i], xv[i], j == 0 ? 0.0f : v[m][0][i]);
                    else
                      v[m][j][i] = __fmaf_rn(wf[j][i], xv[i], c == 0 ? 0.0f : v[m][j][i]);
                  }
                }
            }
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                float s = v[m][0][i];
                if constexpr (!(G == 1 && kFast))
                  s = __fadd_rn(__fadd_rn(__fadd_rn(v[m][0][i], v[m][1][i]), v[m][2][i]), v[m][3][i]);
                sb[(r * MT + m) * kFoldRow + (4 * h + i) * kLStride + pp] = s;
              }
          }
        }
        // Tiles beyond T: s = 0 (zero weights and x) and factor 0, so their fma leaves tot as it is. Both lanes of the
        // tile store the same factor (they loaded the same code): no branch.
        sfac[pp] = t < T ? fp8_tile_factor(ring_e[d]) : 0.0f;
        load_item(d);  // the slot is consumed: refill it with the item D ahead
        __syncwarp();
        if constexpr (kBulk) {
          // Every lane has read stage cslot (the barrier above): refill it with the item p.bstages ahead.
          issue_bulk();
          if (++cslot == p.bstages) cslot = 0, cphase ^= 1u;
        }
        const float* sp = sb + f * kFoldRow + l * kLStride;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float4 a = *reinterpret_cast<const float4*>(sp + 4 * k);
          const float4 e = *reinterpret_cast<const float4*>(sfac + 4 * k);
          tot = __fmaf_rn(a.x, e.x, tot);
          tot = __fmaf_rn(a.y, e.y, tot);
          tot = __fmaf_rn(a.z, e.z, tot);
          tot = __fmaf_rn(a.w, e.w, tot);
        }
        __syncwarp();  // the buffer is free for the next item
        if (++cseg == S) {
          // hsum in the CPU's order: ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)), + the empty tail.
          float hs = __fadd_rn(tot, __shfl_down_sync(0xffffffffu, tot, 4, 8));
          hs = __fadd_rn(hs, __shfl_down_sync(0xffffffffu, hs, 2, 8));
          hs = __fadd_rn(hs, __shfl_down_sync(0xffffffffu, hs, 1, 8));
          const int n = cg * R + f / MT, m = f % MT;
          if (l == 0 && f < R * MT && n < N && m < mrows) {
            const float o = __fadd_rn(hs, 0.0f);
            p.y[static_cast<int64_t>(m0 + m) * N + n] = p.round ? round_to_bf16(o) : o;
          }
          tot = 0.0f;
          cseg = 0;
          cg += gstride;
        }
      }
    }
  };
  // fast is the block's (read from shared memory); the vote tells the compiler it is warp-uniform, so the bulk ring's
  // loader stays uniform inside the walk.
  if (kBulk ? __all_sync(0xffffffffu, fast) : fast)
    walk(std::true_type{});
  else
    walk(std::false_type{});
}

// ---- host side -----------------------------------------------------------------------------------------------
constexpr int64_t kWalkSmemBudget = 200 << 10;  // per block: one block per SM

std::atomic<int> g_bulk_stages{0};  // gemv_set_fp8_walk_bulk_stages (0: the environment's)

// The bulk ring's stages asked for: gemv_set_fp8_walk_bulk_stages, else DEEPINFER_CUDA_WALK_BULK_STAGES; 0: as many as
// fit (at most kBulkMaxStages).
int walk_bulk_stages() {
  static const int env = [] {
    const int64_t n = env_int("DEEPINFER_CUDA_WALK_BULK_STAGES", 0);
    DI_CHECK(n != 1 && n <= kBulkMaxStages, "DEEPINFER_CUDA_WALK_BULK_STAGES must be 0 or 2 .. {} (got {})",
             kBulkMaxStages, n);
    return static_cast<int>(n);
  }();
  const int s = g_bulk_stages.load(std::memory_order_relaxed);
  return s != 0 ? s : env;
}

}  // namespace

int gemv_set_fp8_walk_bulk_stages(int stages) {
  DI_CHECK(stages == 0 || (stages >= 2 && stages <= kBulkMaxStages),
           "gemv_set_fp8_walk_bulk_stages: {} is not 0 or 2 .. {}", stages, kBulkMaxStages);
  return g_bulk_stages.exchange(stages, std::memory_order_relaxed);
}

void gemv_fp8_walk_into(const GemvArgs& a, int form, cudaStream_t stream) {
  const bool whole = form >= 2;
  WalkParams p = {};
  copy_gemv_args(a, p);
  const int B = a.B, G = B / 32;
  p.T = (p.K + B - 1) / B;
  p.S = (p.T + kSegTiles - 1) / kSegTiles;
  p.xcols = kSegTiles * p.S * B;

  // x rows per block: all of M when the 4 fold rows allow it (M = 3 runs as 4 with an empty row), at most 2
  // for tiles above 32 (their chains persist over a tile: 16 MT registers), fewer when x does not fit.
  const bool grouped = a.row_expert != nullptr;
  int MT = grouped ? 1 : a.M == 1 ? 1 : a.M == 2 || G > 1 ? 2 : 4;
  while (MT > 1 && 4 * walk_smem_floats(MT, p.xcols, kMaxWarps, p.ng) > kWalkSmemBudget) MT /= 2;
  p.mtiles = (p.M + MT - 1) / MT;

  // One block per SM, as many as the x-row groups can use (a multiple of mtiles; more, in waves, when the x-row
  // groups outnumber the SMs), and warps per block (16, or fewer when the row groups would leave half of them
  // idle). The kernel deals row groups out evenly over the blocks of an x-row group, so every SM gets the same
  // number to one: with blocks of whole warps' groups, 160 blocks of 8 warps on 132 SMs (wo_b, the shared w2)
  // left 28 SMs with twice the rows of the others (ncu: SMs active 48-62% of the kernel's time).
  // Rows per group: 4 / MT, or 2 at one x row when every group of 2 gets a warp of its own (bench_cuda_gemv, M =
  // 1: wq_a [1280, 5120] 11.8 -> 8.8 us, wkv [512, 5120] 22.2 -> 14.9, the shared w1 / w3 [2304, 5120] 11.3 -> 9.6;
  // but wo_b [5120, 8192], 2,560 groups of 2 for 2,112 warps, 20.8 -> 23.2: a warp with two groups holds up the
  // rest).
  const int64_t sms = sm_count();
  const int64_t per_mt_max = std::max<int64_t>(1, sms / p.mtiles);
  const int R = MT == 1 && (p.N + 1) / 2 <= per_mt_max * kMaxWarps ? 2 : 4 / MT;
  p.groups = (p.N + R - 1) / R;
  const int64_t per_mt = std::min<int64_t>(p.groups, per_mt_max);

  // The whole-chunk form where every weight row is read by one x row: dense calls of one row, grouped calls whose
  // matrices serve one x row each (wo_a's groups and the shared w1 / w3 at one token). Where x-row groups share the
  // weights through L2, its second load per sector costs more than the exchange it saves (bench_cuda_gemv, H100: wo_a's
  // 8 groups at 4 / 8 tokens 32.1 / 59.7 us against the pair form's 30.1 / 54.8).
  const int xr = a.x_rows > 0 ? a.x_rows : a.M;
  const bool one_reader = grouped ? (a.row_period > 0 ? xr / a.row_period : xr) == 1 : a.M == 1;
  void (*kernel)(WalkParams) = nullptr;
  // The bulk ring (form 3) where the whole-chunk form runs and at least 2 stages a warp fit beside x and the fold
  // buffers: as many warps a block as it has row groups (idle warps would hold shared memory, the ring's stages, for
  // nothing; the same groups go to the same warps), and the stages walk_bulk_stages asks for, fewer where they do not
  // fit (0: as many as fit, at most kBulkMaxStages).
  int max_warps = kMaxWarps;
  p.bstages = 0;
  if (form == 3 && G == 1 && MT == 1 && whole && one_reader) {
    const int bw = static_cast<int>(std::min<int64_t>(kMaxWarps, (p.groups + per_mt - 1) / per_mt));
    const int64_t room = smem_optin() - 4 * walk_smem_floats(MT, p.xcols, bw, p.ng) - walk_bulk_bytes(R, bw, 0);
    const int fit = static_cast<int>(
        std::clamp<int64_t>(room / (static_cast<int64_t>(bw) * (R * kBulkRow + 8)), 0, kBulkMaxStages));
    const int want = walk_bulk_stages();
    const int stages = want == 0 ? fit : std::min(want, fit);
    if (stages >= 2) p.bstages = stages, max_warps = bw;
  }
  const bool bulk = p.bstages >= 2;
  if (bulk)
    kernel = R == 4 ? fp8_walk_gemv<1, 1, 4, true, true> : fp8_walk_gemv<1, 1, 2, true, true>;
  else if (G == 1 && MT == 1 && whole && one_reader)
    kernel = R == 4 ? fp8_walk_gemv<1, 1, 4, true> : fp8_walk_gemv<1, 1, 2, true>;
  else if (G == 1)
    kernel = MT == 1   ? (R == 4 ? fp8_walk_gemv<1, 1, 4, false> : fp8_walk_gemv<1, 1, 2, false>)
             : MT == 2 ? fp8_walk_gemv<2, 1, 2, false>
                       : fp8_walk_gemv<4, 1, 1, false>;
  else if (G == 2)
    kernel = MT == 1 ? (R == 4 ? fp8_walk_gemv<1, 2, 4, false> : fp8_walk_gemv<1, 2, 2, false>)
                     : fp8_walk_gemv<2, 2, 2, false>;
  else
    kernel = MT == 1 ? (R == 4 ? fp8_walk_gemv<1, 4, 4, false> : fp8_walk_gemv<1, 4, 2, false>)
                     : fp8_walk_gemv<2, 4, 2, false>;
  launch_sm_blocks(
      kernel, p, p.mtiles, per_mt, p.groups, max_warps,
      [&](int nw) {
        return 4 * walk_smem_floats(MT, p.xcols, nw, p.ng) + (bulk ? walk_bulk_bytes(R, nw, p.bstages) : 0);
      },
      "fp8_walk_gemv", stream);
}

}  // namespace deepinfer::cuda
