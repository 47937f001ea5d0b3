// The op layer's dispatch: each op runs the kernel of the device its tensors live on. A CUDA tensor
// reaching an op that has no CUDA kernel yet is an error that names the op, never a silent copy.
#include "ops/ops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/env.h"
#include "cpu/cpu_ops.h"
#include "deepinfer/error.h"
#include "sampling/sampler.h"
#if DEEPINFER_HAS_CUDA
#include "cuda/attention.cuh"
#include "cuda/attn_inputs.cuh"
#include "cuda/device.h"
#include "cuda/graph.h"
#include "cuda/hc.cuh"
#include "cuda/linear.cuh"
#include "cuda/linear_tc_bf16.cuh"
#include "cuda/model_ops.cuh"
#include "cuda/quant.cuh"
#include "cuda/rms_norm.cuh"
#include "cuda/rope.cuh"
#include "cuda/sampling.cuh"
#include "cuda/topk.cuh"
#endif

namespace deepinfer::ops {

namespace {

// DEEPINFER_OP_PROFILE=1: every op call synchronises its device before and after and adds the wall time
// to a per-op total, printed at exit (what a decode step spends where; it slows the run down, and a
// small op reads its launch latency and the host's work too).
// DEEPINFER_OP_PROFILE=gpu: CUDA ops are bracketed by two events on the stream instead, without any
// synchronisation, so the run keeps its pace and each row is the GPU time between the op's first and
// last kernel (an op nested in another is counted in both). The times are read in batches.
// DEEPINFER_OP_PROFILE=host: the host's own time in each op (its checks, allocations and launches), without any
// synchronisation: where a decode step's host side goes when it bounds the step.
struct OpProfile {
  struct Row {
    double seconds = 0;
    int64_t calls = 0;
  };
  struct Pending {
    std::string label;
    int e0, e1;
  };
  OpProfile(bool gpu, bool host) : gpu_events(gpu), host_only(host) {}
  const bool gpu_events, host_only;
  std::mutex mu;
  std::map<std::string, Row> rows;
  std::vector<Pending> pending;  // gpu mode: event pairs not read yet
  // Reads the pending event pairs into the rows (keep = false: drops them). Caller holds mu.
  void drain(bool keep) {
#if DEEPINFER_HAS_CUDA
    if (keep)
      for (const Pending& q : pending) {
        Row& r = rows[q.label];
        r.seconds += cuda::op_event_ms(q.e0, q.e1) * 1e-3;
        ++r.calls;
      }
    if (!pending.empty()) cuda::op_events_reset();
#else
    (void)keep;
#endif
    pending.clear();
  }
  ~OpProfile() {
    try {
      drain(true);
    } catch (...) {
    }
    if (rows.empty()) return;
    double total = 0;
    for (const auto& [name, r] : rows) total += r.seconds;
    std::fprintf(stderr, "op profile (DEEPINFER_OP_PROFILE=%s): %.3f s %s\n%-28s %10s %12s %10s %7s\n",
                 gpu_events  ? "gpu"
                 : host_only ? "host"
                             : "1",
                 total,
                 gpu_events  ? "of GPU time in ops"
                 : host_only ? "of host time in ops"
                             : "in ops",
                 "op", "calls", "total ms", "us/call", "share");
    for (const auto& [name, r] : rows)
      std::fprintf(stderr, "%-28s %10lld %12.3f %10.2f %6.1f%%\n", name.c_str(), static_cast<long long>(r.calls),
                   r.seconds * 1e3, r.seconds * 1e6 / std::max<int64_t>(1, r.calls), 100.0 * r.seconds / total);
  }
};

OpProfile* op_profile();

#if DEEPINFER_HAS_CUDA
// gpu mode: the last event pairs are read at exit by an atexit handler, registered at the first CUDA op
// (after the CUDA runtime registered its own teardown, so it runs before it).
void drain_op_profile_at_exit() {
  if (OpProfile* p = op_profile()) {
    try {
      std::lock_guard<std::mutex> lock(p->mu);
      p->drain(true);
    } catch (...) {
    }
  }
}
#endif

OpProfile* op_profile() {
  static OpProfile* p = [] {
    const std::string v = env_value("DEEPINFER_OP_PROFILE");
    return v == "1"      ? new OpProfile(false, false)
           : v == "gpu"  ? new OpProfile(true, false)
           : v == "host" ? new OpProfile(false, true)
                         : nullptr;
  }();
  static std::unique_ptr<OpProfile> owner(p);
  return p;
}

class OpScope {
 public:
  OpScope(const char* name, const Tensor& t) : prof_(op_profile()) {
    if (!prof_) return;
    label_ = name;
    device_ = t.defined() ? t.device() : Device::kCPU;
#if DEEPINFER_HAS_CUDA
    if (prof_->gpu_events) {
      if (device_ == Device::kCUDA) {
        e0_ = cuda::op_event_record();
        // Registered after the event pool exists, so that the handler runs before the pool is destroyed.
        static const bool registered = std::atexit(drain_op_profile_at_exit) == 0;
        (void)registered;
      }
      return;
    }
#endif
    if (!prof_->host_only) synchronize(device_);
    t0_ = std::chrono::steady_clock::now();
  }
  ~OpScope() {
    if (!prof_) return;
    const std::string label = label_ + (device_ == Device::kCUDA ? " (cuda)" : "");
    if (prof_->gpu_events) {
#if DEEPINFER_HAS_CUDA
      if (e0_ < 0) return;  // a CPU op: not timed in this mode
      try {
        const int e1 = cuda::op_event_record();
        std::lock_guard<std::mutex> lock(prof_->mu);
        prof_->pending.push_back({label, e0_, e1});
        if (prof_->pending.size() >= 4096) prof_->drain(true);
      } catch (...) {
      }
#endif
      return;
    }
    try {
      if (!prof_->host_only) synchronize(device_);
    } catch (...) {
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    std::lock_guard<std::mutex> lock(prof_->mu);
    auto& r = prof_->rows[label];
    r.seconds += dt;
    ++r.calls;
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;
  // With the profile on, the op's row is split by a detail (linear: the weight's shape and format).
  template <class F>
  void detail(F&& f) {
    if (!prof_) return;
    label_ += ' ';
    label_ += f();
  }

 private:
  std::string label_;
  OpProfile* prof_;
  Device device_ = Device::kCPU;
  int e0_ = -1;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

void reset_op_profile() {
  if (OpProfile* p = op_profile()) {
    std::lock_guard<std::mutex> lock(p->mu);
    p->drain(false);
    p->rows.clear();
  }
}

namespace {

[[noreturn]] void no_kernel(const char* op, const Tensor& t) {
  fail("ops::{}: no {} kernel for {} (this op runs on the CPU only so far)", op, device_name(t.device()), t.describe());
}
bool on_cuda(const Tensor& t) { return t.defined() && t.device() == Device::kCUDA; }
}  // namespace

bool device_available(Device d) {
  if (d == Device::kCPU) return true;
#if DEEPINFER_HAS_CUDA
  return cuda::device_count() > 0;
#else
  return false;
#endif
}

void init_device(Device d) {
  if (d == Device::kCPU) return;
#if DEEPINFER_HAS_CUDA
  cuda::init();
#else
  fail("device cuda: this build of deepinfer has no CUDA backend (nvcc was not found when it was configured)");
#endif
}

void synchronize(Device d) {
  if (d == Device::kCPU) return;
#if DEEPINFER_HAS_CUDA
  cuda::synchronize();
#endif
}

bool graphs_enabled(Device d, int64_t rows) {
  if (d != Device::kCUDA || op_profile() != nullptr) return false;
  static const bool on = env_switch("DEEPINFER_CUDA_GRAPHS", 1) == 1;
  static const int64_t max_rows = env_int("DEEPINFER_CUDA_GRAPH_MAX_BATCH", 0);
  return on && rows >= 1 && rows <= max_rows;
}

struct SegmentGraphs::Impl {
#if DEEPINFER_HAS_CUDA
  std::unique_ptr<cuda::SegmentGraphs> cuda;
#endif
};

SegmentGraphs::SegmentGraphs(Device d) : impl_(std::make_unique<Impl>()) {
#if DEEPINFER_HAS_CUDA
  if (d == Device::kCUDA) impl_->cuda = std::make_unique<cuda::SegmentGraphs>();
#else
  (void)d;
#endif
}
SegmentGraphs::~SegmentGraphs() = default;

bool SegmentGraphs::begin_step(int64_t bucket) {
#if DEEPINFER_HAS_CUDA
  if (impl_->cuda) return impl_->cuda->begin_step(bucket);
#endif
  (void)bucket;
  return false;
}

std::vector<Tensor> SegmentGraphs::run(int64_t key, const std::vector<Tensor>& inputs, const SegmentFn& fn) {
#if DEEPINFER_HAS_CUDA
  if (impl_->cuda) return impl_->cuda->run(key, inputs, fn);
#endif
  (void)key;
  return fn(inputs);
}

Tensor SegmentGraphs::input_buffer(int64_t key, size_t i) const {
#if DEEPINFER_HAS_CUDA
  if (impl_->cuda) return impl_->cuda->input_buffer(key, i);
#endif
  (void)key, (void)i;
  return Tensor();
}

void SegmentGraphs::end_step() {
#if DEEPINFER_HAS_CUDA
  if (impl_->cuda) impl_->cuda->end_step();
#endif
}

void SegmentGraphs::abort_step() {
#if DEEPINFER_HAS_CUDA
  if (impl_->cuda) impl_->cuda->abort_step();
#endif
}

SegmentGraphs::AbortGuard::~AbortGuard() {
  try {
    if (graphs != nullptr) graphs->abort_step();
  } catch (...) {  // a destructor does not throw (the device is lost if this fails)
  }
}

SegmentGraphs::Stats SegmentGraphs::stats() const {
  Stats s;
#if DEEPINFER_HAS_CUDA
  if (impl_->cuda) {
    const cuda::GraphStats& c = impl_->cuda->stats();
    s.captures = c.captures, s.replays = c.replays, s.eager = c.eager, s.failures = c.failures;
    s.spans_merged = c.spans_merged, s.spans_split = c.spans_split;
  }
#endif
  return s;
}

DevicePositions::DevicePositions(const int64_t* host, int64_t rows, const Tensor& device) {
  if (!on_cuda(device)) return;
  DI_CHECK(device.dtype() == DType::kI64 && device.dim() == 1 && device.size(0) == rows && device.is_contiguous(),
           "DevicePositions: expected int64 [{}] on the device, got {}", rows, device.describe());
#if DEEPINFER_HAS_CUDA
  const cuda::BoundPositions prev = cuda::bind_positions({host, rows, device.data<int64_t>()});
  prev_host_ = prev.host, prev_rows_ = prev.rows, prev_device_ = prev.device;
  bound_ = true;
#endif
}
DevicePositions::~DevicePositions() {
#if DEEPINFER_HAS_CUDA
  if (bound_) cuda::bind_positions({prev_host_, prev_rows_, prev_device_});
#endif
}

struct SideWork::Impl {
#if DEEPINFER_HAS_CUDA
  std::unique_ptr<cuda::SideScope> scope;
#endif
};

SideWork::SideWork(Device d, std::vector<Tensor> reads, bool on) : impl_(std::make_unique<Impl>()) {
#if DEEPINFER_HAS_CUDA
  if (on && d == Device::kCUDA) impl_->scope = std::make_unique<cuda::SideScope>(std::move(reads));
#else
  (void)d;
  (void)reads;
  (void)on;
#endif
}
SideWork::~SideWork() = default;
void SideWork::done(const std::vector<Tensor>& writes) {
#if DEEPINFER_HAS_CUDA
  if (impl_->scope) impl_->scope->done(writes);
#else
  (void)writes;
#endif
}

bool linear_tc_mode(Device d) {
#if DEEPINFER_HAS_CUDA
  return d == Device::kCUDA && cuda::tc_from_rows() == 0;
#else
  (void)d;
  return false;
#endif
}

bool linear_grouped_tiled(Device d) { return d == Device::kCUDA; }

Tensor linear_groups_tc(const Tensor& x, const QWeight& w, int64_t groups, const LinearOpts& opts) {
#if DEEPINFER_HAS_CUDA
  if (linear_tc_mode(x.device()) && cuda::linear_tc_groups_supported(x, w, groups, opts))
    return cuda::linear_tc_groups(x, w, groups, opts);
#else
  (void)w, (void)groups, (void)opts;
#endif
  return Tensor();
}

Tensor linear_groups_exact(const Tensor& x, const QWeight& w, int64_t groups, const LinearOpts& opts) {
#if DEEPINFER_HAS_CUDA
  if (x.defined() && x.device() == Device::kCUDA && !linear_tc_mode(x.device()) &&
      cuda::linear_groups_exact_supported(x, w, groups, opts))
    return cuda::linear_groups_exact(x, w, groups, opts);
#else
  (void)x, (void)w, (void)groups, (void)opts;
#endif
  return Tensor();
}

void side_join(Device d) {
#if DEEPINFER_HAS_CUDA
  if (d == Device::kCUDA) cuda::side_join();
#else
  (void)d;
#endif
}

void rope_reserve(const RopeFreqs& f, int64_t rows, Device d) {
  if (d != Device::kCUDA) return;
#if DEEPINFER_HAS_CUDA
  cuda::rope_reserve(f, rows);
#else
  (void)f;
  (void)rows;
#endif
}

Tensor linear(const Tensor& x, const QWeight& w, const LinearOpts& opts) {
  OpScope scope("linear", x);
  scope.detail(
      [&] { return fmt::format("{}x{} {}{}", w.out(), w.in(), dtype_name(w.w.dtype()), x.size(0) > 1 ? " M>1" : ""); });
#if DEEPINFER_HAS_CUDA
  if (on_cuda(x)) return cuda::linear(x, w, opts);
#endif
  if (on_cuda(x)) no_kernel("linear", x);
  return cpu::linear(x, w, opts);
}

Tensor linear_grouped(const Tensor& x, const Tensor& row_expert, const std::vector<const std::vector<QWeight>*>& lists,
                      const LinearOpts& opts, int64_t tile_rows, int64_t row_period) {
  OpScope scope("linear_grouped", x);
  scope.detail([&] {
    if (lists.empty() || lists[0]->empty()) return std::string();
    const QWeight& w = (*lists[0])[0];
    return fmt::format("{}x{} {} x{}", w.out(), w.in(), dtype_name(w.w.dtype()), lists.size());
  });
#if DEEPINFER_HAS_CUDA
  if (on_cuda(x)) return cuda::linear_grouped(x, row_expert, lists, opts, tile_rows, row_period);
#endif
  if (on_cuda(x)) no_kernel("linear_grouped", x);
  (void)tile_rows, (void)row_period;  // CUDA scheduling hints
  return cpu::linear_grouped(x, row_expert, lists, opts);
}

Tensor linear_grouped(const Tensor& x, const Tensor& row_expert, const std::vector<QWeight>& experts,
                      const LinearOpts& opts, int64_t tile_rows, int64_t row_period) {
  return linear_grouped(x, row_expert, std::vector<const std::vector<QWeight>*>{&experts}, opts, tile_rows, row_period);
}

Tensor dequantize(const QWeight& w) {
  const OpScope scope("dequantize", w.w);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(w.w)) return cuda::dequantize(w);
#endif
  if (on_cuda(w.w)) no_kernel("dequantize", w.w);
  return cpu::dequantize(w);
}

void fake_quant_fp8(Tensor& x, int64_t col_begin, int64_t col_end, int64_t block) {
  const OpScope scope("fake_quant_fp8", x);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(x)) return cuda::fake_quant_fp8(x, col_begin, col_end, block);
#endif
  if (on_cuda(x)) no_kernel("fake_quant_fp8", x);
  cpu::fake_quant_fp8(x, col_begin, col_end, block);
}

void fake_quant_fp4(Tensor& x, int64_t block) {
  const OpScope scope("fake_quant_fp4", x);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(x)) return cuda::fake_quant_fp4(x, block);
#endif
  if (on_cuda(x)) no_kernel("fake_quant_fp4", x);
  cpu::fake_quant_fp4(x, block);
}

void fake_quant_fp4_e4m3_scale(Tensor& x, int64_t block) {
  const OpScope scope("fake_quant_fp4_e4m3_scale", x);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(x)) return cuda::fake_quant_fp4_e4m3_scale(x, block);
#endif
  if (on_cuda(x)) no_kernel("fake_quant_fp4_e4m3_scale", x);
  cpu::fake_quant_fp4_e4m3_scale(x, block);
}

void round_bf16(Tensor& x, bool enable) {
  const OpScope scope("round_bf16", x);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(x)) return cuda::round_bf16(x, enable);
#endif
  if (on_cuda(x)) no_kernel("round_bf16", x);
  cpu::round_bf16(x, enable);
}

