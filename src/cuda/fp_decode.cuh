// Exact device decoders of the weight formats of the CUDA linear kernels (nvcc only): E4M3 codes through
// the CPU's fp16 bits, E8M0 scales, packed E2M1 nibbles, the streaming 16-byte weight load and the
// programmatic-dependent-launch hooks (and the host's launch_pdl). Every decoder returns an exact fp32 value (no
// rounding), so a kernel's result depends only on the order of its FP32 additions (see linear.cuh's contract).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/device.h"
#include "cuda/launch_record.h"

namespace deepinfer::cuda {

// Byte permute (PTX prmt.b32): each selector nibble picks a byte of {b, a} (or replicates its sign).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Two e4m3 codes (the low / high 16 bits of v) -> an f16x2 of the same values (exact; NaN codes to NaN). The high
// half goes to the conversion in place (SASS: F2FP.F16.E4M3.UNPACK_B's .H1 operand), so it costs no shift: the E4M3
// decode GEMVs run one conversion per two weights and nothing else to reach them.
__device__ __forceinline__ uint32_t e4m3x2_lo(uint32_t v) {
  uint32_t d;
  asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(d) : "r"(v));
  return d;
}
__device__ __forceinline__ uint32_t e4m3x2_hi(uint32_t v) {
  uint32_t d;
  asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, h;\n}" : "=r"(d) : "r"(v));
  return d;
}

__device__ __forceinline__ float half_bits(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}
// Four e4m3 codes (bytes of w, byte 0 first) -> e4m3 * 2^-8 exactly, through the fp16 bits the CPU uses
// (sign-extend, << 7, clear bit 14): two codes per 32-bit word, each half an fp16. NaN codes are not
// handled here (see nan_bits). (Building the fp32 bits with integer ops and one exact multiply instead of
// the fp16 conversion measured no faster in bench_cuda_gemv.)
__device__ __forceinline__ void e4m3x4(uint32_t w, float* f) {
  const uint32_t a = (prmt(w, 0u, 0xA280u) << 7) & 0xbf80bfffu;  // [b0, sign b0, b2, sign b2] -> codes 0, 2
  const uint32_t b = (prmt(w, 0u, 0xB391u) << 7) & 0xbf80bfffu;  // codes 1, 3
  f[0] = half_bits(a);
  f[1] = half_bits(b);
  f[2] = half_bits(a >> 16);
  f[3] = half_bits(b >> 16);
}

// Bit 7 of a byte of the result is set iff that byte of w is an e4m3 NaN code (S.1111.111).
__device__ __forceinline__ uint32_t nan_bits(uint32_t w) { return (w & 0x7f7f7f7fu) + 0x01010101u; }

// E8M0 code -> 2^(e-127) as deepinfer::e8m0_to_f32: 255 = NaN, 0 = 2^-127 (subnormal).
__device__ __forceinline__ float e8m0_f32(uint32_t e) {
  uint32_t u = e << 23;  // selects, not branches: the hot loops decode a code per fold block
  u = e == 0u ? 0x00400000u : u;
  u = e == 255u ? 0x7fc00000u : u;
  return __uint_as_float(u);
}

// The factor that scales an E4M3 tile's sum of (e4m3 * 2^-8) x products: 2^(e-119) = 2^8 * 2^(e-127),
// the CPU's fp8_factor. Codes above 246 (factor beyond fp32, never seen in checkpoints) take the CPU's
// scalar path, which the GPU kernels do not replay (documented gap): they use 2^(e-127) * 256 instead.
__device__ __forceinline__ float fp8_tile_factor(uint32_t e) {
  return e <= 246u ? __uint_as_float((e + 8u) << 23) : e8m0_f32(e) * 256.0f;
}

