// The Engram n-gram hash of V4.1 (docs/v4-architecture.md §2.9): every position's last
// max_ngram_size compressed token ids, multiplied per look-back, XOR-folded into 2..n-grams, each
// reduced modulo its own prime and offset into the layer's table.
//
// What must match training bit for bit and cannot be re-derived cheaply in C++ (the 129,280-entry
// compressed-vocabulary map from the tokenizer's normalisation, numpy's per-layer multipliers) is
// data: engram_hash.safetensors, written by tools/engram/hash_data.py. The primes and offsets are
// arithmetic: computed here and checked against the file and against the table sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepinfer/model_config.h"

namespace deepinfer {

class EngramHash {
 public:
  // Looks for engram_hash.safetensors in `model_dir`, then for the shipped data of the released
  // model (data/engram/, used only if its layer ids and vocabulary sizes match `cfg`). A config
  // without engram layers gives a disabled hash. Throws deepinfer::Error naming what is missing or
  // inconsistent.
  static EngramHash load(const std::string& model_dir, const ModelConfig& cfg);
  // From explicit data (tests): token_map [vocab], multipliers [n_layers * max_ngram].
  static EngramHash from_data(const ModelConfig& cfg, std::vector<int32_t> token_map, std::vector<int64_t> multipliers);

  bool enabled() const { return max_ngram_ > 0; }
  int64_t n_cols() const { return (max_ngram_ - 1) * n_heads_; }
  int32_t compress(int32_t token) const { return token_map_[static_cast<size_t>(token)]; }
  // Table rows for position p of a sequence whose compressed ids are ids[0..p] (a negative id is a
  // dead token that stops the look-back), for the e-th engram layer: n_cols() values, n-gram major.
  void rows(const int32_t* ids, int64_t p, int64_t e, int64_t* out) const;
  const std::vector<int64_t>& primes() const { return primes_; }  // [n_layers, n_cols]

 private:
  void init(const ModelConfig& cfg);
  std::vector<int32_t> token_map_;
  std::vector<int64_t> multipliers_;       // [n_layers, max_ngram]
  std::vector<int64_t> primes_, offsets_;  // [n_layers, n_cols]
  int64_t max_ngram_ = 0, n_heads_ = 0;
  int32_t pad_ = 0;
};

}  // namespace deepinfer
