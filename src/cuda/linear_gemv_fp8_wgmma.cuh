// The fifth E4M3 decode GEMV kernel (fp8_wgmma_gemv, linear_gemv_fp8_wgmma.cu): the bits of fp8_mma_gemv and of the
// CPU op (the order of linear_gemv.cuh), with the weights streamed into shared memory by the TMA and every weight x
// activation product formed by Hopper's asynchronous tensor cores (wgmma), so that a weight byte costs the SM's threads
// no instruction. Internal to the CUDA backend: callers go through gemv_into, which picks the kernel
// (gemv_set_fp8_variant).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/linear_gemv.cuh"

namespace deepinfer::cuda {

// True when fp8_wgmma_gemv takes this call: dense E4M3 with 32 x 32 tiles and act_quant_block 32 (the V4.1 linears) or
// 0 (raw x, as wo_a's), gemv_supported(a), K % 128 == 0 and K <= 8192, 1 to 4 rows of x (raw x: 1 to 3), 4-byte
// aligned scale rows. Not yet run on a GPU: gemv_into uses it only under gemv_set_fp8_variant(7).
bool gemv_fp8_wgmma_supported(const GemvArgs& a);

// The block-diagonal form (wo_a's groups as row slices of one weight): y[m, g R + n] = x[m, g K .. (g + 1) K) . w[g R +
// n] for groups g, R = N / groups rows each (a multiple of 64), x rows of groups K columns (ldx >= groups K); a.K is
// one group's K. groups 1: the dense call. Each block takes units of one group, so it quantises one group's slice of x.
bool gemv_fp8_wgmma_groups_supported(const GemvArgs& a, int groups);
void gemv_fp8_wgmma_groups_into(const GemvArgs& a, int groups, cudaStream_t stream);

// Launches fp8_wgmma_gemv. Preconditions: gemv_fp8_wgmma_supported(a).
void gemv_fp8_wgmma_into(const GemvArgs& a, cudaStream_t stream);

// Tests: how many (16 weight rows, x row) pieces took the scalar slow path since the last reset (synchronises the
// device; the unit of gemv_fp8_mma_slow_warps); reset: set the count back to 0.
int64_t gemv_fp8_wgmma_slow_warps(bool reset = false);

// Tests on a GPU the kernel has not run on: from the next launch on, the kernel's and the probe's barrier waits give up
// after ns nanoseconds without the phase completing, so that a pipeline that deadlocks ends (its results wrong) instead
// of hanging the test (0, the default: wait without bound). gemv_fp8_wgmma_hang: where a wait first gave up since the
// last call (synchronises the device, then clears the record), or an empty string.
void gemv_fp8_wgmma_set_hang_ns(uint64_t ns);
std::string gemv_fp8_wgmma_hang();

// Tests: the kernel's stage path alone, for a layout check. w: a [64, 128] E4M3 weight tile (device, 128-byte rows),
// x_codes: 128 E4M3 codes of one x row (device, 4 tiles of 32); out (device): for tile q the MMA's whole D [64 weight
// rows][32 columns] at out[(q * 64 + row) * 32 + column], which by the kernel's construction is the product of weight
// row `row`'s code at column 32 q + column with x's code there. diag_swap: the diagonal tiles' descriptor with its
// leading and stride byte offsets swapped (a diagnosis when the kernel's own reading of them fails). raw: the raw-x
// path instead (x_codes: 128 f16 codes, 256 bytes; the A fragments built from the raw box and two f16 MMAs per tile), D
// the product of the weight's E4M3 value with x's f16 value.
void gemv_fp8_wgmma_probe(const uint8_t* w, const uint8_t* x_codes, float* out, cudaStream_t stream,
                          bool diag_swap = false, bool raw = false);

}  // namespace deepinfer::cuda
