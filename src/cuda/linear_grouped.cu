// ops::linear_grouped on CUDA: the routed experts of a decode step in one GEMV launch per matrix. Each
// row of x names its expert on the device (moe_group's row_expert), and the kernel (linear_gemv.cuh)
// looks the expert's weight and scale pointers up in a device table, so the step never copies the
// routing back to the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "core/env.h"
#include "cuda/common.cuh"
#include "cuda/device.h"
#include "cuda/linear.cuh"
#include "cuda/linear_gemm_fp4.cuh"
#include "cuda/linear_gemm_fp8.cuh"
#include "cuda/linear_gemv.cuh"
#include "cuda/linear_gemv_fp8_wgmma.cuh"
#include "cuda/linear_tc.cuh"
#include "cuda/linear_tc_gemv.cuh"

namespace deepinfer::cuda {

namespace {

// The device pointer tables of one expert list, with the host copy they were built from: a list is
// rebuilt only when one of its pointers changed (a list is the model's, fixed after load; comparing
// the pointers on every call is cheaper than trusting an address the allocator may hand out again).
struct ExpertTable {
  std::vector<const void*> host;  // weights then scales
  void* device = nullptr;         // const uint8_t* [2 * E]
};

// The experts of every list must share one format, shape and layout (the kernel's table holds pointers
// only); checked when a table is built, not on every call (384 experts are a few thousand compares).
void check_experts(const std::vector<const std::vector<ops::QWeight>*>& lists) {
  const ops::QWeight& w0 = (*lists[0])[0];
  for (const std::vector<ops::QWeight>* list : lists) {
    DI_CHECK(list->size() == lists[0]->size(), "cuda::linear_grouped: lists of {} and {} experts", list->size(),
             lists[0]->size());
    for (const ops::QWeight& w : *list)
      DI_CHECK(w.w.defined() && w.w.device() == Device::kCUDA && w.w.dtype() == w0.w.dtype() &&
                   w.w.shape() == w0.w.shape() && w.w.strides() == w0.w.strides() && w.block == w0.block &&
                   w.scale.defined() == w0.scale.defined() &&
                   (!w.scale.defined() || (w.scale.device() == Device::kCUDA && w.scale.shape() == w0.scale.shape() &&
                                           w.scale.strides() == w0.scale.strides())),
               "cuda::linear_grouped: the experts differ in format, shape or device ({} vs {})", w.w.describe(),
               w0.w.describe());
    for (const ops::QWeight& w : *list)  // the kernel's 16-byte loads start at each table entry
      DI_CHECK(reinterpret_cast<uintptr_t>(w.w.raw()) % 16 == 0,
               "cuda::linear_grouped: expert weight {} is not 16-byte aligned", w.w.describe());
  }
}

// Device table of the lists' weight pointers (list by list) followed by their scale pointers.
// Whether the table's host copy still names exactly these lists' weights then scales (compared in place: building
// the list of 2 x 768 pointers first cost ~10 us of host time per call of the routed experts' w1 + w3).
bool table_matches(const ExpertTable& t, const std::vector<const std::vector<ops::QWeight>*>& lists) {
  size_t n = 0;
  for (const std::vector<ops::QWeight>* list : lists) n += list->size();
  if (t.host.size() != 2 * n) return false;
  size_t i = 0;
  for (const std::vector<ops::QWeight>* list : lists)
    for (const ops::QWeight& w : *list) {
      if (t.host[i] != w.w.raw() || t.host[n + i] != (w.scale.defined() ? w.scale.raw() : nullptr)) return false;
      ++i;
    }
  return true;
}

const uint8_t* const* expert_table(const std::vector<const std::vector<ops::QWeight>*>& lists) {
  static std::mutex mu;
  static std::map<std::vector<const void*>, ExpertTable> tables;  // keyed by each list's first weight
  std::vector<const void*> key;
  for (const std::vector<ops::QWeight>* list : lists) key.push_back((*list)[0].w.raw());
  std::lock_guard<std::mutex> lock(mu);
  ExpertTable& t = tables[key];
  if (!table_matches(t, lists)) {
    std::vector<const void*> want;
    for (const std::vector<ops::QWeight>* list : lists)
      for (const ops::QWeight& w : *list) want.push_back(w.w.raw());
    const size_t n = want.size();
    for (const std::vector<ops::QWeight>* list : lists)
      for (const ops::QWeight& w : *list) want.push_back(w.scale.defined() ? w.scale.raw() : nullptr);
    check_experts(lists);
    flush_deferred();
    if (t.device != nullptr) {
      DI_CUDA_CHECK(cudaDeviceSynchronize());  // a launch queued earlier may still read the old table
      DI_CUDA_CHECK(cudaFree(t.device));
      t.device = nullptr;
    }
    DI_CUDA_CHECK(cudaMalloc(&t.device, 2 * n * sizeof(void*)));
    DI_CUDA_CHECK(cudaMemcpy(t.device, want.data(), 2 * n * sizeof(void*), cudaMemcpyHostToDevice));
    t.host = std::move(want);
    bump_graph_epoch();  // captured launches name the old table
  }
  return static_cast<const uint8_t* const*>(t.device);
}

// The tensor-core contract's grouped GEMV (linear_tc_gemv.cu) on y [L R, N] where it takes the call: every expert of
// the lists linear_tc_supported on a row of x, their scale rows 4-byte aligned. False: nothing was launched.
bool tc_grouped_into(const Tensor& x, const Tensor& row_expert,
                     const std::vector<const std::vector<ops::QWeight>*>& lists, const uint8_t* const* table,
                     const ops::LinearOpts& opts, Tensor& y) {
  const ops::QWeight& w0 = (*lists[0])[0];
  const int64_t R = x.size(0), L = static_cast<int64_t>(lists.size()), E = static_cast<int64_t>(lists[0]->size());
  if (L * R > 65535 || !linear_tc_supported(x.slice(0, 0, 1), w0, opts)) return false;  // the experts share w0's layout
  bool sc4 = w0.scale.strides()[0] % 4 == 0;
  for (const std::vector<ops::QWeight>* list : lists)
    for (const ops::QWeight& w : *list) sc4 = sc4 && reinterpret_cast<uintptr_t>(w.scale.raw()) % 4 == 0;
  const bool fp4 = w0.w.dtype() == DType::kE2M1x2;
  TcGemvArgs g{};
  g.ldw = fp4 ? w0.in() / 2 : w0.w.strides()[0], g.lds = w0.scale.strides()[0], g.sc4 = sc4, g.fp4 = fp4;
  g.B = fp4 ? 32 : static_cast<int>(w0.block), g.N = static_cast<int>(w0.out()), g.K = static_cast<int>(w0.in());
  g.M = static_cast<int>(L * R), g.act = static_cast<int>(opts.act_quant_block);
  g.fsteps = fp4 ? 1 : static_cast<int>(std::gcd(opts.act_quant_block, w0.block) / 32);
  g.x = x.data<float>(), g.ldx = x.strides()[0], g.y = y.data<float>(), g.round = opts.round_out_bf16;
  g.row_expert = row_expert.data<int32_t>(), g.w_table = table, g.s_table = table + L * E;
  g.x_rows = static_cast<int>(R), g.n_experts = static_cast<int>(E);
  if (tc_stream_takes(g, nullptr)) {  // one token's experts: the TMA-fed stream (linear_tc_stream.cu)
    tc_stream_into(g, nullptr);
    return true;
  }
  if (!tc_gemv_takes(g)) return false;
  tc_gemv_into(g, nullptr);
  return true;
}

// From how many grouped rows (sorted by expert) the tensor-core contract takes its GEMM kernel instead of the
// row-by-row GEMV: each expert's weight is then read once per tile of its rows (DEEPINFER_CUDA_TC_GROUPED_ROWS).
int64_t tc_grouped_gemm_rows() {
  static const int64_t rows = env_int("DEEPINFER_CUDA_TC_GROUPED_ROWS", 1);
  return rows;
}

// Whether the GEMM kernel takes grouped rows on these lists: linear_tc's layout for the first expert (the others
// share it) and 4-byte aligned FP4 scale rows in every expert (its 4-byte copies).
bool tc_grouped_gemm_takes(const Tensor& x, const std::vector<const std::vector<ops::QWeight>*>& lists,
                           const ops::LinearOpts& opts) {
  const ops::QWeight& w0 = (*lists[0])[0];
  if (static_cast<int64_t>(lists.size()) * x.size(0) >= (int64_t{1} << 30) || !linear_tc_supported(x, w0, opts))
    return false;
  if (w0.w.dtype() != DType::kE2M1x2) return true;
  for (const std::vector<ops::QWeight>* list : lists)
    for (const ops::QWeight& w : *list)
      if (reinterpret_cast<uintptr_t>(w.scale.raw()) % 4 != 0) return false;
  return true;
}

void check_grouped_args(const Tensor& x, const Tensor& row_expert,
                        const std::vector<const std::vector<ops::QWeight>*>& lists, const char* op) {
  DI_CHECK(x.defined() && x.device() == Device::kCUDA && x.dtype() == DType::kF32 && x.dim() == 2 && x.is_contiguous(),
           "{}: x must be a contiguous float32 [R, K] CUDA tensor, got {}", op,
           x.defined() ? x.describe() : std::string("(undefined)"));
  DI_CHECK(row_expert.defined() && row_expert.device() == Device::kCUDA && row_expert.dtype() == DType::kI32 &&
               row_expert.dim() == 1 && row_expert.size(0) == x.size(0) && row_expert.is_contiguous(),
           "{}: row_expert must be int32 [{}] on CUDA, got {}", op, x.size(0),
           row_expert.defined() ? row_expert.describe() : std::string("(undefined)"));
  DI_CHECK(!lists.empty() && !lists[0]->empty(), "{}: no experts", op);
  DI_CHECK(x.size(1) == (*lists[0])[0].in(), "{}: x {} for experts of in = {}", op, x.describe(), (*lists[0])[0].in());
}

}  // namespace

void linear_tc_grouped_into(const Tensor& x, const Tensor& row_expert,
                            const std::vector<const std::vector<ops::QWeight>*>& lists, const ops::LinearOpts& opts,
                            Tensor& y) {
  const char* op = "cuda::linear_tc_grouped";
  check_grouped_args(x, row_expert, lists, op);
  const uint8_t* const* table = expert_table(lists);
  const ops::QWeight& w0 = (*lists[0])[0];
  const int64_t rows = static_cast<int64_t>(lists.size()) * x.size(0);
  check_linear_out(y, rows, w0.out(), op);
  if (x.size(0) == 0 || w0.out() == 0) return;
  DI_CHECK(tc_grouped_into(x, row_expert, lists, table, opts, y),
           "{}: the tensor-core GEMV does not take x {}, experts {}", op, x.describe(), w0.w.describe());
}

Tensor linear_tc_grouped(const Tensor& x, const Tensor& row_expert,
                         const std::vector<const std::vector<ops::QWeight>*>& lists, const ops::LinearOpts& opts) {
  DI_CHECK(!lists.empty() && !lists[0]->empty() && x.defined() && x.dim() == 2,
           "cuda::linear_tc_grouped: expected x [R, K] and at least one expert");
  Tensor y =
      Tensor::empty({static_cast<int64_t>(lists.size()) * x.size(0), (*lists[0])[0].out()}, DType::kF32, Device::kCUDA);
  linear_tc_grouped_into(x, row_expert, lists, opts, y);
  return y;
}

Tensor linear_tc_grouped_gemm(const Tensor& x, const Tensor& row_expert,
                              const std::vector<const std::vector<ops::QWeight>*>& lists, const ops::LinearOpts& opts) {
  const char* op = "cuda::linear_tc_grouped_gemm";
  check_grouped_args(x, row_expert, lists, op);
  const uint8_t* const* table = expert_table(lists);
  const ops::QWeight& w0 = (*lists[0])[0];
  const int64_t L = static_cast<int64_t>(lists.size()), E = static_cast<int64_t>(lists[0]->size());
  DI_CHECK(tc_grouped_gemm_takes(x, lists, opts), "{}: the tensor-core GEMM does not take x {}, experts {}", op,
           x.describe(), w0.w.describe());
  Tensor y = Tensor::empty({L * x.size(0), w0.out()}, DType::kF32, Device::kCUDA);
  linear_tc_grouped_gemm_into(x, row_expert, table, table + L * E, static_cast<int>(L), static_cast<int>(E), w0, opts,
                              y);
  return y;
}

Tensor linear_grouped(const Tensor& x, const Tensor& row_expert,
                      const std::vector<const std::vector<ops::QWeight>*>& lists, const ops::LinearOpts& opts,
                      int64_t tile_rows, int64_t row_period) {
  const char* op = "cuda::linear_grouped";
  check_grouped_args(x, row_expert, lists, op);
  const ops::QWeight& w0 = (*lists[0])[0];
  const int64_t R = x.size(0), N = w0.out(), K = w0.in(), L = static_cast<int64_t>(lists.size());
  const int64_t E = static_cast<int64_t>(lists[0]->size());
  const uint8_t* const* table = expert_table(lists);  // (checks that the experts share one layout)
  Tensor y = Tensor::empty({L * R, N}, DType::kF32, Device::kCUDA);
  if (R == 0 || N == 0) return y;
  // DEEPINFER_CUDA_GEMM=tc: the tensor-core contract here too (a row's bits as linear_tc on its expert), where it can.
  // Lists of one matrix (the shared expert's w1 / w3): a dense call per list, so that each weight is read once for all
  // the rows; otherwise the grouped GEMV, one row of x per pass over its expert.
  if (tc_from_rows() == 0 && opts.act_quant_block > 0) {
    bool dense = E == 1;
    for (const std::vector<ops::QWeight>* list : lists) dense = dense && linear_tc_supported(x, (*list)[0], opts);
    if (dense) {
      for (int64_t l = 0; l < L; ++l) {
        Tensor yl = y.slice(0, l * R, (l + 1) * R);
        linear_tc_into(x, (*lists[static_cast<size_t>(l)])[0], opts, yl);
      }
      return y;
    }
    if (E > 1 && tile_rows > 0 && R >= tc_grouped_gemm_rows() && tc_grouped_gemm_takes(x, lists, opts)) {
      linear_tc_grouped_gemm_into(x, row_expert, table, table + L * E, static_cast<int>(L), static_cast<int>(E), w0,
                                  opts, y);
      return y;
    }
    if (E > 1 && tc_grouped_into(x, row_expert, lists, table, opts, y)) return y;
  }

  const WeightLayout wl = weight_layout(w0, op);  // the experts share it (check_experts)
  // Under gemv_set_fp8_variant(7) (fp8_wgmma_gemv, not yet measured): lists of one matrix (the shared expert's w1 / w3)
  // as a dense call each, which cuda::linear hands to the GEMV (and so to that kernel) where it takes them.
  if (E == 1 && w0.w.dtype() == DType::kE4M3 && gemv_fp8_variant() == 7) {
    for (int64_t l = 0; l < L; ++l) {
      Tensor yl = y.slice(0, l * R, (l + 1) * R);
      linear_into(x, (*lists[static_cast<size_t>(l)])[0], opts, yl);
    }
    return y;
  }
  // Matrices that repeat with a period (wo_a's groups, the shared expert's w1 / w3) with enough rows each: the tiled
  // E4M3 GEMM over all of them in one launch (linear_gemm_fp8.cuh), the same bits as the GEMV.
  if (w0.w.dtype() == DType::kE4M3 && row_period > 0 && R % row_period == 0 && L * row_period <= 65535 &&
      fp8_gemm_takes(R / row_period, R, wl.B, K)) {
    const Tensor xq = fp8_gemm_x(x, opts.act_quant_block, nullptr);
    Fp8GemmGroups g;
    g.table = table, g.row_expert = row_expert.data<int32_t>();
    g.L = static_cast<int>(L), g.E = static_cast<int>(E), g.P = static_cast<int>(row_period), g.R = static_cast<int>(R);
    fp8_gemm_grouped_into(g, wl.ldw, wl.lds, wl.B, static_cast<int>(N), static_cast<int>(K), xq.data<float>(),
                          y.data<float>(), opts.round_out_bf16, nullptr);
    return y;
  }
  // FP4 rows sorted by expert (the MoE promises it through tile_rows) with enough rows per expert on average (prefill
  // chunks): the tiled FP4 GEMM over every expert in one launch (linear_gemm_fp4.cuh), each expert's weight decoded
  // once per 16 of its rows instead of read once per 1-4; the same bits as the GEMV.
  if (w0.w.dtype() == DType::kE2M1x2 && tile_rows > 0 && E > 1 && E <= 65535 && L <= 65535 &&
      fp4_gemm_takes(R / E, R, K)) {
    const Tensor xq = fp4_gemm_x(x, opts.act_quant_block, nullptr);
    const Tensor off = call_scratch(static_cast<size_t>(E + 1) * sizeof(int32_t));
    int32_t* offsets = static_cast<int32_t*>(off.raw());
    expert_offsets_into(row_expert.data<int32_t>(), static_cast<int>(R), static_cast<int>(E), offsets, nullptr);
    Fp4GemmGroups g;
    g.table = table, g.offsets = offsets;
    g.L = static_cast<int>(L), g.E = static_cast<int>(E), g.R = static_cast<int>(R);
    fp4_gemm_grouped_into(g, wl.ldw, wl.lds, static_cast<int>(N), static_cast<int>(K), xq.data<float>(),
                          y.data<float>(), opts.round_out_bf16, nullptr);
    return y;
  }
  GemvArgs a;
  a.fmt = wl.fmt, a.B = wl.B, a.ldw = wl.ldw, a.lds = wl.lds;
  a.w = nullptr, a.scale = nullptr;
  a.N = static_cast<int>(N), a.K = static_cast<int>(K);
  a.x = x.data<float>(), a.ldx = K, a.M = static_cast<int>(L * R);
  a.act_quant_block = opts.act_quant_block, a.round = opts.round_out_bf16;
  a.y = y.data<float>();
  a.row_expert = row_expert.data<int32_t>();
  a.w_table = table, a.s_table = table + L * E;
  a.x_rows = static_cast<int>(R), a.n_experts = static_cast<int>(E);
  a.tile_rows = static_cast<int>(std::min<int64_t>(tile_rows, 4));  // launch_fp4_pair takes 1..4
  DI_CHECK(row_period >= 0 && (row_period == 0 || R % row_period == 0), "{}: row period {} for {} rows", op, row_period,
           R);
  a.row_period = static_cast<int>(row_period);
  if (gemv_supported(a)) {
    gemv_into(a, nullptr);
    return y;
  }
  // A shape the grouped kernel does not take: the expert of each row on the host, one linear per run.
  const Tensor ids = row_expert.to(Device::kCPU);
  const int32_t* ip = ids.data<int32_t>();
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t r0 = 0; r0 < R;) {
      const int64_t e = ip[r0];
      DI_CHECK(e >= 0 && e < E, "{}: row {} names expert {} outside [0, {})", op, r0, e, E);
      int64_t r1 = r0 + 1;
      while (r1 < R && ip[r1] == e) ++r1;
      Tensor yr = y.slice(0, l * R + r0, l * R + r1);
      linear_into(x.slice(0, r0, r1), (*lists[l])[e], opts, yr);
      r0 = r1;
    }
  }
  return y;
}

