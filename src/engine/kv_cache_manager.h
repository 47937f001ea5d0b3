// KvCacheManager: byte accounting of the per-sequence V4 state (src/model/state.h), kept per pool
// so each kind of state pages on its own, under one memory budget (--kv-cache-memory on the CPU).
//
// What a sequence holding L tokens occupies, per layer l with compress ratio r (0, 4 or 128):
//
//   pool         page                               pages
//   window       window x head_dim floats (a ring)  1 per layer, from the first token
//   compressor   the open-group rows, 4 x r x c*hd  1 per compressed layer (+1 indexer, r == 4)
//   compressed   64 rows x head_dim floats          ceil(floor(L / r) / 64)       (r > 0)
//   index_keys   64 rows x index_head_dim floats    ceil(floor(L / 4) / 64)       (r == 4)
//
// (c = 2 for r == 4: overlapping groups.) The runner's SequenceState allocates exactly these
// pages, so the accounting is the real footprint of the state (logits and activations aside).
//
// Query/commit: can_allocate() asks, allocate() commits; a shortage is a return value (nullopt),
// never an exception. Calling with a sequence the manager does not know simply starts it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <unordered_map>

#include "deepinfer/model_config.h"
#include "engine/sequence.h"

namespace deepinfer {

enum class KvPool : uint8_t { kWindow, kCompressor, kCompressed, kIndexKeys };
inline constexpr int kNumKvPools = 4;
const char* kv_pool_name(KvPool p);

// Pages one sequence holds in each pool. Opaque to the scheduler (it only checks has_value()); a
// page-id table per pool arrives with the paged runner and the prefix cache.
struct KvPages {
  std::array<int64_t, kNumKvPools> num_pages{};
  int64_t num_bytes = 0;
};

struct KvUsage {
  int64_t budget_bytes = 0;
  int64_t used_bytes = 0;
  int64_t num_sequences = 0;
  std::array<int64_t, kNumKvPools> num_pages{};  // over all sequences
  double fraction() const { return budget_bytes > 0 ? static_cast<double>(used_bytes) / budget_bytes : 0.0; }
};

class KvCacheManager {
 public:
  // Throws deepinfer::Error when budget_bytes is not positive.
  KvCacheManager(const ModelConfig& cfg, int64_t budget_bytes);

  // Pages and bytes of one sequence holding num_tokens tokens.
  KvPages pages_for_tokens(int64_t num_tokens) const;
  int64_t bytes_for_tokens(int64_t num_tokens) const { return pages_for_tokens(num_tokens).num_bytes; }
  int64_t page_bytes(KvPool p) const { return page_bytes_[static_cast<int>(p)]; }

  // Whether seq can grow to seq.num_computed_tokens + num_new_tokens tokens within the budget.
  bool can_allocate(const Sequence& seq, int64_t num_new_tokens) const;
  // Grows seq's holding to cover seq.num_computed_tokens + num_new_tokens tokens. Returns its
  // pages, or nullopt (nothing changed) when the budget cannot cover it.
  std::optional<KvPages> allocate(const Sequence& seq, int64_t num_new_tokens);
  // Releases everything seq_id holds (no-op for an unknown id).
  void free(int64_t seq_id);

  KvUsage usage() const;
  int64_t budget_bytes() const { return budget_bytes_; }

 private:
  int64_t extra_bytes(const Sequence& seq, int64_t num_new_tokens, KvPages* pages) const;

  int64_t budget_bytes_;
  int64_t used_bytes_ = 0;
  std::array<int64_t, kNumKvPools> page_bytes_{};
  // Per layer: rows of the compressed pool (ratio, 0 if none) and whether it has index keys.
  std::vector<int64_t> ratio_;    // per layer owning compressed KV: its ratio
  std::vector<bool> index_keys_;  // ... and whether it also owns index keys
  int64_t num_window_pages_ = 0, num_compressor_pages_ = 0;
  std::unordered_map<int64_t, KvPages> held_;
};

}  // namespace deepinfer
