// GPU benchmark of the decode GEMV (src/cuda/linear_gemv.cu) against the HBM read ceiling, with the current
// exact kernel (cuda::linear_into, src/cuda/linear.cu) as the anchor column. Needs a CUDA GPU (prints SKIP
// and exits 0 without one).
//   ./build/bench/bench_cuda_gemv            (GIT_SHA=$(git rev-parse --short HEAD) to print it)
//
// Rows: M = 1, 2, 4 on the V4.1 decode shapes (E4M3 with 32 x 32 tile scales and act_quant_block 32, among them wq_a
// and wkv stacked as the model calls them [1792, 5120], FP4 experts with E8M0 per 32, the BF16 head [129280, 5120]) and
// the grouped mode as the model calls it (6 FP4 experts out of 384 per token; w1 and w3 [2304, 5120] as 2 expert lists
// in one launch (GemvArgs::x_rows), M = 2 x tokens x 6 rows; w2 [5120, 2304] as 1 list, M = tokens x 6). FP4 rows are
// timed with both FP4 kernels (old: chain_gemv, new: fp4_pair_gemv; linear_gemv.cu's gemv_set_fp4_variant; the grouped
// rows also with fp4_mma_gemv, variant 4, on pre-quantised x as the model passes it), E4M3 rows with both E4M3 kernels
// (old: fp8_gemv, walk: fp8_walk_gemv, mma: fp8_mma_gemv where it takes the call, rows: fp8_rows_gemv where it takes
// the call, wgmma: fp8_wgmma_gemv where it takes the call; gemv_set_fp8_variant 1, 2, 4, 6, 7), the last column giving
// each later kernel's speedup over the old one, and a `tc` row where cuda::linear_tc takes the call (the tensor-core
// contract of linear_tc.cuh, x's quantisation included: its decode GEMV for E4M3 up to 8 rows); E4M3 also in wo_a's
// grouped mode (8 groups [1024, 4096], x row g against group g; and on fp8_wgmma_gemv's block-diagonal form of it), and
// a `read` row per shape: the ceiling's read kernel over the weight's bytes alone at that size (what a plain streaming
// read of them takes, launch ramp and tail included). GB/s counts the weight and scale bytes a call must read (grouped:
// of the distinct experts the call touches, per list), % is of the read ceiling measured in the same run
// (deepinfer::bench::read_ceiling_gbs over 2 GiB). First table: decode batches, dense calls of M = 2..64 rows on the
// V4.1 shapes, the GEMV kernels (E4M3: fp8_gemv, fp8_walk_gemv, fp8_mma_gemv, fp8_rows_gemv and fp8_wgmma_gemv up to 4
// rows; BF16: chain_gemv and bf16_tile_gemv) against linear_into's slab kernels (BENCH_BATCHED=1: that table alone;
// BENCH_BATCHED_SHAPE=<name>: one shape of it; BENCH_SKIP_BATCHED=1: without it). BENCH_DENSE_SHAPE=<name>: that
// shape's rows of the single-row table alone (for ncu). BENCH_GROUPED_ROWS=1: stop after the grouped E4M3 tables
// (wo_a's groups and the shared w1 + w3 at decode batches, walk against rows). BENCH_GROUPED_FP4=1: no dense or grouped
// E4M3 rows (the dense table's header stays, empty), so the grouped FP4 table comes right away (with
// BENCH_SKIP_BATCHED=1; BENCH_GROUPED_TOPK=k: its 1- and 4-token rows route each token to k experts instead of 6, which
// scales the call's work with its shape kept); BENCH_GROUPED_LARGE=1 then skips to the large-batch grouped table
// (BENCH_GROUPED_TOKENS=<32|128|256>: that batch's rows alone; BENCH_GROUPED_VARIANTS=1,2,...: the tc GEMM also at
// those token tiles, linear_tc_set_grouped_variant), BENCH_GROUPED_PREFILL=1 to the prefill-sized one
// (grouped_prefill_table), BENCH_GROUPED_EXACT=1 to the exact contract's prefill-sized one (grouped_exact_table).
// BENCH_SM_PROBE=1: only the table of where the GPU places the blocks of one-wave grids (sm_probe_table).
// BENCH_TC_ONE_ROW=1: only the tensor-core contract's one-row table (tc_one_row_table: its decode GEMV against its TMA
// stream on the V4.1 E4M3 shapes, the exact kernel and the read of the same bytes beside them, the bits compared).
//
// Timing: CUDA events around a CUDA graph of many calls (launch gaps hidden as in a decode graph), after an
// eager warm-up; the median over 7 replays of the mean time of one call. Consecutive calls rotate over weight
// copies totalling >= 512 MiB (L2 is 50-60 MB), so the weights stream from HBM; x and y stay the same (BENCH_L2=1:
// one copy, the weights then L2-resident where they fit; the grouped FP4 table keeps rotating over its 384 experts).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "cuda/linear.cuh"
#include "cuda/linear_gemv.cuh"
#include "cuda/linear_gemv_fp4_mma.cuh"
#include "cuda/linear_gemv_fp8_wgmma.cuh"
#include "cuda/linear_tc.cuh"
#include "cuda/linear_tc_gemv.cuh"
#include "cuda_bench_util.cuh"
#include "deepinfer/dtype.h"
#include "deepinfer/error.h"
#include "ops/ops.h"

namespace di = deepinfer;