// e2m1 code in bits 28..31 of t (lower bits ignored) -> its value times 2^-126 (an exact fp32, subnormal
// for 0.5): the sign lands in bit 31, the E E M bits in 24..22, i.e. the exponent LSBs and the mantissa MSB.
__device__ __forceinline__ float e2m1_top(uint32_t t) {
  return __uint_as_float(static_cast<uint32_t>(static_cast<int32_t>(t) >> 6) & 0x81c00000u);
}

// The fp16 patterns of one weight word W (bytes b0..b3): lo[0] = {low nibble of b0, of b1} (halves 0, 1),
// lo[1] = {b2, b3}, hi[0] / hi[1] the high nibbles likewise; each half is e2m1 * 2^-14 exactly. Per byte the
// nibble is first moved to the top of its byte with the byte's low half cleared; then S (bit 7) stays and
// E E M (bits 6..4) is copied to bits 3..1 by one shift (bits 3..1 of the unshifted byte are zero, and the
// shifted copy puts nothing into bit 7); the PRMTs place two such bytes in the high bytes of two halves whose
// low bytes are zero.
__device__ __forceinline__ void fp4_half_patterns(uint32_t W, uint32_t (&lo)[2], uint32_t (&hi)[2]) {
  const uint32_t H = W & 0xF0F0F0F0u;         // the high nibbles
  const uint32_t L = (W << 4) & 0xF0F0F0F0u;  // the low nibbles
  uint32_t gh, gl;                            // (X | X >> 3) & 0x8E8E8E8E as one LOP3 each (immLut 0xA8 = (a | b) & c)
  asm("lop3.b32 %0, %1, %2, %3, 0xA8;" : "=r"(gh) : "r"(H), "r"(H >> 3), "r"(0x8E8E8E8Eu));
  asm("lop3.b32 %0, %1, %2, %3, 0xA8;" : "=r"(gl) : "r"(L), "r"(L >> 3), "r"(0x8E8E8E8Eu));
  lo[0] = prmt(gl, 0u, 0x1404u);  // bytes [0, gl.b0, 0, gl.b1]
  lo[1] = prmt(gl, 0u, 0x3424u);  // bytes [0, gl.b2, 0, gl.b3]
  hi[0] = prmt(gh, 0u, 0x1404u);
  hi[1] = prmt(gh, 0u, 0x3424u);
}

// An FP4 weight value e2m1 * 2^(e-127) from lo = e2m1 * 2^-126 (e2m1_top): one rounding of the exact
// product, as the CPU's f16(e2m1) * e8m0 (the product is exact whenever it is representable). For
// e <= 128 one multiply by 2^(e-1); above, 2^(e-1) leaves fp32, so e2m1 is rebuilt first (exact) and
// multiplied by the decoded scale (255 = NaN).
__device__ __forceinline__ float fp4_weight(float lo, uint32_t e) {
  if (e <= 128u) return __fmul_rn(lo, __uint_as_float((e + 126u) << 23));
  return __fmul_rn(__fmul_rn(lo, 0x1p126f), e8m0_f32(e));
}

// Two fp16 products (exact here) and their fp32 values (fp4_pair_gemv's fast path, linear_gemv.cu: why the products are
// exact).
__device__ __forceinline__ void fp16x2_scaled(uint32_t pat, uint32_t sc, float& w0, float& w1) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(pat), "r"(sc));
  asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\tcvt.f32.f16 %0, lo;\n\tcvt.f32.f16 %1, hi;\n\t}"
      : "=f"(w0), "=f"(w1)
      : "r"(d));
}

// One weight word W (bytes b0..b3 of a chunk) on the fast path, sc = 2^(e-113) in both fp16 halves: lo[i] / hi[i] =
// the low / high nibble of byte i.
__device__ __forceinline__ void fp4_fast_word(uint32_t W, uint32_t sc, float* lo, float* hi) {
  uint32_t pl[2], ph[2];
  fp4_half_patterns(W, pl, ph);
  fp16x2_scaled(pl[0], sc, lo[0], lo[1]);
  fp16x2_scaled(pl[1], sc, lo[2], lo[3]);
  fp16x2_scaled(ph[0], sc, hi[0], hi[1]);
  fp16x2_scaled(ph[1], sc, hi[2], hi[3]);
}

