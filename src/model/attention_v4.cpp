// V4 attention: shared-KV MQA over a sliding window plus compressed entries (CSA / HCA),
// docs/v4-architecture.md §2.4 and §2.5.
//
// One code path serves prefill, chunked prefill and decode: the chunk's window KV and the
// compressor groups it completes are computed first, then every query attends to the window
// positions max(0, p-W+1)..p (oldest first) and to the compressed entries visible at p
// (group j is visible once its last token j*r+r-1 <= p): all of them for C128, the indexer's
// top-k for C4. Entries are listed window first, then compressed, as the reference does.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/debug_dump.h"
#include "deepinfer/error.h"
#include "model/layers_v4.h"

namespace deepinfer {

namespace {

// Runs a compressor over every sequence's chunk (compressor_pool_batch) from the forward's FP32 projections kv / score
// [rows, c*d] (attention_rows_v4); returns the latents (after norm, before RoPE) of every group the chunks complete,
// [n_new, d], sequence by sequence, with their group ids in `groups` and each sequence's count in `counts`.
Tensor compressor(const CompressorWeights& w, const std::vector<CompressorState*>& states, const Tensor& kv,
                  const Tensor& score, const std::vector<int64_t>& offset, const std::vector<int64_t>& start,
                  std::vector<int64_t>& groups, std::vector<int64_t>& counts, const LayerCtx& c) {
  DI_CHECK(states.front()->ratio == w.ratio, "compressor: state ratio {} for weights of ratio {}",
           states.front()->ratio, w.ratio);
  Tensor lat = compressor_pool_batch(states, kv, score, w.ape, w.head_dim, w.overlap, offset, start, groups, counts);
  if (lat.size(0) == 0) return lat;
  ops::round_bf16(lat, c.num.bf16);  // kv.to(bf16) before the norm
  return ops::rms_norm(lat, w.norm, c.cfg.norm_eps, c.num.bf16);
}

}  // namespace

Tensor compressor_pool_batch(const std::vector<CompressorState*>& states, const Tensor& kv, const Tensor& score,
                             const Tensor& ape, int64_t d, bool overlap, const std::vector<int64_t>& offset,
                             const std::vector<int64_t>& start, std::vector<int64_t>& groups,
                             std::vector<int64_t>& counts) {
  const size_t B = states.size();
  DI_CHECK(B > 0 && offset.size() == B + 1 && start.size() == B && offset.front() == 0,
           "compressor: {} offsets and {} starts for {} sequences", offset.size(), start.size(), B);
  DI_CHECK(kv.dim() == 2 && score.shape() == kv.shape() && kv.is_contiguous() && score.is_contiguous() &&
               kv.dtype() == DType::kF32 && score.dtype() == DType::kF32 && kv.size(0) == offset.back(),
           "compressor: projections {} / {} for {} stacked rows", kv.describe(), score.describe(), offset.back());
  const int64_t r = states[0]->ratio, width = kv.size(1), lead = overlap ? r : 0;
  const Device dev = kv.device();
  // Sequence b's section of the rows to pool (only when its chunk completes a group): with overlap its previous group
  // first, then its pending rows, then its chunk's rows up to its last complete group.
  int64_t rows = 0;
  for (size_t b = 0; b < B; ++b) {
    const CompressorState& st = *states[b];
    DI_CHECK(st.ratio == r && st.width == width, "compressor: state [{}, {}] in a batch of ratio {} and width {}",
             st.ratio, st.width, r, width);
    const int64_t T = offset[b + 1] - offset[b], G = (start[b] % r + T) / r;
    if (T > 0 && G > 0) rows += lead + G * r;
  }
  Tensor kvb = Tensor::empty({rows, width}, DType::kF32, dev), scb = Tensor::empty({rows, width}, DType::kF32, dev);
  std::vector<ops::RowCopy> in, out;  // into the sections; into the states (after `in`: it overwrites what `in` reads)
  std::vector<int32_t> keep;          // overlap: the pooled groups that are real (see below)
  int64_t row = 0, pooled = 0;        // the next section's first row; groups pooled before it
  for (size_t b = 0; b < B; ++b) {
    CompressorState& st = *states[b];
    const int64_t T = offset[b + 1] - offset[b], cur = start[b] % r, G = (cur + T) / r, used = G * r - cur;
    counts.push_back(T > 0 ? G : 0);
    if (T == 0) continue;  // every row of this chunk skipped (bounded replay): its state stays as it is
    const float* kv_rows = kv.data<float>() + offset[b] * width;
    const float* sc_rows = score.data<float>() + offset[b] * width;
    if (G > 0) {
      float* kd = kvb.data<float>() + row * width;
      float* sd = scb.data<float>() + row * width;
      if (overlap) {  // (a state without a previous group holds kv 0 / score -inf there: an empty half)
        in.push_back({kd, st.prev_kv.data<float>(), r});
        in.push_back({sd, st.prev_score.data<float>(), r});
        // One compress_pool over every section with overlap also pools each later section's previous group (as a
        // group after the section before it): those outputs are dropped.
        if (row > 0) ++pooled;
        for (int64_t g = 0; g < G; ++g) keep.push_back(static_cast<int32_t>(pooled + g));
        // The last complete group becomes the next one's previous group.
        out.push_back({st.prev_kv.data<float>(), kd + (lead + (G - 1) * r) * width, r});
        out.push_back({st.prev_score.data<float>(), sd + (lead + (G - 1) * r) * width, r});
      }
      in.push_back({kd + lead * width, st.cur_kv.data<float>(), cur});
      in.push_back({sd + lead * width, st.cur_score.data<float>(), cur});
      in.push_back({kd + (lead + cur) * width, kv_rows, used});
      in.push_back({sd + (lead + cur) * width, sc_rows, used});
      for (int64_t g = 0; g < G; ++g) groups.push_back((start[b] - cur) / r + g);
      pooled += G;
      row += lead + G * r;
    }
    // The open group's rows stay pending: the chunk's rows past its last complete group, after the pending rows when
    // it completed none (scores without the position bias: compress_pool adds it).
    const int64_t kept = G > 0 ? 0 : cur, rest = T - std::max<int64_t>(used, 0);
    out.push_back({st.cur_kv.data<float>() + kept * width, kv_rows + (T - rest) * width, rest});
    out.push_back({st.cur_score.data<float>() + kept * width, sc_rows + (T - rest) * width, rest});
    st.cur_count = kept + rest;
  }
  ops::copy_rows(in, width, dev);
  Tensor lat = Tensor::empty({0, d}, DType::kF32, dev);
  if (rows > 0) {
    lat = ops::compress_pool(kvb, scb, ape, r, d, overlap, /*has_prev=*/true);
    if (overlap && pooled > static_cast<int64_t>(keep.size())) lat = ops::gather_rows(lat, ids_tensor(keep, dev));
  }
  ops::copy_rows(out, width, dev);
  return lat;
}

void append_rows_batch(const Tensor& t, const std::vector<int64_t>& counts, const std::vector<RowPages*>& stores) {
  DI_CHECK(counts.size() == stores.size() && t.dim() == 2, "append_rows_batch: {} counts for {} stores, rows {}",
           counts.size(), stores.size(), t.describe());
  std::vector<ops::RowCopy> copies;
  int64_t r = 0;
  for (size_t b = 0; b < stores.size(); r += counts[b], ++b)
    stores[b]->append_copies(t.slice(0, r, r + counts[b]), copies);
  DI_CHECK(r == t.size(0), "append_rows_batch: {} rows counted for {}", r, t.describe());
  ops::copy_rows(copies, t.size(1), t.device());
}

namespace {

// A sequence's picks (int32 [T, k] in score order, -1 padded; any device) into the trace: each row's picks ascending,
// then -1 to index_topk.
void trace_picks(const Tensor& picks, const LayerCtx& c) {
  const Tensor host = picks.to(Device::kCPU);
  const int64_t T = host.size(0), k = host.size(1), ktop = c.cfg.index_topk;
  std::vector<int32_t> trace_rows(T * ktop, -1);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* out = host.data<int32_t>() + t * k;
    const int64_t m = std::find(out, out + k, -1) - out;
    std::copy(out, out + m, trace_rows.data() + t * ktop);
    std::sort(trace_rows.data() + t * ktop, trace_rows.data() + t * ktop + m);
  }
  c.trace->indexer[c.layer].insert(c.trace->indexer[c.layer].end(), trace_rows.begin(), trace_rows.end());
}

// Lightning indexer (§2.5): scores every visible index key for every query (q [T, heads*d] and the
// scaled weights wts [T, heads] from attention_rows_v4) and keeps the top min(index_topk, visible) by
// (score desc, index asc). Returns picks int32 [T, kcomp] on the scores' device, per query in score
// order, -1 padded (the trace copies them to the host only when one is recorded).
Tensor indexer(const Tensor& q, const Tensor& wts, int64_t start_pos, const RowPages& keys, int64_t kcomp,
               const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t T = q.size(0), nh = cfg.index_n_heads, hd = cfg.index_head_dim, r = 4;
  const bool bf = c.num.bf16;
  // Scores of every visible index key (ops::index_scores), then the top min(index_topk, kcomp) of
  // each row in score order (kcomp <= index_topk).
  const Tensor scores = index_scores_pages(q.view({T, nh, hd}), keys, wts, {Tensor(), start_pos, r}, bf);
  Tensor top = ops::topk_rows(scores, kcomp);
  if (c.trace) trace_picks(top, c);
  return top;
}

}  // namespace