namespace {

#define CK(expr) DI_CUDA_CHECK(expr)

using deepinfer::bench::dev_act;
using deepinfer::bench::dev_bytes;

enum Fmt : int { kFp8 = 0, kFp4 = 1, kBf16 = 2 };

// A weight of format fmt [N, K]: E4M3 with 32 x 32 E8M0 tiles (2^-10 .. 2^-4), packed FP4 with E8M0 per 32
// (2^-7 .. 2^-1), or BF16.
di::ops::QWeight make_weight(int fmt, int64_t N, int64_t K) {
  di::ops::QWeight w;
  if (fmt == kFp8) {
    w.w = dev_bytes({N, K}, di::DType::kE4M3, 0, 255, true);
    w.scale = dev_bytes({(N + 31) / 32, (K + 31) / 32}, di::DType::kE8M0, 117, 123);
    w.block = 32;
  } else if (fmt == kFp4) {
    w.w = dev_bytes({N, K}, di::DType::kE2M1x2, 0, 255);
    w.scale = dev_bytes({N, K / 32}, di::DType::kE8M0, 120, 126);
  } else {
    w.w = deepinfer::bench::dev_bf16({N, K});
  }
  return w;
}

double qbytes(const di::ops::QWeight& w) {
  return static_cast<double>(w.w.nbytes() + (w.scale.defined() ? w.scale.nbytes() : 0));
}

// Device tables of the weights' and scales' pointers (GemvArgs::w_table / s_table) for grouped calls; freed by the
// destructor.
struct DeviceTables {
  void *w = nullptr, *s = nullptr;
  explicit DeviceTables(const std::vector<di::ops::QWeight>& ws) {
    std::vector<const void*> hw, hs;
    for (const auto& q : ws) hw.push_back(q.w.raw()), hs.push_back(q.scale.raw());
    CK(cudaMalloc(&w, hw.size() * sizeof(void*)));
    CK(cudaMalloc(&s, hs.size() * sizeof(void*)));
    CK(cudaMemcpy(w, hw.data(), hw.size() * sizeof(void*), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s, hs.data(), hs.size() * sizeof(void*), cudaMemcpyHostToDevice));
  }
  ~DeviceTables() {
    cudaFree(w);
    cudaFree(s);
  }
  DeviceTables(const DeviceTables&) = delete;
  DeviceTables& operator=(const DeviceTables&) = delete;
  // Entry i of the weight / scale table.
  const uint8_t* const* wt(int64_t i) const { return static_cast<const uint8_t* const*>(w) + i; }
  const uint8_t* const* st(int64_t i) const { return static_cast<const uint8_t* const*>(s) + i; }
};

int64_t ldw_of(const di::ops::QWeight& w) {
  return w.w.dtype() == di::DType::kE2M1x2 ? w.w.size(1) / 2 : w.w.strides()[0] * (di::dtype_bits(w.w.dtype()) / 8);
}

di::cuda::GemvArgs args_of(int fmt, const di::ops::QWeight& w, const di::Tensor& x, di::Tensor& y,
                           const di::ops::LinearOpts& o) {
  di::cuda::GemvArgs a;
  a.fmt = fmt;
  a.w = static_cast<const uint8_t*>(w.w.raw());
  a.ldw = ldw_of(w);
  if (w.scale.defined()) {
    a.scale = static_cast<const uint8_t*>(w.scale.raw());
    a.lds = w.scale.strides()[0];
  }
  a.B = fmt == kFp8 ? static_cast<int>(w.block) : 0;
  a.N = static_cast<int>(w.w.size(0));
  a.K = static_cast<int>(w.w.size(1));
  a.x = x.data<float>();
  a.ldx = x.strides()[0];
  a.M = static_cast<int>(x.size(0));
  a.act_quant_block = o.act_quant_block;
  a.round = o.round_out_bf16;
  a.y = y.data<float>();
  return a;
}

// The grouped FP4 call of the expert tables: `lists` lists of n_experts matrices (w0's shape), x's rows through
// expert ids[r] of each list, no act quant (x pre-quantised as the model passes it), bf16-rounded output.
di::cuda::GemvArgs grouped_fp4_args(const di::ops::QWeight& w0, const di::Tensor& x, di::Tensor& y, int lists,
                                    const uint8_t* const* w_table, const uint8_t* const* s_table, const int32_t* ids,
                                    int n_experts) {
  di::ops::LinearOpts o;
  o.act_quant_block = 0;
  o.round_out_bf16 = true;
  di::cuda::GemvArgs a = args_of(kFp4, w0, x, y, o);
  a.w = nullptr;
  a.scale = nullptr;
  a.M = lists * static_cast<int>(x.size(0));
  a.w_table = w_table;
  a.s_table = s_table;
  a.row_expert = ids;
  a.x_rows = static_cast<int>(x.size(0));
  a.n_experts = n_experts;
  return a;
}

// One eager call per copy (kernel setup outside the capture, weights touched once), then
// deepinfer::bench::time_graph over `calls` calls rotating over the copies: mean ms per call.
template <typename F>
double time_calls(cudaStream_t st, int copies, F body) {
  for (int i = 0; i < copies; ++i) body(i);
  CK(cudaStreamSynchronize(st));
  const int calls = std::max(copies, 64);
  return deepinfer::bench::time_graph(st, calls, [&](int i) { body(i % copies); });
}

// How many copies of a call's weights (`bytes` per copy) the calls rotate over: >= 512 MiB in all (at most 64), so
// that they read HBM; BENCH_L2=1: one, so that every call after the first reads the weights from L2 where they fit
// (what a GEMV whose weights were prefetched into L2 would take).
int weight_copies(double bytes) {
  if (std::getenv("BENCH_L2") != nullptr) return 1;
  return static_cast<int>(std::min<double>(64, std::max(2.0, (512.0 * (1 << 20)) / bytes)));
}

// A shape's weight copies (weight_copies), x [rows, K] and y [rows, N] on the GPU, and the options of its rows
// (act_quant_block 32 for FP8 / FP4, 0 for BF16; bf16 output).
struct ShapeSetup {
  std::vector<di::ops::QWeight> ws;
  double wbytes = 0.0;  // of one copy
  di::Tensor x, y;
  di::ops::LinearOpts o;
};
ShapeSetup setup_shape(int fmt, int64_t N, int64_t K, int64_t rows) {
  ShapeSetup su;
  su.ws.push_back(make_weight(fmt, N, K));
  su.wbytes = qbytes(su.ws[0]);
  const int copies = weight_copies(su.wbytes);
  for (int i = 1; i < copies; ++i) su.ws.push_back(make_weight(fmt, N, K));
  su.x = dev_act({rows, K});
  su.y = di::Tensor::empty({rows, N}, di::DType::kF32, di::Device::kCUDA);
  su.o.act_quant_block = fmt == kBf16 ? 0 : 32;
  su.o.round_out_bf16 = true;
  CK(cudaDeviceSynchronize());
  return su;
}

const char* fmt_name(int fmt) { return fmt == kFp8 ? "fp8 B32" : fmt == kFp4 ? "fp4" : "bf16"; }

// `routings` routings of `tokens` tokens, each token top-k distinct experts of `experts` (uniform, from `seed`), each
// routing's rows sorted by expert (moe_group's order), one after the other; with the mean number of distinct experts
// a routing uses.
struct Routings {
  std::vector<int32_t> ids;
  double distinct = 0.0;
};
Routings sorted_routings(int tokens, int topk, int experts, int routings, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, experts - 1);
  const int64_t rows = static_cast<int64_t>(tokens) * topk;
  Routings out;
  for (int r = 0; r < routings; ++r) {
    std::set<int> used;
    for (int t = 0; t < tokens; ++t) {
      std::set<int> mine;
      while (static_cast<int>(mine.size()) < topk) mine.insert(pick(rng));
      out.ids.insert(out.ids.end(), mine.begin(), mine.end());
      used.insert(mine.begin(), mine.end());
    }
    std::sort(out.ids.end() - rows, out.ids.end());
    out.distinct += static_cast<double>(used.size());
  }
  out.distinct /= routings;
  return out;
}

// Host ids as an int32 CUDA tensor.
di::Tensor device_ids(const std::vector<int32_t>& ids) {
  di::Tensor h = di::Tensor::empty({static_cast<int64_t>(ids.size())}, di::DType::kI32);
  std::memcpy(h.data<int32_t>(), ids.data(), ids.size() * sizeof(int32_t));
  return di::cuda::copy_to_device(h);
}

// Eager calls of `body` on `st`: events around 3 calls after a warm-up, the median of 5; ms per call.
template <typename F>
double eager_ms(cudaStream_t st, const F& body) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  body();
  CK(cudaStreamSynchronize(st));
  std::vector<float> v;
  for (int rep = 0; rep < 5; ++rep) {
    CK(cudaEventRecord(e0, st));
    for (int k = 0; k < 3; ++k) body();
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    v.push_back(ms / 3.0f);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(v.begin(), v.end());
  return static_cast<double>(v[2]);
}

// One prefill-sized call of the routed experts (w1 + w3 as two lists, or w2): rows sorted by expert (uniform routing),
// each expert's offsets on the host and its ids on the device, x and y, x quantised per 32 by the call.
struct PrefillCall {
  int tokens = 0, rows = 0, lists = 0;
  bool second = false;  // w2
  std::vector<const std::vector<di::ops::QWeight>*> tl;
  std::vector<int64_t> off;
  di::Tensor ids_d, x, y;
  di::ops::LinearOpts ot;
  int64_t N = 0, K = 0;
  // Every expert's rows through `linear(x rows, expert, y rows)`, list by list (the per-expert loop of a prefill).
  template <typename F>
  void per_expert(const F& linear) {
    for (int l = 0; l < lists; ++l)
      for (size_t e = 0; e + 1 < off.size(); ++e) {
        if (off[e] == off[e + 1]) continue;
        di::Tensor ye = y.slice(0, l * rows + off[e], l * rows + off[e + 1]);
        linear(x.slice(0, off[e], off[e + 1]), (*tl[static_cast<size_t>(l)])[e], ye);
      }
  }
  double flop() const { return 2.0 * lists * rows * static_cast<double>(N) * static_cast<double>(K); }
};

template <typename F>
void for_each_prefill_call(const std::vector<int>& token_counts, int topk, int experts,
                           const std::vector<di::ops::QWeight>& w1, const std::vector<di::ops::QWeight>& w3,
                           const std::vector<di::ops::QWeight>& w2, const F& body) {
  for (const int tokens : token_counts) {
    PrefillCall c;
    c.tokens = tokens, c.rows = tokens * topk;
    const std::vector<int32_t> ids =
        sorted_routings(tokens, topk, experts, 1, 3000u + static_cast<unsigned>(tokens)).ids;
    c.off.assign(static_cast<size_t>(experts) + 1, 0);
    for (const int32_t e : ids) ++c.off[static_cast<size_t>(e) + 1];
    for (int e = 0; e < experts; ++e) c.off[static_cast<size_t>(e) + 1] += c.off[static_cast<size_t>(e)];
    c.ids_d = device_ids(ids);
    for (const bool second : {false, true}) {
      c.second = second, c.lists = second ? 1 : 2;
      c.tl = second ? std::vector<const std::vector<di::ops::QWeight>*>{&w2}
                    : std::vector<const std::vector<di::ops::QWeight>*>{&w1, &w3};
      c.N = (*c.tl[0])[0].out(), c.K = (*c.tl[0])[0].in();
      c.x = dev_act({c.rows, c.K});
      c.y = di::Tensor::empty({c.lists * c.rows, c.N}, di::DType::kF32, di::Device::kCUDA);
      c.ot.act_quant_block = 32;
      c.ot.round_out_bf16 = true;
      body(c);
    }
  }
}

