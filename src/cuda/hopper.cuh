// Hopper (sm_90a) asynchronous pieces for kernels that stage operands with the TMA and multiply with wgmma: shared-
// memory mbarriers (a try of a wait, and a wait bounded by the global timer), L2 policies (evict-first, evict-normal),
// the 2-D tensor-map load and a warp's elected 1-D bulk loads, the wgmma fences and groups, the shared-memory matrix
// descriptor of a 128-byte-swizzled K-major tile and of an unswizzled one (and one moved by an offset), the wgmma
// shapes (m64nNk32 E4M3 x E4M3 into FP32 with both operands in shared memory, N = 32, 64, 96, 128; m64n32k16 f16 x f16
// with A from registers), the E4M3 -> f16x2 conversion, and on the host the tensor map of a row-major byte matrix. PTX
// ISA sections: "Parallel Synchronization and Communication Instructions: mbarrier", "cp.async.bulk.tensor",
// "Asynchronous Warpgroup Level Matrix Multiply-Accumulate".
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: the encoder is reached through the runtime's driver entry point)

#include <cstdint>

namespace deepinfer::cuda {

// Host: the tensor map of a [rows, cols] matrix of bytes with row stride ld (a multiple of 16, base 16-byte aligned)
// read in boxes of box_rows x box_cols bytes (box_cols <= 128) laid out in shared memory with the 128-byte swizzle;
// rows past the end read as zeros; l2_promotion: the L2 fetch granule (0 none, 128 or 256 bytes). Throws
// deepinfer::Error when the driver refuses the map.
CUtensorMap tensor_map_u8_sw128(const void* base, int64_t rows, int64_t cols, int64_t ld, int box_rows, int box_cols,
                                int l2_promotion = 256);

// Host, for tests: one warp runs bulk_pieces_elect<R> (constant: its kBytes = 512 form) for R pieces of `bytes` from
// src + r * ld (device memory) into a shared-memory stage of rows `step` apart, first filled with 0xEE, waits for the
// barrier's phase, and copies the R * step stage bytes to out (device memory). Returns 0, or 1 when the phase did not
// complete within 0.1 s (out is then not written).
int bulk_pieces_probe(const uint8_t* src, int64_t ld, int R, uint32_t bytes, bool constant, uint32_t step,
                      uint8_t* out);

#ifdef __CUDACC__
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The first 1,024-byte aligned address at or after p in shared memory (the 128-byte swizzle's atoms need it; dynamic
// shared memory is only 16-byte aligned).
__device__ __forceinline__ uint8_t* smem_align1024(uint8_t* p) {
  const uint32_t a = smem_u32(p);
  return p + (((a + 1023u) & ~1023u) - a);
}

// mbarriers (8 bytes of shared memory each, by shared-space address).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (the TMA) before the block barrier that follows.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Adds `bytes` to the transaction count of the current phase without arriving (the arrive comes later).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Makes this thread's earlier shared-memory stores visible to the async proxy (the TMA, wgmma's shared operands).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Spins until the phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// One try of a phase wait: true once the phase with this parity has completed (the hardware may hold the thread a
// while before it answers false).
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// The GPU's global timer, nanoseconds.
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// A wait with a bound: true once the phase with this parity has completed, false when it has not within ns
// nanoseconds of the first try that found it incomplete (tests and first runs: a barrier that never completes then
// fails instead of hanging).
__device__ __forceinline__ bool mbar_wait_ns(uint32_t bar, uint32_t parity, uint64_t ns) {
  uint64_t t0 = 0;
  while (!mbar_try_wait(bar, parity)) {
    const uint64_t now = global_ns();
    if (t0 == 0)
      t0 = now;
    else if (now - t0 > ns)
      return false;
  }
  return true;
}

// An L2 policy for data read once (weights streamed by a decode GEMV).
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
// The default policy, as an explicit one (bench_cuda_wgmma_probe's A/B against evict-first).
__device__ __forceinline__ uint64_t l2_evict_normal() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

// The TMA: the box at (c0 = column, c1 = row) of the map into shared memory at dst, completing on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
      : "memory");
}