Tensor rms_norm(const Tensor& x, const Tensor& w, float eps, bool round) {
  const OpScope scope("rms_norm", x);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(x)) return cuda::rms_norm(x, w, eps, round);
#endif
  if (on_cuda(x)) no_kernel("rms_norm", x);
  return cpu::rms_norm(x, w, eps, round);
}

void hadamard(Tensor& x, int64_t n, bool round) {
  const OpScope scope("hadamard", x);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(x)) return cuda::hadamard(x, n, round);
#endif
  if (on_cuda(x)) no_kernel("hadamard", x);
  cpu::hadamard(x, n, round);
}

RopeFreqs rope_freqs(int64_t rope_dim, double base, double factor, int64_t original_seq_len, double beta_fast,
                     double beta_slow) {
  return cpu::rope_freqs(rope_dim, base, factor, original_seq_len, beta_fast, beta_slow);  // a host-side table
}

void apply_rope(Tensor& x, int64_t head_width, int64_t rope_dim, const int64_t* positions, const RopeFreqs& f,
                bool inverse, bool round) {
  const OpScope scope("apply_rope", x);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(x)) return cuda::apply_rope(x, head_width, rope_dim, positions, f, inverse, round);
#endif
  if (on_cuda(x)) no_kernel("apply_rope", x);
  cpu::apply_rope(x, head_width, rope_dim, positions, f, inverse, round);
}

