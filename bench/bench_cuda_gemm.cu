// GPU benchmark of cuda::linear as a GEMM (M = 1 .. 4096) on the V4.1-Flash shapes, against cuBLASLt FP8,
// and of the FP4 routed experts as src/model/moe.cpp runs them (one cuda::linear per expert and weight).
// Needs a CUDA GPU (prints SKIP and exits 0 without one).
//   ./build/bench/bench_cuda_gemm            (GIT_SHA=$(git rev-parse --short HEAD) to print it)
//
// "ours" is cuda::linear_into (cuda::linear into a preallocated output: the same kernels, and no allocation
// inside the graph capture). "tc" is cuda::linear_tc_into (src/cuda/linear_tc.cu: the tensor-core kernel,
// within tolerance of the CPU op rather than bit-exact), timed the same way on the same data.
// Part 0: the BF16 vocabulary head [129280, 5120] (no input site, float32 logits) at M = 1 .. 1024: the exact kernel,
//   the tensor-core one (linear_tc_bf16.cuh) and cuBLASLt BF16 (x as one bf16 piece: a speed anchor) in TFLOP/s and
//   the weight's GB/s against the read ceiling (BENCH_GEMM_HEAD=1: this table alone).
// Part 1: dense E4M3 weights with 32x32 E8M0 block scales (V4.1), FP8 input site (act_quant_block 32),
//   BF16-rounded output, vs cuBLASLt E4M3 x E4M3 -> BF16 ("TN", FP32 compute, fast accumulation off) with
//   per-tensor scales (Hopper cuBLASLt has no 32x32 block scaling: a speed anchor, not the same numerics).
//   An extra column tries cuBLASLt's Hopper block-scaled mode (A = weight 128x128 FP32 scales, B =
//   activations 1x128 FP32 scales: V4's numerics, not V4.1's), "n/a" where cuBLASLt rejects it.
// Part 2: FP4 (E2M1 packed, E8M0 per 32 along K) experts w1/w3 [2304, 5120], w2 [5120, 2304] over 384
//   experts, top-6 uniform random routing with fixed seeds: (a) decode steps vs the HBM read ceiling,
//   (b) a 4096-token prefill expert loop in TFLOP/s, with the same per-expert GEMMs through cuBLASLt FP8.
// Part 3 (exact_table; BENCH_GEMM_EXACT=1: this table alone): the exact E4M3 linear at M = 8 .. 4096, the tiled GEMM
//   against the exact path before it and against cuBLASLt's FP32 SGEMM on the same shape (BENCH_GEMM_EXACT_SHAPE=name,
//   BENCH_GEMM_EXACT_M=M: that shape or M alone, e.g. for ncu).
//
// Timing: every figure is CUDA-event time over a CUDA graph that captures many calls (launch gaps hidden
// as in a decode graph), after an eager run and a graph warm-up; the median over the replays of the mean
// time of one call. Weights rotate over copies totalling >= 512 MiB (L2 is 50-60 MB), so small-M calls
// stream them from HBM. Slow calls (large M) are captured fewer times (>= 1) and replayed 3 times, and a
// call above 100 ms is timed once eagerly, so the whole binary stays well under a minute of GPU time.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/device.h"
#include "cuda/linear.cuh"
#include "cuda/linear_tc.cuh"
#include "cuda/linear_tc_bf16.cuh"
#include "cuda_bench_util.cuh"
#include "deepinfer/dtype.h"
#include "deepinfer/error.h"

namespace di = deepinfer;

