// launch_record.h's copy of a kernel's arguments (src/cuda; host code, so it runs without a GPU): each argument at
// its type's alignment (64 bytes for a CUtensorMap-like struct), the values intact after the buffer grows and after
// the record moves, and kernelParams pointing at them, as cudaGraphExecKernelNodeSetParams and cudaLaunchKernelExC
// read them. Built where the CUDA backend is.
#include <gtest/gtest.h>

#if DEEPINFER_HAS_CUDA
#include <cstdint>
#include <cstring>
#include <utility>

#include "cuda/launch_record.h"

namespace {

struct alignas(64) Map {  // the shape of a CUtensorMap argument
  unsigned char b[128];
};
struct Small {
  int32_t a;
  float b;
  int64_t c;
};

void fake_kernel(int8_t, Map, double, Small, const float*, int32_t) {}

template <typename T>
void expect_arg(const deepinfer::cuda::LaunchRecord& r, size_t i, const T& v) {
  ASSERT_LT(i, r.params.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r.params[i]) % alignof(T), 0u) << "argument " << i;
  EXPECT_EQ(std::memcmp(r.params[i], &v, sizeof(T)), 0) << "argument " << i;
}

}  // namespace

TEST(LaunchRecord, KeepsEachArgumentAlignedAndIntact) {
  Map m;
  for (int i = 0; i < 128; ++i) m.b[i] = static_cast<unsigned char>(3 * i + 1);
  const Small s{-7, 2.5f, int64_t{1} << 40};
  const float f = 0.0f;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(132, 2, 1);
  cfg.blockDim = dim3(256, 1, 1);
  cfg.dynamicSmemBytes = 4096;
  deepinfer::cuda::LaunchRecord r =
      deepinfer::cuda::make_launch_record(fake_kernel, cfg, true, int8_t{-3}, m, 1.25, s, &f, int32_t{99});
  deepinfer::cuda::LaunchRecord moved = std::move(r);  // the arguments live on the heap: a move keeps them
  EXPECT_EQ(moved.func, reinterpret_cast<const void*>(fake_kernel));
  EXPECT_EQ(moved.grid.x, 132u);
  EXPECT_EQ(moved.grid.y, 2u);
  EXPECT_EQ(moved.block.x, 256u);
  EXPECT_EQ(moved.smem, 4096u);
  EXPECT_TRUE(moved.pdl);
  expect_arg(moved, 0, int8_t{-3});
  expect_arg(moved, 1, m);
  expect_arg(moved, 2, 1.25);
  expect_arg(moved, 3, s);
  expect_arg(moved, 4, &f);
  expect_arg(moved, 5, int32_t{99});
  const cudaKernelNodeParams p = moved.node_params();
  EXPECT_EQ(p.kernelParams, moved.params.data());
  EXPECT_EQ(p.gridDim.x, 132u);
  EXPECT_EQ(p.sharedMemBytes, 4096u);
}

TEST(LaunchRecord, GrowsItsBufferWithoutLosingEarlierArguments) {
  deepinfer::cuda::LaunchRecord r;
  Map m;
  for (int i = 0; i < 128; ++i) m.b[i] = static_cast<unsigned char>(i ^ 0x5a);
  for (int i = 0; i < 20; ++i) {  // 20 x 128 bytes: several reallocations past the first 256
    m.b[0] = static_cast<unsigned char>(i);
    r.add(m);
    r.add(static_cast<int16_t>(i));
  }
  r.finish();
  ASSERT_EQ(r.params.size(), 40u);
  for (int i = 0; i < 20; ++i) {
    m.b[0] = static_cast<unsigned char>(i);
    expect_arg(r, static_cast<size_t>(2 * i), m);
    expect_arg(r, static_cast<size_t>(2 * i + 1), static_cast<int16_t>(i));
  }
}
#endif