AttnInputs attn_input_norms(const Tensor& qa, const Tensor& q_w, const Tensor& kva, const Tensor& kv_w, float eps,
                            bool round, int64_t rope_dim, const int64_t* positions, const RopeFreqs& f,
                            int64_t quant_end, int64_t quant_block) {
  const OpScope scope("attn_input_norms", kva);
  // The shape rules of both backends here, so that a bad call names this op rather than one of its parts.
  auto name = [](const Tensor& t) { return t.defined() ? t.describe() : std::string("undefined"); };
  DI_CHECK(qa.defined() && kva.defined() && qa.dim() == 2 && kva.dim() == 2 && qa.dtype() == DType::kF32 &&
               kva.dtype() == DType::kF32 && qa.device() == kva.device() && qa.size(0) == kva.size(0),
           "ops::attn_input_norms: qa and kva must be float32 [T, q_lora] and [T, D] on one device, got {} and {}",
           name(qa), name(kva));
  const int64_t T = kva.size(0), D = kva.size(1);
  DI_CHECK(rope_dim >= 0 && rope_dim % 2 == 0 && rope_dim <= D && static_cast<int64_t>(f.freq.size()) * 2 == rope_dim,
           "ops::attn_input_norms: rope dim {} (table for {}) does not fit kv rows of {}", rope_dim, f.freq.size() * 2,
           D);
  DI_CHECK(quant_block <= 0 || (0 <= quant_end && quant_end <= D),
           "ops::attn_input_norms: quant columns [0, {}) out of range for kv rows of {}", quant_end, D);
  DI_CHECK(T == 0 || rope_dim == 0 || positions != nullptr, "ops::attn_input_norms: {} rows need positions", T);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(kva))
    return cuda::attn_input_norms(qa, q_w, kva, kv_w, eps, round, rope_dim, positions, f, quant_end, quant_block);
