#include "model/engram_hash.h"

#include <filesystem>
#include <set>

#include "deepinfer/error.h"
#include "io/safetensors.h"

#ifndef DEEPINFER_DATA_DIR
#define DEEPINFER_DATA_DIR ""
#endif

namespace deepinfer {

namespace {

namespace fs = std::filesystem;

uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m) { return static_cast<unsigned __int128>(a) * b % m; }
uint64_t powmod(uint64_t a, uint64_t e, uint64_t m) {
  uint64_t r = 1;
  for (a %= m; e; e >>= 1, a = mulmod(a, a, m))
    if (e & 1) r = mulmod(r, a, m);
  return r;
}

// Deterministic Miller-Rabin for 64-bit n (these bases cover every n < 2^64).
bool is_prime(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t p : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int s = 0;
  while ((d & 1) == 0) d >>= 1, ++s;
  for (uint64_t a : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
    uint64_t x = powmod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int i = 1; i < s && composite; ++i) {
      x = mulmod(x, x, n);
      if (x == n - 1) composite = false;
    }
    if (composite) return false;
  }
  return true;
}

template <typename T>
std::vector<T> read_ints(const SafetensorsFile& f, const std::string& name, DType dtype, size_t n) {
  DI_CHECK(f.has(name), "engram hash data {}: missing tensor {}", f.path(), name);
  const Tensor t = f.get(name);
  DI_CHECK(t.dtype() == dtype && static_cast<size_t>(t.numel()) == n,
           "engram hash data {}: tensor {} must be {} with {} values, got {} with {}", f.path(), name,
           dtype_name(dtype), n, dtype_name(t.dtype()), t.numel());
  return std::vector<T>(t.data<T>(), t.data<T>() + n);
}

}  // namespace

void EngramHash::init(const ModelConfig& cfg) {
  max_ngram_ = cfg.engram_max_ngram_size;
  n_heads_ = cfg.engram_n_heads;
  const int64_t L = static_cast<int64_t>(cfg.engram_layer_ids.size()), cols = n_cols();
  DI_CHECK(static_cast<int64_t>(token_map_.size()) == cfg.vocab_size, "engram token map has {} entries for vocab {}",
           token_map_.size(), cfg.vocab_size);
  int32_t max_id = -1;
  for (int32_t v : token_map_) {
    DI_CHECK(v >= 0, "engram token map holds a negative id {}", v);
    max_id = std::max(max_id, v);
  }
  DI_CHECK(max_id + 1 == cfg.engram_compressed_vocab_size,
           "engram token map has {} compressed ids but the config says engram_compressed_vocab_size {}", max_id + 1,
           cfg.engram_compressed_vocab_size);
  DI_CHECK(static_cast<int64_t>(multipliers_.size()) == L * max_ngram_, "engram multipliers: {} values for {}x{}",
           multipliers_.size(), L, max_ngram_);
  // The products id * multiplier must not overflow int64 (the bound training chose, §2.9).
  const int64_t bound = std::max<int64_t>(1, (INT64_MAX / cfg.engram_compressed_vocab_size) / 2);
  for (int64_t m : multipliers_)
    DI_CHECK(m > 0 && m < 2 * bound && (m & 1), "engram multiplier {} is not an odd value below {}", m, 2 * bound);
  pad_ = token_map_[static_cast<size_t>(cfg.engram_pad_id)];

  // Primes: per layer, per n-gram size, per head, the next unused prime above engram_vocab_size - 1.
  primes_.assign(L * cols, 0);
  offsets_.assign(L * cols, 0);
  std::set<uint64_t> seen;
  for (int64_t e = 0; e < L; ++e) {
    int64_t total = 0;
    for (int64_t n = 0; n < max_ngram_ - 1; ++n) {
      uint64_t cur = static_cast<uint64_t>(cfg.engram_vocab_size - 1);
      for (int64_t h = 0; h < n_heads_; ++h) {
        do ++cur;
        while (!is_prime(cur) || seen.count(cur));
        seen.insert(cur);
        const int64_t c = n * n_heads_ + h;
        primes_[e * cols + c] = static_cast<int64_t>(cur);
        offsets_[e * cols + c] = total;
        total += static_cast<int64_t>(cur);
      }
    }
    DI_CHECK(total == cfg.engram_num_embeddings[e],
             "engram layer {}: its {} prime-sized buckets add up to {} rows but engram_num_embeddings says {}",
             cfg.engram_layer_ids[e], cols, total, cfg.engram_num_embeddings[e]);
  }
}