// The same for any scale code e, each value equal to fp4_weight(e2m1_top(nibble), e) bit for bit: the fast path for e
// in [104, 128], else fp4_weight's exact fp32 decode.
__device__ __forceinline__ void fp4_word_weights(uint32_t W, uint32_t e, float* lo, float* hi) {
  if (e - 104u <= 24u) {
    fp4_fast_word(W, (e - 98u) * 0x04000400u, lo, hi);  // exponent field e - 98 in [6, 30]
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = fp4_weight(e2m1_top(W << (28 - 8 * i)), e);
      hi[i] = fp4_weight(e2m1_top(W << (24 - 8 * i)), e);
    }
  }
}

// The 16 weights of a lane's half chunk: words A = bytes 8h .. 8h+3, B = bytes 8h+4 .. 8h+7; w[l] / w[8 + l] = the
// low / high nibble of byte 8h + l. On the fast path (sc = 2^(e-113) in both fp16 halves), then for any scale code e.
__device__ __forceinline__ void fp4_fast_weights(uint32_t A, uint32_t B, uint32_t sc, float (&w)[16]) {
  fp4_fast_word(A, sc, w, w + 8);
  fp4_fast_word(B, sc, w + 4, w + 12);
}
__device__ __forceinline__ void fp4_any_weights(uint32_t A, uint32_t B, uint32_t e, float (&w)[16]) {
  fp4_word_weights(A, e, w, w + 8);
  fp4_word_weights(B, e, w + 4, w + 12);
}

// 16 bytes of a weight stream: read once, so bypass L1 and ask L2 to fetch the surrounding 256 bytes
// (the next steps of the same row). kL1: through L1 instead (allocated, evicted first), for kernels whose lanes read
// the two halves of a 32-byte sector in two instructions, so that the second finds the sector in L1 instead of asking
// L2 for it again.
template <bool kL1 = false>
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 v;
  if constexpr (kL1)
    asm volatile("ld.global.nc.L1::evict_first.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  else
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  return v;
}

// 4 bytes of a weight stream, read once (bypassing L1).
__device__ __forceinline__ uint32_t ldg_stream4(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// 8 bytes of a weight stream, read once (bypassing L1).
__device__ __forceinline__ uint2 ldg_stream8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// Programmatic dependent launch (the kernel is launched with programmatic stream serialisation): it may
// start while the previous kernel on the stream still runs; pdl_wait() blocks until that kernel has
// finished and its writes are visible. Nothing produced upstream may be read before it.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Whether launch_pdl uses programmatic dependent launch (DEEPINFER_CUDA_PDL, read once; device.cu).
bool pdl_enabled();

// Launches `kernel` with programmatic stream serialisation, so that it may start while the previous
// kernel on the stream still runs (it must pdl_wait() before reading anything that kernel produced).
// Why: PDL lets a kernel's launch and block scheduling overlap the previous kernel's tail;
// DEEPINFER_CUDA_PDL=0 turns it off (a plain launch; griddepcontrol is then a no-op).
template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, int threads, int64_t smem, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream != nullptr ? stream : current_stream();  // null: the backend's stream (device.h)
  cudaLaunchAttribute attr;
  set_pdl(cfg, attr, pdl_enabled());
  // A decode step whose launches SegmentGraphs records (graph.cu): the recorder may defer this one into the step's
  // graph.
  if (LaunchRecorder* rec = launch_recorder();
      rec != nullptr &&
      rec->on_launch(cfg.stream, make_launch_record(kernel, cfg, cfg.numAttrs > 0, static_cast<KArgs>(args)...)))
    return;
  DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

}  // namespace deepinfer::cuda
