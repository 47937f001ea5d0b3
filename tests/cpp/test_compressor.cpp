// compressor_pool_batch (src/model/attention_v4.cpp): a batch's pooling gives every sequence the latents and the state
// it gets alone, bit for bit: with overlap and a position bias (V4's ratio 4) and without (V4.1's ratio 2), sequences
// that complete several groups, none, or have no rows at all in the call.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "deepinfer/error.h"
#include "model/layers_v4.h"

using namespace deepinfer;

namespace {

Tensor random_rows(int64_t n, int64_t width, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  Tensor t = Tensor::empty({n, width}, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

std::vector<float> values(const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); }

struct Case {
  int64_t ratio, d;
  bool overlap;
};

}  // namespace

TEST(Compressor, ABatchPoolsEachSequenceAsAlone) {
  for (const Case c : {Case{4, 3, true}, Case{2, 5, false}}) {
    const int64_t r = c.ratio, width = c.overlap ? 2 * c.d : c.d;
    std::mt19937 rng(static_cast<unsigned>(7 + r));
    const Tensor ape = c.overlap ? random_rows(r, width, rng) : Tensor();
    // Per sequence: the rows already run (alone), then the rows of the batched call (0: none in this call).
    const std::vector<int64_t> before = {0, 6, 3, 5, 1}, now = {9, 1, 5, 0, 2 * r + 3};
    const size_t B = before.size();
    std::vector<Tensor> kv, sc;
    std::vector<CompressorState> alone(B), batched(B);
    std::vector<std::vector<float>> alone_lat(B);
    auto run_one = [&](CompressorState& st, const Tensor& k, const Tensor& s, int64_t start) {
      std::vector<int64_t> groups, counts;
      const Tensor lat =
          compressor_pool_batch({&st}, k, s, ape, c.d, c.overlap, {0, k.size(0)}, {start}, groups, counts);
      EXPECT_EQ(counts.at(0), static_cast<int64_t>(groups.size()));
      return lat;
    };
    for (size_t b = 0; b < B; ++b) {
      kv.push_back(random_rows(before[b] + now[b], width, rng));
      sc.push_back(random_rows(before[b] + now[b], width, rng));
      alone[b].init(r, width, Device::kCPU);
      batched[b].init(r, width, Device::kCPU);
      // Both histories run the first rows alone; then `alone` runs the rest alone too.
      for (CompressorState* st : {&alone[b], &batched[b]})
        run_one(*st, kv[b].slice(0, 0, before[b]).clone(), sc[b].slice(0, 0, before[b]).clone(), 0);
      alone_lat[b] = values(run_one(alone[b], kv[b].slice(0, before[b], before[b] + now[b]).clone(),
                                    sc[b].slice(0, before[b], before[b] + now[b]).clone(), before[b]));
    }
    // The batch: every sequence's rows of this call stacked.
    std::vector<int64_t> offset = {0}, start;
    std::vector<CompressorState*> states;
    for (size_t b = 0; b < B; ++b) offset.push_back(offset.back() + now[b]), start.push_back(before[b]);
    for (CompressorState& st : batched) states.push_back(&st);
    Tensor skv = Tensor::empty({offset.back(), width}, DType::kF32), ssc = skv.clone();
    for (size_t b = 0; b < B; ++b) {
      copy_tensor(skv.slice(0, offset[b], offset[b + 1]), kv[b].slice(0, before[b], before[b] + now[b]));
      copy_tensor(ssc.slice(0, offset[b], offset[b + 1]), sc[b].slice(0, before[b], before[b] + now[b]));
    }
    std::vector<int64_t> groups, counts;
    const Tensor lat = compressor_pool_batch(states, skv, ssc, ape, c.d, c.overlap, offset, start, groups, counts);
    ASSERT_EQ(counts.size(), B);
    int64_t row = 0;
    for (size_t b = 0; b < B; ++b) {
      const std::vector<float> got = values(lat.slice(0, row, row + counts[b]).clone());
      EXPECT_EQ(got, alone_lat[b]) << "ratio " << r << " sequence " << b;
      row += counts[b];
      EXPECT_EQ(batched[b].cur_count, alone[b].cur_count) << "ratio " << r << " sequence " << b;
      EXPECT_EQ(values(batched[b].cur_kv.slice(0, 0, alone[b].cur_count).clone()),
                values(alone[b].cur_kv.slice(0, 0, alone[b].cur_count).clone()));
      EXPECT_EQ(values(batched[b].cur_score.slice(0, 0, alone[b].cur_count).clone()),
                values(alone[b].cur_score.slice(0, 0, alone[b].cur_count).clone()));
      EXPECT_EQ(values(batched[b].prev_kv), values(alone[b].prev_kv));
      EXPECT_EQ(values(batched[b].prev_score), values(alone[b].prev_score));
    }
    EXPECT_EQ(row, lat.size(0));
    // Completed groups: ratio 4: 9 rows from 0 -> 2, 1 from 6 -> 0, 5 from 3 -> 2, none, 11 from 1 -> 3; ratio 2: 4,
    // 0, 3, none, 4.
    EXPECT_EQ(counts, (r == 4 ? std::vector<int64_t>{2, 0, 2, 0, 3} : std::vector<int64_t>{4, 0, 3, 0, 4}));
  }
}

TEST(Compressor, ABatchRejectsMismatchedStates) {
  CompressorState a, b;
  a.init(4, 6, Device::kCPU);
  b.init(2, 6, Device::kCPU);
  const Tensor kv = Tensor::zeros({2, 6}, DType::kF32);
  std::vector<int64_t> groups, counts;
  EXPECT_THROW(compressor_pool_batch({&a, &b}, kv, kv, Tensor(), 3, true, {0, 1, 2}, {0, 0}, groups, counts), Error);
  EXPECT_THROW(compressor_pool_batch({&a}, kv, kv, Tensor(), 3, true, {0, 1}, {0}, groups, counts), Error);
}