// An mbarrier phase's R bulk pieces (R = 2 or 4): `bytes` each (a multiple of 16) from src[r] into shared memory at
// dst + r * step, issued with the arrive that expects their R * bytes, by one elected lane of a converged warp (every
// lane calls it with the same operands). Why one elected block: a bulk copy is a uniform-datapath instruction (UBLKCP),
// so the warp issues each piece as one instruction; under `if (lane == 0)`, with operands the compiler cannot prove
// uniform, every piece costs a loop of ELECT, R2UR moves and a branch, and a separate elect per piece an ELECT and a
// vote each. kBytes > 0: the size as a constant (no per-piece move of it into a uniform register). The bulk-ring walk's
// item of 4 pieces: ~96 SASS instructions under `if (lane == 0)`, ~40 here (bench/RESULTS.md, sixty-second session).
template <int R, int kBytes = 0>
__device__ __forceinline__ void bulk_pieces_elect(uint32_t dst, uint32_t step, const void* const (&src)[R],
                                                  uint32_t bytes, uint32_t bar) {
  static_assert(R == 2 || R == 4, "2 or 4 pieces");
  if constexpr (kBytes > 0) bytes = kBytes;
  if constexpr (R == 2) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        ".reg .b32 d1, tx;\n"
        "elect.sync _|p, 0xffffffff;\n"
        "shl.b32 tx, %3, 1;\n"
        "add.u32 d1, %0, %4;\n"
        "@p mbarrier.arrive.expect_tx.shared::cta.b64 _, [%5], tx;\n"
        "@p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %3, [%5];\n"
        "@p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d1], [%2], %3, [%5];\n"
        "}\n" ::"r"(dst),
        "l"(src[0]), "l"(src[1]), "r"(bytes), "r"(step), "r"(bar)
        : "memory");
  } else {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        ".reg .b32 d1, d2, d3, tx;\n"
        "elect.sync _|p, 0xffffffff;\n"
        "shl.b32 tx, %5, 2;\n"
        "add.u32 d1, %0, %6;\n"
        "add.u32 d2, d1, %6;\n"
        "add.u32 d3, d2, %6;\n"
        "@p mbarrier.arrive.expect_tx.shared::cta.b64 _, [%7], tx;\n"
        "@p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %5, [%7];\n"
        "@p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d1], [%2], %5, [%7];\n"
        "@p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d2], [%3], %5, [%7];\n"
        "@p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [d3], [%4], %5, [%7];\n"
        "}\n" ::"r"(dst),
        "l"(src[0]), "l"(src[1]), "l"(src[2]), "l"(src[3]), "r"(bytes), "r"(step), "r"(bar)
        : "memory");
  }
}

// wgmma ordering: fence before an MMA whose registers other instructions touched; commit the MMAs issued so far as a
// group; wait until at most N groups are pending.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads of an accumulator across the waits above.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Descriptor of a K-major operand tile in shared memory as the TMA writes it with the 128-byte swizzle: rows of 128
// bytes, 8-row groups 1,024 bytes apart (the stride byte offset), the group base 1,024-byte aligned. addr: the tile's
// shared-space address plus the byte offset of the K step within the row (a multiple of 16 below 128).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3ffffu) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// Descriptor of a K-major operand tile without swizzle: core matrices of 8 rows x 16 bytes (128 contiguous bytes), lbo
// bytes apart along K and sbo bytes apart along the rows (M or N).
__device__ __forceinline__ uint64_t wgmma_desc_plain(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3ffffu) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32);
}

