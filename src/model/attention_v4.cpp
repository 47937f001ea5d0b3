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

#include "core/debug_dump.h"
#include "deepinfer/error.h"
#include "model/layers_v4.h"

namespace deepinfer {

namespace {

// The compressor's gated pooling of one complete group (§2.5): per channel a softmax over the
// group's rows (ratio 4: the previous group's first-half channels and this group's second half).
void pool_group(const CompressorState& st, bool overlap, int64_t d, float* out) {
  const int64_t r = st.ratio, w = st.width;
  std::vector<float> sc(2 * r), kv(2 * r);
  for (int64_t ch = 0; ch < d; ++ch) {
    int64_t n = 0;
    if (overlap) {
      for (int64_t i = 0; i < r; ++i, ++n) {
        kv[n] = st.has_prev ? st.prev_kv[i * w + ch] : 0.0f;
        sc[n] = st.has_prev ? st.prev_score[i * w + ch] : -INFINITY;
      }
      for (int64_t i = 0; i < r; ++i, ++n) {
        kv[n] = st.cur_kv[i * w + d + ch];
        sc[n] = st.cur_score[i * w + d + ch];
      }
    } else {
      for (int64_t i = 0; i < r; ++i, ++n) {
        kv[n] = st.cur_kv[i * w + ch];
        sc[n] = st.cur_score[i * w + ch];
      }
    }
    float m = -INFINITY;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, sc[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += (sc[i] = std::exp(sc[i] - m));
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc += kv[i] * (sc[i] / sum);
    out[ch] = acc;
  }
}

// Runs a compressor over the chunk; returns the latents (after norm, before RoPE) of every group
// the chunk completes, [n_new, d], and their group ids in `groups`.
Tensor compressor(const CompressorWeights& w, CompressorState& st, const Tensor& x, int64_t start_pos,
                  std::vector<int64_t>& groups, const LayerCtx& c) {
  const int64_t T = x.size(0), r = w.ratio, d = w.head_dim, width = st.width;
  Tensor kv = linear_f32(x, w.wkv);     // [T, c*d] FP32
  Tensor score = linear_f32(x, w.wgate);
  const float* ape = w.ape.data<float>();
  std::vector<float> pooled;
  for (int64_t i = 0; i < T; ++i) {
    const int64_t pos = start_pos + i, slot = pos % r;
    std::memcpy(&st.cur_kv[slot * width], kv.data<float>() + i * width, width * sizeof(float));
    const float* s = score.data<float>() + i * width;
    for (int64_t k = 0; k < width; ++k) st.cur_score[slot * width + k] = s[k] + ape[slot * width + k];
    st.cur_count = slot + 1;
    if (slot != r - 1) continue;
    groups.push_back(pos / r);
    pooled.resize(pooled.size() + d);
    pool_group(st, w.overlap, d, pooled.data() + pooled.size() - d);
    if (w.overlap) {
      st.prev_kv = st.cur_kv;
      st.prev_score = st.cur_score;
      st.has_prev = true;
    }
    st.cur_count = 0;
  }
  const int64_t n = static_cast<int64_t>(groups.size());
  Tensor lat = Tensor::empty({n, d}, DType::kF32);
  if (n == 0) return lat;
  std::memcpy(lat.data<float>(), pooled.data(), n * d * sizeof(float));
  ops::round_bf16(lat, c.num.bf16);  // kv.to(bf16) before the norm
  return ops::rms_norm(lat, w.norm, c.cfg.norm_eps, c.num.bf16);
}

// Weightless per-head RMS re-normalisation of q (V4), in BF16 like the reference when bf16 is on:
// q.square() and its mean are BF16, rsqrt(mean + eps) is BF16, q * that is rounded.
void renorm_heads(Tensor& q, int64_t head_dim, float eps, bool bf16) {
  const int64_t n = q.numel() / head_dim;
  float* p = q.data<float>();
  auto rd = [&](float v) { return bf16 ? round_bf16(v) : v; };
#pragma omp parallel for if (n > 16)
  for (int64_t h = 0; h < n; ++h) {
    float* a = p + h * head_dim;
    double ss = 0;
    for (int64_t i = 0; i < head_dim; ++i) ss += rd(a[i] * a[i]);
    const float mean = rd(static_cast<float>(ss / head_dim));
    const float r = rd(1.0f / std::sqrt(rd(mean + eps)));
    for (int64_t i = 0; i < head_dim; ++i) a[i] = rd(a[i] * r);
  }
}

// Lightning indexer (§2.5): scores every visible index key for every query and keeps the top
// min(index_topk, visible) by (score desc, index asc). Returns picks per query, -1 padded to
// `kcomp` entries, in score order.
std::vector<int32_t> indexer(const IndexerWeights& w, const Tensor& x, const Tensor& qr, int64_t start_pos,
                             const RowPages& keys, const ops::RopeFreqs& rope, const std::vector<int64_t>& positions,
                             int64_t kcomp, const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t T = x.size(0), nh = cfg.index_n_heads, hd = cfg.index_head_dim, r = 4;
  const bool bf = c.num.bf16;
  Tensor q = linear_q(qr, w.wq_b, c);  // [T, nh*hd]
  ops::apply_rope(q, hd, cfg.rope_head_dim, positions.data(), rope, false, bf);
  ops::hadamard(q, hd, bf);
  if (c.num.simulate_qat) ops::fake_quant_fp4(q, 32);
  Tensor wts = linear_bf16(x, w.weights_proj, c);  // [T, nh]
  const float wscale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5) * std::pow(static_cast<double>(nh), -0.5));
  float* wp = wts.data<float>();
  for (int64_t i = 0; i < wts.numel(); ++i) wp[i] = bf ? round_bf16(wp[i] * wscale) : wp[i] * wscale;