// ---- the routed experts of a prefill chunk (BENCH_GROUPED_PREFILL=1) ---------------------------------------------
// Rows sorted by expert, tens to hundreds per expert. Under DEEPINFER_CUDA_GEMM=tc the MoE ran a prefill chunk as a
// loop of linear_tc calls, one per expert and matrix; now it runs the grouped GEMM (one launch per call) at a token
// tile chosen by rows per expert (linear_tc_set_grouped_variant: 1-4 = tiles of 8 / 16 / 32 / 64 tokens). Both give
// every row linear_tc's bits. Eager calls (the loop is 384 launches per list), events around 3 repeats after a
// warm-up, the median of 5; TFLOP/s as 2 x rows x N x K per list.
void grouped_prefill_table(cudaStream_t st, const std::vector<di::ops::QWeight>& w1,
                           const std::vector<di::ops::QWeight>& w3, const std::vector<di::ops::QWeight>& w2,
                           const uint8_t* const* w13t, const uint8_t* const* w13s, const uint8_t* const* w2t,
                           const uint8_t* const* w2s, int experts, int topk) {
  std::printf(
      "\n## Grouped FP4 experts at prefill (top-%d of %d, uniform routing, rows sorted by expert; tc contract, x "
      "quantised per 32 by the call): the per-expert loop of linear_tc against the grouped GEMM at each token tile, ms "
      "(TFLOP/s)\n\n| call | tokens | rows / expert | per-expert loop | tile 8 | tile 16 | tile 32 | tile 64 | default "
      "|\n|---|---|---|---|---|---|---|---|---|\n",
      topk, experts);
  std::fflush(stdout);
  di::cuda::StreamScope on(st);
  for_each_prefill_call({512, 1024, 4096}, topk, experts, w1, w3, w2, [&](PrefillCall& c) {
    const double loop_ms = eager_ms(st, [&] {
      c.per_expert([&](const di::Tensor& xe, const di::ops::QWeight& w, di::Tensor& ye) {
        di::cuda::linear_tc_into(xe, w, c.ot, ye, st);
      });
    });
    double tile_ms[5];
    for (int v = 0; v <= 4; ++v) {
      const int prev = di::cuda::linear_tc_set_grouped_variant(v);
      tile_ms[v] = eager_ms(st, [&] {
        di::cuda::linear_tc_grouped_gemm_into(c.x, c.ids_d, c.second ? w2t : w13t, c.second ? w2s : w13s, c.lists,
                                              experts, (*c.tl[0])[0], c.ot, c.y);
      });
      di::cuda::linear_tc_set_grouped_variant(prev);
    }
    auto cell = [&](double ms) {
      char b[48];
      std::snprintf(b, sizeof b, "%.2f (%.0f)", ms, c.flop() / ms / 1e9);
      return std::string(b);
    };
    std::printf("| %s [%lld, %lld] | %d | %.0f | %s |", c.second ? "w2" : "w1 + w3", static_cast<long long>(c.N),
                static_cast<long long>(c.K), c.tokens, static_cast<double>(c.rows) / experts, cell(loop_ms).c_str());
    for (int v = 1; v <= 4; ++v) std::printf(" %s |", cell(tile_ms[v]).c_str());
    std::printf(" %s |\n", cell(tile_ms[0]).c_str());
    std::fflush(stdout);
  });
}

// ---- the routed experts under the exact contract at prefill and large decode batches (BENCH_GROUPED_EXACT=1) ------
// The exact prefill ran a chunk's experts as a loop of cuda::linear calls, one per expert and matrix (the FP4 slab
// kernels, 1-4 x rows per pass over the weight); now rows sorted by expert take the tiled FP4 GEMM over every expert in
// one launch (linear_gemm_fp4.cuh) from DEEPINFER_CUDA_FP4_GEMM_ROWS rows per expert. Columns: that loop; the loop of
// the same calls on the tiled GEMM (dense, one expert per launch); the grouped GEMV (linear_grouped's kernel at
// decode, rows of one expert sharing a pass 4 at a time); the grouped tiled GEMM. Every column gives the same bits
// (checked here: the grouped GEMM's y against the loop's). Eager calls as above; ms (TFLOP/s).
void grouped_exact_table(cudaStream_t st, const std::vector<di::ops::QWeight>& w1,
                         const std::vector<di::ops::QWeight>& w3, const std::vector<di::ops::QWeight>& w2, int experts,
                         int topk) {
  std::printf(
      "\n## Grouped FP4 experts, exact contract (top-%d of %d, uniform routing, rows sorted by expert, x quantised per "
      "32 by the call), ms (TFLOP/s)\n\n| call | tokens | rows / expert | per-expert loop | loop on fp4_gemm | grouped "
      "GEMV | grouped fp4_gemm | same bits |\n|---|---|---|---|---|---|---|---|\n",
      topk, experts);
  std::fflush(stdout);
  di::cuda::StreamScope on(st);
  const int64_t prev_rows = di::cuda::fp4_gemm_rows_min();
  for_each_prefill_call({256, 512, 1024, 2048, 4096}, topk, experts, w1, w3, w2, [&](PrefillCall& c) {
    auto loop = [&] {
      c.per_expert([&](const di::Tensor& xe, const di::ops::QWeight& w, di::Tensor& ye) {
        di::cuda::linear_exact_into(xe, w, c.ot, ye, st);
      });
    };
    di::Tensor yg;
    auto grouped = [&] { yg = di::cuda::linear_grouped(c.x, c.ids_d, c.tl, c.ot, 4); };
    di::cuda::linear_set_fp4_gemm_rows(0);
    const double loop_ms = eager_ms(st, loop), gemv_ms = eager_ms(st, grouped);
    di::cuda::linear_set_fp4_gemm_rows(1);
    const double loop_tiled_ms = eager_ms(st, loop), tiled_ms = eager_ms(st, grouped);
    di::cuda::linear_set_fp4_gemm_rows(0);
    loop();
    const di::Tensor a = di::cuda::copy_to_host(yg), b = di::cuda::copy_to_host(c.y);
    const bool same = a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), b.nbytes()) == 0;
    auto cell = [&](double ms) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "%.2f (%.1f)", ms, c.flop() / ms / 1e9);
      return std::string(buf);
    };
    std::printf("| %s [%lld, %lld] | %d | %.0f | %s | %s | %s | %s | %s |\n", c.second ? "w2" : "w1 + w3",
                static_cast<long long>(c.N), static_cast<long long>(c.K), c.tokens,
                static_cast<double>(c.rows) / experts, cell(loop_ms).c_str(), cell(loop_tiled_ms).c_str(),
                cell(gemv_ms).c_str(), cell(tiled_ms).c_str(), same ? "yes" : "NO");
    std::fflush(stdout);
  });
  di::cuda::linear_set_fp4_gemm_rows(prev_rows);
}

// The anchor of a shape: the ceiling's read kernel over one weight copy's bytes (graph-launched like the calls,
// rotating over the same copies, one 16-byte load per thread), so that a GEMV's distance from it is the kernel's own
// and not the ramp and tail of a read this short. ms per call; `bytes` gets the bytes one call reads.
double read_anchor_ms(cudaStream_t st, const std::vector<di::ops::QWeight>& ws, int sms, double& bytes) {
  float* sink = nullptr;
  CK(cudaMalloc(&sink, 4));
  const size_t n16 = static_cast<size_t>(ws[0].w.nbytes()) / 16;
  const unsigned grid = static_cast<unsigned>(std::min<size_t>((n16 + 511) / 512, size_t{8} * sms));
  const double ms = time_calls(st, static_cast<int>(ws.size()), [&](int i) {
    deepinfer::bench::read_kernel<<<grid, 512, 0, st>>>(static_cast<const float4*>(ws[static_cast<size_t>(i)].w.raw()),
                                                        n16, sink);
  });
  CK(cudaFree(sink));
  bytes = static_cast<double>(n16) * 16;
  return ms;
}