AttnRows AttnRows::rows(int64_t a, int64_t b) const {
  auto cut = [&](const Tensor& t) { return t.defined() ? t.slice(0, a, b) : Tensor(); };
  return AttnRows{cut(qr), cut(q), cut(kv), cut(ckv), cut(cscore), cut(ikv), cut(iscore), cut(iq), cut(iw)};
}

AttnRows attention_rows_v4(const AttentionWeights& w, const Tensor& x, const int64_t* positions,
                           const ops::RopeFreqs& rope, const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t D = cfg.head_dim, rd = cfg.rope_head_dim;
  const bool bf = c.num.bf16;
  AttnRows r;
  // The compressors' FP32 projections and the indexer's head weights read only x: side work beside wq_a / wkv and
  // wq_b (ops::SideWork; the same ops, joined before returning).
  if (w.has_compressor || w.has_indexer) {
    ops::SideWork side(x.device(), {x}, run_beside(x.size(0)));
    if (w.has_compressor) {
      r.ckv = linear_f32(x, w.compressor.wkv);  // [T, c*d]
      r.cscore = linear_f32(x, w.compressor.wgate);
    }
    if (w.has_indexer) {
      r.ikv = linear_f32(x, w.indexer.compressor.wkv);
      r.iscore = linear_f32(x, w.indexer.compressor.wgate);
      r.iw = indexer_head_weights(x, w.indexer.weights_proj, c);  // [T, nh]
    }
    side.done({r.ckv, r.cscore, r.ikv, r.iscore, r.iw});
  }
  // wq_a and wkv read the same x: one launch when stacked.
  const std::pair<Tensor, Tensor> qa_kv = linear_q_pair(x, w.wq_a, w.wkv, w.wq_a_kv, c);
  // The two low-rank norms together (one launch on CUDA): q's input, and the window KV [T, D] (one shared latent
  // per token) with RoPE, then FP8 fake quant of the NoPE part in blocks of 64.
  ops::AttnInputs in = ops::attn_input_norms(qa_kv.first, w.q_norm, qa_kv.second, w.kv_norm, cfg.norm_eps, bf, rd,
                                             positions, rope, D - rd, c.num.simulate_qat ? 64 : 0);
  r.qr = std::move(in.qr);
  r.kv = std::move(in.kv);
  if (w.has_indexer) {  // the indexer's queries beside wq_b
    ops::SideWork side(x.device(), {r.qr}, run_beside(x.size(0)));
    const int64_t hd = cfg.index_head_dim;
    r.iq = linear_q(r.qr, w.indexer.wq_b, c);  // [T, nh*hd]
    ops::apply_rope(r.iq, hd, rd, positions, rope, false, bf);
    ops::hadamard(r.iq, hd, bf);
    if (c.num.simulate_qat) ops::fake_quant_fp4(r.iq, 32);
    side.done({r.iq});
  }
  // q: low-rank projection, weightless per-head re-norm, RoPE on each head's tail.
  r.q = linear_q(r.qr, w.wq_b, c);  // [T, H*D]
  dump("q_proj", c.layer, r.q);
  ops::renorm_heads(r.q, D, cfg.norm_eps, bf);
  ops::apply_rope(r.q, D, rd, positions, rope, false, bf);
  ops::side_join(x.device());
  dump("q", c.layer, r.q);
  dump("qr", c.layer, r.qr);
  dump("kv", c.layer, r.kv);
  return r;
}