#endif
  if (on_cuda(kva)) no_kernel("attn_input_norms", kva);
  AttnInputs r{cpu::rms_norm(qa, q_w, eps, round), cpu::rms_norm(kva, kv_w, eps, round)};
  if (T > 0 && rope_dim > 0) cpu::apply_rope(r.kv, D, rope_dim, positions, f, false, round);
  if (quant_block > 0) cpu::fake_quant_fp8(r.kv, 0, quant_end, quant_block);
  return r;
}

HcMix hc_mixes(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, int64_t hc,
               int64_t sinkhorn_iters, float hc_eps, float norm_eps) {
  const OpScope scope("hc_mixes", stream);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(stream)) return cuda::hc_mixes(stream, fn, scale, base, hc, sinkhorn_iters, hc_eps, norm_eps);
#endif
  if (on_cuda(stream)) no_kernel("hc_mixes", stream);
  return cpu::hc_mixes(stream, fn, scale, base, hc, sinkhorn_iters, hc_eps, norm_eps);
}

Tensor hc_collapse(const Tensor& stream, const Tensor& pre, bool round) {
  const OpScope scope("hc_collapse", stream);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(stream)) return cuda::hc_collapse(stream, pre, round);
#endif
  if (on_cuda(stream)) no_kernel("hc_collapse", stream);
  return cpu::hc_collapse(stream, pre, round);
}

Tensor hc_collapse_norm(const Tensor& stream, const Tensor& pre, const Tensor& w, float eps, bool round) {
  const OpScope scope("hc_collapse_norm", stream);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(stream)) return cuda::hc_collapse_norm(stream, pre, w, eps, round);
#endif
  if (on_cuda(stream)) no_kernel("hc_collapse_norm", stream);
  return cpu::rms_norm(cpu::hc_collapse(stream, pre, round), w, eps, round);
}

Tensor hc_expand(const Tensor& y, const Tensor& stream, const Tensor& post, const Tensor& comb, bool round) {
  const OpScope scope("hc_expand", stream);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(stream)) return cuda::hc_expand(y, stream, post, comb, round);
#endif
  if (on_cuda(stream)) no_kernel("hc_expand", stream);
  return cpu::hc_expand(y, stream, post, comb, round);
}

Tensor hc_head(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, float hc_eps,
               float norm_eps, bool round) {
  const OpScope scope("hc_head", stream);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(stream)) return cuda::hc_head(stream, fn, scale, base, hc_eps, norm_eps, round);
#endif
  if (on_cuda(stream)) no_kernel("hc_head", stream);
  return cpu::hc_head(stream, fn, scale, base, hc_eps, norm_eps, round);
}

namespace {
// sparse_attention's de-rotation request (ops.h), checked once for both forms of the op.
void check_derotate(const Tensor& q, const AttnDerotate* derotate) {
  DI_CHECK(!derotate || (derotate->freqs && derotate->positions && q.defined() && q.dim() == 3 &&
                         derotate->rope_dim > 0 && derotate->rope_dim % 2 == 0 && derotate->rope_dim <= q.size(2)),
           "sparse_attention: the de-rotation needs positions, a table and an even rope_dim in (0, {}]",
           q.defined() && q.dim() == 3 ? q.size(2) : 0);
}
// The CPU attention's output through the de-rotation when asked (the CUDA kernels apply it themselves).
void cpu_derotate(Tensor& o, const AttnDerotate* derotate, bool round) {
  if (derotate) cpu::apply_rope(o, o.size(2), derotate->rope_dim, derotate->positions, *derotate->freqs, true, round);
}
}  // namespace