// ---- the tensor-core contract at one row of x (BENCH_TC_ONE_ROW=1) --------------------------------------------------
// linear_tc's two one-row paths on the V4.1 E4M3 shapes: the decode GEMV (linear_tc_gemv.cu, its register rings) and
// the TMA stream (linear_tc_stream.cu, tc_stream_set), with the exact contract's kernel and the read of the same bytes
// as anchors; each call's output checked bit for bit between the two tc paths (the same contract, so the same bits).
void tc_one_row_table(cudaStream_t st, double read_gbs, int sms) {
  std::printf("## One row of x under the tensor-core contract (E4M3 32 x 32 tiles, act 32, bf16 out)\n\n");
  std::printf(
      "| weight [N, K] | exact us | tc gemv us | tc stream us | stream GB/s | stream %% of read | read us | read %% | "
      "gemv / stream | bits |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  struct S1 {
    const char* name;
    int64_t N, K;
  };
  const S1 shapes[] = {{"wq_a + wkv", 1792, 5120},   {"attn.wq_b", 32768, 1280}, {"attn.wo_b", 5120, 8192},
                       {"shared w1/w3", 2304, 5120}, {"shared w2", 5120, 2304},  {"indexer.wq_b", 4096, 1280},
                       {"wo_a-sized", 8192, 4096}};
  for (const S1& s : shapes) {
    ShapeSetup su = setup_shape(kFp8, s.N, s.K, 1);
    const std::vector<di::ops::QWeight>& ws = su.ws;
    const di::ops::LinearOpts& o = su.o;
    const int copies = static_cast<int>(ws.size());
    const double ms_exact =
        time_calls(st, copies, [&](int i) { di::cuda::linear_into(su.x, ws[static_cast<size_t>(i)], o, su.y, st); });
    double ms_tc[2] = {0.0, 0.0};
    di::Tensor out[2];
    for (const int on : {0, 1}) {
      const int prev = di::cuda::tc_stream_set(2 * on);  // 2: the stream on every call it can take
      ms_tc[on] = time_calls(st, copies,
                             [&](int i) { di::cuda::linear_tc_into(su.x, ws[static_cast<size_t>(i)], o, su.y, st); });
      di::cuda::linear_tc_into(su.x, ws[0], o, su.y, st);
      CK(cudaStreamSynchronize(st));
      out[on] = di::cuda::copy_to_host(su.y);
      di::cuda::tc_stream_set(prev);
    }
    const int64_t n = out[0].numel();
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i)
      differ += std::memcmp(out[0].data<float>() + i, out[1].data<float>() + i, sizeof(float)) != 0;
    double rbytes = 0.0;
    const double ms_read = read_anchor_ms(st, ws, sms, rbytes);
    const double gbs = su.wbytes / ms_tc[1] / 1e6, rgbs = rbytes / ms_read / 1e6;
    std::printf(
        "| %s [%lld, %lld] | %.2f | %.2f | %.2f | %.0f | %.0f%% | %.2f | %.0f%% | %.2fx | %lld of %lld differ |\n",
        s.name, static_cast<long long>(s.N), static_cast<long long>(s.K), ms_exact * 1e3, ms_tc[0] * 1e3,
        ms_tc[1] * 1e3, gbs, 100.0 * gbs / read_gbs, ms_read * 1e3, 100.0 * rgbs / read_gbs, ms_tc[0] / ms_tc[1],
        static_cast<long long>(differ), static_cast<long long>(n));
    std::fflush(stdout);
  }
}

// ---- where the GPU places the blocks of a one-wave grid (BENCH_SM_PROBE=1) ----------------------------------------
// Each block records its SM and spins ~30 us, so that the whole grid is resident at once; blocks of 128 threads with
// 52 KB of dynamic shared memory (4 a SM, as fp4_mma_gemv's 4-warp blocks are held to 4 by their
// registers). Why: fp4_mma_gemv at one token took as long for top-4 as for top-6 (bench/RESULTS.md, forty-first
// session), which would fit a GPU that fills some SMs to four blocks and leaves others idle; it spreads them
// round-robin instead (forty-second session).
__global__ void sm_probe_kernel(int* sm_of_block, long long spin) {
  di::cuda::pdl_wait();
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  if (threadIdx.x == 0) sm_of_block[blockIdx.x] = static_cast<int>(smid);
  const long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
}
__global__ void sm_probe_busy(long long spin) {  // a kernel ahead of the probe, as a GEMV's predecessor in a graph
  const long long t0 = clock64();
  di::cuda::pdl_launch_dependents();
  while (clock64() - t0 < spin) {
  }
}

void sm_probe_table(cudaStream_t st, int sms) {
  std::printf(
      "## Blocks per SM of one-wave grids (128 threads, 52 KB of dynamic shared memory: at most 4 a SM); plain: on an "
      "idle GPU; pdl: launched with programmatic serialisation behind a kernel of 8 blocks that runs ~10 us\n\n");
  std::printf("| grid | launch | SMs with 0 / 1 / 2 / 3 / 4 blocks |\n|---|---|---|\n");
  constexpr int kSmem = 52 * 1024;
  CK(cudaFuncSetAttribute(sm_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  int* d = nullptr;
  CK(cudaMalloc(&d, 4 * sms * sizeof(int)));
  for (const int grid : {288, 360, 432, 480, 4 * sms}) {
    if (grid > 4 * sms) continue;
    for (const bool pdl : {false, true}) {
      if (pdl) sm_probe_busy<<<8, 32, 0, st>>>(20000);
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(static_cast<unsigned>(grid));
      cfg.blockDim = dim3(128);
      cfg.dynamicSmemBytes = kSmem;
      cfg.stream = st;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, sm_probe_kernel, d, 60000LL));
      CK(cudaStreamSynchronize(st));
      std::vector<int> sm(static_cast<size_t>(grid));
      CK(cudaMemcpy(sm.data(), d, grid * sizeof(int), cudaMemcpyDeviceToHost));
      std::vector<int> per(static_cast<size_t>(sms), 0), hist(6, 0);
      for (const int v : sm)
        if (v >= 0 && v < sms) ++per[static_cast<size_t>(v)];
      for (const int n : per) ++hist[static_cast<size_t>(std::min(n, 5))];
      std::printf("| %d | %s | %d / %d / %d / %d / %d%s |\n", grid, pdl ? "pdl" : "plain", hist[0], hist[1], hist[2],
                  hist[3], hist[4], hist[5] > 0 ? " (some SM above 4)" : "");
    }
  }
  CK(cudaFree(d));
  std::fflush(stdout);
}

