// The V4.1 forward (docs/v4-architecture.md §2.2, §2.3, §2.9, §2.10): embed, expand to hc copies;
// per layer the Engram lookup (engram layers), then the staggered hyper-connections: the attention
// input is collapsed with the incoming pre-mix (the previous FFN's, one-hot before layer 0), the
// FFN input with this layer's attention pre-mix; after the last layer the stream is collapsed with
// the last FFN's pre-mix, normed and projected by the FP32 head.
#include <algorithm>
#include <cstring>
#include <mutex>

#include "core/debug_dump.h"
#include "deepinfer/error.h"
#include "model/layers_v41.h"

namespace deepinfer {

namespace {

// Drops the first drop[b] rows of every sequence b from the stacked per-row data and re-bases the
// offsets (bounded replay: those rows skip the decoder layers).
void compact_rows(const std::vector<int64_t>& drop, std::vector<int64_t>& offset, Tensor& stream, Tensor& pre,
                  std::vector<int32_t>& tokens, std::vector<std::vector<int64_t>>& engram_rows, int64_t cols,
                  std::vector<SharedAttnV41>& shared) {
  const size_t B = drop.size();
  std::vector<int64_t> keep;
  std::vector<int64_t> next(B + 1, 0);
  for (size_t b = 0; b < B; ++b) {
    for (int64_t r = offset[b] + drop[b]; r < offset[b + 1]; ++r) keep.push_back(r);
    next[b + 1] = next[b] + (offset[b + 1] - offset[b] - drop[b]);
    SharedAttnV41& s = shared[b];
    auto drop_rows = [&](Tensor& t) {  // a row slice of the device list (still contiguous)
      if (t.defined()) t = t.slice(0, std::min(drop[b], t.size(0)), t.size(0));
    };
    drop_rows(s.picks);
    drop_rows(s.candidate_blocks);
  }
  const int64_t R = static_cast<int64_t>(keep.size());
  std::vector<int32_t> tk(R);
  for (auto& rows : engram_rows) {
    std::vector<int64_t> kept(R * cols);
    for (int64_t i = 0; i < R; ++i) std::copy_n(rows.begin() + keep[i] * cols, cols, kept.begin() + i * cols);
    rows.swap(kept);
  }
  for (int64_t i = 0; i < R; ++i) tk[i] = tokens[keep[i]];
  const Tensor rows = ids_tensor(keep, stream.device());
  stream = ops::gather_rows(stream, rows);
  pre = ops::gather_rows(pre, rows);
  tokens.swap(tk);
  offset.swap(next);
}

}  // namespace

std::unique_ptr<ModelV41> ModelV41::load(const std::string& dir, const ModelConfig& cfg, Device device) {
  DI_CHECK(cfg.family == ModelFamily::kV41, "{}: not a DeepSeek-V4.1 config", cfg.source);
  auto m = std::unique_ptr<ModelV41>(new ModelV41());
  m->open(dir, cfg, device);
  m->w_ = load_weights_v41(m->ckpt_, cfg);
  move_weights(m->w_, device);
  if (device == Device::kCUDA) m->stack_linears();
  m->engram_ = EngramHash::load(dir, cfg);
  return m;
}

Tensor ModelV41::forward_batch(const std::vector<SeqChunk>& batch, const ForwardOptions& opts) const {
  const ModelConfig& cfg = cfg_;
  const ops::Numerics& num = opts.numerics;
  const int64_t hc = cfg.hc_mult;
  std::vector<int64_t> offset;
  const std::vector<int32_t> tokens = stack_batch(batch, offset);
  const int64_t T = offset.back();  // before any bounded-replay compaction
  force_begin_forward();
  const size_t B = batch.size();

  // Engram rows of every token for every engram layer, from each sequence's compressed history.
  const int64_t n_engram = static_cast<int64_t>(cfg.engram_layer_ids.size()), cols = engram_.n_cols();
  std::vector<std::vector<int64_t>> engram_rows(n_engram, std::vector<int64_t>(T * cols));
  if (engram_.enabled()) {
    for (size_t b = 0; b < B; ++b) {
      SequenceState& s = *batch[b].state;
      DI_CHECK(static_cast<int64_t>(s.engram_ids.size()) == s.num_tokens,
               "forward: the sequence's Engram history has {} ids for {} processed tokens", s.engram_ids.size(),
               s.num_tokens);
      for (int32_t tok : batch[b].tokens) s.engram_ids.push_back(engram_.compress(tok));
      for (int64_t r = offset[b]; r < offset[b + 1]; ++r) {
        const int64_t p = s.num_tokens + (r - offset[b]);
        for (int64_t e = 0; e < n_engram; ++e) engram_.rows(s.engram_ids.data(), p, e, &engram_rows[e][r * cols]);
      }
    }
  }

  // Bounded replay: how many leading rows of each chunk skip the decoder layers.
  const int64_t last_source = cfg.kv_source_layers.empty() ? -1 : cfg.kv_source_layers.back();
  std::vector<int64_t> start(B), drop(B, 0);
  bool replay = false;
  for (size_t b = 0; b < B; ++b) {
    const SeqChunk& c = batch[b];
    start[b] = c.state->num_tokens;
    if (last_source < 0 || c.replay_from <= start[b]) continue;
    const int64_t n = offset[b + 1] - offset[b];
    drop[b] = std::min(c.replay_from - start[b], n);
    DI_CHECK(!c.all_logits && !(c.want_logits && drop[b] == n),
             "forward: bounded replay from position {} would skip rows whose logits are wanted", c.replay_from);
    DI_CHECK(c.replay_from >= c.state->replay_floor, "forward: bounded replay from {} is below the earlier floor {}",
             c.replay_from, c.state->replay_floor);
    replay = true;
  }

  Tensor stream = embed_stream(w_.embed, tokens);
  // The incoming pre-mix of layer 0 selects copy 0. Its rows are all alike, so one tensor, uploaded again only when a
  // forward has more rows than it, serves every row count as a slice (on a GPU: no upload per step).
  Tensor pre;
  {
    const std::lock_guard<std::mutex> lock(initial_pre_mu_);
    if (!initial_pre_.defined() || initial_pre_.size(0) < T) {
      Tensor p = Tensor::zeros({T, hc}, DType::kF32);
      for (int64_t t = 0; t < T; ++t) p.data<float>()[t * hc] = 1.0f;
      initial_pre_ = p.to(device_);
    }
    pre = initial_pre_.slice(0, 0, T);
  }
  std::vector<SharedAttnV41> shared(B);

  std::vector<int32_t> layer_tokens = tokens;
  std::vector<int64_t> positions = stacked_positions(start, offset);  // of the rows still in the batch
  // The rows' positions and (for hash-routed layers) tokens on the device, uploaded once for every layer.
  Tensor pos_dev = device_positions(positions);
  const bool hashed = cfg.n_hash_layers > 0;
  Tensor token_ids = hashed ? ids_tensor(layer_tokens, device_) : Tensor();
  // A decode step replays its dense pieces as CUDA graphs (Model::begin_graphs); bounded replay is prefill only.
  const bool graphs = !replay && begin_graphs(batch, opts, T);
  const ops::SegmentGraphs::AbortGuard graph_guard{graphs ? graphs_.get() : nullptr};  // an exception closes the step
  // A layer's two dense pieces (ops::SegmentGraphs): A, the attention's input (this layer's mixes on the side
  // stream: only the sublayer's end reads them; the stream collapsed with the incoming pre-mix and normed; every
  // row's projections), inputs {stream, pre, positions}, outputs {stream, positions, attn pre / post / comb, the
  // AttnRows}; and B, the attention's output back into the stream, then the FFN sublayer, inputs {o, stream,
  // positions, attn pre / post / comb, token ids}, outputs {stream, the FFN's pre-mix, token ids}.
  auto piece_a = [&](int64_t l) {
    return [&, l](const std::vector<Tensor>& in) {
      const LayerWeightsV41& L = w_.layers[l];
      const LayerCtx ctx{cfg, num, l, opts.trace};
      const int64_t T = offset.back();
      const ops::DevicePositions on_device(positions.data(), T, in[2]);
      ops::HcMix mix = ops::hc_mixes(in[0], L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base, hc, cfg.hc_sinkhorn_iters,
                                     cfg.hc_eps, cfg.norm_eps);
      dump("attn_post", l, mix.post);
      dump("attn_comb", l, mix.comb);
      Tensor x = ops::hc_collapse_norm(in[0], in[1], L.attn_norm, cfg.norm_eps, num.bf16);
      dump("attn_in", l, x);
      force("attn_in", l, x);
      const AttnRows r = attention_rows_v41(L.attn, x, positions.data(), rope_[l], ctx);
      return std::vector<Tensor>{in[0], in[2], mix.pre,  mix.post, mix.comb, r.qr, r.q,
                                 r.kv,  r.ckv, r.cscore, r.ikv,    r.iscore, r.iq, r.iw};
    };
  };
  auto piece_b = [&](int64_t l) {
    return [&, l](const std::vector<Tensor>& in) {
      const LayerWeightsV41& L = w_.layers[l];
      const LayerCtx ctx{cfg, num, l, opts.trace};
      Tensor y = attention_output(in[0], L.attn.wo_a, L.attn.wo_b, ctx);
      dump("attn_out", l, y);
      Tensor s = ops::hc_expand(y, in[1], in[4], in[5], num.bf16);
      ops::HcMix ffn_mix = ops::hc_mixes(s, L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base, hc, cfg.hc_sinkhorn_iters,
                                         cfg.hc_eps, cfg.norm_eps);
      dump("attn_stream", l, s);
      force("attn_stream", l, s);
      dump("ffn_post", l, ffn_mix.post);
      dump("ffn_comb", l, ffn_mix.comb);
      s = ffn_moe(L.ffn, s, in[3], L.ffn_norm, ffn_mix.post, ffn_mix.comb, in[6], ctx);
      dump("stream", l, s);
      force("stream", l, s);
      return std::vector<Tensor>{s, ffn_mix.pre, in[6]};
    };
  };
  // With graphs, layer l's B and layer l + 1's A are one piece (one graph launch fewer per layer: the gap between
  // two graphs was ~3 us) unless something must run between them on the host (Engram); `next_a` holds its A part.
  std::vector<Tensor> next_a;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const LayerWeightsV41& L = w_.layers[l];
    const LayerCtx ctx{cfg, num, l, opts.trace};
    if (replay && l == last_source + 1) {
      // The decoder layers run only the kept (trailing) rows of each chunk.
      compact_rows(drop, offset, stream, pre, layer_tokens, engram_rows, cols, shared);
      for (size_t b = 0; b < B; ++b) {
        if (drop[b] == 0) continue;
        start[b] += drop[b];
        batch[b].state->replay_floor = batch[b].replay_from;
      }
      positions = stacked_positions(start, offset);
      pos_dev = device_positions(positions);
      if (hashed) token_ids = ids_tensor(layer_tokens, device_);
    }
    const int64_t T = offset.back();
    if (T == 0) break;  // bounded replay skipped every row of this forward in the decoder layers
    std::vector<Tensor> io;
    if (!next_a.empty()) {
      io = std::move(next_a);
      next_a.clear();
    } else {
      if (L.has_engram) {
        stream = engram_forward(L.engram, stream, engram_rows[cfg.engram_index(l)], cols, ctx);
        dump("engram_stream", l, stream);
        force("engram_stream", l, stream);
      }
      io = run_piece(graphs, 2 * l, {stream, pre, pos_dev}, piece_a(l));
    }
    stream = io[0];
    pos_dev = io[1];
    const ops::HcMix attn_mix{io[2], io[3], io[4]};
    AttnRows rows;
    rows.qr = io[5], rows.q = io[6], rows.kv = io[7], rows.ckv = io[8], rows.cscore = io[9];
    rows.ikv = io[10], rows.iscore = io[11], rows.iq = io[12], rows.iw = io[13];

    if (L.attn.kv_source && cfg.compress_ratio(l) > 0) {  // every sequence's new compressed entries and index keys
      std::vector<LayerState*> states;
      for (const SeqChunk& sc : batch) states.push_back(&sc.state->layers[l]);
      compress_batch_v41(L.attn, rows, offset, start, states, rope_[l], ctx);
    }
    std::vector<AttnChunk> chunks;
    std::vector<IndexJobV41> jobs;               // the index sources' indexers, run for every sequence at once
    for (size_t b = 0; b < B; ++b) {             // the middle reads and writes each sequence's own state
      if (offset[b + 1] == offset[b]) continue;  // every row of this chunk skipped (bounded replay)
      const int64_t floor = l > last_source ? batch[b].state->replay_floor : 0;
      const size_t before = jobs.size();
      chunks.push_back(attention_seq_v41(L.attn, rows.rows(offset[b], offset[b + 1]), start[b], floor, *batch[b].state,
                                         shared[b], ctx, &jobs));
      if (jobs.size() > before) jobs.back().row0 = offset[b], jobs.back().chunk = chunks.size() - 1;
    }
    index_batch_v41(jobs, chunks, rows.iq, rows.iw, ctx);
    // Every sequence's rows in one call; o comes back de-rotated at the rows' positions (read from pos_dev on CUDA).
    const ops::DevicePositions on_device(positions.data(), T, pos_dev);
    const Tensor o = attend_chunks(rows.q, chunks, L.attn.attn_sink, positions.data(), rope_[l], ctx,
                                   piece_input(graphs, 2 * l + 1, 0));

    const std::vector<Tensor> b_in{o, stream, pos_dev, attn_mix.pre, attn_mix.post, attn_mix.comb, token_ids};
    if (graphs && l + 1 < cfg.n_layers && !w_.layers[l + 1].has_engram) {
      io = run_piece(graphs, 2 * l + 1, b_in, [&](const std::vector<Tensor>& in) {
        const std::vector<Tensor> b = piece_b(l)(in);
        std::vector<Tensor> a = piece_a(l + 1)({b[0], b[1], in[2]});
        a.push_back(b[2]);  // the token ids
        return a;
      });
      token_ids = io.back();
      io.pop_back();
      next_a = std::move(io);
    } else {
      io = run_piece(graphs, 2 * l + 1, b_in, piece_b(l));
      stream = io[0];
      pre = io[1];
      token_ids = io[2];
    }
  }
  end_graphs(graphs);
  for (const SeqChunk& c : batch) c.state->num_tokens += static_cast<int64_t>(c.tokens.size());

  // Only the wanted rows go through the final collapse, the norm and the head.
  const std::vector<int64_t> rows = wanted_rows(batch, offset);
  const int64_t R = static_cast<int64_t>(rows.size());
  if (R == 0) return Tensor::empty({0, cfg.vocab_size}, DType::kF32);
  Tensor picked = stream, picked_pre = pre;  // a decode step wants every row: no upload, no gathers
  if (!every_row(rows, stream.size(0))) {
    const Tensor row_ids = ids_tensor(rows, device_);
    picked = ops::gather_rows(stream, row_ids), picked_pre = ops::gather_rows(pre, row_ids);
  }
  Tensor h = ops::hc_collapse_norm(picked, picked_pre, w_.norm, cfg.norm_eps, num.bf16);
  Tensor logits = linear_f32(h, ops::QWeight{w_.head, {}, 0});
  return opts.logits_device ? logits : logits.to(Device::kCPU);
}

}  // namespace deepinfer
