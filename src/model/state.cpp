#include "model/state.h"

namespace deepinfer {

float* RowPages::append() {
  if (rows_ % kRowsPerPage == 0) pages_.push_back(std::make_unique<float[]>(kRowsPerPage * width_));
  return row(rows_++);
}

SequenceState::SequenceState(const ModelConfig& cfg) {
  layers.resize(cfg.n_layers);
  if (cfg.family == ModelFamily::kV41) {
    // V4.1: every layer has its window ring; only kv sources hold compressed KV, index keys and
    // (ratio 2) the open pair of the compressor.
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
      LayerState& s = layers[l];
      s.window = WindowRing(cfg.window_size, cfg.head_dim);
      if (!cfg.is_kv_source(l)) continue;
      s.compressed = RowPages(cfg.head_dim);
      s.index_keys = RowPages(cfg.index_head_dim);
      if (cfg.compress_ratio(l) > 1) s.compressor.init(cfg.compress_ratio(l), cfg.head_dim);
    }
    return;
  }
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    LayerState& s = layers[l];
    s.window = WindowRing(cfg.window_size, cfg.head_dim);
    const int64_t r = cfg.compress_ratio(l);
    if (r > 0) {
      const int64_t c = r == 4 ? 2 : 1;
      s.compressed = RowPages(cfg.head_dim);
      s.compressor.init(r, c * cfg.head_dim);
      if (r == 4) {
        s.index_keys = RowPages(cfg.index_head_dim);
        s.index_compressor.init(r, c * cfg.index_head_dim);
      }
    }
  }
}

}  // namespace deepinfer
