// The op layer: one function per numerics contract of docs/v4-architecture.md §2.1 and §3.
// Model code calls only these; each dispatches on the tensor's device (CPU kernels live in
// src/cpu, CUDA kernels in src/cuda).
//
// Activation convention: activations are float32 tensors whose values sit on the bf16 grid when
// Numerics::bf16 is set (the model's BF16 contract: one rounding where the reference rounds);
// with bf16 off they stay full fp32 between ops (for comparisons with FP32 references).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "deepinfer/tensor.h"

namespace deepinfer {
struct SampleInput;  // sampling/sampler.h (declared here only: callers of sample_rows include it)
struct SampleResult;
}  // namespace deepinfer

namespace deepinfer::ops {

// ---- devices -------------------------------------------------------------------------------------
// Whether this build has kernels for `d` and a device of that kind is visible (the CPU: always).
bool device_available(Device d);
// Makes `d` usable (allocator and copies registered); throws deepinfer::Error saying why it cannot be.
void init_device(Device d);
// Blocks until the work queued on `d` has finished (no-op on the CPU).
void synchronize(Device d);
// DEEPINFER_OP_PROFILE=1: forgets the op times gathered so far (a benchmark's warm-up).
void reset_op_profile();

struct RopeFreqs;

// ---- CUDA graphs of the decode step ---------------------------------------------------------------
// Whether a decode step of `rows` rows on `d` replays its pieces as CUDA graphs: CUDA with DEEPINFER_CUDA_GRAPHS=1
// (the default), rows <= DEEPINFER_CUDA_GRAPH_MAX_BATCH and no DEEPINFER_OP_PROFILE (a replay runs no op's host side,
// so the profile would miss them).
bool graphs_enabled(Device d, int64_t rows);
// The pieces of a decode step between two attentions, run as graphs (src/cuda/graph.h says how): begin_step(bucket)
// for a step of `bucket` rows (false: this step runs eagerly: a batch size's first step, or one that cannot be
// captured), then run(key, inputs, fn) per piece in the same order every step, then end_step(). fn must only queue
// device work on its inputs and the weights (no host round trip, no upload: a capture that tries one fails and that
// batch size stays eager); its outputs are valid until the same piece runs again. On the CPU fn just runs.
using SegmentFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
class SegmentGraphs {
 public:
  explicit SegmentGraphs(Device d);
  ~SegmentGraphs();
  bool begin_step(int64_t bucket);
  std::vector<Tensor> run(int64_t key, const std::vector<Tensor>& inputs, const SegmentFn& fn);
  // During a replay, where the next piece (if its key is `key`) takes its input i from outside the graph (a buffer that
  // run() would copy that input into), else undefined: a caller that writes the input there saves that copy.
  Tensor input_buffer(int64_t key, size_t i) const;
  void end_step();
  // Closes a step that end_step did not (an exception): what it deferred is launched in order. A no-op otherwise.
  void abort_step();
  // Calls abort_step when it goes out of scope (null: nothing).
  struct AbortGuard {
    SegmentGraphs* graphs;
    ~AbortGuard();
  };
  // Captures, replays and eager runs of pieces so far (tests and benchmarks).
  struct Stats {
    int64_t captures = 0, replays = 0, eager = 0, failures = 0;
    int64_t spans_merged = 0, spans_split = 0;  // replayed spans (middles and pieces) as one graph / one by one
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// The forward's positions on the device: while it lives (on this thread), RoPE calls (apply_rope,
// attn_input_norms) whose host positions are `host` with `rows` rows read them from `device` (int64 [rows] on the
// device): one upload per forward instead of one per call, and what a replayed graph reads. Nothing on the CPU.
class DevicePositions {
 public:
  DevicePositions(const int64_t* host, int64_t rows, const Tensor& device);
  ~DevicePositions();
  DevicePositions(const DevicePositions&) = delete;
  DevicePositions& operator=(const DevicePositions&) = delete;