Tensor sparse_attention(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale,
                        bool bf16_probs, bool round, const AttnDerotate* derotate, const Tensor& out) {
  const OpScope scope("sparse_attention", q);
  check_derotate(q, derotate);
  if (out.defined())
    DI_CHECK(q.defined() && q.dim() == 3 && out.dtype() == DType::kF32 && out.is_contiguous() &&
                 out.device() == q.device() && out.numel() == q.numel(),
             "sparse_attention: out {} must be a contiguous float32 tensor of q's {} values on its device",
             out.describe(), q.defined() ? q.describe() : std::string("undefined"));
#if DEEPINFER_HAS_CUDA
  if (on_cuda(q)) {
    if (!out.defined()) return cuda::sparse_attention(q, kv, idx, sink, scale, bf16_probs, round, derotate);
    Tensor o = out.view(q.shape());
    cuda::sparse_attention_into(q, kv, idx, sink, scale, bf16_probs, round, o, nullptr, 0, derotate);
    return o;
  }
#endif
  if (on_cuda(q)) no_kernel("sparse_attention", q);
  Tensor o = cpu::sparse_attention(q, kv, idx, sink, scale, bf16_probs, round);
  cpu_derotate(o, derotate, round);
  if (!out.defined()) return o;
  Tensor dst = out.view(q.shape());
  std::copy(o.data<float>(), o.data<float>() + o.numel(), dst.data<float>());
  return dst;
}

namespace {

// A run of rows >= 0 at a non-null address, or a paged store with a power-of-two page size.
void check_segment(const RowSegment& s, const char* what) {
  if (s.paged()) {
    DI_CHECK(s.rows >= 0 && s.page_rows > 0 && (s.page_rows & (s.page_rows - 1)) == 0,
             "{}: a paged store of {} rows in pages of {}", what, s.rows, s.page_rows);
    return;
  }
  DI_CHECK(s.rows >= 0 && (s.rows == 0 || s.src != nullptr), "{}: a run of {} rows at {}", what, s.rows,
           static_cast<const void*>(s.src));
}

// Rows in all the segments.
int64_t segment_total(const std::vector<RowSegment>& segments, const char* what) {
  int64_t n = 0;
  for (const RowSegment& s : segments) {
    check_segment(s, what);
    n += s.rows;
  }
  return n;
}

// The address of every row of the runs laid end to end (width floats a row): what the *_segments ops read.
std::vector<const float*> segment_rows(const std::vector<RowSegment>& segments, int64_t width, const char* what) {
  std::vector<const float*> rows;
  for (const RowSegment& s : flat_runs(segments, what))
    for (int64_t r = 0; r < s.rows; ++r) rows.push_back(s.src + r * width);
  DI_CHECK(rows.size() < (size_t{1} << 31), "{}: {} rows", what, rows.size());
  return rows;
}

}  // namespace

std::vector<RowSegment> flat_runs(const std::vector<RowSegment>& segments, const char* what) {
  std::vector<RowSegment> runs;
  runs.reserve(segments.size());
  for (const RowSegment& s : segments) {
    check_segment(s, what);
    if (!s.paged()) {
      if (s.rows > 0) runs.push_back({s.src, s.rows});
      continue;
    }
    for (int64_t r = 0; r < s.rows; r += s.page_rows)
      runs.push_back({s.pages[r / s.page_rows], std::min(s.page_rows, s.rows - r)});
  }
  return runs;
}

Tensor sparse_attention_segments(const Tensor& q, const std::vector<RowSegment>& segments, const Tensor& idx,
                                 const Tensor& sink, float scale, bool bf16_probs, bool round,
                                 const AttnDerotate* derotate) {
  const OpScope scope("sparse_attention", q);
  DI_CHECK(q.defined() && q.dim() == 3 && q.device() == Device::kCPU && idx.device() == Device::kCPU &&
               sink.device() == Device::kCPU,
           "sparse_attention_segments: q, idx and sink must be CPU tensors (the CUDA kernels read one table), got q {}",
           q.defined() ? q.describe() : std::string("undefined"));
  check_derotate(q, derotate);
  const std::vector<const float*> rows = segment_rows(segments, q.size(2), "sparse_attention_segments");
  Tensor o = cpu::sparse_attention_rows(q, rows.data(), static_cast<int64_t>(rows.size()), idx, sink, scale, bf16_probs,
                                        round);
  cpu_derotate(o, derotate, round);
  return o;
}

int64_t topk(const float* scores, int64_t n, int64_t k, int32_t* out) { return cpu::topk(scores, n, k, out); }

Tensor topk_rows(const Tensor& scores, int64_t k, bool sort_by_index) {
  const OpScope scope("topk_rows", scores);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(scores)) return cuda::topk_rows(scores, k, sort_by_index);
#endif
  if (on_cuda(scores)) no_kernel("topk_rows", scores);
  return cpu::topk_rows(scores, k, sort_by_index);
}

Tensor candidate_blocks(const Tensor& scores, int64_t start_pos, int64_t ratio, int64_t block_size, int64_t keep) {
  const OpScope scope("candidate_blocks", scores);
  DI_CHECK(ratio >= 1 && block_size >= 1 && keep >= 0 && start_pos >= 0,
           "candidate_blocks: ratio {}, block_size {}, keep {}, start_pos {}", ratio, block_size, keep, start_pos);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(scores)) return cuda::candidate_blocks(scores, start_pos, ratio, block_size, keep);
#endif
  if (on_cuda(scores)) no_kernel("candidate_blocks", scores);
  return cpu::candidate_blocks(scores, start_pos, ratio, block_size, keep);
}

void mask_to_blocks(Tensor& scores, const Tensor& blocks, int64_t block_size) {
  const OpScope scope("mask_to_blocks", scores);
  DI_CHECK(block_size >= 1, "mask_to_blocks: block_size {}", block_size);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(scores)) return cuda::mask_to_blocks(scores, blocks, block_size);
