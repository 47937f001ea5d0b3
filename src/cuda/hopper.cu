// Host side of hopper.cuh: the tensor map encoder, reached through the runtime's driver entry point (so the backend
// does not link libcuda: binaries need only the driver at run time, as with the static runtime), and the probe that
// tests bulk_pieces_elect alone.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "cuda/device.h"
#include "cuda/hopper.cuh"
#include "deepinfer/error.h"

namespace deepinfer::cuda {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  DI_CHECK(fn != nullptr, "cuda: the driver has no cuTensorMapEncodeTiled (CUDA 12.0+ driver needed)");
  return fn;
}

// bulk_pieces_probe's kernel (one warp): the stage filled with 0xEE, R pieces of `bytes` from src + r * ld issued by
// bulk_pieces_elect (kBytes: its constant-size form) into rows `step` apart, a bounded wait on the barrier's first
// phase (status 1 when it has not completed after 0.1 s), then the whole stage copied out.
template <int R, int kBytes>
__global__ void bulk_pieces_kernel(const uint8_t* src, int64_t ld, uint32_t bytes, uint32_t step, uint8_t* out,
                                   int* status) {
  extern __shared__ __align__(16) uint8_t probe_smem[];
  const int lane = static_cast<int>(threadIdx.x);
  const int stage_bytes = R * static_cast<int>(step);
  const uint32_t stage = smem_u32(probe_smem), bar = smem_u32(probe_smem + stage_bytes);
  for (int i = lane; i < stage_bytes; i += 32) probe_smem[i] = 0xEE;
  fence_proxy_async();  // the fill before the async proxy's writes to the same bytes
  if (lane == 0) mbar_init(bar, 1);
  mbar_init_fence();
  __syncwarp();
  const void* pieces[R];
  for (int r = 0; r < R; ++r) pieces[r] = src + r * ld;
  bulk_pieces_elect<R, kBytes>(stage, step, pieces, bytes, bar);
  if (!mbar_wait_ns(bar, 0, 100000000ull)) {
    if (lane == 0) *status = 1;
    return;
  }
  for (int i = lane; i < stage_bytes; i += 32) out[i] = probe_smem[i];
}

}  // namespace

int bulk_pieces_probe(const uint8_t* src, int64_t ld, int R, uint32_t bytes, bool constant, uint32_t step,
                      uint8_t* out) {
  DI_CHECK((R == 2 || R == 4) && bytes % 16 == 0 && bytes > 0 && bytes <= step && step % 16 == 0 &&
               (!constant || bytes == 512) && ld % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0,
           "cuda::bulk_pieces_probe: R {}, bytes {}, step {}, ld {}", R, bytes, step, ld);
  int* status = nullptr;
  DI_CUDA_CHECK(cudaMalloc(&status, sizeof(int)));
  DI_CUDA_CHECK(cudaMemset(status, 0, sizeof(int)));
  const size_t smem = static_cast<size_t>(R) * step + 8;
  if (R == 2)
    constant ? bulk_pieces_kernel<2, 512><<<1, 32, smem>>>(src, ld, bytes, step, out, status)
             : bulk_pieces_kernel<2, 0><<<1, 32, smem>>>(src, ld, bytes, step, out, status);
  else
    constant ? bulk_pieces_kernel<4, 512><<<1, 32, smem>>>(src, ld, bytes, step, out, status)
             : bulk_pieces_kernel<4, 0><<<1, 32, smem>>>(src, ld, bytes, step, out, status);
  DI_CUDA_CHECK(cudaGetLastError());
  int h = 0;
  DI_CUDA_CHECK(cudaMemcpy(&h, status, sizeof(int), cudaMemcpyDeviceToHost));
  DI_CUDA_CHECK(cudaFree(status));
  return h;
}

CUtensorMap tensor_map_u8_sw128(const void* base, int64_t rows, int64_t cols, int64_t ld, int box_rows, int box_cols,
                                int l2_promotion) {
  DI_CHECK(rows > 0 && cols > 0 && ld % 16 == 0 && ld >= cols && reinterpret_cast<uintptr_t>(base) % 16 == 0 &&
               box_rows >= 1 && box_rows <= 256 && box_cols >= 16 && box_cols <= 128 && box_cols % 16 == 0 &&
               (l2_promotion == 0 || l2_promotion == 128 || l2_promotion == 256),
           "cuda: no 128-byte-swizzled tensor map for [{}, {}] bytes, row stride {}, box {} x {}", rows, cols, ld,
           box_rows, box_cols);
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box,
                               elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               l2_promotion == 0     ? CU_TENSOR_MAP_L2_PROMOTION_NONE
                               : l2_promotion == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                                     : CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DI_CHECK(r == CUDA_SUCCESS, "cuda: cuTensorMapEncodeTiled failed ({}) for [{}, {}] bytes, row stride {}",
           static_cast<int>(r), rows, cols, ld);
  return map;
}

}  // namespace deepinfer::cuda