void compress_batch_v4(const AttentionWeights& w, const AttnRows& rows, const std::vector<int64_t>& offset,
                       const std::vector<int64_t>& start, const std::vector<LayerState*>& states,
                       const ops::RopeFreqs& rope, const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t D = cfg.head_dim, rd = cfg.rope_head_dim;
  const bool bf = c.num.bf16;
  // The indexer's compressor first (§2.5 order; both run before any scoring or attention).
  if (w.has_indexer) {
    std::vector<int64_t> groups, counts;
    Tensor keys = compressor(w.indexer.compressor, each_state(states, &LayerState::index_compressor), rows.ikv,
                             rows.iscore, offset, start, groups, counts, c);
    if (!groups.empty()) {
      for (int64_t& g : groups) g *= 4;  // each key stands at its group's first token
      ops::apply_rope(keys, cfg.index_head_dim, rd, groups.data(), rope, false, bf);
      ops::hadamard(keys, cfg.index_head_dim, bf);
      if (c.num.simulate_qat) ops::fake_quant_fp4(keys, 32);
      append_rows_batch(keys, counts, each_state(states, &LayerState::index_keys));
    }
  }
  if (w.has_compressor) {
    std::vector<int64_t> groups, counts;
    Tensor lat = compressor(w.compressor, each_state(states, &LayerState::compressor), rows.ckv, rows.cscore, offset,
                            start, groups, counts, c);
    if (!groups.empty()) {
      for (int64_t& g : groups) g *= w.compressor.ratio;
      ops::apply_rope(lat, D, rd, groups.data(), rope, false, bf);
      if (c.num.simulate_qat) ops::fake_quant_fp8(lat, 0, D - rd, 64);
      append_rows_batch(lat, counts, each_state(states, &LayerState::compressed));
    }
  }
}