#endif
  if (on_cuda(scores)) no_kernel("mask_to_blocks", scores);
  cpu::mask_to_blocks(scores, blocks, block_size);
}

namespace {
// ops::sparse_index's checks of one chunk (layout, picks, output).
void check_sparse_index(const IndexLayout& l, int64_t T, const Tensor& picks, Device device, const Tensor& into) {
  DI_CHECK(T >= 0 && l.start_pos >= 0 && l.window >= 1 && l.wcols >= 0 && l.kcols >= 0 && l.offset >= 0 &&
               (picks.defined() || l.kcols == 0 || l.ratio >= 1) && l.base >= 0 &&
               (l.width == 0 || l.width >= l.wcols + l.kcols),
           "sparse_index: T {}, start_pos {}, window {}, wcols {}, kcols {}, offset {}, ratio {}, base {}, width {}", T,
           l.start_pos, l.window, l.wcols, l.kcols, l.offset, l.ratio, l.base, l.width);
  DI_CHECK(!picks.defined() || (picks.device() == device && picks.dtype() == DType::kI32 && picks.dim() == 2 &&
                                picks.size(0) == T && picks.size(1) == l.kcols && picks.is_contiguous()),
           "sparse_index: picks {} are not contiguous int32 [{}, {}] on {}", picks.defined() ? picks.describe() : "", T,
           l.kcols, device_name(device));
  const int64_t width = l.width > 0 ? l.width : l.wcols + l.kcols;
  DI_CHECK(!into.defined() || (into.device() == device && into.dtype() == DType::kI32 && into.dim() == 2 &&
                               into.size(0) == T && into.size(1) == width && into.is_contiguous()),
           "sparse_index: output {} is not a contiguous int32 [{}, {}] on {}", into.defined() ? into.describe() : "", T,
           width, device_name(device));
  if (T > 0) {  // the window of row t grows with t: row 0 has the lowest start, row T-1 the most entries
    auto lo = [&](int64_t p) { return std::max<int64_t>({0, p - l.window + 1, l.floor}); };
    const int64_t last = l.start_pos + T - 1;
    DI_CHECK(l.wstart <= lo(l.start_pos) && last - lo(last) + 1 <= l.wcols,
             "sparse_index: window rows from {} (table from {}) and {} entries for {} columns", lo(l.start_pos),
             l.wstart, last - lo(last) + 1, l.wcols);
  }
}
}  // namespace

Tensor sparse_index(const IndexLayout& l, int64_t T, const Tensor& picks, Device device, const Tensor& into) {
  const OpScope scope("sparse_index", picks);
  check_sparse_index(l, T, picks, device, into);
#if DEEPINFER_HAS_CUDA
  if (device == Device::kCUDA) return cuda::sparse_index(l, T, picks, into);
#endif
  if (device != Device::kCPU) fail("ops::sparse_index: no {} kernel", device_name(device));
  return cpu::sparse_index(l, T, picks, into);
}

void sparse_index_many(const std::vector<IndexChunk>& chunks, Device device, const Tensor& into) {
  const OpScope scope("sparse_index_many", into);
  DI_CHECK(into.defined() && into.device() == device && into.dtype() == DType::kI32 && into.dim() == 2 &&
               into.is_contiguous(),
           "sparse_index_many: output {} is not a contiguous int32 [rows, width] on {}",
           into.defined() ? into.describe() : "", device_name(device));
  const int64_t width = into.size(1);
  int64_t rows = 0;
  for (const IndexChunk& k : chunks) {
    DI_CHECK(k.T >= 0 && (k.layout.width > 0 ? k.layout.width : k.layout.wcols + k.layout.kcols) == width,
             "sparse_index_many: a chunk of {} rows and width {} for lists of width {}", k.T, k.layout.width, width);
    check_sparse_index(k.layout, k.T, k.picks, device, into.slice(0, rows, std::min(rows + k.T, into.size(0))));
    rows += k.T;
  }
  DI_CHECK(rows == into.size(0), "sparse_index_many: {} chunk rows for {} list rows", rows, into.size(0));
#if DEEPINFER_HAS_CUDA
  if (device == Device::kCUDA) return cuda::sparse_index_many(chunks, into);
#endif
  if (device != Device::kCPU) fail("ops::sparse_index_many: no {} kernel", device_name(device));
  int64_t r = 0;
  for (const IndexChunk& k : chunks) {
    cpu::sparse_index(k.layout, k.T, k.picks, into.slice(0, r, r + k.T));
    r += k.T;
  }
}

Tensor index_scores(const Tensor& q, const Tensor& keys, const Tensor& w, const KeyVisibility& vis, bool round) {
  const OpScope scope("index_scores", q);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(q)) return cuda::index_scores(q, keys, w, vis, round);
#endif
  if (on_cuda(q)) no_kernel("index_scores", q);
  return cpu::index_scores(q, keys, w, vis, round);
}

Tensor index_scores_segments(const Tensor& q, const std::vector<RowSegment>& segments, const Tensor& w,
                             const KeyVisibility& vis, bool round, bool in_place) {
  DI_CHECK(q.defined() && q.dim() >= 2 && w.defined() && w.dim() == 2 && w.size(1) > 0 &&
               (q.size(0) == 0 || q.numel() % (q.size(0) * w.size(1)) == 0),
           "index_scores_segments: expected q [T, heads, d] and w [T, heads], got q {} w {}",
           q.defined() ? q.describe() : std::string("undefined"),
           w.defined() ? w.describe() : std::string("undefined"));
  const int64_t d = q.size(0) > 0 ? q.numel() / (q.size(0) * w.size(1)) : 0;
  if (q.device() != Device::kCPU) {
    const int64_t n = segment_total(segments, "index_scores_segments");
#if DEEPINFER_HAS_CUDA
    if (in_place && on_cuda(q)) {  // the decode kernel reads the keys where they are
      const OpScope scope("index_scores", q);
      const Tensor out = cuda::index_scores_runs(q, segments, d, w, vis, round);
      if (out.defined()) return out;
    }
#endif
    // The other calls (the CUDA prefill kernel reads one table: a block's queries share its keys) gather the runs
    // into one table (one launch).
    Tensor table = Tensor::empty({n, d}, DType::kF32, q.device());
    gather_segments(segments, table);
    return index_scores(q, table, w, vis, round);  // each op under its own profile scope
  }
  const OpScope scope("index_scores", q);
  const std::vector<const float*> rows = segment_rows(segments, d, "index_scores_segments");
  return cpu::index_scores_rows(q, rows.data(), static_cast<int64_t>(rows.size()), d, w, vis, round);
}

