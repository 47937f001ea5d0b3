// Host side of hopper.cuh: the tensor map encoder, reached through the runtime's driver entry point (so the backend
// does not link libcuda: binaries need only the driver at run time, as with the static runtime).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <mutex>

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

}  // namespace

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