// A shared-memory descriptor moved by `bytes` (a multiple of 16): the start address field (bits 0-13, the address / 16)
// takes the sum, and shared addresses stay below 2^18, so nothing carries into the next field. One add instead of
// building the descriptor anew per MMA (about 70 integer instructions a stage).
__device__ __forceinline__ uint64_t desc_plus(uint64_t desc, uint32_t bytes) {
  return (desc & 0xffffffff00000000ull) | (static_cast<uint32_t>(desc) + (bytes >> 4));
}

// D[64 x 32] = A[64 x 32] B[32 x 32] (scale-d 0: D is only written, so its registers are outputs and need not hold
// anything before), E4M3 x E4M3 into FP32, both operands in shared memory (K-major descriptors). D's fragment: d[4i +
// 2h + e] = row 16 w + g + 8 h, column 8 i + 2 r + e (warp w, lane 4 g + r).
__device__ __forceinline__ void wgmma_m64n32k32_e4m3_ss(float (&d)[16], uint64_t a_desc, uint64_t b_desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n"
      "}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]),
        "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15])
      : "l"(a_desc), "l"(b_desc));
}

// The same E4M3 MMA with B [32 x N], N = 64, 96, 128 (D[64 x N]: d[4i + 2h + e] = row 16 w + g + 8 h, column 8 i + 2 r
// + e), and wgmma_e4m3_ss<N> choosing among the four by N.
__device__ __forceinline__ void wgmma_m64n64k32_e4m3_ss(float (&d)[32], uint64_t a_desc, uint64_t b_desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n"
      "}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]),
        "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]),
        "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]),
        "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
      : "l"(a_desc), "l"(b_desc));
}
__device__ __forceinline__ void wgmma_m64n96k32_e4m3_ss(float (&d)[48], uint64_t a_desc, uint64_t b_desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47}, %48, %49, p, 1, 1;\n"
      "}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]),
        "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]),
        "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]),
        "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]),
        "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]),
        "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47])
      : "l"(a_desc), "l"(b_desc));
}
__device__ __forceinline__ void wgmma_m64n128k32_e4m3_ss(float (&d)[64], uint64_t a_desc, uint64_t b_desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n"
      "}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]),
        "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]),
        "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]),
        "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]),
        "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]),
        "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]),
        "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]), "=f"(d[56]),
        "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
      : "l"(a_desc), "l"(b_desc));
}
template <int N>
__device__ __forceinline__ void wgmma_e4m3_ss(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc) {
  static_assert(N == 32 || N == 64 || N == 96 || N == 128, "wgmma_e4m3_ss: N is 32, 64, 96 or 128");
  if constexpr (N == 32) wgmma_m64n32k32_e4m3_ss(d, a_desc, b_desc);
  if constexpr (N == 64) wgmma_m64n64k32_e4m3_ss(d, a_desc, b_desc);
  if constexpr (N == 96) wgmma_m64n96k32_e4m3_ss(d, a_desc, b_desc);
  if constexpr (N == 128) wgmma_m64n128k32_e4m3_ss(d, a_desc, b_desc);
}

// Two E4M3 values (the low byte at the lower half) as an f16x2, exactly (every E4M3 value is an f16 value).
__device__ __forceinline__ uint32_t cvt_f16x2_e4m3x2(uint16_t two) {
  uint32_t d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(two));
  return d;
}

// D[64 x 32] (+)= A[64 x 16] B[16 x 32], f16 x f16 into FP32, A from registers (lane 4 g + r of warp w: a[0] = row 16 w
// + g, k 2r and 2r + 1 in the lower and upper half; a[1] = row + 8, the same k; a[2] / a[3] = k 8 + 2r, 9 + 2r), B in
// shared memory (K-major descriptor). _first: scale-d 0, D only written; _acc: D accumulated. D's fragment as above.
__device__ __forceinline__ void wgmma_m64n32k16_f16_rs_first(float (&d)[16], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n"
      "}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]),
        "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}
__device__ __forceinline__ void wgmma_m64n32k16_f16_rs_acc(float (&d)[16], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}

#endif

}  // namespace deepinfer::cuda