Routing moe_route(const Tensor& logits, const Tensor& bias, const Tensor& tid2eid, const Tensor& tokens, int64_t k,
                  const RouteOpts& opts) {
  const OpScope scope("moe_route", logits);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(logits)) return cuda::moe_route(logits, bias, tid2eid, tokens, k, opts);
#endif
  if (on_cuda(logits)) no_kernel("moe_route", logits);
  return cpu::moe_route(logits, bias, tid2eid, tokens, k, opts);
}

Tensor swiglu(const Tensor& g, const Tensor& u, const Tensor& weights, float limit, bool round, int64_t quant_block) {
  const OpScope scope("swiglu", g);
  DI_CHECK(quant_block >= 0, "swiglu: quant_block must be >= 0, got {}", quant_block);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(g)) return cuda::swiglu(g, u, weights, limit, round, quant_block);
#endif
  if (on_cuda(g)) no_kernel("swiglu", g);
  Tensor h = cpu::swiglu(g, u, weights, limit, round);
  if (quant_block > 0) cpu::fake_quant_fp8(h, 0, h.size(-1), quant_block);
  return h;
}

Tensor embedding(const Tensor& table, const Tensor& ids, int64_t copies) {
  const OpScope scope("embedding", table);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(table)) return cuda::embedding(table, ids, copies);
#endif
  if (on_cuda(table)) no_kernel("embedding", table);
  return cpu::embedding(table, ids, copies);
}

Tensor gather_rows(const Tensor& x, const Tensor& rows, int64_t quant_block) {
  const OpScope scope("gather_rows", x);
  DI_CHECK(quant_block >= 0 && (quant_block == 0 || x.dim() == 2),
           "gather_rows: quant_block {} needs x [N, width], got {}", quant_block, x.describe());
#if DEEPINFER_HAS_CUDA
  if (on_cuda(x)) return cuda::gather_rows(x, rows, quant_block);
#endif
  if (on_cuda(x)) no_kernel("gather_rows", x);
  Tensor out = cpu::gather_rows(x, rows);
  if (quant_block > 0) cpu::fake_quant_fp8(out, 0, out.size(1), quant_block);
  return out;
}

MoeGroups moe_group(const Tensor& ids, const Tensor& weights, int64_t n_experts, bool host_offsets) {
  const OpScope scope("moe_group", ids);
  (void)host_offsets;  // the CPU always has the offsets
#if DEEPINFER_HAS_CUDA
  if (on_cuda(ids)) return cuda::moe_group(ids, weights, n_experts, host_offsets);
#endif
  if (on_cuda(ids)) no_kernel("moe_group", ids);
  return cpu::moe_group(ids, weights, n_experts);
}

MoeDispatch moe_dispatch(const Tensor& logits, const Tensor& bias, const Tensor& tid2eid, const Tensor& tokens,
                         int64_t k, const RouteOpts& opts, int64_t n_experts, bool host_offsets, const Tensor& x_tokens,
                         int64_t quant_block) {
#if DEEPINFER_HAS_CUDA
  if (on_cuda(logits) && !host_offsets) {
    const OpScope scope("moe_dispatch", logits);  // the three ops below profile themselves
    MoeDispatch d = cuda::moe_dispatch(logits, bias, tid2eid, tokens, k, opts, n_experts, x_tokens, quant_block);
    if (d.routing.ids.defined()) return d;
  }
#endif
  MoeDispatch d;
  d.routing = moe_route(logits, bias, tid2eid, tokens, k, opts);
  d.groups = moe_group(d.routing.ids, d.routing.weights, n_experts, host_offsets);
  d.x = gather_rows(x_tokens, d.groups.rows, quant_block);
  return d;
}

Tensor moe_combine_expand(const Tensor& expert_out, const Tensor& slots, const Tensor& shared, const Tensor& stream,
                          const Tensor& post, const Tensor& comb, bool round) {
  const OpScope scope("moe_combine_expand", stream);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(stream)) return cuda::moe_combine_expand(expert_out, slots, shared, stream, post, comb, round);
#endif
  if (on_cuda(stream)) no_kernel("moe_combine_expand", stream);
  return cpu::hc_expand(cpu::moe_combine(expert_out, slots, shared, round), stream, post, comb, round);
}

Tensor moe_combine(const Tensor& expert_out, const Tensor& slots, const Tensor& shared, bool round) {
  const OpScope scope("moe_combine", shared);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(shared)) return cuda::moe_combine(expert_out, slots, shared, round);
#endif
  if (on_cuda(shared)) no_kernel("moe_combine", shared);
  return cpu::moe_combine(expert_out, slots, shared, round);
}

void scale(Tensor& x, float s, bool round) {
  const OpScope scope("scale", x);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(x)) return cuda::scale(x, s, round);
#endif
  if (on_cuda(x)) no_kernel("scale", x);
  cpu::scale(x, s, round);
}

void copy_into(const Tensor& dst, const Tensor& src) {
  const OpScope scope("copy_into", dst);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(dst)) return cuda::copy_into(dst, src);
#endif
  if (on_cuda(dst)) no_kernel("copy_into", dst);
  cpu::copy_into(dst, src);
}

