// The V4.1 Engram hash (src/model/engram_hash.h): prime-sized bucket layout, the rolling-XOR
// n-gram rows worked out by hand, the look-back stops, and the shipped data of the released model.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <numeric>

#include "deepinfer/error.h"
#include "deepinfer/model_config.h"
#include "model/engram_hash.h"

using namespace deepinfer;

namespace {

ModelConfig small_cfg() {
  ModelConfig c;
  c.family = ModelFamily::kV41;
  c.vocab_size = 12;
  c.engram_layer_ids = {1};
  c.engram_max_ngram_size = 3;
  c.engram_n_heads = 2;
  c.engram_vocab_size = 10;
  c.engram_num_embeddings = {11 + 13 + 17 + 19};
  c.engram_compressed_vocab_size = 10;
  c.engram_pad_id = 2;
  return c;
}

// Tokens 0..9 map to themselves, 10 and 11 collapse onto 3 and 7.
std::vector<int32_t> small_map() { return {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 7}; }

}  // namespace

TEST(EngramHash, PrimesAndOffsetsFollowTheLayout) {
  EngramHash h = EngramHash::from_data(small_cfg(), small_map(), {3, 5, 7});
  ASSERT_TRUE(h.enabled());
  EXPECT_EQ(h.n_cols(), 4);
  // Per n-gram size, per head: the next unused primes above engram_vocab_size - 1 = 9.
  EXPECT_EQ(h.primes(), (std::vector<int64_t>{11, 13, 17, 19}));
}

TEST(EngramHash, RowsByHand) {
  EngramHash h = EngramHash::from_data(small_cfg(), small_map(), {3, 5, 7});
  std::vector<int32_t> ids = {4, 6, 9};
  int64_t rows[4];
  // p = 2: tokens 9, 6, 4 -> products 27, 30, 28; 2-gram 27^30 = 5; 3-gram 5^28 = 25.
  h.rows(ids.data(), 2, 0, rows);
  EXPECT_EQ(rows[0], 5 % 11 + 0);
  EXPECT_EQ(rows[1], 5 % 13 + 11);
  EXPECT_EQ(rows[2], 25 % 17 + 24);
  EXPECT_EQ(rows[3], 25 % 19 + 41);
  // p = 0: the look-back before the start reads the compressed pad id (token 2 -> 2).
  h.rows(ids.data(), 0, 0, rows);
  const int64_t r1 = (4 * 3) ^ (2 * 5), r2 = r1 ^ (2 * 7);
  EXPECT_EQ(rows[0], r1 % 11);
  EXPECT_EQ(rows[3], r2 % 19 + 41);
  // A dead token (image span) stops the look-back: it and everything older read as pad.
  std::vector<int32_t> dead = {4, -1, 9};
  h.rows(dead.data(), 2, 0, rows);
  const int64_t d1 = (9 * 3) ^ (2 * 5), d2 = d1 ^ (2 * 7);
  EXPECT_EQ(rows[1], d1 % 13 + 11);
  EXPECT_EQ(rows[2], d2 % 17 + 24);
  EXPECT_EQ(h.compress(10), 3);
}

TEST(EngramHash, RejectsInconsistentData) {
  ModelConfig c = small_cfg();
  auto err = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err([&] { EngramHash::from_data(c, small_map(), {3, 4, 7}); }).find("multiplier 4"), std::string::npos);
  EXPECT_NE(err([&] { EngramHash::from_data(c, {0, 1, 2}, {3, 5, 7}); }).find("token map has 3"), std::string::npos);
  c.engram_num_embeddings = {61};
  EXPECT_NE(err([&] {
              EngramHash::from_data(c, small_map(), {3, 5, 7});
            }).find("add up to 60 rows"),
            std::string::npos);
  c = small_cfg();
  c.engram_compressed_vocab_size = 11;
  EXPECT_NE(err([&] {
              EngramHash::from_data(c, small_map(), {3, 5, 7});
            }).find("10 compressed ids"),
            std::string::npos);
}

// The released V4.1-Flash layout: the primes of each layer add up to its table rows, and the shipped
// data (data/engram, derived from the real tokenizer) loads and agrees with them.
TEST(EngramHash, ReleasedModelLayout) {
  ModelConfig c;
  c.family = ModelFamily::kV41;
  c.vocab_size = 129280;
  c.engram_layer_ids = {1, 14};
  c.engram_max_ngram_size = 4;
  c.engram_n_heads = 8;
  c.engram_vocab_size = 16000000;
  c.engram_num_embeddings = {384006168, 384016682};
  c.engram_compressed_vocab_size = 99092;
  c.engram_pad_id = 2;
  c.source = "v41-flash";
  EngramHash h = EngramHash::load("/nonexistent-model-dir", c);  // falls back to the shipped data
  ASSERT_EQ(h.primes().size(), 48u);
  EXPECT_EQ(std::accumulate(h.primes().begin(), h.primes().begin() + 24, int64_t{0}), 384006168);
  EXPECT_EQ(std::accumulate(h.primes().begin() + 24, h.primes().end(), int64_t{0}), 384016682);
  EXPECT_EQ(h.primes().front(), 16000057);  // the first prime above 15,999,999
}
