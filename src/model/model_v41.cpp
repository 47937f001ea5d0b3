// The V4.1 forward (docs/v4-architecture.md §2.2, §2.3, §2.9, §2.10): embed, expand to hc copies;
// per layer the Engram lookup (engram layers), then the staggered hyper-connections: the attention
// input is collapsed with the incoming pre-mix (the previous FFN's, one-hot before layer 0), the
// FFN input with this layer's attention pre-mix; after the last layer the stream is collapsed with
// the last FFN's pre-mix, normed and projected by the FP32 head.
#include <cstring>

#include "core/debug_dump.h"
#include "cpu/threads.h"
#include "deepinfer/error.h"
#include "model/layers_v41.h"

namespace deepinfer {

std::unique_ptr<ModelV41> ModelV41::load(const std::string& dir) {
  cpu::configure_threads();
  auto m = std::unique_ptr<ModelV41>(new ModelV41());
  m->cfg_ = load_model_config(dir);
  const ModelConfig& cfg = m->cfg_;
  DI_CHECK(cfg.family == ModelFamily::kV41, "{}: not a DeepSeek-V4.1 config", cfg.source);
  DI_CHECK(!cfg.weights_fp8 || cfg.o_lora_rank % cfg.fp8_block == 0,
           "{}: o_lora_rank {} must be a multiple of the FP8 block {} (wo_a is split per group)", cfg.source,
           cfg.o_lora_rank, cfg.fp8_block);
  m->ckpt_ = Checkpoint::open(dir);
  m->w_ = load_weights_v41(m->ckpt_, cfg);
  m->engram_ = EngramHash::load(dir, cfg);
  m->init_rope();
  return m;
}

Tensor ModelV41::forward_batch(const std::vector<SeqChunk>& batch, const ForwardOptions& opts) const {
  const ModelConfig& cfg = cfg_;
  const ops::Numerics& num = opts.numerics;
  const int64_t hc = cfg.hc_mult, dim = cfg.dim;
  std::vector<int64_t> offset;
  const std::vector<int32_t> tokens = stack_batch(batch, offset);
  const int64_t T = offset.back();
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

  Tensor stream = embed_stream(w_.embed, tokens);
  // The incoming pre-mix of layer 0 selects copy 0.
  Tensor pre = Tensor::zeros({T, hc}, DType::kF32);
  for (int64_t t = 0; t < T; ++t) pre.data<float>()[t * hc] = 1.0f;
  std::vector<SharedAttnV41> shared(B);

  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const LayerWeightsV41& L = w_.layers[l];
    const LayerCtx ctx{cfg, num, l, opts.trace};
    if (L.has_engram) {
      stream = engram_forward(L.engram, stream, engram_rows[cfg.engram_index(l)], cols, ctx);
      dump("engram_stream", l, stream);
    }
    ops::HcMix attn_mix = ops::hc_mixes(stream, L.hc_attn_fn, L.hc_attn_scale, L.hc_attn_base, hc,
                                        cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.norm_eps);
    Tensor x = ops::rms_norm(ops::hc_collapse(stream, pre, num.bf16), L.attn_norm, cfg.norm_eps, num.bf16);
    dump("attn_in", l, x);
    Tensor y = Tensor::empty({T, dim}, DType::kF32);
    for (size_t b = 0; b < B; ++b) {  // attention reads and writes each sequence's own state
      Tensor xb = x.slice(0, offset[b], offset[b + 1]);
      Tensor yb = attention_v41(L.attn, xb, batch[b].state->num_tokens, *batch[b].state, shared[b], rope_[l], ctx);
      std::memcpy(y.data<float>() + offset[b] * dim, yb.data<float>(), yb.numel() * sizeof(float));
    }
    dump("attn_out", l, y);
    stream = ops::hc_expand(y, stream, attn_mix.post, attn_mix.comb, num.bf16);

    ops::HcMix ffn_mix = ops::hc_mixes(stream, L.hc_ffn_fn, L.hc_ffn_scale, L.hc_ffn_base, hc, cfg.hc_sinkhorn_iters,
                                       cfg.hc_eps, cfg.norm_eps);
    x = ops::rms_norm(ops::hc_collapse(stream, attn_mix.pre, num.bf16), L.ffn_norm, cfg.norm_eps, num.bf16);
    dump("ffn_in", l, x);
    y = moe(L.ffn, x, tokens, ctx);
    dump("ffn_out", l, y);
    stream = ops::hc_expand(y, stream, ffn_mix.post, ffn_mix.comb, num.bf16);
    pre = ffn_mix.pre;
    dump("stream", l, stream);
  }
  for (const SeqChunk& c : batch) c.state->num_tokens += static_cast<int64_t>(c.tokens.size());

  // Only the wanted rows go through the final collapse, the norm and the head.
  const std::vector<int64_t> rows = wanted_rows(batch, offset);
  const int64_t R = static_cast<int64_t>(rows.size());
  if (R == 0) return Tensor::empty({0, cfg.vocab_size}, DType::kF32);
  Tensor picked = Tensor::empty({R, hc, dim}, DType::kF32), picked_pre = Tensor::empty({R, hc}, DType::kF32);
  for (int64_t i = 0; i < R; ++i) {
    std::memcpy(picked.data<float>() + i * hc * dim, stream.data<float>() + rows[i] * hc * dim, hc * dim * sizeof(float));
    std::memcpy(picked_pre.data<float>() + i * hc, pre.data<float>() + rows[i] * hc, hc * sizeof(float));
  }
  Tensor h = ops::rms_norm(ops::hc_collapse(picked, picked_pre, num.bf16), w_.norm, cfg.norm_eps, num.bf16);
  return linear_f32(h, ops::QWeight{w_.head, {}, 0});
}

}  // namespace deepinfer