void gather_segments(const std::vector<RowSegment>& segments, const Tensor& dst) {
  const OpScope scope("gather_segments", dst);
  const std::vector<RowSegment> runs = flat_runs(segments, "gather_segments");
  int64_t rows = 0;
  for (const RowSegment& s : runs) rows += s.rows;
  DI_CHECK(dst.defined() && dst.dim() == 2 && dst.dtype() == DType::kF32 && dst.is_contiguous() && dst.size(0) == rows,
           "gather_segments: {} rows of segments for {}", rows,
           dst.defined() ? dst.describe() : std::string("undefined"));
  const int64_t width = dst.size(1);
  std::vector<RowCopy> copies;
  int64_t r = 0;
  for (const RowSegment& s : runs) {
    copies.push_back({dst.data<float>() + r * width, s.src, s.rows});
    r += s.rows;
  }
  copy_rows(copies, width, dst.device());
}

void gather_listed(const std::vector<RowSegment>& segments, const Tensor& idx, const Tensor& dst) {
  const OpScope scope("gather_listed", dst);
  DI_CHECK(idx.defined() && idx.dim() == 2 && idx.dtype() == DType::kI32 && idx.is_contiguous() && dst.defined() &&
               dst.dim() == 2 && dst.dtype() == DType::kF32 && dst.is_contiguous() && dst.size(0) == idx.numel() &&
               dst.device() == idx.device() && idx.numel() < (int64_t{1} << 31),
           "gather_listed: expected idx int32 [R, K] and dst float32 [R K, width] (contiguous, one device), got idx {} "
           "dst {}",
           idx.defined() ? idx.describe() : std::string("undefined"),
           dst.defined() ? dst.describe() : std::string("undefined"));
  const int64_t n = segment_total(segments, "gather_listed");
  DI_CHECK(n < (int64_t{1} << 31), "gather_listed: {} rows in the runs", n);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(dst)) return cuda::gather_listed(segments, idx, dst);
#endif
  if (on_cuda(dst)) no_kernel("gather_listed", dst);
  const int64_t width = dst.size(1);
  const std::vector<const float*> rows = segment_rows(segments, width, "gather_listed");
  int32_t* list = idx.data<int32_t>();
  for (int64_t e = 0; e < idx.numel(); ++e)  // every entry checked before any is rewritten
    DI_CHECK(list[e] < n, "gather_listed: entry {} names row {} of a table of {} rows", e, list[e], n);
  for (int64_t e = 0; e < idx.numel(); ++e) {
    const int32_t j = list[e];
    if (j < 0) {
      list[e] = -1;
      continue;
    }
    std::memcpy(dst.data<float>() + e * width, rows[static_cast<size_t>(j)],
                static_cast<size_t>(width) * sizeof(float));
    list[e] = static_cast<int32_t>(e);
  }
}

void copy_rows(const std::vector<RowCopy>& copies, int64_t width, Device device) {
  DI_CHECK(width >= 0, "copy_rows: width {}", width);
  for (const RowCopy& c : copies)
    DI_CHECK(c.rows >= 0 && (c.rows == 0 || (c.src != nullptr && c.dst != nullptr)),
             "copy_rows: a copy of {} rows from {} to {}", c.rows, static_cast<const void*>(c.src),
             static_cast<const void*>(c.dst));
#if DEEPINFER_HAS_CUDA
  if (device == Device::kCUDA) return cuda::copy_rows(copies, width);
#endif
  if (device == Device::kCUDA) fail("ops::copy_rows: no cuda kernel in this build");
  for (const RowCopy& c : copies)
    if (c.rows > 0) std::memcpy(c.dst, c.src, static_cast<size_t>(c.rows * width) * sizeof(float));
}

Tensor compress_pool(const Tensor& kv, const Tensor& score, const Tensor& ape, int64_t ratio, int64_t d, bool overlap,
                     bool has_prev) {
  const OpScope scope("compress_pool", kv);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(kv)) return cuda::compress_pool(kv, score, ape, ratio, d, overlap, has_prev);
#endif
  if (on_cuda(kv)) no_kernel("compress_pool", kv);
  return cpu::compress_pool(kv, score, ape, ratio, d, overlap, has_prev);
}

void renorm_heads(Tensor& q, int64_t head_dim, float eps, bool round) {
  const OpScope scope("renorm_heads", q);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(q)) return cuda::renorm_heads(q, head_dim, eps, round);
#endif
  if (on_cuda(q)) no_kernel("renorm_heads", q);
  cpu::renorm_heads(q, head_dim, eps, round);
}

std::vector<SampleResult> sample_rows(const Tensor& logits, const std::vector<SampleInput>& rows) {
  const OpScope scope("sample_rows", logits);
#if DEEPINFER_HAS_CUDA
  if (on_cuda(logits)) return cuda::sample_rows(logits, rows);
#endif
  if (on_cuda(logits)) no_kernel("sample_rows", logits);
  DI_CHECK(logits.defined(), "ops::sample_rows: logits is undefined");
  DI_CHECK(logits.dtype() == DType::kF32 && logits.dim() == 2 && logits.strides()[1] == 1,
           "ops::sample_rows: logits must be float32 [R, V] with dense rows, got {}", logits.describe());
  const int64_t R = logits.size(0), V = logits.size(1);
  DI_CHECK(R == static_cast<int64_t>(rows.size()), "ops::sample_rows: {} logits rows for {} inputs", R, rows.size());
  // Checked for every row before any is sampled, as the CUDA path does, so both report the same misuse.
  for (size_t r = 0; r < rows.size(); ++r)
    DI_CHECK(rows[r].vocab == 0 || rows[r].vocab == V,
             "ops::sample_rows: row {} has vocab {} but the logits have {} columns", r, rows[r].vocab, V);
  std::vector<SampleResult> results;
  results.reserve(rows.size());
  for (int64_t r = 0; r < R; ++r) {
    SampleInput in = rows[static_cast<size_t>(r)];
    in.logits = logits.data<float>() + r * logits.strides()[0];
    in.vocab = V;
    results.push_back(sample(in));
  }
  return results;
}

}  // namespace deepinfer::ops