AttnChunk attention_seq_v4(const AttentionWeights& w, const AttnRows& r, int64_t start_pos, LayerState& st,
                           const LayerCtx& c, std::vector<IndexJob>* jobs) {
  const ModelConfig& cfg = c.cfg;
  const int64_t T = r.q.size(0), W = cfg.window_size;
  const Tensor& kv = r.kv;
  const int64_t ratio = w.has_compressor ? w.compressor.ratio : 0;  // (compress_batch_v4 ran the compressors)

  // The KV table: window rows for positions wstart..start_pos+T-1, then every compressed entry.
  const int64_t wstart = std::max<int64_t>(0, start_pos - W + 1);
  const int64_t nwin = start_pos + T - wstart, ncomp = w.has_compressor ? st.compressed.rows() : 0;
  AttnChunk chunk = attn_chunk(kv, start_pos, wstart, &st.window, w.has_compressor ? &st.compressed : nullptr);

  // Index lists: W window slots (oldest first, -1 padded) then the compressed picks.
  const int64_t kcomp = ratio == 4 ? std::min(cfg.index_topk, ncomp) : ncomp;
  if (ratio == 4 && jobs != nullptr && kcomp > 0) {  // scored with the layer's other sequences (index_batch_v4)
    IndexJob job;
    job.T = T, job.start_pos = start_pos, job.ratio = 4, job.keys = &st.index_keys;
    jobs->push_back(job);
  } else if (ratio == 4) {
    chunk.picks = indexer(r.iq, r.iw, start_pos, st.index_keys, kcomp, c);
  }
  ops::IndexLayout& lay = chunk.lay;
  lay.start_pos = start_pos;
  lay.window = W;
  lay.wstart = wstart;
  lay.wcols = W;
  lay.offset = nwin;
  lay.kcols = kcomp;
  lay.ratio = ratio;  // C128 (no picks): every visible entry in order
  return chunk;
}

void index_batch_v4(const std::vector<IndexJob>& jobs, std::vector<AttnChunk>& chunks, const Tensor& iq,
                    const Tensor& iw, const LayerCtx& c) {
  if (jobs.empty()) return;
  for (const IndexJob& j : jobs)
    DI_CHECK(j.chunk < chunks.size() && chunks[j.chunk].lay.kcols > 0, "layer {}: a deferred indexer without its chunk",
             c.layer);
  if (jobs.size() == 1) {  // one sequence: its own indexer, as without jobs
    const IndexJob& j = jobs[0];
    AttnChunk& k = chunks[j.chunk];
    k.picks = indexer(iq.slice(0, j.row0, j.row0 + j.T), iw.slice(0, j.row0, j.row0 + j.T), j.start_pos, *j.keys,
                      k.lay.kcols, c);
    return;
  }
  const ModelConfig& cfg = c.cfg;
  const Tensor scores = index_scores_jobs(jobs, iq, iw, cfg.index_n_heads, cfg.index_head_dim, c.num.bf16);
  // k: the largest kcols (each min(index_topk, the chunk's compressed entries)); a row's picks are its own top, then -1
  // (past its kcols it has no further finite score).
  int64_t k = 0;
  for (const IndexJob& j : jobs) k = std::max(k, chunks[j.chunk].lay.kcols);
  const Tensor top = ops::topk_rows(scores, k);
  const int64_t lo = jobs.front().row0;
  for (const IndexJob& j : jobs) {
    AttnChunk& ch = chunks[j.chunk];
    ch.picks = top.slice(0, j.row0 - lo, j.row0 - lo + j.T);
    ch.lay.kcols = k;
    if (c.trace) trace_picks(ch.picks, c);
  }
}

}  // namespace deepinfer