  // Scores of every visible index key (ops::index_scores), then the top min(index_topk, kcomp) of
  // each row in score order (kcomp <= index_topk).
  const Tensor scores = ops::index_scores(q.view({T, nh, hd}), pages_tensor(keys), wts, {Tensor(), start_pos, r}, bf);
  const Tensor top = ops::topk_rows(scores, kcomp);
  std::vector<int32_t> picks(top.data<int32_t>(), top.data<int32_t>() + T * kcomp);
  if (c.trace) {
    const int64_t ktop = cfg.index_topk;
    std::vector<int32_t> trace_rows(T * ktop, -1);
    for (int64_t t = 0; t < T; ++t) {
      const int32_t* out = picks.data() + t * kcomp;
      const int64_t m = std::find(out, out + kcomp, -1) - out;
      std::copy(out, out + m, trace_rows.data() + t * ktop);
      std::sort(trace_rows.data() + t * ktop, trace_rows.data() + t * ktop + m);
    }
    c.trace->indexer[c.layer].insert(c.trace->indexer[c.layer].end(), trace_rows.begin(), trace_rows.end());
  }
  return picks;
}

}  // namespace

Tensor attention_v4(const AttentionWeights& w, const Tensor& x, int64_t start_pos, LayerState& st,
                    const ops::RopeFreqs& rope, const LayerCtx& c) {
  const ModelConfig& cfg = c.cfg;
  const int64_t T = x.size(0), D = cfg.head_dim, rd = cfg.rope_head_dim, W = cfg.window_size;
  const bool bf = c.num.bf16;
  std::vector<int64_t> positions(T);
  for (int64_t i = 0; i < T; ++i) positions[i] = start_pos + i;

  // q: low-rank projection, weightless per-head re-norm, RoPE on each head's tail.
  Tensor qr = ops::rms_norm(linear_q(x, w.wq_a, c), w.q_norm, cfg.norm_eps, bf);
  Tensor q = linear_q(qr, w.wq_b, c);  // [T, H*D]
  dump("q_proj", c.layer, q);
  renorm_heads(q, D, cfg.norm_eps, bf);
  ops::apply_rope(q, D, rd, positions.data(), rope, false, bf);
  dump("q", c.layer, q);
  dump("qr", c.layer, qr);

  // Window KV: one shared latent per token, RoPE, FP8 fake quant of the NoPE part.
  Tensor kv = ops::rms_norm(linear_q(x, w.wkv, c), w.kv_norm, cfg.norm_eps, bf);  // [T, D]
  ops::apply_rope(kv, D, rd, positions.data(), rope, false, bf);
  if (c.num.simulate_qat) ops::fake_quant_fp8(kv, 0, D - rd, 64);
  dump("kv", c.layer, kv);

  // Compressors (indexer's first, §2.5 order; both run before any scoring or attention).
  if (w.has_indexer) {
    std::vector<int64_t> groups;
    Tensor keys = compressor(w.indexer.compressor, st.index_compressor, x, start_pos, groups, c);
    std::vector<int64_t> kpos(groups.size());
    for (size_t i = 0; i < groups.size(); ++i) kpos[i] = groups[i] * 4;
    if (!groups.empty()) {
      ops::apply_rope(keys, cfg.index_head_dim, rd, kpos.data(), rope, false, bf);
      ops::hadamard(keys, cfg.index_head_dim, bf);
      if (c.num.simulate_qat) ops::fake_quant_fp4(keys, 32);
      for (int64_t i = 0; i < keys.size(0); ++i)
        std::memcpy(st.index_keys.append(), keys.data<float>() + i * cfg.index_head_dim,
                    cfg.index_head_dim * sizeof(float));
    }
  }
  const int64_t ratio = w.has_compressor ? w.compressor.ratio : 0;
  if (w.has_compressor) {
    std::vector<int64_t> groups;
    Tensor lat = compressor(w.compressor, st.compressor, x, start_pos, groups, c);
    if (!groups.empty()) {
      std::vector<int64_t> gpos(groups.size());
      for (size_t i = 0; i < groups.size(); ++i) gpos[i] = groups[i] * ratio;
      ops::apply_rope(lat, D, rd, gpos.data(), rope, false, bf);
      if (c.num.simulate_qat) ops::fake_quant_fp8(lat, 0, D - rd, 64);
      for (int64_t i = 0; i < lat.size(0); ++i) std::memcpy(st.compressed.append(), lat.data<float>() + i * D, D * sizeof(float));
    }
  }

  // The KV table: window rows for positions wstart..start_pos+T-1, then every compressed entry.
  const int64_t wstart = std::max<int64_t>(0, start_pos - W + 1);
  const int64_t nwin = start_pos + T - wstart, ncomp = w.has_compressor ? st.compressed.rows() : 0;
  Tensor table = Tensor::empty({nwin + ncomp, D}, DType::kF32);
  for (int64_t p = wstart; p < start_pos + T; ++p) {
    const float* src = p < start_pos ? st.window.slot(p) : kv.data<float>() + (p - start_pos) * D;
    std::memcpy(table.data<float>() + (p - wstart) * D, src, D * sizeof(float));
  }
  for (int64_t j = 0; j < ncomp; ++j) std::memcpy(table.data<float>() + (nwin + j) * D, st.compressed.row(j), D * sizeof(float));

  // Index lists: W window slots (oldest first, -1 padded) then the compressed picks.
  const int64_t kcomp = ratio == 4 ? std::min(cfg.index_topk, ncomp) : ncomp;
  std::vector<int32_t> picks;
  if (ratio == 4) picks = indexer(w.indexer, x, qr, start_pos, st.index_keys, rope, positions, kcomp, c);
  Tensor idx = Tensor::empty({T, W + kcomp}, DType::kI32);
  for (int64_t t = 0; t < T; ++t) {
    int32_t* row = idx.data<int32_t>() + t * (W + kcomp);
    const int64_t p = positions[t], lo = std::max<int64_t>(0, p - W + 1);
    int64_t n = 0;
    for (int64_t s = lo; s <= p; ++s) row[n++] = static_cast<int32_t>(s - wstart);
    while (n < W) row[n++] = -1;
    const int64_t visible = ratio > 0 ? (p + 1) / ratio : 0;
    for (int64_t k = 0; k < kcomp; ++k) {
      int32_t j = -1;
      if (ratio == 4) j = picks[t * kcomp + k];
      else if (k < visible) j = static_cast<int32_t>(k);
      row[W + k] = j < 0 ? -1 : static_cast<int32_t>(nwin + j);
    }
  }

  if (dump_enabled()) {
    dump("table", c.layer, table);
    Tensor fi = Tensor::empty(idx.shape(), DType::kF32);
    for (int64_t i = 0; i < idx.numel(); ++i) fi.data<float>()[i] = static_cast<float>(idx.data<int32_t>()[i]);
    dump("idx", c.layer, fi);
  }
  return attend_and_project(q, table, idx, kv, w.attn_sink, start_pos, st.window, w.wo_a, w.wo_b, positions.data(), rope,
                            c);
}

}  // namespace deepinfer