EngramHash EngramHash::from_data(const ModelConfig& cfg, std::vector<int32_t> token_map,
                                 std::vector<int64_t> multipliers) {
  EngramHash h;
  if (cfg.engram_layer_ids.empty()) return h;
  h.token_map_ = std::move(token_map);
  h.multipliers_ = std::move(multipliers);
  h.init(cfg);
  return h;
}

EngramHash EngramHash::load(const std::string& model_dir, const ModelConfig& cfg) {
  if (cfg.engram_layer_ids.empty()) return {};
  const int64_t L = static_cast<int64_t>(cfg.engram_layer_ids.size());
  std::error_code ec;
  fs::path path = fs::path(model_dir) / "engram_hash.safetensors";
  const fs::path shipped = fs::path(DEEPINFER_DATA_DIR) / "engram" / "deepseek-v41-flash.safetensors";
  const bool own = fs::exists(path, ec);
  if (!own) path = shipped;
  DI_CHECK(fs::exists(path, ec),
           "{} has Engram layers but no engram_hash.safetensors; derive it from the model's tokenizer with "
           "`python tools/engram/hash_data.py --model {}`",
           model_dir, model_dir);
  auto f = SafetensorsFile::open(path.string());
  const auto layer_ids = read_ints<int64_t>(*f, "layer_ids", DType::kI64, static_cast<size_t>(L));
  if (!own) {
    // The shipped data is the released model's: usable only for a config with the same layout.
    DI_CHECK(layer_ids == cfg.engram_layer_ids && cfg.vocab_size == f->get("token_map").numel(),
             "{} has Engram layers but no engram_hash.safetensors, and the shipped {} is for another layout; run "
             "`python tools/engram/hash_data.py --model {}`",
             model_dir, path.string(), model_dir);
  }
  DI_CHECK(layer_ids == cfg.engram_layer_ids, "engram hash data {}: made for other engram layers than config {}",
           path.string(), cfg.source);
  EngramHash h;
  h.token_map_ = read_ints<int32_t>(*f, "token_map", DType::kI32, static_cast<size_t>(cfg.vocab_size));
  h.multipliers_ =
      read_ints<int64_t>(*f, "multipliers", DType::kI64, static_cast<size_t>(L * cfg.engram_max_ngram_size));
  h.init(cfg);
  if (f->has("primes")) {
    const auto primes = read_ints<int64_t>(*f, "primes", DType::kI64, h.primes_.size());
    DI_CHECK(primes == h.primes_, "engram hash data {}: its primes differ from the ones derived from config {}",
             path.string(), cfg.source);
  }
  return h;
}

void EngramHash::rows(const int32_t* ids, int64_t p, int64_t e, int64_t* out) const {
  // tokens[s] = id at p - s; the look-back stops at the sequence start and at a dead token.
  int64_t prod[16];
  bool blocked = false;
  for (int64_t s = 0; s < max_ngram_; ++s) {
    blocked = blocked || p - s < 0 || ids[p - s] < 0;
    const int64_t tok = blocked ? pad_ : ids[p - s];
    prod[s] = tok * multipliers_[e * max_ngram_ + s];
  }
  const int64_t cols = n_cols();
  int64_t rolling = prod[0];
  for (int64_t n = 1; n < max_ngram_; ++n) {
    rolling ^= prod[n];
    for (int64_t h = 0; h < n_heads_; ++h) {
      const int64_t c = (n - 1) * n_heads_ + h;
      out[c] = rolling % primes_[e * cols + c] + offsets_[e * cols + c];
    }
  }
}

}  // namespace deepinfer