namespace {

// The block-diagonal call's GemvArgs (y filled by the caller), or why it does not apply.
std::string groups_exact_args(const Tensor& x, const ops::QWeight& w, int64_t groups, const ops::LinearOpts& opts,
                              GemvArgs& a) {
  if (gemv_fp8_variant() != 7) return "not under gemv_set_fp8_variant(7)";
  if (!x.defined() || x.device() != Device::kCUDA || x.dtype() != DType::kF32 || x.dim() != 2 || x.strides()[1] != 1)
    return "x is not a 2-D float32 CUDA tensor with dense rows";
  if (!w.w.defined() || w.w.device() != Device::kCUDA || w.w.dtype() != DType::kE4M3 || w.w.dim() != 2 || w.block != 32)
    return "the weight is not a CUDA E4M3 matrix with tiles of 32";
  if (groups < 1 || x.size(1) != groups * w.w.size(1) || w.w.size(0) % groups != 0)
    return "x is not [M, groups K] for a weight [groups N, K]";
  const WeightLayout l = weight_layout(w, "cuda::linear_groups_exact");
  a.fmt = l.fmt, a.w = static_cast<const uint8_t*>(w.w.raw()), a.ldw = l.ldw, a.scale = l.scale, a.lds = l.lds;
  a.B = l.B, a.N = static_cast<int>(w.w.size(0)), a.K = static_cast<int>(w.w.size(1));
  a.x = x.data<float>(), a.ldx = x.strides()[0], a.M = static_cast<int>(x.size(0));
  a.act_quant_block = static_cast<int>(opts.act_quant_block), a.round = opts.round_out_bf16;
  a.y = reinterpret_cast<float*>(uintptr_t{256});  // a placeholder for the check: the caller's y
  if (!gemv_fp8_wgmma_groups_supported(a, static_cast<int>(groups))) return "fp8_wgmma_gemv does not take the call";
  return std::string();
}

}  // namespace

bool linear_groups_exact_supported(const Tensor& x, const ops::QWeight& w, int64_t groups,
                                   const ops::LinearOpts& opts) {
  GemvArgs a;
  return groups_exact_args(x, w, groups, opts, a).empty();
}

Tensor linear_groups_exact(const Tensor& x, const ops::QWeight& w, int64_t groups, const ops::LinearOpts& opts) {
  GemvArgs a;
  const std::string why = groups_exact_args(x, w, groups, opts, a);
  DI_CHECK(why.empty(), "cuda::linear_groups_exact: {}", why);
  Tensor y = Tensor::empty({x.size(0), w.w.size(0)}, DType::kF32, Device::kCUDA);
  a.y = y.data<float>();
  gemv_fp8_wgmma_groups_into(a, static_cast<int>(groups), current_stream());
  return y;
}

}  // namespace deepinfer::cuda