namespace {

#define CK(expr) DI_CUDA_CHECK(expr)
#define CL(expr)                                                                                                    \
  do {                                                                                                              \
    const cublasStatus_t cl_status_ = (expr);                                                                       \
    if (cl_status_ != CUBLAS_STATUS_SUCCESS) di::fail("{} failed: status {}", #expr, static_cast<int>(cl_status_)); \
  } while (0)

using deepinfer::bench::time_graph;

using deepinfer::bench::dev_act;
using deepinfer::bench::dev_bytes;

// An E4M3 weight [N, K] with 32x32 E8M0 tile scales (2^-10 .. 2^-4), as the V4.1 FP8 tensors.
di::ops::QWeight fp8_weight(int64_t N, int64_t K) {
  di::ops::QWeight w;
  w.w = dev_bytes({N, K}, di::DType::kE4M3, 0, 255, true);
  w.scale = dev_bytes({(N + 31) / 32, (K + 31) / 32}, di::DType::kE8M0, 117, 123);
  w.block = 32;
  return w;
}

// A packed FP4 weight [N, K] (K / 2 bytes a row) with E8M0 scales per 32 along K (2^-7 .. 2^-1).
di::ops::QWeight fp4_weight(int64_t N, int64_t K) {
  di::ops::QWeight w;
  w.w = dev_bytes({N, K}, di::DType::kE2M1x2, 0, 255);
  w.scale = dev_bytes({N, K / 32}, di::DType::kE8M0, 120, 126);
  return w;
}

double qbytes(const di::ops::QWeight& w) {
  return static_cast<double>(w.w.nbytes() + (w.scale.defined() ? w.scale.nbytes() : 0));
}

struct Timed {
  double ms = 0;  // mean time of one call
  int calls = 0;  // calls captured in the graph
};

// One eager call (sizes cuda::linear's x workspace, which must not grow inside a capture, and sets the
// kernels' smem attributes), one eager timed call to choose how many calls fit `budget_ms` per replay
// (1 .. max_calls), then deepinfer::bench::time_graph (graph warm-up + median of 7 replays, 3 if slow).
// A call slower than 100 ms is reported from that one eager call.
template <typename F>
Timed time_calls(cudaStream_t st, int max_calls, F body, double budget_ms) {
  body(0);
  CK(cudaStreamSynchronize(st));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a, st));
  body(0);
  CK(cudaEventRecord(b, st));
  CK(cudaEventSynchronize(b));
  float ms1 = 0;
  CK(cudaEventElapsedTime(&ms1, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  Timed r;
  if (ms1 > 100.0) {  // a slow call (large M on CUDA cores): launch gaps are noise, one eager call is the figure
    r.ms = ms1, r.calls = 1;
    return r;
  }
  r.calls = std::clamp(static_cast<int>(budget_ms / std::max(static_cast<double>(ms1), 1e-3)), 1, max_calls);
  const int reps = ms1 * r.calls > 50.0 ? 3 : 7;
  r.ms = time_graph(st, r.calls, body, reps);
  return r;
}

// ---- cuBLASLt FP8: y[M, N] (row-major) = x[M, K] . W[N, K]^T --------------------------------------------
// Column-major view: D (N x M, ld N) = op(A) . B with A = W stored K x N (ld K), op(A) = T, and
// B = x stored K x M (ld K), op(B) = N: the "TN" layout FP8 needs. m = N, n = M, k = K. Row strides of
// every operand used here are multiples of 256 bytes, so slices of rows keep cuBLASLt's default
// 256-byte alignment assumption.
struct Lt {
  cublasLtHandle_t h = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = size_t{32} << 20;
  float* ones = nullptr;  // scale factors (all 1): per-tensor scalars or block-scale tensors
  size_t ones_floats = size_t{4} << 20;
};

struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulHeuristicResult_t res = {};
  bool ok = false;
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// block_scaled: A (the weight) with 128x128 FP32 block scales, B (x) with 1x128 FP32 scales (Hopper only).
// ab: the operands' type (E4M3 with per-tensor scales of 1, BF16 without scales, or FP32: an SGEMM with FP32 out).
std::unique_ptr<LtPlan> lt_plan(const Lt& lt, int64_t N, int64_t M, int64_t K, bool block_scaled,
                                cudaDataType_t ab = CUDA_R_8F_E4M3) {
  auto p = std::make_unique<LtPlan>();
  CL(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (ab == CUDA_R_8F_E4M3) {
    const int8_t fast = 0;
    CL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    const void* sp = lt.ones;
    CL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sp, sizeof sp));
    CL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sp, sizeof sp));
  }
  if (block_scaled) {
    const int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    if (cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb) !=
            CUBLAS_STATUS_SUCCESS)
      return p;
  }
  CL(cublasLtMatrixLayoutCreate(&p->a, ab, static_cast<uint64_t>(K), static_cast<uint64_t>(N), K));
  CL(cublasLtMatrixLayoutCreate(&p->b, ab, static_cast<uint64_t>(K), static_cast<uint64_t>(M), K));
  const cudaDataType_t dt = ab == CUDA_R_32F ? CUDA_R_32F : CUDA_R_16BF;  // FP32 SGEMM: FP32 out
  CL(cublasLtMatrixLayoutCreate(&p->d, dt, static_cast<uint64_t>(N), static_cast<uint64_t>(M), N));
  cublasLtMatmulPreference_t pref = nullptr;
  CL(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t wsb = lt.ws_bytes;
  CL(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
  int n = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt.h, p->op, p->a, p->b, p->d, p->d, pref, 1, &p->res, &n);
  CL(cublasLtMatmulPreferenceDestroy(pref));
  p->ok = s == CUBLAS_STATUS_SUCCESS && n > 0 && p->res.state == CUBLAS_STATUS_SUCCESS;
  return p;
}

cublasStatus_t lt_run(const Lt& lt, const LtPlan& p, const void* w, const void* x, void* d, cudaStream_t st) {
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(lt.h, p.op, &alpha, w, p.a, x, p.b, &beta, d, p.d, d, p.d, &p.res.algo, lt.ws, lt.ws_bytes, st);
}

