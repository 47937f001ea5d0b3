// The V4 forward (docs/v4-architecture.md §2.2, §2.3, §2.10): embed, expand to hc copies, per
// layer mHC-collapse -> norm -> attention -> mHC-expand and the same around the MoE, then the
// hc_head collapse, the final norm and the FP32 head.
#include <cstring>

#include "core/debug_dump.h"
#include "deepinfer/error.h"
#include "model/layers_v4.h"

namespace deepinfer {

std::unique_ptr<ModelV4> ModelV4::load(const std::string& dir, const ModelConfig& cfg, Device device) {
  DI_CHECK(cfg.family == ModelFamily::kV4, "{}: not a DeepSeek-V4 config", cfg.source);
  auto m = std::unique_ptr<ModelV4>(new ModelV4());
  m->open(dir, cfg, device);
  m->w_ = load_weights_v4(m->ckpt_, cfg);
  move_weights(m->w_, device);
  if (device == Device::kCUDA) m->stack_linears();
  return m;
}

Tensor ModelV4::forward_batch(const std::vector<SeqChunk>& batch, const ForwardOptions& opts) const {
  const ModelConfig& cfg = cfg_;
  const ops::Numerics& num = opts.numerics;
  const int64_t hc = cfg.hc_mult;
  std::vector<int64_t> offset;
  const std::vector<int32_t> tokens = stack_batch(batch, offset);
  std::vector<int64_t> starts;
  for (const SeqChunk& c : batch) starts.push_back(c.state->num_tokens);
  const std::vector<int64_t> positions = stacked_positions(starts, offset);
  Tensor stream = embed_stream(w_.embed, tokens);  // expanded to hc identical copies
  const int64_t T = offset.back();
  // The rows' positions and (for hash-routed layers) tokens on the device, uploaded once for every layer.
  Tensor pos_dev = device_positions(positions);
  Tensor token_ids = cfg.n_hash_layers > 0 ? ids_tensor(tokens, device_) : Tensor();
  const bool graphs = begin_graphs(batch, opts, T);  // a decode step replays its dense pieces as CUDA graphs
  const ops::SegmentGraphs::AbortGuard graph_guard{graphs ? graphs_.get() : nullptr};  // an exception closes the step

  // A layer's two dense pieces (ops::SegmentGraphs): A, the attention's input (the mixes, the stream collapsed and
  // normed, every row's projections), inputs {stream, positions}, outputs {stream, positions, post, comb, the
  // AttnRows}; B, the attention's output back into the stream, then the FFN sublayer, inputs {o, stream, positions,
  // post, comb, token ids}, outputs {stream, token ids}.
  auto piece_a = [&](int64_t l) {
    return [&, l](const std::vector<Tensor>& in) {
      const LayerWeights& L = w_.layers[l];
      const LayerCtx ctx{cfg, num, l, opts.trace};
      const ops::DevicePositions on_device(positions.data(), T, in[1]);
      const ops::HcMix mix = ops::hc_mixes(in[0], L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base, hc,
                                           cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.norm_eps);
      Tensor x = ops::hc_collapse_norm(in[0], mix.pre, L.attn_norm, cfg.norm_eps, num.bf16);
      dump("attn_in", l, x);
      const AttnRows r = attention_rows_v4(L.attn, x, positions.data(), rope_[l], ctx);
      return std::vector<Tensor>{in[0], in[1],    mix.post, mix.comb, r.qr, r.q, r.kv,
                                 r.ckv, r.cscore, r.ikv,    r.iscore, r.iq, r.iw};
    };
  };
  auto piece_b = [&](int64_t l) {
    return [&, l](const std::vector<Tensor>& in) {
      const LayerWeights& L = w_.layers[l];
      const LayerCtx ctx{cfg, num, l, opts.trace};
      Tensor y = attention_output(in[0], L.attn.wo_a, L.attn.wo_b, ctx);
      dump("attn_out", l, y);
      Tensor s = ops::hc_expand(y, in[1], in[3], in[4], num.bf16);
      const ops::HcMix mix = ops::hc_mixes(s, L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base, hc, cfg.hc_sinkhorn_iters,
                                           cfg.hc_eps, cfg.norm_eps);
      s = ffn_moe(L.ffn, s, mix.pre, L.ffn_norm, mix.post, mix.comb, in[5], ctx);
      dump("stream", l, s);
      return std::vector<Tensor>{s, in[5]};
    };
  };
  // With graphs, layer l's B and layer l + 1's A are one piece: one graph launch fewer per layer (~3 us of gap);
  // `next_a` holds its A part.
  std::vector<Tensor> next_a;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    const LayerCtx ctx{cfg, num, l, opts.trace};
    std::vector<Tensor> io;
    if (!next_a.empty()) {
      io = std::move(next_a);
      next_a.clear();
    } else {
      io = run_piece(graphs, 2 * l, {stream, pos_dev}, piece_a(l));
    }
    stream = io[0];
    pos_dev = io[1];
    AttnRows rows;
    rows.qr = io[4], rows.q = io[5], rows.kv = io[6], rows.ckv = io[7], rows.cscore = io[8];
    rows.ikv = io[9], rows.iscore = io[10], rows.iq = io[11], rows.iw = io[12];
    if (L.attn.has_compressor || L.attn.has_indexer) {  // every sequence's new compressed entries and index keys
      std::vector<int64_t> start;
      std::vector<LayerState*> states;
      for (const SeqChunk& sc : batch) start.push_back(sc.state->num_tokens), states.push_back(&sc.state->layers[l]);
      compress_batch_v4(L.attn, rows, offset, start, states, rope_[l], ctx);
    }
    std::vector<AttnChunk> chunks;
    std::vector<IndexJob> jobs;                  // the indexers, run for every sequence at once
    for (size_t b = 0; b < batch.size(); ++b) {  // the middle reads and writes each sequence's own state
      const size_t before = jobs.size();
      chunks.push_back(attention_seq_v4(L.attn, rows.rows(offset[b], offset[b + 1]), batch[b].state->num_tokens,
                                        batch[b].state->layers[l], ctx, &jobs));
      if (jobs.size() > before) jobs.back().row0 = offset[b], jobs.back().chunk = chunks.size() - 1;
    }
    index_batch_v4(jobs, chunks, rows.iq, rows.iw, ctx);
    // Every sequence's rows in one call; o comes back de-rotated at the rows' positions (read from pos_dev on CUDA).
    const ops::DevicePositions on_device(positions.data(), T, pos_dev);
    const Tensor o = attend_chunks(rows.q, chunks, L.attn.attn_sink, positions.data(), rope_[l], ctx,
                                   piece_input(graphs, 2 * l + 1, 0));

    const std::vector<Tensor> b_in{o, stream, pos_dev, io[2], io[3], token_ids};
    if (graphs && l + 1 < cfg.n_layers) {
      io = run_piece(graphs, 2 * l + 1, b_in, [&](const std::vector<Tensor>& in) {
        const std::vector<Tensor> b = piece_b(l)(in);
        std::vector<Tensor> a = piece_a(l + 1)({b[0], in[2]});
        a.push_back(b[1]);  // the token ids
        return a;
      });
      token_ids = io.back();
      io.pop_back();
      next_a = std::move(io);
    } else {
      const std::vector<Tensor> out = run_piece(graphs, 2 * l + 1, b_in, piece_b(l));
      stream = out[0];
      token_ids = out[1];
    }
  }
  end_graphs(graphs);
  for (const SeqChunk& c : batch) c.state->num_tokens += static_cast<int64_t>(c.tokens.size());

  // Only the wanted rows go through the head.
  const std::vector<int64_t> rows = wanted_rows(batch, offset);
  const int64_t R = static_cast<int64_t>(rows.size());
  if (R == 0) return Tensor::empty({0, cfg.vocab_size}, DType::kF32);
  const Tensor picked = every_row(rows, stream.size(0)) ? stream : ops::gather_rows(stream, ids_tensor(rows, device_));
  Tensor h = ops::hc_head(picked, w_.hc_head_fn, w_.hc_head_scale, w_.hc_head_base, cfg.hc_eps, cfg.norm_eps, num.bf16);
  h = ops::rms_norm(h, w_.norm, cfg.norm_eps, num.bf16);
  Tensor logits = linear_f32(h, ops::QWeight{w_.head, {}, 0});
  return opts.logits_device ? logits : logits.to(Device::kCPU);
}

}  // namespace deepinfer