 private:
  bool bound_ = false;
  const int64_t* prev_host_ = nullptr;  // the binding this one replaced
  int64_t prev_rows_ = 0;
  const int64_t* prev_device_ = nullptr;
};
// Work beside the main stream: while a SideWork lives on this thread, the ops it runs on a CUDA device go to the side
// stream, after everything queued before it, concurrently with what the main stream queues after it; `reads` are held
// until the join. done(writes) ends it (the destructor does, with no writes); side_join(d) makes the main stream
// wait for it (so do the ops that read a pending write: hc_collapse_norm, hc_collapse, gather_rows, moe_combine).
// Inside, no copy to the host and no nesting. On the CPU the ops just run. Used where independent work of a step
// (the shared expert beside the routed ones, the indexer's and compressor's projections beside wq_b) would
// otherwise wait in line on one stream: under CUDA graphs the fork and join are edges of the graph.
class SideWork {
 public:
  // on = false: the ops run on the main stream as usual (the caller's size rule).
  SideWork(Device d, std::vector<Tensor> reads, bool on = true);
  ~SideWork();
  void done(const std::vector<Tensor>& writes);
  SideWork(const SideWork&) = delete;
  SideWork& operator=(const SideWork&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
void side_join(Device d);
// Whether linear on device d follows the tensor-core contract for every call it can (CUDA with
// DEEPINFER_CUDA_GEMM=tc; never on the CPU): callers that pre-quantise x for the exact kernels keep the FP8 input
// site in the call instead, so that the grouped tensor-core GEMV takes it.
bool linear_tc_mode(Device d);
// Whether linear_grouped on device d serves rows sorted by expert (the caller's tile_rows promise) a tile of rows at a
// time, so that the MoE groups a prefill chunk's calls too instead of looping over the experts (CUDA: the grouped
// GEMV's tiles of up to 4 rows, the exact FP4 GEMM from DEEPINFER_CUDA_FP4_GEMM_ROWS rows per expert; measured 3-3.5x
// the loop of 384 calls per matrix, each filling part of the GPU; never on the CPU). The same bits either way.
bool linear_grouped_tiled(Device d);
// Makes f's device table cover positions [0, rows) now (a replayed graph's RoPE reads it without growing it; a
// growth makes the graphs that named the old table capture again). Nothing on the CPU.
void rope_reserve(const RopeFreqs& f, int64_t rows, Device d);

struct Numerics {
  bool bf16 = true;          // round activations to bf16 where the reference does
  bool simulate_qat = true;  // apply the FP8/FP4 fake-quantisation sites
};

// A linear layer's weight as shipped. `w` is [out, in]:
//   BF16 / F32          dense (also the stand-in for a dequantised FP8/FP4 weight)
//   E4M3 + E8M0 scale   scale [ceil(out/block), ceil(in/block)]
//   E2M1x2 + E8M0 scale logical [out, in], scale [out, in/32]
struct QWeight {
  Tensor w;
  Tensor scale;
  int64_t block = 0;  // tile size of an E4M3 weight's scale
  int64_t out() const { return w.size(0); }
  int64_t in() const { return w.size(1); }
};

struct LinearOpts {
  // > 0: fake-quantise each row of x to FP8 e4m3 per `act_quant_block` columns first (ue8m0
  // scale, amax floor 1e-4, clamp +-448): the FP8/FP4 GEMM input site. 0: x is used as is.
  int64_t act_quant_block = 0;
  bool round_out_bf16 = false;  // round y to bf16 (BF16 output); false keeps FP32 output
};

// y[M, N] = x[M, K] . W^T with FP32 accumulation. x: float32 [M, K] contiguous.
Tensor linear(const Tensor& x, const QWeight& w, const LinearOpts& opts);

// Grouped rows (the routed experts of a decode step): y[r] = linear(x[r], experts[row_expert[r]]).
// x float32 [R, K] contiguous, row_expert int32 [R] on x's device (each in [0, experts.size())),
// experts all of one format and shape [N, K] on x's device. Bit-identical to calling linear on each
// run of rows that share an expert (a row's result never depends on the other rows). On CUDA one
// launch reads the expert ids on the device (no copy to the host). With several lists (of equal
// length, one format and shape: w1 and w3 of the experts), y is [lists * R, N], block l being x
// through lists[l], still in one launch.
// tile_rows > 1 promises rows sorted by expert (moe_group's order): on CUDA an FP4 call then lets one block
// serve up to tile_rows rows of one expert, sharing its pass over the weight (the same bits; ignored elsewhere).
// row_period > 0 promises row_expert[r] == row_expert[r % row_period] (R a multiple of it: wo_a's groups, the
// shared expert's matrix 0): on CUDA the E4M3 rows kernel then serves the rows of one matrix together (the same bits).
Tensor linear_grouped(const Tensor& x, const Tensor& row_expert, const std::vector<QWeight>& experts,
                      const LinearOpts& opts, int64_t tile_rows = 0, int64_t row_period = 0);
Tensor linear_grouped(const Tensor& x, const Tensor& row_expert, const std::vector<const std::vector<QWeight>*>& lists,
                      const LinearOpts& opts, int64_t tile_rows = 0, int64_t row_period = 0);

// Under linear_tc_mode, the block-diagonal projection of wo_a's groups through the tensor-core contract for x without
// an input site (src/cuda/linear_tc_bf16.cuh): x [M, groups K], w E4M3 [groups N, K] with block scales, y [M, groups N]
// with y[:, g N + n] = x[:, g K : (g + 1) K] . w[g N + n], one launch. An undefined tensor where it does not apply (the
// CPU, the other modes, a layout the kernel does not take): the caller then runs the exact path.
Tensor linear_groups_tc(const Tensor& x, const QWeight& w, int64_t groups, const LinearOpts& opts);
// The same block-diagonal projection under the exact contract, in one launch where a kernel takes it (CUDA:
// fp8_wgmma_gemv under gemv_set_fp8_variant(7), not yet run on a GPU); an undefined tensor elsewhere (the CPU, the
// default kernels, a layout the kernel does not take): the caller then runs the per-group path, with the same bits.
Tensor linear_groups_exact(const Tensor& x, const QWeight& w, int64_t groups, const LinearOpts& opts);

// Dequantises a weight to a dense float32 [out, in] tensor (exact: every format fits fp32).
Tensor dequantize(const QWeight& w);

// ---- fake quantisation (in place on float32 rows; values end exactly representable in bf16) ----
// FP8 e4m3 per `block` columns within [col_begin, col_end) of each row: ue8m0 scale of
// max(amax, 1e-4)/448, clamp to +-448, round to nearest even.
void fake_quant_fp8(Tensor& x, int64_t col_begin, int64_t col_end, int64_t block);
// FP4 e2m1 per `block` (32) columns, ue8m0 scale of max(amax, 6*2^-126)/6, clamp +-6, RNE.
void fake_quant_fp4(Tensor& x, int64_t block);
// FP4 e2m1 per `block` (16) columns with an E4M3 scale e4m3_rne(max(amax, 6*2^-9)/6) (V4.1 KV).
void fake_quant_fp4_e4m3_scale(Tensor& x, int64_t block);

// ---- elementwise and normalisation ---------------------------------------------------------------
// In place: every value rounded to the bf16 grid (no-op when !enable).
void round_bf16(Tensor& x, bool enable = true);
// y = w * x * rsqrt(mean(x^2) + eps) per row, FP32 math, rounded to bf16 if `round`.
// w: BF16 or F32 [cols], or undefined for a weightless norm.
Tensor rms_norm(const Tensor& x, const Tensor& w, float eps, bool round);
// Normalised Walsh-Hadamard transform (scale n^-1/2) of each row's n-wide segments, in place.
void hadamard(Tensor& x, int64_t n, bool round);

// RoPE on the last `rope_dim` columns of each `head_width`-wide head: x is [T, heads*head_width]
// (or [T, head_width]); positions[T]. Interleaved pairs (x[2i], x[2i+1]); angle = pos * freq[i]
// in fp32; complex multiply in fp32; rounded to bf16 if `round`. inverse: conjugate rotation.
struct RopeFreqs {
  std::vector<float> freq;  // rope_dim / 2 values
};
RopeFreqs rope_freqs(int64_t rope_dim, double base, double factor, int64_t original_seq_len, double beta_fast,
                     double beta_slow);
void apply_rope(Tensor& x, int64_t head_width, int64_t rope_dim, const int64_t* positions, const RopeFreqs& f,
                bool inverse, bool round);

// The attention's low-rank inputs (both families): qr = rms_norm(qa, q_w, eps, round) and kv = rms_norm(kva, kv_w,
// eps, round), then apply_rope(kv, D, rope_dim, positions, f, false, round) (one head of kv's width D) and, when
// quant_block > 0, fake_quant_fp8(kv, 0, quant_end, quant_block); the bits of those ops, one kernel on CUDA.
// qa [T, q_lora] and kva [T, D]: float32 on one device with dense rows (column slices of linear_q_pair's stacked
// output work); q_w / kv_w as rms_norm's; positions: T host values (unread when rope_dim is 0).
struct AttnInputs {
  Tensor qr, kv;
};
AttnInputs attn_input_norms(const Tensor& qa, const Tensor& q_w, const Tensor& kva, const Tensor& kv_w, float eps,
                            bool round, int64_t rope_dim, const int64_t* positions, const RopeFreqs& f,
                            int64_t quant_end, int64_t quant_block);

// ---- hyper-connections (§2.3) ------------------------------------------------------------------
// stream: [T, hc, dim] float32 (bf16 values in bf16 mode). fn [mix, hc*dim] F32, scale [3], base [mix].
// Writes x_in [T, dim] = bf16(sum_j pre_j h_j), post [T, hc], comb [T, hc, hc] (comb[j][k]).
struct HcMix {
  Tensor pre, post, comb;
};
HcMix hc_mixes(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, int64_t hc,
               int64_t sinkhorn_iters, float hc_eps, float norm_eps);
Tensor hc_collapse(const Tensor& stream, const Tensor& pre, bool round);
// rms_norm(hc_collapse(stream, pre, round), w, eps, round): a sublayer's input; one kernel on CUDA.
Tensor hc_collapse_norm(const Tensor& stream, const Tensor& pre, const Tensor& w, float eps, bool round);
// out[t, k, :] = round(post[t,k] * y[t,:] + sum_j comb[t,j,k] * stream[t,j,:])
Tensor hc_expand(const Tensor& y, const Tensor& stream, const Tensor& post, const Tensor& comb, bool round);
// Final collapse without Sinkhorn (V4 hc_head): pre_j = sigmoid(mix_j*scale + base_j) + hc_eps.
Tensor hc_head(const Tensor& stream, const Tensor& fn, const Tensor& scale, const Tensor& base, float hc_eps,
               float norm_eps, bool round);

// ---- attention ---------------------------------------------------------------------------------
// q [T, H, D] float32; kv [N, D] float32 (K = V); idx [T, K] int32, -1 = empty; sink [H] F32.
// Per (t, h): online softmax over idx in tiles of 64 (FP32 scores times `scale`), the sink adds
// exp(sink - m) to the denominator only. bf16_probs: each tile's probabilities are rounded to bf16
// (relative to the running max) before P.V, as the reference kernel does. Output rounded if `round`.
// derotate (optional): then the inverse RoPE of each head's last rope_dim columns, exactly
// apply_rope(o, D, rope_dim, positions, *freqs, true, round) on the output (the attention output's de-rotation, one
// kernel fewer on CUDA, where the attention kernels apply it to their own output). out (optional): a contiguous
// float32 tensor of T * H * D values on q's device that receives the result (returned as [T, H, D] over it).
struct AttnDerotate {
  const int64_t* positions = nullptr;  // [T] host positions of q's rows
  const RopeFreqs* freqs = nullptr;
  int64_t rope_dim = 0;
};
Tensor sparse_attention(const Tensor& q, const Tensor& kv, const Tensor& idx, const Tensor& sink, float scale,
                        bool bf16_probs, bool round, const AttnDerotate* derotate = nullptr,
                        const Tensor& out = Tensor());

// Indices of the k largest of scores[0..n) ordered by (score desc, index asc). -inf entries are
// never returned: fewer than k finite scores give fewer results. Returns the count written.
int64_t topk(const float* scores, int64_t n, int64_t k, int32_t* out);
// Row-wise topk over scores float32 [T, n] (rows dense), on the scores' device: int32 [T, k], each
// row the picks of topk() in its order (score desc, index asc), or by index ascending when
// `sort_by_index`, then -1 for the slots past the row's count.
Tensor topk_rows(const Tensor& scores, int64_t k, bool sort_by_index = false);

// ---- sparse-attention index lists (the indexers' selection kept on the scores' device) -------------
// V4.1 candidate blocks (level one of the two-level selection, §2.6). scores float32 [T, n] (rows
// dense; -inf = not visible), row t at position start_pos + t with visible = (start_pos + t + 1) / ratio
// entries. Per row: nb = ceil(n / block_size) block maxima (fp32 max over the block's entries, -inf
// when none is finite), the block of the newest visible entry (min(visible, n) - 1) set to +inf when
// visible > 0, then topk() of the maxima keeping min(keep, nb) blocks (score desc, index asc; -inf
// blocks never kept). Returns int32 [T, keep] on the scores' device: the kept block ids ascending,
// then -1. Integer-exact (no value is computed: only maxima and comparisons).
Tensor candidate_blocks(const Tensor& scores, int64_t start_pos, int64_t ratio, int64_t block_size, int64_t keep);
// In place on scores float32 [T, n] (rows dense): scores[t, j] = -inf unless the block j / block_size
// is one of blocks[t, :] (int32 [T, keep] on the scores' device, as candidate_blocks returns them:
// ascending ids, then -1; -1 keeps nothing). Exact.
void mask_to_blocks(Tensor& scores, const Tensor& blocks, int64_t block_size);
// The index lists of sparse_attention for a chunk of T rows at positions p_t = start_pos + t over a KV
// table whose row 0 holds position `wstart` (window rows, then the compressed entries from row
// `offset`). Returns int32 [T, wcols + kcols] on `device`:
//   window part (wcols columns): the positions lo_t..p_t, lo_t = max(0, p_t - window + 1, floor), as
//     table rows s - wstart, oldest first, then -1 (pad_front: the -1 first, then the rows);
//     requires wstart <= lo_0 and p_t - lo_t + 1 <= wcols for every t (checked).
//   compressed part (kcols columns): picks defined (int32 [T, kcols] on `device`): picks < 0 -> -1,
//     else offset + pick, in the picks' order; picks undefined: column i -> offset + i while
//     i < (p_t + 1) / ratio (every visible entry, in order), else -1 (ratio > 0 when kcols > 0).
// Every listed row is then shifted by `base`, and the lists padded with -1 to `width` columns (the
// chunks of a batch attended in one call). Exact (integers only). Built on the device: no host list, no upload.
struct IndexLayout {
  int64_t start_pos = 0;
  int64_t window = 0;  // W
  int64_t floor = 0;   // the lowest position the window may list (bounded replay; else 0)
  int64_t wstart = 0;  // the position of table row 0
  int64_t wcols = 0;
  bool pad_front = false;
  int64_t offset = 0;  // table row of compressed entry 0
  int64_t kcols = 0;
  int64_t ratio = 0;  // the dense compressed rule (picks undefined)
  int64_t base = 0;   // added to every listed row (the chunk's table inside a batch's stacked table)
  int64_t width = 0;  // columns of each list, >= wcols + kcols, -1 past them (0: wcols + kcols)
};
// `into`, when defined (a contiguous int32 [T, width] on `device`, e.g. a row slice of a batch's stacked lists),
// receives the lists in place and is returned.
Tensor sparse_index(const IndexLayout& layout, int64_t T, const Tensor& picks, Device device,
                    const Tensor& into = Tensor());
// The lists of several chunks in one call (a decode batch's chunks: one launch on CUDA instead of one per chunk):
// chunk i (its layout, T rows and picks as for sparse_index) fills rows [r_i, r_i + T_i) of `into` (a contiguous int32
// [sum T, width] on `device`, r_i = T_0 + .. + T_{i-1}); every layout's width must be into's. The same lists as one
// sparse_index per chunk into those rows.
struct IndexChunk {
  IndexLayout layout;
  int64_t T = 0;
  Tensor picks;
};
void sparse_index_many(const std::vector<IndexChunk>& chunks, Device device, const Tensor& into);

// ---- model pieces (issue 8): the per-token loops of src/model behind ops ---------------------------
// Indexer scores (§2.5, §2.6). q [T, heads, d] (or [T, heads*d]), keys [N, d], w [T, heads], all
// float32 on one device. For j < visible(t):
//   scores[t, j] = rd(float(sum_h  (dot_h > 0 ? rd(dot_h * w[t, h]) : 0)))   with dot_h = rd(q[t,h,:] . keys[j,:])
// where each dot is an fp32 sum in ascending i (no FMA), the head sum is FP64 in head order and
// rd rounds to bf16 when `round` (identity otherwise); scores[t, j] = -inf for j >= visible(t).
// visible(t): counts[t] (int32 [T] on q's device) when `counts` is defined, else the causal rule
// min(N, (start_pos + t + 1) / ratio). Returns float32 [T, N].
// Rows over their own keys (a batch's sequences, keys stacked in one table): with `offsets` (int32 [T] on q's
// device; needs counts) row t reads keys[offsets[t] + j] for j < visible(t) = min(counts[t], N - offsets[t], width)
// and the result is float32 [T, width] (-inf past each row's visible keys): each row's scores are those of the row
// alone over its keys.
struct KeyVisibility {
  KeyVisibility(Tensor counts_ = Tensor(), int64_t start_pos_ = 0, int64_t ratio_ = 1)
      : counts(std::move(counts_)), start_pos(start_pos_), ratio(ratio_) {}
  Tensor counts;
  int64_t start_pos = 0;
  int64_t ratio = 1;
  Tensor offsets;     // per-row first key (with counts), or undefined
  int64_t width = 0;  // the result's columns when offsets are given
};
Tensor index_scores(const Tensor& q, const Tensor& keys, const Tensor& w, const KeyVisibility& vis, bool round);

// MoE routing (§2.8). logits float32 [T, E] (the FP32 gate). Per row: l = logit / temp (divided only
// when temp != 1), s = score(l): sqrt(softplus(l)) (softplus(x) = x > 20 ? x : log1p(exp(x))),
// sigmoid(l) = 1 / (1 + exp(-l)), or softmax over the row (fp32, max-subtracted, sequential sum);
// ids: k experts by topk() of s + bias (bias [E] float32, selection only; undefined = none), or
// hash routing when `tid2eid` is defined: ids = tid2eid[tokens[t], :] (int32/int64 [vocab, k],
// tokens int32 [T]); weights = s[ids], divided by (fp32 sequential sum + norm_eps) when `normalize`,
// then times route_scale. Returns ids int32 [T, k] (in selection order) and weights float32 [T, k].
enum class ScoreFunc { kSqrtSoftplus, kSigmoid, kSoftmax };
struct RouteOpts {
  ScoreFunc func = ScoreFunc::kSqrtSoftplus;
  float temp = 1.0f;
  bool normalize = true;
  float norm_eps = 0.0f;
  float route_scale = 1.0f;
};
struct Routing {
  Tensor ids, weights;
};
Routing moe_route(const Tensor& logits, const Tensor& bias, const Tensor& tid2eid, const Tensor& tokens, int64_t k,
                  const RouteOpts& opts);

// Clamped SwiGLU of the experts: h = silu(min(g, L)) * clamp(u, -L, L) (no clamp when limit <= 0),
// times weights[t] when `weights` (float32 [T]) is defined, rounded to bf16 when `round`.
// g, u float32 [T, I] contiguous; silu(x) = x / (1 + exp(-x)) in fp32. quant_block > 0: h is then
// fake_quant_fp8(h, 0, I, quant_block)'d (the linear it feeds takes act_quant_block 0 and gives the same bits as
// it would quantising itself; on CUDA in the same launch, where each linear block would redo it).
Tensor swiglu(const Tensor& g, const Tensor& u, const Tensor& weights, float limit, bool round,
              int64_t quant_block = 0);

// Embedding gather: table [V, dim] BF16 or F32, ids int32 [T] (each in [0, V)) on the table's device.
// Returns float32 [T, copies, dim]: every copy the table row (exact).
Tensor embedding(const Tensor& table, const Tensor& ids, int64_t copies = 1);

// Row gather: x float32 contiguous [N, ...], rows int32 [R] (each in [0, N)) on x's device.
// Returns [R, ...] with out[i] = x[rows[i]] (exact).
// quant_block > 0 (x [N, width]): each gathered row fake_quant_fp8'd as swiglu's.
Tensor gather_rows(const Tensor& x, const Tensor& rows, int64_t quant_block = 0);

// MoE dispatch (§2.8): groups the routed (token, slot) pairs by expert. ids int32 [T, k] (each in
// [0, n_experts), as moe_route returns them), weights float32 [T, k], on one device. The grouped order
// is expert ascending, then token ascending, then slot ascending (the reference's per-expert loop).
// rows int32 [R] / weights float32 [R]: each grouped pair's token and routing weight; slots int32
// [T, k]: the grouped position of (t, j); row_expert int32 [R]: each grouped pair's expert;
// offsets (host, n_experts + 1 values): expert e owns the grouped positions [offsets[e], offsets[e+1])
// (on CUDA one small device-to-host copy, which host_offsets = false skips: offsets stays empty and
// the step keeps running on the device). Exact.
struct MoeGroups {
  Tensor rows, weights, slots, row_expert;
  std::vector<int64_t> offsets;
};
MoeGroups moe_group(const Tensor& ids, const Tensor& weights, int64_t n_experts, bool host_offsets = true);

// The grouped experts' dispatch: routing = moe_route(logits, bias, tid2eid, tokens, k, opts), groups =
// moe_group(routing.ids, routing.weights, n_experts, host_offsets), x = gather_rows(x_tokens, groups.rows,
// quant_block), with those ops' bits. On CUDA a single token's call without host offsets (a decode step at batch 1) can
// be one launch (cuda::moe_dispatch, DEEPINFER_CUDA_MOE_DISPATCH): the route's launch also groups and gathers, two
// launches fewer between the gate and the experts.
struct MoeDispatch {
  Routing routing;
  MoeGroups groups;
  Tensor x;
};
MoeDispatch moe_dispatch(const Tensor& logits, const Tensor& bias, const Tensor& tid2eid, const Tensor& tokens,
                         int64_t k, const RouteOpts& opts, int64_t n_experts, bool host_offsets, const Tensor& x_tokens,
                         int64_t quant_block);

// MoE combine: expert_out float32 [R, dim] (the experts' weighted outputs in the grouped order of
// moe_group), slots int32 [T, k] (moe_group's; -1 = no pair), shared float32 [T, dim] (the shared
// expert). out[t, :] = rd(acc + shared[t, :]) with acc = 0.0f + expert_out[s_1] + expert_out[s_2] + ...
// in fp32 over t's slots in ascending grouped position (= ascending expert), rd = bf16 rounding when
// `round`. Returns float32 [T, dim] (exact: one fixed order of fp32 adds).
Tensor moe_combine(const Tensor& expert_out, const Tensor& slots, const Tensor& shared, bool round);
// hc_expand(moe_combine(expert_out, slots, shared, round), stream, post, comb, round): the FFN's output back into the
// stream [T, hc, dim], bit for bit (CUDA: one kernel).
Tensor moe_combine_expand(const Tensor& expert_out, const Tensor& slots, const Tensor& shared, const Tensor& stream,
                          const Tensor& post, const Tensor& comb, bool round);

// Compressor pooling (§2.5, §2.6): the gated pooling of G complete groups of `ratio` rows.
// kv, score float32 [lead + G*ratio, width] on one device, rows in position order from a group
// boundary; with `overlap` (V4 ratio 4, width 2d) the first lead = ratio rows are the previous
// group's (read only when has_prev; otherwise that half is empty: kv 0, score -inf), else lead = 0
// and width = d. ape float32 [ratio, width] (undefined = none) is added to each row's score by its
// slot (row mod ratio). Per group and channel ch < d, over the n rows (overlap: the previous group's
// column ch, then this group's column d + ch; else this group's column ch): s_i = score + ape,
// m = max s_i, e_i = exp(s_i - m), sum = fp32 sum of e_i in order, out = fp32 sum from 0 of
// kv_i * (e_i / sum) in order. Returns float32 [G, d].
Tensor compress_pool(const Tensor& kv, const Tensor& score, const Tensor& ape, int64_t ratio, int64_t d, bool overlap,
                     bool has_prev);

// Weightless per-head RMS re-normalisation (V4 q), in place on float32 q [..., n*head_dim] contiguous,
// in BF16 like the reference when `round` (rd = bf16 rounding, identity otherwise): per head,
// ss = FP64 sum in ascending i of rd(q_i * q_i), mean = rd(float(ss / head_dim)),
// r = rd(1 / sqrt(rd(mean + eps))) (fp32), q_i = rd(q_i * r).
void renorm_heads(Tensor& q, int64_t head_dim, float eps, bool round);

// In place: x = rd(x * s) elementwise on float32 x (rd = bf16 rounding when `round`, identity
// otherwise): the indexer's weight scaling. Exact (one fp32 product per value).
void scale(Tensor& x, float s, bool round);

// Copies src into dst (same shape and dtype, both contiguous, one device; dst may be a row slice of a
// larger tensor, e.g. Tensor::slice(0, a, b)). Exact.
void copy_into(const Tensor& dst, const Tensor& src);
// Runs of contiguous rows (of dst's width) into dst one after the other: segment i's `rows` rows from `src` fill the
// next rows of dst (float32 [sum of rows, width], contiguous, on the segments' device). One CUDA kernel for all of
// them (copy_rows): the attention's stacked KV table of a decode batch (every chunk's window runs, its new rows and
// its compressed pages) and a paged store's rows (index_scores_segments: the indexer's keys), where a copy per run or
// 64-row page cost a launch each; a copy per segment on the CPU. Exact.
//
// A segment is either a run (src: its first row, rows contiguous) or a paged store's rows [0, rows) (src null, pages
// set: row r at pages[r / page_rows] + (r % page_rows) * width, page_rows a power of two). A paged store names its page
// addresses on the host (pages) and, where the store keeps them there, in device memory too (device_pages, the same
// addresses, u64): the CUDA kernels that read rows in place (gather_listed, index_scores_segments' decode kernel) then
// take the whole store as one entry of their launch's run table instead of one run per page, so a long context's table
// is not uploaded at every step. Every other consumer sees the store as its pages' runs (flat_runs).
struct RowSegment {
  const float* src;
  int64_t rows;
  float* const* pages = nullptr;
  const uint64_t* device_pages = nullptr;
  int64_t page_rows = 0;
  bool paged() const { return pages != nullptr; }
};
// The segments with every paged store as its pages' runs (in order; empty runs kept out). Throws on a malformed
// segment (negative rows, a run at null, a paged store without a power-of-two page_rows).
std::vector<RowSegment> flat_runs(const std::vector<RowSegment>& segments, const char* what);
void gather_segments(const std::vector<RowSegment>& segments, const Tensor& dst);
// The rows the index lists name, gathered out of the runs instead of the whole table: idx (int32 [R, K], contiguous,
// on the runs' device) lists rows of the table that gather_segments(segments, ...) would build (N rows); entry e = t K
// + p that names row j in [0, N) has row j copied into row e of dst (float32 [R K, width], contiguous) and is
// rewritten to e; an empty entry (j < 0) is rewritten to -1 and its dst row is left as it was. So sparse_attention over
// (dst, idx) afterwards gives the same bits as over (the whole table, idx before): it reads the same rows in the same
// list order. A decode row's lists name at most window + index_topk rows (640 in V4.1-Flash) however long the context,
// where the whole table copied every compressed entry of the layer at every step (attend_chunks on CUDA takes whichever
// is smaller). An entry j >= N is rejected on the CPU; the CUDA kernel, which cannot report it, treats it as empty (as
// its attention kernels do). One CUDA launch (the runs' table in its parameters up to 16 runs, else uploaded).
void gather_listed(const std::vector<RowSegment>& segments, const Tensor& idx, const Tensor& dst);
// sparse_attention over the table that gather_segments(segments, ...) would build (row j of the runs laid end to end,
// q's D floats a row), read where the rows live instead: the same bits as gathering first. On the CPU only (host runs;
// the CUDA kernels read one table): attend_chunks there reads a sequence's window ring, its new rows and its
// compressed pages in place, where the table cost a copy of every row of the layer's state at every step.
Tensor sparse_attention_segments(const Tensor& q, const std::vector<RowSegment>& segments, const Tensor& idx,
                                 const Tensor& sink, float scale, bool bf16_probs, bool round,
                                 const AttnDerotate* derotate = nullptr);
// index_scores over the key table that gather_segments(segments, ...) would build (key j of the runs laid end to end,
// q's per-head width a row): the same bits as gathering first. The CPU reads the keys where they live (the indexer's
// keys are a paged store, RowPages, which a table copied whole at every step), and so does CUDA's decode kernel (up to
// 16 queries, or rows over their own keys); other CUDA calls, and every one when in_place is false (the A/B of
// DEEPINFER_CUDA_WHOLE_TABLES), gather the keys into one table first.
Tensor index_scores_segments(const Tensor& q, const std::vector<RowSegment>& segments, const Tensor& w,
                             const KeyVisibility& vis, bool round, bool in_place = true);
// Row copies of one width on one device: copy i moves `rows` rows (`width` floats each, contiguous runs) from src to
// dst. One CUDA kernel for all of them (a decode batch's window-ring writes; gather_segments is one use), a copy each
// on the CPU. Exact; the runs must not overlap.
struct RowCopy {
  float* dst;
  const float* src;
  int64_t rows;
};
void copy_rows(const std::vector<RowCopy>& copies, int64_t width, Device device);

// ---- sampling ------------------------------------------------------------------------------------
// sample() of sampling/sampler.h for every row of logits (float32 [R, V], last dimension dense) with
// rows[r] (R inputs; their `logits` is ignored and may be null, their `vocab` is V or 0): the same
// results, bit for bit, on either device. On CUDA the logits stay on the GPU (cuda::sample_rows: one
// launch for all rows, only the results come back). Throws deepinfer::Error as sample() does, for the
// first bad row in row order (no result is returned then).
std::vector<SampleResult> sample_rows(const Tensor& logits, const std::vector<SampleInput>& rows);

}  // namespace deepinfer::ops