// Runs the plan once eagerly; false (and the CUDA error cleared) if cuBLASLt refuses it.
bool lt_probe(const Lt& lt, const LtPlan& p, const void* w, const void* x, void* d, cudaStream_t st) {
  if (!p.ok) return false;
  if (lt_run(lt, p, w, x, d, st) != CUBLAS_STATUS_SUCCESS) return false;
  const cudaError_t e = cudaStreamSynchronize(st);
  if (e != cudaSuccess || cudaGetLastError() != cudaSuccess) {
    std::fprintf(stderr, "cuBLASLt probe: %s\n", cudaGetErrorString(e));
    return false;
  }
  return true;
}

// ---- MoE routing: top-6 distinct experts per token, uniform, fixed seed -----------------------------------
struct Group {
  int expert;
  int64_t a, b;  // rows [a, b) of the dispatched buffers
};

std::vector<Group> route(int tokens, int experts, int topk, std::mt19937& rng) {
  std::vector<int64_t> count(experts, 0);
  std::uniform_int_distribution<int> pick(0, experts - 1);
  for (int t = 0; t < tokens; ++t) {
    int chosen[16];
    for (int k = 0; k < topk; ++k) {
      int e;
      do e = pick(rng);
      while (std::find(chosen, chosen + k, e) != chosen + k);
      chosen[k] = e;
      ++count[e];
    }
  }
  std::vector<Group> g;
  int64_t off = 0;
  for (int e = 0; e < experts; ++e)
    if (count[e] > 0) g.push_back({e, off, off + count[e]}), off += count[e];
  return g;
}

// A dense weight shape of the tables (parts 1 and 3).
struct Dense {
  const char* name;
  int64_t N, K;
};

