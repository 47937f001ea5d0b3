// V4.1 "CSA2" attention (docs/v4-architecture.md §2.6): shared-KV MQA over this layer's sliding
// window plus top-k compressed entries of the latest kv source at or below the layer.
//
// Order inside a layer follows the reference: the compressor's new latents (pre-RoPE) first give
// the index keys, then the indexer scores, then the latents are rotated, FP4-quantised and
// appended to the compressed cache. Index lists follow the reference's layouts: prefill rows list
// the window positions oldest first then -1; a decode row lists the ring slots oldest first, so
// the empty slots (-1) lead while the ring fills; compressed picks follow, ascending, then -1.
// The indexer always reads its own kv source's keys (the corrected §2.6 behaviour).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/debug_dump.h"
#include "deepinfer/error.h"
#include "model/layers_v41.h"

namespace deepinfer {

namespace {

// The two-level selection's first level on one sequence's scores [T, >= n] (columns past its n keys are -inf: no block
// there is ever kept, and its newest visible entry lies within them): the candidate source picks its blocks from its
// unmasked scores; the layers after it mask the scores to those blocks.
void candidates_v41(Tensor& scores, int64_t T, int64_t start_pos, int64_t ratio, int64_t n, SharedAttnV41& shared,
                    const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  if (c.layer == cfg.candidate_source_layer) {
    shared.candidate_blocks =
        ops::candidate_blocks(scores, start_pos, ratio, cfg.candidate_block_size, cfg.candidate_topk_blocks);
    shared.candidate_width = n;
  }
  if (cfg.candidate_source_layer >= 0 && c.layer > cfg.candidate_source_layer) {
    DI_CHECK(shared.candidate_width == n && shared.candidate_blocks.defined() && shared.candidate_blocks.size(0) == T,
             "layer {}: candidate blocks over {} index keys for {} keys and {} rows", c.layer, shared.candidate_width,
             n, T);
    ops::mask_to_blocks(scores, shared.candidate_blocks, cfg.candidate_block_size);
  }
}

// A sequence's published picks (int32 [T, k], any device) into the trace: each row's k picks, then -1 to index_topk;
// and the candidate source's blocks.
void trace_picks_v41(const Tensor& picks, int64_t k, const SharedAttnV41& shared, const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  const Tensor host = picks.to(Device::kCPU);
  auto& rec = c.trace->indexer[c.layer];
  for (int64_t t = 0; t < host.size(0); ++t) {
    rec.insert(rec.end(), host.data<int32_t>() + t * k, host.data<int32_t>() + (t + 1) * k);
    rec.insert(rec.end(), cfg.index_topk - k, -1);
  }
  if (c.layer == cfg.candidate_source_layer) {
    const Tensor cand = shared.candidate_blocks.to(Device::kCPU);
    auto& cr = c.trace->candidates[c.layer];
    cr.insert(cr.end(), cand.data<int32_t>(), cand.data<int32_t>() + cand.numel());
  }
}

// The indexer of an index source: scores every key of its kv source for every query (q [T, nh*hd],
// wts [T, nh] from attention_rows_v41), applies visibility (and the candidate blocks on layers after
// the candidate source), keeps the top k = min(index_topk, keys) by (score desc, index asc) and
// publishes them ascending. The candidate source picks its candidate blocks (level one of the
// two-level selection: per row the candidate_topk_blocks blocks of candidate_block_size entries with
// the best max score, the block of the newest visible entry pinned in, blocks with no finite score
// never kept) from its own unmasked scores. Everything stays on the scores' device; the trace rows
// are copied to the host only when a trace is recorded.
void indexer_v41(const Tensor& q, const Tensor& wts, const RowPages& keys, int64_t start_pos, int64_t ratio,
                 SharedAttnV41& shared, const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t T = q.size(0), nh = cfg.index_n_heads, hd = cfg.index_head_dim, n = keys.rows();
  const bool bf = c.num.bf16;

  // Scores of every visible key (ops::index_scores: -inf past a row's visible count).
  Tensor scores = index_scores_pages(q.view({T, nh, hd}), keys, wts, {Tensor(), start_pos, ratio}, bf);
  candidates_v41(scores, T, start_pos, ratio, n, shared, c);
  const int64_t k = std::min(cfg.index_topk, n);
  shared.k = k;
  shared.picks = ops::topk_rows(scores, k, /*sort_by_index=*/true);
  if (c.trace) trace_picks_v41(shared.picks, k, shared, c);
}

}  // namespace

AttnRows attention_rows_v41(const AttentionWeightsV41& w, const Tensor& x, const int64_t* positions,
                            const ops::RopeFreqs& rope, const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  const FamilyNumerics fam = family_numerics(cfg.family);
  const int64_t D = cfg.head_dim, rd = cfg.rope_head_dim;
  const bool bf = c.num.bf16;
  AttnRows r;
  const bool compressed = cfg.compress_ratio(c.layer) > 0;
  const bool kv_source = compressed && w.kv_source, index_source = compressed && w.index_source;
  // The compressor's projections and the indexer's head weights read only x: side work beside wq_a / wkv and
  // wq_b (ops::SideWork; the same ops, joined before returning).
  if (kv_source || index_source) {
    ops::SideWork side(x.device(), {x}, run_beside(x.size(0)));
    if (kv_source) {
      if (w.compressor.ratio == 1) {  // every token its own entry: the normed BF16 projection
        r.ckv = ops::rms_norm(linear_bf16(x, w.compressor.wkv, c), w.compressor.norm, cfg.norm_eps, bf);
      } else {  // ratio 2: the FP32 projections the pooling gates
        r.ckv = linear_f32(x, w.compressor.wkv);
        r.cscore = linear_f32(x, w.compressor.wgate);
      }
    }
    if (index_source) r.iw = indexer_head_weights(x, w.indexer.weights_proj, c);  // [T, nh]
    side.done({r.ckv, r.cscore, r.iw});
  }
  // wq_a and wkv read the same x: one launch when stacked.
  const std::pair<Tensor, Tensor> qa_kv = linear_q_pair(x, w.wq_a, w.wkv, w.wq_a_kv, c);
  // The two low-rank norms together (one launch on CUDA): q's input, and the window KV [T, D] with RoPE, then
  // FP8 fake quant over the whole vector (RoPE tail included), block 32.
  const int64_t kv_quant_block = c.num.simulate_qat ? fam.window_quant_block : 0;
  ops::AttnInputs in = ops::attn_input_norms(qa_kv.first, w.q_norm, qa_kv.second, w.kv_norm, cfg.norm_eps, bf, rd,
                                             positions, rope, fam.window_quant_rope_dims ? D : D - rd, kv_quant_block);
  r.qr = std::move(in.qr);
  r.kv = std::move(in.kv);
  if (index_source) {  // the indexer's queries beside wq_b
    ops::SideWork side(x.device(), {r.qr}, run_beside(x.size(0)));
    const int64_t hd = cfg.index_head_dim;
    r.iq = linear_q(r.qr, w.indexer.wq_b, c);  // [T, nh*hd]
    ops::apply_rope(r.iq, hd, rd, positions, rope, false, bf);
    if (c.num.simulate_qat) ops::fake_quant_fp4(r.iq, 32);
    side.done({r.iq});
  }
  // q: low-rank projection and RoPE on each head's tail (no per-head re-normalisation in V4.1).
  r.q = linear_q(r.qr, w.wq_b, c);  // [T, H*D]
  ops::apply_rope(r.q, D, rd, positions, rope, false, bf);
  ops::side_join(x.device());
  dump("q", c.layer, r.q);
  dump("kv", c.layer, r.kv);
  return r;
}

void compress_batch_v41(const AttentionWeightsV41& w, const AttnRows& rows, const std::vector<int64_t>& offset,
                        const std::vector<int64_t>& start, const std::vector<LayerState*>& states,
                        const ops::RopeFreqs& rope, const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t D = cfg.head_dim, rd = cfg.rope_head_dim;
  const bool bf = c.num.bf16;
  DI_CHECK(w.kv_source && cfg.compress_ratio(c.layer) > 0 && offset.size() == states.size() + 1 &&
               start.size() == states.size(),
           "layer {}: compress_batch_v41 for a layer that is no kv source, or {} offsets / {} starts for {} sequences",
           c.layer, offset.size(), start.size(), states.size());
  std::vector<int64_t> gpos, counts;  // each new entry's position (its group's first token); entries per sequence
  Tensor lat;
  if (w.compressor.ratio == 1) {  // every token its own entry: the normed BF16 projection
    lat = rows.ckv;
    for (size_t b = 0; b < states.size(); ++b) {
      counts.push_back(offset[b + 1] - offset[b]);
      for (int64_t p = start[b]; p < start[b] + counts.back(); ++p) gpos.push_back(p);
    }
  } else {
    lat = compressor_pool_batch(each_state(states, &LayerState::compressor), rows.ckv, rows.cscore, Tensor(), D, false,
                                offset, start, gpos, counts);
    for (int64_t& g : gpos) g *= w.compressor.ratio;  // entry j stands at its group's first token
    if (lat.size(0) > 0) {
      ops::round_bf16(lat, bf);  // kv.to(bf16) before the norm
      lat = ops::rms_norm(lat, w.compressor.norm, cfg.norm_eps, bf);
    }
  }
  if (gpos.empty()) return;
  DI_CHECK(lat.dim() == 2 && lat.size(0) == static_cast<int64_t>(gpos.size()) && lat.size(1) == D,
           "layer {}: {} compressed latents for {} entries", c.layer, lat.describe(), gpos.size());
  if (w.indexer.owns_keys) {  // index keys from the latents before their RoPE
    Tensor k = ops::rms_norm(linear_bf16(lat, w.indexer.wk, c), w.indexer.k_norm, cfg.norm_eps, bf);
    ops::apply_rope(k, cfg.index_head_dim, rd, gpos.data(), rope, false, bf);
    if (c.num.simulate_qat) ops::fake_quant_fp4(k, 32);
    append_rows_batch(k, counts, each_state(states, &LayerState::index_keys));
  }
  ops::apply_rope(lat, D, rd, gpos.data(), rope, false, bf);
  if (c.num.simulate_qat) ops::fake_quant_fp4_e4m3_scale(lat, 16);
  append_rows_batch(lat, counts, each_state(states, &LayerState::compressed));
}

AttnChunk attention_seq_v41(const AttentionWeightsV41& w, const AttnRows& rows, int64_t start_pos, int64_t window_floor,
                            SequenceState& seq, SharedAttnV41& shared, const LayerCtx& c,
                            std::vector<IndexJobV41>* jobs) {
  const ModelConfig& cfg = c.cfg;
  const int64_t T = rows.q.size(0), W = cfg.window_size;
  LayerState& st = seq.layers[c.layer];
  const Tensor& kv = rows.kv;

  const int64_t ratio = cfg.compress_ratio(c.layer);
  bool deferred = false;  // the indexer recorded in jobs: picks and kcols set by index_batch_v41
  const int64_t n_comp = ratio > 0 ? (start_pos + T) / ratio : 0;  // entries visible to the chunk's last query
  if (ratio > 0) {  // a kv source's new entries and keys are in already (compress_batch_v41)
    LayerState& src = seq.layers[cfg.kv_source_of(c.layer)];
    DI_CHECK(src.index_keys.rows() == n_comp, "layer {}: kv source {} holds {} index keys, expected {}", c.layer,
             cfg.kv_source_of(c.layer), src.index_keys.rows(), n_comp);
    if (w.index_source) {
      if (n_comp == 0) {
        shared.k = 0;
        shared.picks = Tensor();
      } else if (jobs != nullptr) {
        IndexJobV41 job;
        job.T = T, job.start_pos = start_pos, job.ratio = ratio, job.keys = &src.index_keys, job.shared = &shared;
        jobs->push_back(job);
        deferred = true;
      } else {
        indexer_v41(rows.iq, rows.iw, src.index_keys, start_pos, ratio, shared, c);
      }
    }
    DI_CHECK(src.compressed.rows() == n_comp, "layer {}: kv source holds {} compressed entries, expected {}", c.layer,
             src.compressed.rows(), n_comp);
  }
  const LayerState* src = ratio > 0 ? &seq.layers[cfg.kv_source_of(c.layer)] : nullptr;
  const int64_t k = ratio > 0 && !deferred ? shared.k : 0;
  DI_CHECK(ratio == 0 || deferred || (shared.picks.defined() ? shared.picks.numel() : 0) == T * k,
           "layer {}: no top-k list from an index source for this chunk", c.layer);

  // The KV table (attend_chunks): window rows for positions wstart..start_pos+T-1, then the compressed entries.
  DI_CHECK(window_floor <= start_pos, "layer {}: window floor {} above the chunk start {}", c.layer, window_floor,
           start_pos);
  const int64_t wstart = std::max<int64_t>({0, start_pos - W + 1, window_floor});
  const int64_t nwin = start_pos + T - wstart;

  // Index lists (ops::sparse_index, built on the table's device): the window rows, oldest first (a
  // decode row right-aligned: the empty slots lead while the ring fills), then the picks.
  AttnChunk chunk = attn_chunk(kv, start_pos, wstart, &st.window, src ? &src->compressed : nullptr);
  ops::IndexLayout& lay = chunk.lay;
  lay.start_pos = start_pos;
  lay.window = W;
  lay.floor = window_floor;
  lay.wstart = wstart;
  lay.wcols = start_pos == 0 ? std::min(T, W) : W;
  lay.pad_front = start_pos > 0 && T == 1;
  lay.offset = nwin;
  lay.kcols = k;
  if (k > 0) chunk.picks = shared.picks;
  return chunk;
}

void index_batch_v41(const std::vector<IndexJobV41>& jobs, std::vector<AttnChunk>& chunks, const Tensor& iq,
                     const Tensor& iw, const LayerCtx& c) {
  if (jobs.empty()) return;
  auto publish = [&](const IndexJobV41& j) {  // the job's list into its chunk
    DI_CHECK(j.chunk < chunks.size() && j.shared->picks.defined() && j.shared->picks.numel() == j.T * j.shared->k,
             "layer {}: no top-k list for a deferred indexer", c.layer);
    chunks[j.chunk].lay.kcols = j.shared->k;
    chunks[j.chunk].picks = j.shared->picks;
  };
  if (jobs.size() == 1) {  // one sequence: its own indexer, as without jobs
    const IndexJobV41& j = jobs[0];
    indexer_v41(iq.slice(0, j.row0, j.row0 + j.T), iw.slice(0, j.row0, j.row0 + j.T), *j.keys, j.start_pos, j.ratio,
                *j.shared, c);
    publish(j);
    return;
  }
  const ModelConfig& cfg = c.cfg;
  const int64_t lo = jobs.front().row0;
  Tensor scores = index_scores_jobs(std::vector<IndexJob>(jobs.begin(), jobs.end()), iq, iw, cfg.index_n_heads,
                                    cfg.index_head_dim, c.num.bf16);
  for (const IndexJobV41& j : jobs) {  // per sequence, on its rows
    Tensor rows = scores.slice(0, j.row0 - lo, j.row0 - lo + j.T);
    candidates_v41(rows, j.T, j.start_pos, j.ratio, j.keys->rows(), *j.shared, c);
  }
  const int64_t k = std::min(cfg.index_topk, scores.size(1));
  const Tensor picks = ops::topk_rows(scores, k, /*sort_by_index=*/true);
  for (const IndexJobV41& j : jobs) {
    j.shared->k = k;
    j.shared->picks = picks.slice(0, j.row0 - lo, j.row0 - lo + j.T);
    publish(j);
    if (c.trace) trace_picks_v41(j.shared->picks, k, *j.shared, c);
  }
}

}  // namespace deepinfer