void run() {
  di::cuda::init();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const char* sha = std::getenv("GIT_SHA");
  std::printf("device: %s, %d SMs, L2 %d MB%s%s\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
              sha ? "; git " : "", sha ? sha : "");
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const double read_gbs = deepinfer::bench::read_ceiling_gbs(st, size_t{2} << 30);
  std::printf("HBM ceiling: read kernel %.0f GB/s\n\n", read_gbs);
  if (std::getenv("BENCH_TC_ONE_ROW") != nullptr) {  // the one-row tensor-core table alone
    tc_one_row_table(st, read_gbs, prop.multiProcessorCount);
    CK(cudaStreamDestroy(st));
    return;
  }
  if (std::getenv("BENCH_SM_PROBE") != nullptr) {  // the block placement table alone
    sm_probe_table(st, prop.multiProcessorCount);
    CK(cudaStreamDestroy(st));
    return;
  }

  struct Shape {
    const char* name;
    int fmt;
    int64_t N, K;
  };
  // ---- batched decode: dense calls of M = 2..64 rows, each GEMV kernel against the slab kernels ------------
  std::printf(
      "## Batched decode (dense, M rows of x; GEMV kernels against linear_into's slab kernels; GB/s of the "
      "weight read once)\n\n");
  std::printf(
      "| weight [N, K] | fmt | M | slab us | gemv us (fp8_gemv / chain_gemv) | walk / tile us (fp8_walk_gemv / "
      "bf16_tile_gemv) | mma us (fp8_mma_gemv) | rows us (fp8_rows_gemv) | wgmma us (fp8_wgmma_gemv) | best GB/s | %% "
      "of read | "
      "best / slab |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  const Shape batched[] = {
      {"attn.wq_a", kFp8, 1024, 5120}, {"attn.wq_b", kFp8, 32768, 1280},   {"attn.wkv", kFp8, 512, 5120},
      {"attn.wo_b", kFp8, 5120, 8192}, {"shared w1/w3", kFp8, 2304, 5120}, {"shared w2", kFp8, 5120, 2304},
      {"head", kBf16, 129280, 5120},
  };
  const char* only = std::getenv("BENCH_BATCHED_SHAPE");  // a shape name: that shape alone
  const bool skip_batched = std::getenv("BENCH_SKIP_BATCHED") != nullptr;
  for (const Shape& s : batched) {
    if (skip_batched || (only != nullptr && std::string(only) != s.name)) continue;
    ShapeSetup su = setup_shape(s.fmt, s.N, s.K, 64);
    const std::vector<di::ops::QWeight>& ws = su.ws;  // (lambdas capture these: no structured bindings in C++17)
    const di::ops::LinearOpts& o = su.o;
    const int copies = static_cast<int>(ws.size());
    for (const int64_t M : {2, 3, 4, 5, 6, 8, 16, 32, 64}) {
      const di::Tensor xs = su.x.slice(0, 0, M);
      di::Tensor ys = su.y.slice(0, 0, M);
      std::vector<di::cuda::GemvArgs> args;
      for (const auto& w : ws) args.push_back(args_of(s.fmt, w, xs, ys, o));
      DI_CHECK(di::cuda::gemv_supported(args[0]), "gemv does not support {} at M = {}", s.name, M);
      const double ms_slab =
          time_calls(st, copies, [&](int i) { di::cuda::linear_into(xs, ws[static_cast<size_t>(i)], o, ys, st); });
      // E4M3: both GEMV kernels (fp8_gemv, fp8_walk_gemv); BF16: both (chain_gemv, bf16_tile_gemv).
      double ms[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};  // [variant]
      for (const int variant : {1, 2, 4, 6, 7}) {
        if (variant >= 4 && s.fmt != kFp8) continue;
        if (variant == 7 && !di::cuda::gemv_fp8_wgmma_supported(args[0])) continue;
        if (s.fmt == kFp8) di::cuda::gemv_set_fp8_variant(variant);
        if (s.fmt == kBf16) di::cuda::gemv_set_bf16_variant(variant);
        ms[variant] = time_calls(st, copies, [&](int i) { di::cuda::gemv_into(args[static_cast<size_t>(i)], st); });
      }
      di::cuda::gemv_set_fp8_variant(0);
      di::cuda::gemv_set_bf16_variant(0);
      double best = std::min(ms[1], ms[2]);
      if (ms[4] > 0.0) best = std::min(best, ms[4]);
      if (ms[6] > 0.0) best = std::min(best, ms[6]);
      if (ms[7] > 0.0) best = std::min(best, ms[7]);
      const double gbs = su.wbytes / best / 1e6;
      char mma[32] = "-", rows[32] = "-", wg[32] = "-";
      if (ms[4] > 0.0) std::snprintf(mma, sizeof mma, "%.2f", ms[4] * 1e3);
      if (ms[6] > 0.0) std::snprintf(rows, sizeof rows, "%.2f", ms[6] * 1e3);
      if (ms[7] > 0.0) std::snprintf(wg, sizeof wg, "%.2f", ms[7] * 1e3);
      std::printf("| %s [%lld, %lld] | %s | %lld | %.2f | %.2f | %.2f | %s | %s | %s | %.0f | %.0f%% | %.2fx |\n",
                  s.name, static_cast<long long>(s.N), static_cast<long long>(s.K), fmt_name(s.fmt),
                  static_cast<long long>(M), ms_slab * 1e3, ms[1] * 1e3, ms[2] * 1e3, mma, rows, wg, gbs,
                  100.0 * gbs / read_gbs, ms_slab / best);
      std::fflush(stdout);
    }
  }

  if (std::getenv("BENCH_BATCHED") != nullptr) {  // the batched table alone
    CK(cudaStreamDestroy(st));
    return;
  }

  std::printf("\n## Dense decode GEMV (act_quant_block 32 for fp8 / fp4, 0 for bf16; bf16-rounded output)\n\n");
  std::printf(
      "| weight [N, K] | fmt | M | gemv us | GB/s | %% of read | linear_into us | GB/s | %% of read | speedup | new / "
      "old "
      "kernel |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  const Shape shapes[] = {
      {"attn.wq_a", kFp8, 1280, 5120},    {"flash wq_a", kFp8, 1024, 5120}, {"attn.wq_b", kFp8, 32768, 1280},
      {"attn.wkv", kFp8, 512, 5120},      {"wq_a + wkv", kFp8, 1792, 5120}, {"attn.wo_b", kFp8, 5120, 8192},
      {"shared w1/w3", kFp8, 2304, 5120}, {"shared w2", kFp8, 5120, 2304},  {"indexer.wq_b", kFp8, 4096, 1280},
      {"expert w1/w3", kFp4, 2304, 5120}, {"expert w2", kFp4, 5120, 2304},  {"gate", kBf16, 384, 5120},
      {"head", kBf16, 129280, 5120},
  };
  const char* dense_only = std::getenv("BENCH_DENSE_SHAPE");          // a shape name: that row alone, then stop
  const bool fp4_only = std::getenv("BENCH_GROUPED_FP4") != nullptr;  // the grouped FP4 table alone
  for (const Shape& s : shapes) {
    if (fp4_only || (dense_only != nullptr && std::string(dense_only) != s.name)) continue;
    ShapeSetup su = setup_shape(s.fmt, s.N, s.K, 4);
    const std::vector<di::ops::QWeight>& ws = su.ws;  // (lambdas capture these: no structured bindings in C++17)
    const di::ops::LinearOpts& o = su.o;
    const int copies = static_cast<int>(ws.size());
    for (const int64_t M : {1, 2, 4}) {
      if (s.fmt == kBf16 && M > 1) continue;  // the head at M > 1: the batched table
      const di::Tensor xs = su.x.slice(0, 0, M);
      di::Tensor ys = su.y.slice(0, 0, M);
      std::vector<di::cuda::GemvArgs> args;
      for (const auto& w : ws) args.push_back(args_of(s.fmt, w, xs, ys, o));
      DI_CHECK(di::cuda::gemv_supported(args[0]), "gemv does not support {}", s.name);
      const double ms_old =
          time_calls(st, copies, [&](int i) { di::cuda::linear_into(xs, ws[static_cast<size_t>(i)], o, ys, st); });
      const double gbs_old = su.wbytes / ms_old / 1e6;
      // FP4 and E4M3: one row per kernel (old first, so that the new row can show its speedup over it).
      const bool two = s.fmt == kFp4 || s.fmt == kFp8;
      double ms_first = 0.0;
      for (const int variant : s.fmt == kFp8 ? std::vector<int>{1, 2, 4, 6, 7}
                               : two         ? std::vector<int>{1, 2}
                                             : std::vector<int>{0}) {
        if (variant == 7 && !di::cuda::gemv_fp8_wgmma_supported(args[0])) continue;
        if (s.fmt == kFp4) di::cuda::gemv_set_fp4_variant(variant);
        if (s.fmt == kFp8) di::cuda::gemv_set_fp8_variant(variant);
        const double ms = time_calls(st, copies, [&](int i) { di::cuda::gemv_into(args[static_cast<size_t>(i)], st); });
        if (variant == 1) ms_first = ms;
        const double gbs = su.wbytes / ms / 1e6;
        const char* tag = variant == 0    ? ""
                          : variant == 1  ? " old"
                          : variant == 4  ? " mma"
                          : variant == 6  ? " rows"
                          : variant == 7  ? " wgmma"
                          : s.fmt == kFp8 ? " walk"
                                          : " new";
        char vs[32] = "-";
        if (variant >= 2) std::snprintf(vs, sizeof vs, "%.2fx", ms_first / ms);
        std::printf("| %s [%lld, %lld] | %s%s | %lld | %.2f | %.0f | %.0f%% | %.2f | %.0f | %.0f%% | %.2fx | %s |\n",
                    s.name, static_cast<long long>(s.N), static_cast<long long>(s.K), fmt_name(s.fmt), tag,
                    static_cast<long long>(M), ms * 1e3, gbs, 100.0 * gbs / read_gbs, ms_old * 1e3, gbs_old,
                    100.0 * gbs_old / read_gbs, ms_old / ms, vs);
        std::fflush(stdout);
      }
      di::cuda::gemv_set_fp4_variant(0);
      di::cuda::gemv_set_fp8_variant(0);
      // The tensor-core kernel (its own contract: within tolerance of the CPU op, batch-invariant), with its x
      // pre-pass, where it takes the call.
      if (s.fmt != kBf16 && di::cuda::linear_tc_supported(xs, ws[0], o)) {
        const double ms =
            time_calls(st, copies, [&](int i) { di::cuda::linear_tc_into(xs, ws[static_cast<size_t>(i)], o, ys, st); });
        const double gbs = su.wbytes / ms / 1e6;
        std::printf(
            "| %s [%lld, %lld] | %s tc | %lld | %.2f | %.0f | %.0f%% | %.2f | %.0f | %.0f%% | %.2fx | %.2fx |\n",
            s.name, static_cast<long long>(s.N), static_cast<long long>(s.K), fmt_name(s.fmt),
            static_cast<long long>(M), ms * 1e3, gbs, 100.0 * gbs / read_gbs, ms_old * 1e3, gbs_old,
            100.0 * gbs_old / read_gbs, ms_old / ms, ms_first / ms);
        std::fflush(stdout);
      }
    }
    // The anchor of this size (read_anchor_ms).
    {
      double bytes = 0.0;
      const double ms = read_anchor_ms(st, ws, prop.multiProcessorCount, bytes);
      std::printf("| %s [%lld, %lld] | %s read | - | %.2f | %.0f | %.0f%% | - | - | - | - | - |\n", s.name,
                  static_cast<long long>(s.N), static_cast<long long>(s.K), fmt_name(s.fmt), ms * 1e3, bytes / ms / 1e6,
                  100.0 * bytes / ms / 1e6 / read_gbs);
      std::fflush(stdout);
    }
  }

  if (dense_only != nullptr && std::getenv("BENCH_GROUPED_ROWS") == nullptr) {
    CK(cudaStreamDestroy(st));
    return;
  }

  // ---- grouped E4M3, as wo_a: 8 groups [1024, 4096], x row g against group g's weight (x_rows 8) ---------
  if (!fp4_only) {
    constexpr int kGroups = 8;
    constexpr int64_t kN = 1024, kK = 4096;
    const di::ops::QWeight g0 = make_weight(kFp8, kN, kK);
    const double bytes = kGroups * qbytes(g0);
    const int copies = weight_copies(bytes);
    std::vector<di::ops::QWeight> gw{g0};
    for (int i = 1; i < copies * kGroups; ++i) gw.push_back(make_weight(kFp8, kN, kK));
    const DeviceTables tables(gw);  // copy c: tables of groups [c * 8, c * 8 + 8)
    void* ids_d = nullptr;
    std::vector<int32_t> ids(kGroups);
    for (int g = 0; g < kGroups; ++g) ids[static_cast<size_t>(g)] = g;
    CK(cudaMalloc(&ids_d, ids.size() * sizeof(int32_t)));
    CK(cudaMemcpy(ids_d, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    const di::Tensor x = dev_act({kGroups, kK});
    di::Tensor y = di::Tensor::empty({kGroups, kN}, di::DType::kF32, di::Device::kCUDA);
    di::ops::LinearOpts o;
    o.act_quant_block = 32;
    o.round_out_bf16 = true;
    di::cuda::GemvArgs a = args_of(kFp8, g0, x, y, o);
    a.w = nullptr;
    a.scale = nullptr;
    a.row_expert = static_cast<const int32_t*>(ids_d);
    a.x_rows = kGroups;
    a.n_experts = kGroups;
    double ms[5] = {0.0, 0.0, 0.0, 0.0, 0.0};
    for (const int variant : {1, 2, 4}) {
      di::cuda::gemv_set_fp8_variant(variant);
      ms[variant] = time_calls(st, copies, [&](int i) {
        di::cuda::GemvArgs ai = a;
        ai.w_table = tables.wt(static_cast<int64_t>(i) * kGroups);
        ai.s_table = tables.st(static_cast<int64_t>(i) * kGroups);
        DI_CHECK(di::cuda::gemv_supported(ai), "gemv does not support the grouped wo_a call");
        di::cuda::gemv_into(ai, st);
      });
    }
    di::cuda::gemv_set_fp8_variant(0);
    const double gbs_old = bytes / ms[1] / 1e6, gbs_new = bytes / ms[2] / 1e6, gbs_mma = bytes / ms[4] / 1e6;
    std::printf("\n## Grouped E4M3 (wo_a: %d groups [%lld, %lld], act_quant_block 32)\n\n", kGroups,
                static_cast<long long>(kN), static_cast<long long>(kK));
    std::printf(
        "| MB / call | old us | GB/s | %% of read | walk us | GB/s | %% of read | mma us | GB/s | %% of read | walk / "
        "old | mma / walk |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::printf("| %.1f | %.2f | %.0f | %.0f%% | %.2f | %.0f | %.0f%% | %.2f | %.0f | %.0f%% | %.2fx | %.2fx |\n",
                bytes / 1e6, ms[1] * 1e3, gbs_old, 100.0 * gbs_old / read_gbs, ms[2] * 1e3, gbs_new,
                100.0 * gbs_new / read_gbs, ms[4] * 1e3, gbs_mma, 100.0 * gbs_mma / read_gbs, ms[1] / ms[2],
                ms[2] / ms[4]);
    std::fflush(stdout);
    CK(cudaFree(ids_d));
  }

  // ---- grouped E4M3 at decode batches with a known row period (GemvArgs::row_period), as the model calls them:
  // wo_a (row t * 8 + g against group g, period 8, no act quant) and the shared expert's w1 + w3 (2 lists of one
  // matrix each, every row against it: period 1, act quant 32); fp8_walk_gemv against fp8_rows_gemv ------------
  if (!fp4_only) {
    struct GShape {
      const char* name;
      int64_t N, K;
      int lists, period, act;
    };
    const GShape gshapes[] = {{"wo_a 8 groups", 1024, 4096, 1, 8, 0}, {"shared w1 + w3", 2304, 5120, 2, 1, 32}};
    std::printf(
        "\n## Grouped E4M3 decode batches (row_period; fp8_walk_gemv against fp8_rows_gemv; wo_a also on "
        "fp8_wgmma_gemv's block-diagonal form, one [8 N, K] weight, up to 3 tokens)\n\n");
    std::printf(
        "| call | tokens | rows | MB / call | walk us | GB/s | rows us | GB/s | walk / rows | wgmma us | GB/s | walk / "
        "wgmma |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const GShape& g : gshapes) {
      const int mats = g.lists * g.period;  // distinct matrices of one call
      const di::ops::QWeight w0 = make_weight(kFp8, g.N, g.K);
      const double bytes = mats * qbytes(w0);
      const int copies = weight_copies(bytes);
      std::vector<di::ops::QWeight> gw{w0};
      for (int i = 1; i < copies * mats; ++i) gw.push_back(make_weight(kFp8, g.N, g.K));
      // Copy c: tables of matrices [c * mats, c * mats + mats): list l's entries at l * period.
      const DeviceTables tables(gw);
      void* ids_d = nullptr;
      constexpr int kMaxTokens = 32;
      std::vector<int32_t> ids(static_cast<size_t>(kMaxTokens * g.period));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % static_cast<size_t>(g.period));
      CK(cudaMalloc(&ids_d, ids.size() * sizeof(int32_t)));
      CK(cudaMemcpy(ids_d, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
      const di::Tensor x = dev_act({kMaxTokens * g.period, g.K});
      di::Tensor y = di::Tensor::empty({g.lists * kMaxTokens * g.period, g.N}, di::DType::kF32, di::Device::kCUDA);
      // The block-diagonal form (wo_a: no act quant): the groups as row slices of one weight per copy; x [tokens, G K]
      // is the grouped call's x [tokens G, K], the same memory.
      std::vector<di::ops::QWeight> big;
      if (g.act == 0)
        for (int i = 0; i < copies; ++i) big.push_back(make_weight(kFp8, g.period * g.N, g.K));
      di::Tensor ybig = di::Tensor::empty({kMaxTokens, g.period * g.N}, di::DType::kF32, di::Device::kCUDA);
      di::ops::LinearOpts o;
      o.act_quant_block = g.act;
      o.round_out_bf16 = true;
      for (const int tokens : {1, 2, 4, 8, 16, 32}) {
        const int xr = tokens * g.period;
        di::cuda::GemvArgs a = args_of(kFp8, w0, x.slice(0, 0, xr), y, o);
        a.w = nullptr;
        a.scale = nullptr;
        a.M = g.lists * xr;
        a.row_expert = static_cast<const int32_t*>(ids_d);
        a.x_rows = xr;
        a.n_experts = g.period;
        a.row_period = g.period;
        double ms[7] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
        for (const int variant : {2, 6}) {
          di::cuda::gemv_set_fp8_variant(variant);
          ms[variant] = time_calls(st, copies, [&](int i) {
            di::cuda::GemvArgs ai = a;
            ai.w_table = tables.wt(static_cast<int64_t>(i) * mats);
            ai.s_table = tables.st(static_cast<int64_t>(i) * mats);
            DI_CHECK(di::cuda::gemv_supported(ai), "gemv does not support the grouped {} call", g.name);
            di::cuda::gemv_into(ai, st);
          });
        }
        di::cuda::gemv_set_fp8_variant(0);
        char wg[96] = "- | - | -";
        if (!big.empty()) {
          di::Tensor yb = ybig.slice(0, 0, tokens);
          di::cuda::GemvArgs ab = args_of(kFp8, big[0], x.slice(0, 0, xr).view({tokens, g.period * g.K}), yb, o);
          if (di::cuda::gemv_fp8_wgmma_groups_supported(ab, g.period)) {
            const double msw = time_calls(st, copies, [&](int i) {
              di::cuda::GemvArgs ai = ab;
              ai.w = static_cast<const uint8_t*>(big[static_cast<size_t>(i)].w.raw());
              ai.scale = static_cast<const uint8_t*>(big[static_cast<size_t>(i)].scale.raw());
              di::cuda::gemv_fp8_wgmma_groups_into(ai, g.period, st);
            });
            std::snprintf(wg, sizeof wg, "%.2f | %.0f | %.2fx", msw * 1e3, bytes / msw / 1e6, ms[2] / msw);
          }
        }
        std::printf("| %s | %d | %d | %.1f | %.2f | %.0f | %.2f | %.0f | %.2fx | %s |\n", g.name, tokens, a.M,
                    bytes / 1e6, ms[2] * 1e3, bytes / ms[2] / 1e6, ms[6] * 1e3, bytes / ms[6] / 1e6, ms[2] / ms[6], wg);
        std::fflush(stdout);
      }
      CK(cudaFree(ids_d));
    }
  }
  if (std::getenv("BENCH_GROUPED_ROWS") != nullptr) {  // the tables up to here
    CK(cudaStreamDestroy(st));
    return;
  }

  // ---- grouped FP4 experts, as the model calls them: w1 + w3 as 2 lists in one launch, w2 as 1 list ---------
  constexpr int kExperts = 384, kTopK = 6;
  constexpr int64_t kDim = 5120, kInter = 2304;
  // BENCH_GROUPED_TOPK=k: each token of this table routed to k experts (1..64).
  const char* topk_env = std::getenv("BENCH_GROUPED_TOPK");
  const int topk_small = topk_env != nullptr ? std::clamp(std::atoi(topk_env), 1, 64) : kTopK;
  std::printf(
      "\n## Grouped FP4 experts (top-%d of %d, uniform routing, fixed seed; one gemv launch per call; w1 + w3: 2 "
      "expert lists over the same x rows; x fake-quantised per 128 columns beforehand and act_quant_block 0, as "
      "gather_rows / swiglu hand it to the model's calls)\n\n",
      topk_small, kExperts);
  std::printf(
      "| call | tokens | rows | distinct experts / list | weight MB / call | old us | GB/s | %% of read | new us | "
      "GB/s | %% of read | mma us | GB/s | %% of read | mma / new | tc us (linear_tc_grouped) | %% of read |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  std::vector<di::ops::QWeight> w1(kExperts), w3(kExperts), w2(kExperts);
  for (int e = 0; e < kExperts; ++e) {
    w1[static_cast<size_t>(e)] = make_weight(kFp4, kInter, kDim);
    w3[static_cast<size_t>(e)] = make_weight(kFp4, kInter, kDim);
    w2[static_cast<size_t>(e)] = make_weight(kFp4, kDim, kInter);
  }
  CK(cudaDeviceSynchronize());
  // The device table of a call: the weights of list 0's experts, then list 1's, ... (scales likewise).
  std::vector<void*> tables;
  auto table = [&](const std::vector<const std::vector<di::ops::QWeight>*>& lists, bool scales) {
    std::vector<const void*> h;
    for (const auto* l : lists)
      for (const auto& w : *l) h.push_back(scales ? w.scale.raw() : w.w.raw());
    void* d = nullptr;
    CK(cudaMalloc(&d, h.size() * sizeof(void*)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(void*), cudaMemcpyHostToDevice));
    tables.push_back(d);
    return static_cast<const uint8_t* const*>(d);
  };
  const uint8_t* const* w13t = table({&w1, &w3}, false);
  const uint8_t* const* w13s = table({&w1, &w3}, true);
  const uint8_t* const* w2t = table({&w2}, false);
  const uint8_t* const* w2s = table({&w2}, true);
  // BENCH_GROUPED_LARGE=1: the large-batch table alone.
  const bool large_only = std::getenv("BENCH_GROUPED_LARGE") != nullptr;
  const bool exact_only = std::getenv("BENCH_GROUPED_EXACT") != nullptr;  // grouped_exact_table alone
  const bool prefill_only = std::getenv("BENCH_GROUPED_PREFILL") != nullptr || exact_only;
  for (const int tokens : {1, 4}) {
    if (large_only || prefill_only) break;
    const int rows = tokens * topk_small;
    // Steps of fresh routing: each call of the graph uses the next step's ids (distinct experts per token).
    constexpr int kRoutings = 64;
    std::mt19937 rng(1000u + static_cast<unsigned>(tokens));
    std::uniform_int_distribution<int> pick(0, kExperts - 1);
    std::vector<int32_t> ids(static_cast<size_t>(kRoutings * rows));
    double distinct = 0;
    for (int r = 0; r < kRoutings; ++r) {
      std::set<int> used;
      for (int t = 0; t < tokens; ++t) {
        std::set<int> mine;
        for (int k = 0; k < topk_small; ++k) {
          int e;
          do e = pick(rng);
          while (mine.count(e));
          mine.insert(e);
          used.insert(e);
          ids[static_cast<size_t>(r * rows + t * topk_small + k)] = e;
        }
      }
      distinct += static_cast<double>(used.size());
    }
    distinct /= kRoutings;
    // The ids on the device, as a tensor for linear_tc_grouped and as the raw pointer for gemv_into.
    di::Tensor ids_h = di::Tensor::empty({static_cast<int64_t>(ids.size())}, di::DType::kI32);
    std::memcpy(ids_h.data<int32_t>(), ids.data(), ids.size() * sizeof(int32_t));
    const di::Tensor ids_t = di::cuda::copy_to_device(ids_h);
    const int32_t* ids_d = ids_t.data<int32_t>();
    for (const bool second : {false, true}) {
      const int lists = second ? 1 : 2;
      const int64_t N = second ? kDim : kInter, K = second ? kInter : kDim;
      di::Tensor xh = di::cuda::copy_to_host(dev_act({rows, K}));
      di::ops::fake_quant_fp8(xh, 0, K, 128);
      const di::Tensor x = di::cuda::copy_to_device(xh);
      di::Tensor y = di::Tensor::empty({lists * rows, N}, di::DType::kF32, di::Device::kCUDA);
      di::cuda::GemvArgs a = grouped_fp4_args(second ? w2[0] : w1[0], x, y, lists, second ? w2t : w13t,
                                              second ? w2s : w13s, ids_d, kExperts);
      DI_CHECK(di::cuda::gemv_supported(a), "gemv does not support the grouped call");
      auto routed_call = [&](int i) {  // call i of the graph: routing step i's ids
        di::cuda::GemvArgs ai = a;
        ai.row_expert = ids_d + static_cast<int64_t>(i) * rows;
        di::cuda::gemv_into(ai, st);
      };
      double ms[5] = {0.0, 0.0, 0.0, 0.0, 0.0};
      for (const int variant : {1, 2, 4}) {
        di::cuda::gemv_set_fp4_variant(variant);
        ms[variant] = time_calls(st, kRoutings, routed_call);
      }
      di::cuda::gemv_set_fp4_variant(0);
      // The tensor-core contract's grouped GEMV on the same call (x quantised per 32 in the kernel: act 32).
      {
        di::ops::LinearOpts ot;
        ot.act_quant_block = 32;
        ot.round_out_bf16 = true;
        const std::vector<const std::vector<di::ops::QWeight>*> tl =
            second ? std::vector<const std::vector<di::ops::QWeight>*>{&w2}
                   : std::vector<const std::vector<di::ops::QWeight>*>{&w1, &w3};
        di::cuda::linear_tc_grouped_into(x, ids_t.slice(0, 0, rows), tl, ot, y);  // builds its expert table (eager)
        CK(cudaDeviceSynchronize());
        ms[3] = time_calls(st, kRoutings, [&](int i) {
          di::cuda::StreamScope on(st);
          di::cuda::linear_tc_grouped_into(x, ids_t.slice(0, static_cast<int64_t>(i) * rows, (i + 1) * rows), tl, ot,
                                           y);
        });
      }
      const double bytes = lists * distinct * qbytes(second ? w2[0] : w1[0]);
      const double gbs_old = bytes / ms[1] / 1e6, gbs_new = bytes / ms[2] / 1e6, gbs_mma = bytes / ms[4] / 1e6;
      std::printf(
          "| %s [%lld, %lld] | %d | %d | %.1f | %.1f | %.2f | %.0f | %.0f%% | %.2f | %.0f | %.0f%% | %.2f | %.0f | "
          "%.0f%% | %.2fx | %.2f | %.0f%% |\n",
          second ? "w2" : "w1 + w3", static_cast<long long>(N), static_cast<long long>(K), tokens, lists * rows,
          distinct, bytes / 1e6, ms[1] * 1e3, gbs_old, 100.0 * gbs_old / read_gbs, ms[2] * 1e3, gbs_new,
          100.0 * gbs_new / read_gbs, ms[4] * 1e3, gbs_mma, 100.0 * gbs_mma / read_gbs, ms[2] / ms[4], ms[3] * 1e3,
          100.0 * bytes / ms[3] / 1e6 / read_gbs);
      std::fflush(stdout);
    }
  }

  // ---- the same experts at large decode batches: rows sorted by expert, as moe_group leaves them ------------------
  std::printf(
      "\n## Grouped FP4 experts at large decode batches (top-%d of %d, uniform routing, rows sorted by expert; exact: "
      "the GEMV with tiles of up to 4 rows of one expert, x quantised per 128 beforehand; tc GEMV: linear_tc_grouped, "
      "a pass over the expert per row; tc GEMM: linear_tc_grouped_gemm, a pass per tile of the expert's rows; both tc "
      "quantise x per 32 themselves)\n\n",
      kTopK, kExperts);
  std::printf(
      "| call | tokens | rows | distinct experts / list | weight MB / call | exact us | %% of read | tc GEMV us | %% "
      "of "
      "read | tc GEMM us | %% of read | GEMV / GEMM |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  const char* only_tokens = std::getenv("BENCH_GROUPED_TOKENS");  // one batch of the table (for ncu)
  for (const int tokens : {32, 128, 256}) {
    if (prefill_only) break;
    if (only_tokens != nullptr && std::atoi(only_tokens) != tokens) continue;
    const int rows = tokens * kTopK;
    constexpr int kRoutings = 16;
    const Routings rt = sorted_routings(tokens, kTopK, kExperts, kRoutings, 2000u + static_cast<unsigned>(tokens));
    const double distinct = rt.distinct;
    const di::Tensor ids_t = device_ids(rt.ids);
    for (const bool second : {false, true}) {
      const int lists = second ? 1 : 2;
      const int64_t N = second ? kDim : kInter, K = second ? kInter : kDim;
      const std::vector<const std::vector<di::ops::QWeight>*> tl =
          second ? std::vector<const std::vector<di::ops::QWeight>*>{&w2}
                 : std::vector<const std::vector<di::ops::QWeight>*>{&w1, &w3};
      di::Tensor xh = di::cuda::copy_to_host(dev_act({rows, K}));
      di::Tensor xq = xh.clone();
      di::ops::fake_quant_fp8(xq, 0, K, 128);
      const di::Tensor x = di::cuda::copy_to_device(xh), xqd = di::cuda::copy_to_device(xq);
      di::Tensor y = di::Tensor::empty({lists * rows, N}, di::DType::kF32, di::Device::kCUDA);
      di::cuda::GemvArgs a = grouped_fp4_args(second ? w2[0] : w1[0], xqd, y, lists, second ? w2t : w13t,
                                              second ? w2s : w13s, ids_t.data<int32_t>(), kExperts);
      a.tile_rows = 4;
      DI_CHECK(di::cuda::gemv_supported(a), "gemv does not support the grouped call");
      const double exact_ms = time_calls(st, kRoutings, [&](int i) {
        di::cuda::GemvArgs ai = a;
        ai.row_expert = ids_t.data<int32_t>() + static_cast<int64_t>(i) * rows;
        di::cuda::gemv_into(ai, st);
      });
      di::ops::LinearOpts ot;
      ot.act_quant_block = 32;
      ot.round_out_bf16 = true;
      di::cuda::linear_tc_grouped_into(x, ids_t.slice(0, 0, rows), tl, ot, y);  // builds its expert table (eager)
      CK(cudaDeviceSynchronize());
      const double gemv_ms = time_calls(st, kRoutings, [&](int i) {
        di::cuda::StreamScope on(st);
        di::cuda::linear_tc_grouped_into(x, ids_t.slice(0, static_cast<int64_t>(i) * rows, (i + 1) * rows), tl, ot, y);
      });
      const double gemm_ms = time_calls(st, kRoutings, [&](int i) {
        di::cuda::StreamScope on(st);
        di::cuda::linear_tc_grouped_gemm_into(x, ids_t.slice(0, static_cast<int64_t>(i) * rows, (i + 1) * rows),
                                              second ? w2t : w13t, second ? w2s : w13s, lists, kExperts,
                                              second ? w2[0] : w1[0], ot, y);
      });
      const double bytes = lists * distinct * qbytes(second ? w2[0] : w1[0]);
      auto pct = [&](double ms) { return 100.0 * bytes / ms / 1e6 / read_gbs; };
      // BENCH_GROUPED_VARIANTS=v,v,...: the tc GEMM again at those token-tile variants (linear_tc_set_grouped_variant).
      if (const char* vs = std::getenv("BENCH_GROUPED_VARIANTS")) {
        for (const char* p = vs; *p != '\0';) {
          const int v = std::atoi(p);
          const int prev = di::cuda::linear_tc_set_grouped_variant(v);
          const double ms = time_calls(st, kRoutings, [&](int i) {
            di::cuda::StreamScope on(st);
            di::cuda::linear_tc_grouped_gemm_into(x, ids_t.slice(0, static_cast<int64_t>(i) * rows, (i + 1) * rows),
                                                  second ? w2t : w13t, second ? w2s : w13s, lists, kExperts,
                                                  second ? w2[0] : w1[0], ot, y);
          });
          di::cuda::linear_tc_set_grouped_variant(prev);
          std::printf("| %s, %d tokens, tc GEMM variant %d | %.1f us | %.0f%% of read |\n", second ? "w2" : "w1 + w3",
                      tokens, v, ms * 1e3, pct(ms));
          while (*p != '\0' && *p != ',') ++p;
          if (*p == ',') ++p;
        }
      }
      std::printf(
          "| %s [%lld, %lld] | %d | %d | %.1f | %.1f | %.1f | %.0f%% | %.1f | %.0f%% | %.1f | %.0f%% | %.2fx |\n",
          second ? "w2" : "w1 + w3", static_cast<long long>(N), static_cast<long long>(K), tokens, lists * rows,
          distinct, bytes / 1e6, exact_ms * 1e3, pct(exact_ms), gemv_ms * 1e3, pct(gemv_ms), gemm_ms * 1e3,
          pct(gemm_ms), gemv_ms / gemm_ms);
      std::fflush(stdout);
    }
  }
  if (prefill_only && !exact_only) grouped_prefill_table(st, w1, w3, w2, w13t, w13s, w2t, w2s, kExperts, kTopK);
  if (exact_only) grouped_exact_table(st, w1, w3, w2, kExperts, kTopK);
  for (void* p : tables) CK(cudaFree(p));
  CK(cudaStreamDestroy(st));
}

}  // namespace

int main() { return deepinfer::bench::bench_main("bench_cuda_gemv", run); }
