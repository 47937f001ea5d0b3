// MoE of both families (docs/v4-architecture.md §2.8): sqrt-softplus scores, hash or biased top-k routing,
// clamped SwiGLU experts with the routing weight applied before w2, FP32 accumulation in
// ascending expert order, then the shared expert.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/debug_dump.h"
#include "deepinfer/error.h"
#include "model/layers_v4.h"

namespace deepinfer {

namespace {

// The experts' FFN: w2(swiglu(w1 x, w3 x) [* routing weight]) (ops::swiglu: clamp, weight before w2).
Tensor expert_forward(const ExpertWeights& e, const Tensor& x, const Tensor& weights, const LayerCtx& c) {
  Tensor g = linear_q(x, e.w1, c), u = linear_q(x, e.w3, c);
  return linear_q(ops::swiglu(g, u, weights, c.cfg.swiglu_limit, c.num.bf16), e.w2, c);
}

// The block by which the gather of `rows` grouped rows quantises them for the experts' linears (their input site,
// act_quant_block), or 0 where the linears quantise x themselves. For few rows the quantisation is done once per row
// by the gather and the swiglu instead of in every block of the grouped GEMV (at batch 1 ~70 blocks share each row: a
// fifth of the FP4 kernel's instructions): up to kPrequantRows grouped rows (decode batches up to 10 tokens at
// top-6), where the FP4 w1 + w3 / w2 kernels went from 57 / 36 to 49 / 26 us at batch 1 (ncu, V4.1-Flash shape),
// neutral at 48 rows; at 192 rows (batch 32) the step measured 5% slower with it. Under the tensor-core contract
// (ops::linear_tc_mode) the grouped GEMV quantises x itself.
int64_t gather_quant_block(int64_t rows, Device d, const LayerCtx& c) {
  constexpr int64_t kPrequantRows = 64;
  return rows <= kPrequantRows && !ops::linear_tc_mode(d) ? linear_q_opts(c).act_quant_block : 0;
}

// expert_forward over grouped rows: grouped row r (x's row r, gathered from token groups.rows[r] and quantised by
// qb, gather_quant_block) goes through expert row_expert[r]. The same linear, swiglu and linear as the per-expert
// loop, row for row, so the same bits.
Tensor grouped_experts_forward(const MoeWeights& w, const Tensor& x, int64_t qb, const ops::MoeGroups& groups,
                               const LayerCtx& c) {
  ops::LinearOpts o = linear_q_opts(c);
  if (qb > 0) o.act_quant_block = 0;
  const int64_t R = x.size(0);
  const std::vector<const std::vector<ops::QWeight>*> w13{&w.routed_w1, &w.routed_w3};
  // moe_group's rows are sorted by expert: from kTileFromRows rows on (256 tokens of top-6), experts that several
  // rows share are read once per tile of up to 4 of them (ops::linear_grouped's tile_rows). Measured on the
  // V4.1-Flash shape (bench/RESULTS.md): batch 256 (~4 rows per expert) 1,638 -> 1,769 tok/s, but batch 32 and
  // 128 (~1.3 and ~2.3 rows per expert) slower, where the 4-row blocks' shared memory costs more occupancy
  // than the shared passes save.
  constexpr int64_t kTileFromRows = 1536;
  // Under the tensor-core contract the promise of sorted rows lets linear_grouped take its grouped GEMM (the same
  // bits).
  const int64_t tile = R >= kTileFromRows || ops::linear_tc_mode(x.device()) ? 4 : 0;
  const Tensor gu = ops::linear_grouped(x, groups.row_expert, w13, o, tile);  // [2R, inter]: w1 rows, then w3 rows
  Tensor h = ops::swiglu(gu.slice(0, 0, R), gu.slice(0, R, 2 * R), groups.weights, c.cfg.swiglu_limit, c.num.bf16, qb);
  return ops::linear_grouped(h, groups.row_expert, w.routed_w2, o, tile);
}

// The shared expert. On CUDA at decode its w1 and w3 run as one grouped launch (two lists of one matrix,
// every row against matrix 0), as the routed experts' w1 / w3 do: one GEMV streaming both matrices instead
// of two calls each with its own x pre-pass. The same linears row for row, so the same bits.
Tensor shared_expert_forward(const MoeWeights& w, const Tensor& x, const LayerCtx& c) {
  const ExpertWeights& e = w.shared;
  const int64_t T = x.size(0);
  if (!run_grouped(T, x.device()) || !w.shared_rows.defined() || T > w.shared_rows.numel() ||
      w.shared_rows.device() != x.device())
    return expert_forward(e, x, Tensor(), c);
  const Tensor matrix0 = w.shared_rows.slice(0, 0, T);
  const std::vector<const std::vector<ops::QWeight>*> w13{&w.shared_w1, &w.shared_w3};
  const Tensor gu = ops::linear_grouped(x, matrix0, w13, linear_q_opts(c), 0, 1);  // [2T, inter]: w1, then w3
  const Tensor h = ops::swiglu(gu.slice(0, 0, T), gu.slice(0, T, 2 * T), Tensor(), c.cfg.swiglu_limit, c.num.bf16);
  return linear_q(h, e.w2, c);
}

// What the MoE's combine adds: the routed experts' outputs in the grouped order, each pair's slot, the shared expert's
// output.
struct MoeOut {
  Tensor expert_out, slots, shared;
};

// The MoE of one layer up to the combine (§2.8). token_ids: the rows' token ids, int32 [T] on x's device, read by
// hash-routed layers only (undefined otherwise).
MoeOut moe_experts(const MoeWeights& w, const Tensor& x, const Tensor& token_ids, const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t T = x.size(0), E = cfg.n_routed_experts, K = cfg.n_activated_experts, dim = cfg.dim;
  DI_CHECK(cfg.score_func == "sqrtsoftplus", "score_func '{}' is not supported (V4 uses sqrtsoftplus)", cfg.score_func);
  // The shared expert beside the routed ones (on CUDA on the side stream: both are GEMV chains that leave HBM bandwidth
  // unused, and the gate -> route -> group chain before the routed GEMVs is latency; moe_combine joins). Where it
  // forks was measured, not derived (bench_cuda_model, V4.1 flash shape, ms per step): at one token before the gate
  // (1.24 against 1.25-1.27 after it); from two tokens after the gate (batch 2 1.79-1.81 against 1.83, batch 4
  // 2.71-2.73 against 2.83-2.84; batches 8 and 32 alike either way). Both orders give the same bits: the shared
  // expert and the gate read x only.
  Tensor ys;
  auto run_shared = [&] {
    ops::SideWork side(x.device(), {x}, run_beside(T));
    ys = shared_expert_forward(w, x, c);
    side.done({ys});
  };
  const bool shared_first = T == 1;
  if (shared_first) run_shared();
  ops::QWeight gate{w.gate_weight, {}, 0};
  Tensor logits = linear_f32(x, gate);  // [T, E]
  if (!shared_first) run_shared();
  const FamilyNumerics fam = family_numerics(cfg.family);
  ops::RouteOpts ro;
  ro.func = ops::ScoreFunc::kSqrtSoftplus;
  ro.temp = cfg.gate_temp;  // V4.1 gate temperature (1 in V4 configs)
  ro.normalize = fam.moe_norm_switchable ? cfg.norm_topk_prob && K > 1 : true;
  ro.norm_eps = fam.moe_norm_eps;
  ro.route_scale = cfg.route_scale;
  const bool hash = w.tid2eid.defined();
  DI_CHECK(!hash || (token_ids.defined() && token_ids.numel() == T),
           "layer {}: a hash-routed MoE needs the {} rows' token ids", c.layer, T);
  const Tensor bias = hash ? Tensor() : w.gate_bias;
  const Tensor tid2eid = hash ? w.tid2eid : Tensor();
  const Tensor tokens = hash ? token_ids : Tensor();

  // Dispatch by expert (ops::moe_group), each expert's FFN on its rows (the FP32 combine in ascending expert order
  // plus the shared expert follows: ffn_moe). Where linear_grouped serves rows sorted by expert a tile at a time (CUDA,
  // whatever the contract) every chunk is grouped, prefill chunks too: one launch per matrix gives each row the bits of
  // the per-expert loop, whose 384 calls per matrix each filled part of the GPU (a 4,096-token prefill's experts 3x
  // faster grouped under the exact contract; tc: its grouped GEMM). Chunks of over kGroupedRowsMax rows pass the tile
  // promise of grouped_experts_forward. The grouped path routes, groups and gathers in one op (ops::moe_dispatch: at
  // one token one launch on CUDA unless DEEPINFER_CUDA_MOE_DISPATCH=0).
  const bool grouped = ops::linear_grouped_tiled(x.device());
  ops::Routing routing;
  ops::MoeGroups groups;
  Tensor yg;
  if (grouped) {
    const int64_t qb = gather_quant_block(T * K, x.device(), c);
    ops::MoeDispatch d = ops::moe_dispatch(logits, bias, tid2eid, tokens, K, ro, E, /*host_offsets=*/false, x, qb);
    routing = std::move(d.routing);
    groups = std::move(d.groups);
    yg = grouped_experts_forward(w, d.x, qb, groups, c);
  } else {
    routing = ops::moe_route(logits, bias, tid2eid, tokens, K, ro);
    groups = ops::moe_group(routing.ids, routing.weights, E);
    yg = Tensor::empty({groups.rows.size(0), dim}, DType::kF32, x.device());
    for (int64_t e = 0; e < E; ++e) {
      const int64_t a = groups.offsets[e], b = groups.offsets[e + 1];
      if (a == b) continue;
      const Tensor xe = ops::gather_rows(x, groups.rows.slice(0, a, b));
      ops::copy_into(yg.slice(0, a, b), expert_forward(w.experts[e], xe, groups.weights.slice(0, a, b), c));
    }
  }
  if (c.trace) {
    const Tensor ids = routing.ids.to(Device::kCPU);
    const int32_t* idx = ids.data<int32_t>();
    auto& rec = c.trace->experts[c.layer];
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> row(idx + t * K, idx + (t + 1) * K);
      std::sort(row.begin(), row.end());
      rec.insert(rec.end(), row.begin(), row.end());
    }
  }
  dump("shared_out", c.layer, ys);
  return {yg, groups.slots, ys};
}

}  // namespace

Tensor ffn_moe(const MoeWeights& w, const Tensor& stream, const Tensor& pre, const Tensor& norm, const Tensor& post,
               const Tensor& comb, const Tensor& token_ids, const LayerCtx& c) {
  const bool bf = c.num.bf16;
  Tensor x = ops::hc_collapse_norm(stream, pre, norm, c.cfg.norm_eps, bf);
  dump("ffn_in", c.layer, x);
  force("ffn_in", c.layer, x);
  const MoeOut m = moe_experts(w, x, token_ids, c);
  if (dump_enabled()) dump("ffn_out", c.layer, ops::moe_combine(m.expert_out, m.slots, m.shared, bf));
  // The combine and the expand in one op (one kernel on CUDA: a launch and a round trip of y fewer per layer).
  return ops::moe_combine_expand(m.expert_out, m.slots, m.shared, stream, post, comb, bf);
}

}  // namespace deepinfer