// Part 3: the exact E4M3 linear at many rows of x (V4.1 dense shapes, act_quant_block 32, bf16-rounded out): the tiled
// GEMM (linear_gemm_fp8.cuh) against the exact path before it (the decode GEMV's passes of 4 rows or the slab
// kernels: cuda::linear_set_fp8_gemm_rows(0)), both through cuda::linear_exact_into, and against cuBLASLt's FP32 SGEMM
// (FP32 compute, no TF32) on the same M, N, K: the CUDA-core anchor (the exact contract forms one FP32 FMA per weight
// and row plus a fold FMA per 4, so an SGEMM's rate is about its ceiling).
void exact_table(const Lt& lt, cudaStream_t st) {
  const Dense dense[] = {{"attn.wq_a + wkv", 1536, 5120},
                         {"attn.wq_b", 32768, 1024},
                         {"attn.wo_b", 5120, 8192},
                         {"shared w2", 5120, 2304},
                         {"indexer.wq_b", 8192, 1024}};
  const int64_t Ms[] = {8, 16, 32, 64, 96, 128, 256, 1024, 4096};
  const int64_t Mmax = 4096;
  di::ops::LinearOpts o;
  o.act_quant_block = 32;
  o.round_out_bf16 = true;
  std::printf(
      "\n## Exact E4M3 linear at many rows: the tiled GEMM vs the exact path before it vs cuBLASLt FP32 SGEMM\n"
      "TFLOP/s count 2 M N K. SGEMM: FP32 x FP32 -> FP32, TN, CUBLAS_COMPUTE_32F (no TF32), same M, N, K.\n\n");
  std::printf(
      "| shape [N, K] | M | tiled us | tiled TFLOP/s | before us | before TFLOP/s | SGEMM us | SGEMM TFLOP/s | "
      "tiled / before (speedup) | tiled / SGEMM (rate) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  const char* only_shape = std::getenv("BENCH_GEMM_EXACT_SHAPE");  // one shape's rows (e.g. for ncu)
  const char* only_m = std::getenv("BENCH_GEMM_EXACT_M");          // one M
  for (const Dense& s : dense) {
    if (only_shape != nullptr && std::string(only_shape) != s.name) continue;
    const di::ops::QWeight w0 = fp8_weight(s.N, s.K);
    const int copies = 4;  // the weights are re-read per tile of rows: a few copies, so that L2 holds none whole
    std::vector<di::ops::QWeight> ws{w0};
    for (int i = 1; i < copies; ++i) ws.push_back(fp8_weight(s.N, s.K));
    const di::Tensor x = dev_act({Mmax, s.K});
    const di::Tensor xf = dev_act({Mmax, s.K}), wf = dev_act({s.N, s.K});  // the SGEMM's operands
    di::Tensor y = di::Tensor::empty({Mmax, s.N}, di::DType::kF32, di::Device::kCUDA);
    CK(cudaDeviceSynchronize());
    for (const int64_t M : Ms) {
      if (only_m != nullptr && std::atoll(only_m) != M) continue;
      const di::Tensor xs = x.slice(0, 0, M);
      di::Tensor ys = y.slice(0, 0, M);
      const double flop = 2.0 * static_cast<double>(M) * static_cast<double>(s.N) * static_cast<double>(s.K);
      auto exact = [&](int64_t from) {
        di::cuda::linear_set_fp8_gemm_rows(from);
        const Timed t = time_calls(
            st, 32, [&](int i) { di::cuda::linear_exact_into(xs, ws[i % copies], o, ys, st); }, 10.0);
        di::cuda::linear_set_fp8_gemm_rows(-1);
        return t;
      };
      const Timed tn = exact(1), tb = exact(0);
      const std::unique_ptr<LtPlan> pf = lt_plan(lt, s.N, M, s.K, false, CUDA_R_32F);
      char sg_us[32] = "n/a", sg_tf[32] = "n/a", rate[32] = "n/a";
      if (lt_probe(lt, *pf, wf.raw(), xf.raw(), y.raw(), st)) {
        const Timed t = time_calls(
            st, 32, [&](int) { CL(lt_run(lt, *pf, wf.raw(), xf.raw(), y.raw(), st)); }, 10.0);
        std::snprintf(sg_us, sizeof sg_us, "%.1f", t.ms * 1e3);
        std::snprintf(sg_tf, sizeof sg_tf, "%.1f", flop / t.ms / 1e9);
        std::snprintf(rate, sizeof rate, "%.2f", t.ms / tn.ms);
      }
      std::printf("| %s [%lld, %lld] | %lld | %.1f | %.1f | %.1f | %.1f | %s | %s | %.2fx | %s |\n", s.name,
                  static_cast<long long>(s.N), static_cast<long long>(s.K), static_cast<long long>(M), tn.ms * 1e3,
                  flop / tn.ms / 1e9, tb.ms * 1e3, flop / tb.ms / 1e9, sg_us, sg_tf, tb.ms / tn.ms, rate);
      std::fflush(stdout);
    }
  }
}

void run() {
  di::cuda::init();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int lt_ver = static_cast<int>(cublasLtGetVersion());
  const char* sha = std::getenv("GIT_SHA");
  std::printf("device: %s, %d SMs, L2 %d MB; cuBLASLt %d%s%s\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, lt_ver, sha ? "; git " : "", sha ? sha : "");
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  // ---- HBM read ceiling over 2 GiB -----------------------------------------------------------------------
  const double read_gbs = deepinfer::bench::read_ceiling_gbs(st, size_t{2} << 30);
  std::printf("HBM ceiling: read kernel %.0f GB/s\n", read_gbs);

  Lt lt;
  CL(cublasLtCreate(&lt.h));
  CK(cudaMalloc(&lt.ws, lt.ws_bytes));
  CK(cudaMalloc(&lt.ones, lt.ones_floats * sizeof(float)));
  {
    std::vector<float> h(lt.ones_floats, 1.0f);
    CK(cudaMemcpy(lt.ones, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  }

  if (std::getenv("BENCH_GEMM_EXACT") != nullptr) {  // the exact table alone
    exact_table(lt, st);
    CK(cudaFree(lt.ws));
    CK(cudaFree(lt.ones));
    CL(cublasLtDestroy(lt.h));
    CK(cudaStreamDestroy(st));
    return;
  }

  di::ops::LinearOpts o;
  o.act_quant_block = 32;  // the V4.1 FP8 / FP4 GEMM input site
  o.round_out_bf16 = true;

  // ---- part 0: the BF16 vocabulary head ----------------------------------------------------------------------
  {
    constexpr int64_t kVocab = 129280, kHidden = 5120;
    const double wbytes = static_cast<double>(kVocab * kHidden * 2);
    std::vector<di::ops::QWeight> ws(2);  // two copies (2.6 GB): consecutive calls read HBM
    for (di::ops::QWeight& w : ws) w.w = deepinfer::bench::dev_bf16({kVocab, kHidden});
    const int64_t Mmax = 1024;
    const di::Tensor x = dev_act({Mmax, kHidden});
    const di::Tensor xb = dev_bytes({Mmax, kHidden}, di::DType::kBF16, 0, 0);  // cuBLASLt's x (values do not matter)
    di::Tensor y = di::Tensor::empty({Mmax, kVocab}, di::DType::kF32, di::Device::kCUDA);
    di::Tensor d = di::Tensor::empty({Mmax, kVocab}, di::DType::kBF16, di::Device::kCUDA);
    CK(cudaDeviceSynchronize());
    di::ops::LinearOpts ho;  // the head: no input site, float32 logits
    std::printf(
        "\n## BF16 head [%lld, %lld]: exact (cuda::linear_into) and tc (cuda::linear_tc_bf16_into: x in three bf16 "
        "pieces) vs cuBLASLt BF16\n",
        static_cast<long long>(kVocab), static_cast<long long>(kHidden));
    std::printf(
        "cuBLASLt: BF16 x BF16 -> BF16, TN, FP32 compute, x one bf16 piece (a third of tc's MMAs): a speed anchor.\n"
        "TFLOP/s count 2 M N K (tc issues 3x that); %% of read: the weight's bytes over the read ceiling.\n\n");
    std::printf(
        "| M | exact us | exact TFLOP/s | tc us | tc TFLOP/s | tc weight GB/s (%% of read) | cuBLASLt us | "
        "cuBLASLt TFLOP/s | tc / cuBLASLt | exact / tc |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
    for (const int64_t M : {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024}) {
      const di::Tensor xs = x.slice(0, 0, M);
      di::Tensor ys = y.slice(0, 0, M);
      const double flop = 2.0 * static_cast<double>(M) * kVocab * kHidden;
      const Timed te = time_calls(
          st, 8, [&](int i) { di::cuda::linear_into(xs, ws[i % 2], ho, ys, st); }, 20.0);
      const Timed tt = time_calls(
          st, 8, [&](int i) { di::cuda::linear_tc_bf16_into(xs, ws[i % 2], ho, ys, st); }, 20.0);
      const std::unique_ptr<LtPlan> pl = lt_plan(lt, kVocab, M, kHidden, false, CUDA_R_16BF);
      char lt_us[32] = "n/a", lt_tf[32] = "n/a", ratio[32] = "n/a";
      if (lt_probe(lt, *pl, ws[0].w.raw(), xb.raw(), d.raw(), st)) {
        const Timed t = time_calls(
            st, 8, [&](int i) { CL(lt_run(lt, *pl, ws[i % 2].w.raw(), xb.raw(), d.raw(), st)); }, 20.0);
        std::snprintf(lt_us, sizeof lt_us, "%.1f", t.ms * 1e3);
        std::snprintf(lt_tf, sizeof lt_tf, "%.1f", flop / t.ms / 1e9);
        std::snprintf(ratio, sizeof ratio, "%.2f", tt.ms / t.ms);
      }
      const double gbs = wbytes / tt.ms / 1e6;
      std::printf("| %lld | %.1f | %.1f | %.1f | %.1f | %.0f (%.0f%%) | %s | %s | %s | %.2f |\n",
                  static_cast<long long>(M), te.ms * 1e3, flop / te.ms / 1e9, tt.ms * 1e3, flop / tt.ms / 1e9, gbs,
                  100.0 * gbs / read_gbs, lt_us, lt_tf, ratio, te.ms / tt.ms);
      std::fflush(stdout);
    }
  }
  if (std::getenv("BENCH_GEMM_HEAD") != nullptr) {  // the head table alone
    CK(cudaFree(lt.ws));
    CK(cudaFree(lt.ones));
    CL(cublasLtDestroy(lt.h));
    CK(cudaStreamDestroy(st));
    return;
  }

  // ---- part 1: dense FP8 GEMMs ------------------------------------------------------------------------------
  const Dense dense[] = {
      {"attn.wq_a", 1280, 5120},    {"attn.wq_b", 32768, 1280}, {"attn.wkv", 512, 5120},      {"attn.wo_b", 5120, 8192},
      {"shared w1/w3", 2304, 5120}, {"shared w2", 5120, 2304},  {"indexer.wq_b", 4096, 1280},
  };
  const int64_t Ms[] = {1, 16, 64, 256, 4096};
  const int64_t Mmax = 4096;
  std::printf("\n## FP8 block-scaled GEMM (E4M3 + 32x32 E8M0, act_quant_block 32, bf16-rounded out) vs cuBLASLt FP8\n");
  std::printf(
      "cuBLASLt: E4M3 x E4M3 -> BF16, TN, FP32 compute, fast accum off, per-tensor scales (no 32x32 block\n"
      "scaling on Hopper): a speed anchor, not the same numerics; its x is pre-quantised E4M3 (ours quantises\n"
      "fp32 x in the call). Last column: cuBLASLt block-scaled (128x128 weight / 1x128 act FP32 scales).\n\n");
  std::printf(
      "| shape [N, K] | M | ours us | cuBLASLt us | ratio ours/cuBLASLt | ours TFLOP/s | ours weight GB/s "
      "(%% of read) | cuBLASLt TFLOP/s | cuBLASLt blk128 us | tc us | tc TFLOP/s | tc weight GB/s (%% of read) | "
      "ratio tc/cuBLASLt |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (const Dense& s : dense) {
    const di::ops::QWeight w0 = fp8_weight(s.N, s.K);
    const double wbytes = qbytes(w0);
    const int copies = static_cast<int>(std::min<double>(64, std::max(2.0, (512.0 * (1 << 20)) / wbytes)));
    std::vector<di::ops::QWeight> ws{w0};
    for (int i = 1; i < copies; ++i) ws.push_back(fp8_weight(s.N, s.K));
    const di::Tensor x = dev_act({Mmax, s.K});
    const di::Tensor x8 = dev_bytes({Mmax, s.K}, di::DType::kE4M3, 0, 255, true);
    di::Tensor y = di::Tensor::empty({Mmax, s.N}, di::DType::kF32, di::Device::kCUDA);
    di::Tensor d = di::Tensor::empty({Mmax, s.N}, di::DType::kBF16, di::Device::kCUDA);
    CK(cudaDeviceSynchronize());
    const int max_calls = std::max(copies, 32);
    for (const int64_t M : Ms) {
      const di::Tensor xs = x.slice(0, 0, M);
      di::Tensor ys = y.slice(0, 0, M);
      const double flop = 2.0 * static_cast<double>(M) * static_cast<double>(s.N) * static_cast<double>(s.K);
      const Timed t_ours = time_calls(
          st, max_calls, [&](int i) { di::cuda::linear_into(xs, ws[i % copies], o, ys, st); }, 10.0);
      const Timed t_tc = time_calls(
          st, max_calls, [&](int i) { di::cuda::linear_tc_into(xs, ws[i % copies], o, ys, st); }, 10.0);
      const std::unique_ptr<LtPlan> pt = lt_plan(lt, s.N, M, s.K, false);
      char lt_us[32] = "n/a", lt_tf[32] = "n/a", ratio[32] = "n/a", blk_us[32] = "n/a", tc_ratio[32] = "n/a";
      if (lt_probe(lt, *pt, ws[0].w.raw(), x8.raw(), d.raw(), st)) {
        const Timed t = time_calls(
            st, max_calls, [&](int i) { CL(lt_run(lt, *pt, ws[i % copies].w.raw(), x8.raw(), d.raw(), st)); }, 10.0);
        std::snprintf(lt_us, sizeof lt_us, "%.2f", t.ms * 1e3);
        std::snprintf(lt_tf, sizeof lt_tf, "%.1f", flop / t.ms / 1e9);
        std::snprintf(ratio, sizeof ratio, "%.2f", t_ours.ms / t.ms);
        std::snprintf(tc_ratio, sizeof tc_ratio, "%.2f", t_tc.ms / t.ms);
      }
      const std::unique_ptr<LtPlan> pb = lt_plan(lt, s.N, M, s.K, true);
      if (lt_probe(lt, *pb, ws[0].w.raw(), x8.raw(), d.raw(), st)) {
        const Timed t = time_calls(
            st, max_calls, [&](int i) { CL(lt_run(lt, *pb, ws[i % copies].w.raw(), x8.raw(), d.raw(), st)); }, 10.0);
        std::snprintf(blk_us, sizeof blk_us, "%.2f", t.ms * 1e3);
      }
      const double gbs = wbytes / t_ours.ms / 1e6, tc_gbs = wbytes / t_tc.ms / 1e6;
      std::printf(
          "| %s [%lld, %lld] | %lld | %.2f | %s | %s | %.2f | %.0f (%.0f%%) | %s | %s | %.2f | %.1f | %.0f (%.0f%%) | "
          "%s "
          "|\n",
          s.name, static_cast<long long>(s.N), static_cast<long long>(s.K), static_cast<long long>(M), t_ours.ms * 1e3,
          lt_us, ratio, flop / t_ours.ms / 1e9, gbs, 100.0 * gbs / read_gbs, lt_tf, blk_us, t_tc.ms * 1e3,
          flop / t_tc.ms / 1e9, tc_gbs, 100.0 * tc_gbs / read_gbs, tc_ratio);
      std::fflush(stdout);
    }
  }

  // ---- part 2: FP4 routed experts ----------------------------------------------------------------------------
  constexpr int kExperts = 384, kTopK = 6;
  constexpr int64_t kDim = 5120, kInter = 2304;
  struct Expert {
    di::ops::QWeight w1, w3, w2;
  };
  std::vector<Expert> ex(kExperts);
  for (Expert& e : ex) {
    e.w1 = fp4_weight(kInter, kDim);
    e.w3 = fp4_weight(kInter, kDim);
    e.w2 = fp4_weight(kDim, kInter);
  }
  const double expert_bytes = qbytes(ex[0].w1) + qbytes(ex[0].w3) + qbytes(ex[0].w2);
  CK(cudaDeviceSynchronize());

  // The three GEMMs of one expert on rows [a, b) of the dispatched buffers (swiglu and gather left out).
  struct Bufs {
    di::Tensor x, h, g, u, y;
  };
  auto make_bufs = [&](int64_t rows) {
    return Bufs{dev_act({rows, kDim}), dev_act({rows, kInter}),
                di::Tensor::empty({rows, kInter}, di::DType::kF32, di::Device::kCUDA),
                di::Tensor::empty({rows, kInter}, di::DType::kF32, di::Device::kCUDA),
                di::Tensor::empty({rows, kDim}, di::DType::kF32, di::Device::kCUDA)};
  };
  auto expert_ours = [&](const Bufs& bf, const Group& gr) {
    const Expert& e = ex[static_cast<size_t>(gr.expert)];
    const di::Tensor xs = bf.x.slice(0, gr.a, gr.b), hs = bf.h.slice(0, gr.a, gr.b);
    di::Tensor gs = bf.g.slice(0, gr.a, gr.b), us = bf.u.slice(0, gr.a, gr.b), ys = bf.y.slice(0, gr.a, gr.b);
    di::cuda::linear_into(xs, e.w1, o, gs, st);
    di::cuda::linear_into(xs, e.w3, o, us, st);
    di::cuda::linear_into(hs, e.w2, o, ys, st);
  };
  auto expert_tc = [&](const Bufs& bf, const Group& gr) {
    const Expert& e = ex[static_cast<size_t>(gr.expert)];
    const di::Tensor xs = bf.x.slice(0, gr.a, gr.b), hs = bf.h.slice(0, gr.a, gr.b);
    di::Tensor gs = bf.g.slice(0, gr.a, gr.b), us = bf.u.slice(0, gr.a, gr.b), ys = bf.y.slice(0, gr.a, gr.b);
    di::cuda::linear_tc_into(xs, e.w1, o, gs, st);
    di::cuda::linear_tc_into(xs, e.w3, o, us, st);
    di::cuda::linear_tc_into(hs, e.w2, o, ys, st);
  };

  std::printf("\n## FP4 routed experts, decode (one cuda::linear per expert and weight, as src/model/moe.cpp)\n");
  std::printf(
      "384 experts of w1/w3 [2304, 5120] + w2 [5120, 2304] (E2M1 packed + E8M0 per 32: %.2f MB each),\n"
      "top-6 distinct uniform routing per token (fixed seed), each step a fresh routing; bytes = FP4 +\n"
      "scales of the experts hit; fraction = achieved / read-kernel ceiling (%.0f GB/s).\n\n",
      expert_bytes / 1e6, read_gbs);
  std::printf(
      "| tokens B (impl) | steps in graph | experts hit / step | linears / step | us / step | us / linear | "
      "weight MB / step | GB/s | fraction of read ceiling |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (const int B : {1, 8, 32}) {
    const int S = B == 1 ? 32 : (B == 8 ? 16 : 8);
    std::mt19937 rng(1000u + static_cast<unsigned>(B));
    std::vector<std::vector<Group>> steps;
    for (int i = 0; i < S; ++i) steps.push_back(route(B, kExperts, kTopK, rng));
    const Bufs bf = make_bufs(int64_t{B} * kTopK);
    CK(cudaDeviceSynchronize());
    // Every step once eagerly: rows per expert vary (1 or more), so each kernel variant (x rows per pass)
    // gets its one-time setup outside the capture.
    for (const auto& step : steps)
      for (const Group& gr : step) {
        expert_ours(bf, gr);
        expert_tc(bf, gr);
      }
    CK(cudaStreamSynchronize(st));
    for (const bool tc : {false, true}) {
      const Timed t = time_calls(
          st, S,
          [&](int i) {
            for (const Group& gr : steps[static_cast<size_t>(i % S)]) tc ? expert_tc(bf, gr) : expert_ours(bf, gr);
          },
          60.0);
      double hit = 0;
      for (int i = 0; i < t.calls; ++i) hit += static_cast<double>(steps[static_cast<size_t>(i)].size());
      hit /= t.calls;
      const double bytes = hit * expert_bytes, gbs = bytes / t.ms / 1e6;
      std::printf("| %d (%s) | %d | %.1f | %.0f | %.1f | %.2f | %.1f | %.0f | %.2f |\n", B, tc ? "tc" : "ours", t.calls,
                  hit, 3 * hit, t.ms * 1e3, t.ms * 1e3 / (3 * hit), bytes / 1e6, gbs, gbs / read_gbs);
      std::fflush(stdout);
    }
  }

  // (b) prefill: 4096 tokens, ~64 rows per expert.
  {
    const int T = 4096;
    std::mt19937 rng(4096u);
    const std::vector<Group> groups = route(T, kExperts, kTopK, rng);
    const int64_t rows = int64_t{T} * kTopK;
    int64_t rmin = rows, rmax = 0;
    double flop = 0;
    for (const Group& gr : groups) {
      rmin = std::min(rmin, gr.b - gr.a), rmax = std::max(rmax, gr.b - gr.a);
      flop += 2.0 * static_cast<double>(gr.b - gr.a) * 3.0 * static_cast<double>(kDim * kInter);
    }
    const Bufs bf = make_bufs(rows);
    CK(cudaDeviceSynchronize());
    const Timed t_ours = time_calls(
        st, 2,
        [&](int) {
          for (const Group& gr : groups) expert_ours(bf, gr);
        },
        50.0);
    const Timed t_tc = time_calls(
        st, 2,
        [&](int) {
          for (const Group& gr : groups) expert_tc(bf, gr);
        },
        50.0);

    // Anchor: the same per-expert GEMMs through cuBLASLt FP8 (E4M3 expert weights, per-tensor scales).
    struct Expert8 {
      di::Tensor w1, w3, w2;
    };
    std::vector<Expert8> ex8(kExperts);
    for (Expert8& e : ex8) {
      e.w1 = dev_bytes({kInter, kDim}, di::DType::kE4M3, 0, 255, true);
      e.w3 = dev_bytes({kInter, kDim}, di::DType::kE4M3, 0, 255, true);
      e.w2 = dev_bytes({kDim, kInter}, di::DType::kE4M3, 0, 255, true);
    }
    const di::Tensor x8 = dev_bytes({rows, kDim}, di::DType::kE4M3, 0, 255, true);
    const di::Tensor h8 = dev_bytes({rows, kInter}, di::DType::kE4M3, 0, 255, true);
    di::Tensor gd = di::Tensor::empty({rows, kInter}, di::DType::kBF16, di::Device::kCUDA);
    di::Tensor ud = di::Tensor::empty({rows, kInter}, di::DType::kBF16, di::Device::kCUDA);
    di::Tensor yd = di::Tensor::empty({rows, kDim}, di::DType::kBF16, di::Device::kCUDA);
    CK(cudaDeviceSynchronize());
    std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<LtPlan>> plans;
    auto plan = [&](int64_t N, int64_t M, int64_t K) -> const LtPlan& {
      auto& p = plans[{N, M, K}];
      if (!p) p = lt_plan(lt, N, M, K, false);
      return *p;
    };
    bool lt_ok = true;
    for (const Group& gr : groups) {
      const int64_t m = gr.b - gr.a;
      const auto& e = ex8[static_cast<size_t>(gr.expert)];
      lt_ok = lt_ok &&
              lt_probe(lt, plan(kInter, m, kDim), e.w1.raw(), x8.slice(0, gr.a, gr.b).raw(),
                       gd.slice(0, gr.a, gr.b).raw(), st) &&
              lt_probe(lt, plan(kDim, m, kInter), e.w2.raw(), h8.slice(0, gr.a, gr.b).raw(),
                       yd.slice(0, gr.a, gr.b).raw(), st);
    }
    char lt_ms[32] = "n/a", lt_tf[32] = "n/a", ratio[32] = "n/a", tc_ratio[32] = "n/a";
    if (lt_ok) {
      const Timed t = time_calls(
          st, 8,
          [&](int) {
            for (const Group& gr : groups) {
              const int64_t m = gr.b - gr.a;
              const auto& e = ex8[static_cast<size_t>(gr.expert)];
              const void* xs = x8.slice(0, gr.a, gr.b).raw();
              CL(lt_run(lt, plan(kInter, m, kDim), e.w1.raw(), xs, gd.slice(0, gr.a, gr.b).raw(), st));
              CL(lt_run(lt, plan(kInter, m, kDim), e.w3.raw(), xs, ud.slice(0, gr.a, gr.b).raw(), st));
              CL(lt_run(lt, plan(kDim, m, kInter), e.w2.raw(), h8.slice(0, gr.a, gr.b).raw(),
                        yd.slice(0, gr.a, gr.b).raw(), st));
            }
          },
          50.0);
      std::snprintf(lt_ms, sizeof lt_ms, "%.2f", t.ms);
      std::snprintf(lt_tf, sizeof lt_tf, "%.1f", flop / t.ms / 1e9);
      std::snprintf(ratio, sizeof ratio, "%.1f", t_ours.ms / t.ms);
      std::snprintf(tc_ratio, sizeof tc_ratio, "%.2f", t_tc.ms / t.ms);
    }
    std::printf("\n## FP4 routed experts, prefill expert loop (%d tokens x top-%d over %d experts)\n", T, kTopK,
                kExperts);
    std::printf(
        "FLOPs = sum over experts of 2 * rows * (2 * 2304 * 5120 + 5120 * 2304) = %.3f TFLOP; anchor: the same\n"
        "per-expert GEMMs (3 per expert, same row counts) through cuBLASLt FP8 E4M3 x E4M3 -> BF16 with\n"
        "per-tensor scales (E4M3 expert weights: 2x the FP4 bytes; x pre-quantised; not the same numerics).\n\n",
        flop / 1e12);
    std::printf(
        "| expert loop | experts hit | rows / expert min-avg-max | linears | ms | TFLOP/s | ratio ours/cuBLASLt |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    std::printf("| ours FP4 cuda::linear | %zu | %lld-%.1f-%lld | %zu | %.2f | %.2f | %s |\n", groups.size(),
                static_cast<long long>(rmin), static_cast<double>(rows) / static_cast<double>(groups.size()),
                static_cast<long long>(rmax), 3 * groups.size(), t_ours.ms, flop / t_ours.ms / 1e9, ratio);
    std::printf("| tc FP4 cuda::linear_tc | %zu | same | %zu | %.2f | %.2f | %s |\n", groups.size(), 3 * groups.size(),
                t_tc.ms, flop / t_tc.ms / 1e9, tc_ratio);
    std::printf("| cuBLASLt FP8 per expert | %zu | same | %zu | %s | %s | 1 |\n", groups.size(), 3 * groups.size(),
                lt_ms, lt_tf);
    std::fflush(stdout);
  }

  exact_table(lt, st);  // part 3
  CK(cudaFree(lt.ws));
  CK(cudaFree(lt.ones));
  CL(cublasLtDestroy(lt.h));
  CK(cudaStreamDestroy(st));
}

}  // namespace

int main() { return deepinfer::bench::bench_main("bench_cuda_gemm", run); }
