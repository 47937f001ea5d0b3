// Whether the E4M3 mma.sync (m16n8k32, e4m3 x e4m3 -> f32) could serve the exact decode GEMVs on Hopper, in two
// parts (bench/RESULTS.md, sixtieth session):
//  - its lowering, on the CPU machine: nvcc -O2 -gencode arch=compute_90a,code=sm_90a -o /tmp/fp8mma
//    bench/sass/fp8_mma_sync_probe.cu && cuobjdump -sass /tmp/fp8mma | grep -cE 'HMMA|F2FP'. On sm_90a one m16n8k32
//    e4m3 MMA becomes 12 F2FP.F16.E4M3.UNPACK_B (every A and B register, both halves) and two HMMA.16816.F32, the
//    second accumulating onto the first: the f16 MMA of fp8_mma_gemv / fp8_bmma_gemv with the conversions they
//    already do, so it saves them nothing (only wgmma has a native E4M3 path on this architecture);
//  - on the GPU (run the binary): whether an output that holds one nonzero product (the diag(x) trick of those
//    kernels) comes out exact, for random codes with one nonzero per A row (mode 0) or per B column (mode 1), and how
//    far a dense 32-term sum lands from the correctly rounded one (mode 2; expected to differ: the tensor cores do
//    not round each addition).
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

__device__ __forceinline__ void mma_q(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}
// A: [trials][16][32] bytes row-major; B: [trials][8 n][32 k] bytes (col-major: column n contiguous); D:
// [trials][16][8]
__global__ void k(const uint8_t* A, const uint8_t* B, float* D, int trials) {
  const int lane = threadIdx.x & 31, w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (w >= trials) return;
  const int g = lane >> 2, t = lane & 3;
  const uint8_t* a = A + w * 512;
  const uint8_t* b = B + w * 256;
  uint32_t ar[4];
  ar[0] = *reinterpret_cast<const uint32_t*>(a + g * 32 + 4 * t);
  ar[1] = *reinterpret_cast<const uint32_t*>(a + (g + 8) * 32 + 4 * t);
  ar[2] = *reinterpret_cast<const uint32_t*>(a + g * 32 + 16 + 4 * t);
  ar[3] = *reinterpret_cast<const uint32_t*>(a + (g + 8) * 32 + 16 + 4 * t);
  const uint32_t b0 = *reinterpret_cast<const uint32_t*>(b + g * 32 + 4 * t);
  const uint32_t b1 = *reinterpret_cast<const uint32_t*>(b + g * 32 + 16 + 4 * t);
  float d[4];
  mma_q(d, ar, b0, b1);
  float* o = D + w * 128;
  o[g * 8 + 2 * t] = d[0];
  o[g * 8 + 2 * t + 1] = d[1];
  o[(g + 8) * 8 + 2 * t] = d[2];
  o[(g + 8) * 8 + 2 * t + 1] = d[3];
}
static float e4m3(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  float v = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return s ? -v : v;
}
static uint32_t rng = 12345u;
static uint32_t nxt() {
  rng ^= rng << 13;
  rng ^= rng >> 17;
  rng ^= rng << 5;
  return rng;
}
static uint8_t code() {
  for (;;) {
    uint8_t c = nxt() & 0xff;
    if ((c & 0x7f) != 0x7f) return c;
  }
}
int main() {
  const int trials = 20000;
  uint8_t *hA = new uint8_t[trials * 512], *hB = new uint8_t[trials * 256];
  float* hD = new float[trials * 128];
  long bad1 = 0, badd = 0;
  for (int mode = 0; mode < 3;
       ++mode) {  // 0: A one nonzero per row (B dense); 1: B one nonzero per column (A dense); 2: dense both
    for (int w = 0; w < trials; ++w) {
      for (int i = 0; i < 512; ++i) hA[w * 512 + i] = mode == 0 ? 0 : code();
      for (int i = 0; i < 256; ++i) hB[w * 256 + i] = mode == 1 ? 0 : code();
      if (mode == 0)
        for (int m = 0; m < 16; ++m) hA[w * 512 + m * 32 + nxt() % 32] = code();
      if (mode == 1)
        for (int n = 0; n < 8; ++n) hB[w * 256 + n * 32 + nxt() % 32] = code();
    }
    uint8_t *dA, *dB;
    float* dD;
    cudaMalloc(&dA, trials * 512);
    cudaMalloc(&dB, trials * 256);
    cudaMalloc(&dD, trials * 128 * 4);
    cudaMemcpy(dA, hA, trials * 512, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, hB, trials * 256, cudaMemcpyHostToDevice);
    k<<<(trials + 7) / 8, 256>>>(dA, dB, dD, trials);
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
      printf("cuda error %s\n", cudaGetErrorString(err));
      return 1;
    }
    cudaMemcpy(hD, dD, trials * 128 * 4, cudaMemcpyDeviceToHost);
    long bad = 0, shown = 0;
    double maxrel = 0;
    for (int w = 0; w < trials; ++w)
      for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
          double exact = 0;
          for (int kk = 0; kk < 32; ++kk) {
            const double p = (double)e4m3(hA[w * 512 + m * 32 + kk]) * e4m3(hB[w * 256 + n * 32 + kk]);
            exact += p;
          }
          const float ref = (float)exact;  // one product: exact; dense: the correctly rounded sum
          const float got = hD[w * 128 + m * 8 + n];
          uint32_t ub, ur;
          memcpy(&ub, &got, 4);
          memcpy(&ur, &ref, 4);
          if (ub != ur && !(got == 0 && ref == 0)) {
            ++bad;
            if (exact != 0) maxrel = fmax(maxrel, fabs((got - exact) / exact));
            if (shown++ < 3) printf("  mode %d w %d m %d n %d got %a ref %a\n", mode, w, m, n, got, ref);
          }
          if (ub != ur && got == 0 && ref == 0 && mode < 2) ++badd;  // signed-zero differences
        }
    printf("mode %d: %ld of %d outputs differ from the exact value (max rel %.3g)\n", mode, bad, trials * 128, maxrel);
    if (mode < 2) bad1 += bad;
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dD);
  }
  printf("signed-zero differences in one-product modes: %ld\n", badd);
  printf(bad1 == 0 ? "QMMA ONE-PRODUCT EXACT\n" : "QMMA ONE-PRODUCT NOT EXACT\n");
  return 0;
}
