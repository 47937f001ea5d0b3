// Op-level checks of the CPU kernels in src/cpu against plain double-precision references.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "deepinfer/dtype.h"
#include "deepinfer/error.h"
#include "ops/ops.h"

using namespace deepinfer;

namespace {
Tensor randn(const Shape& s, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, scale);
  Tensor t = Tensor::empty(s, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(g);
  return t;
}
}  // namespace

TEST(Ops, TopkOrdersByScoreThenIndex) {
  const float s[] = {1.0f, 3.0f, 3.0f, -INFINITY, 2.0f, 3.0f};
  int32_t out[6];
  ASSERT_EQ(ops::topk(s, 6, 4, out), 4);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 2);
  EXPECT_EQ(out[2], 5);
  EXPECT_EQ(out[3], 4);
  // -inf is never picked: asking for everything returns the 5 finite entries.
  EXPECT_EQ(ops::topk(s, 6, 6, out), 5);
}

TEST(Ops, TopkRowsPadsWithMinusOneAndCanSortByIndex) {
  Tensor s = Tensor::empty({2, 6}, DType::kF32);
  const float v[] = {1.0f, 3.0f, 3.0f, -INFINITY, 2.0f, 3.0f, -INFINITY, 0.5f, -INFINITY, -INFINITY, 4.0f, -INFINITY};
  for (int i = 0; i < 12; ++i) s.data<float>()[i] = v[i];
  const Tensor by_score = ops::topk_rows(s, 4);
  const std::vector<int32_t> want_score = {1, 2, 5, 4, 4, 1, -1, -1};
  const Tensor by_index = ops::topk_rows(s, 4, /*sort_by_index=*/true);
  const std::vector<int32_t> want_index = {1, 2, 4, 5, 1, 4, -1, -1};
  ASSERT_EQ(by_score.size(0), 2);
  ASSERT_EQ(by_score.size(1), 4);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(by_score.data<int32_t>()[i], want_score[i]) << i;
    EXPECT_EQ(by_index.data<int32_t>()[i], want_index[i]) << i;
  }
}

TEST(Ops, SparseAttentionMatchesDenseSoftmaxWithSink) {
  const int64_t T = 3, H = 2, D = 16, N = 150;
  Tensor q = randn({T, H, D}, 1), kv = randn({N, D}, 2), sink = randn({H}, 3);
  Tensor idx = Tensor::empty({T, 140}, DType::kI32);
  std::mt19937 g(4);
  for (int64_t i = 0; i < idx.numel(); ++i)
    idx.data<int32_t>()[i] = (g() % 5 == 0) ? -1 : static_cast<int32_t>(g() % N);
  idx.data<int32_t>()[0] = 7;
  const float scale = 0.25f;
  Tensor o = ops::sparse_attention(q, kv, idx, sink, scale, false, false);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> s;
      std::vector<int32_t> rows;
      for (int64_t k = 0; k < 140; ++k) {
        int32_t j = idx.data<int32_t>()[t * 140 + k];
        if (j < 0) continue;
        double d = 0;
        for (int64_t c = 0; c < D; ++c) d += double(q.data<float>()[(t * H + h) * D + c]) * kv.data<float>()[j * D + c];
        s.push_back(d * scale);
        rows.push_back(j);
      }
      double m = -1e300;
      for (double v : s) m = std::max(m, v);
      double den = std::exp(double(sink.data<float>()[h]) - m);
      for (double v : s) den += std::exp(v - m);
      for (int64_t c = 0; c < D; ++c) {
        double num = 0;
        for (size_t i = 0; i < s.size(); ++i) num += std::exp(s[i] - m) * kv.data<float>()[rows[i] * D + c];
        EXPECT_NEAR(o.data<float>()[(t * H + h) * D + c], num / den, 1e-5);
      }
    }
}

TEST(Ops, SparseAttentionAllEmptyRowIsZeroAndBadIndexThrows) {
  Tensor q = randn({1, 1, 8}, 1), kv = randn({4, 8}, 2), sink = randn({1}, 3);
  Tensor idx = Tensor::empty({1, 3}, DType::kI32);
  for (int i = 0; i < 3; ++i) idx.data<int32_t>()[i] = -1;
  Tensor o = ops::sparse_attention(q, kv, idx, sink, 1.0f, true, true);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(o.data<float>()[i], 0.0f);
  idx.data<int32_t>()[1] = 4;
  EXPECT_THROW(ops::sparse_attention(q, kv, idx, sink, 1.0f, true, true), Error);
}

// The de-rotation fused into sparse_attention (ops::AttnDerotate) is the output's inverse RoPE at each row's position:
// rotating back by the forward RoPE gives the plain output; a bad rope_dim is an error, not a silent mis-rotation.
TEST(Ops, SparseAttentionDerotatesItsOutput) {
  const int64_t T = 3, H = 2, D = 16, N = 20;
  Tensor q = randn({T, H, D}, 11), kv = randn({N, D}, 12), sink = randn({H}, 13);
  Tensor idx = Tensor::empty({T, 5}, DType::kI32);
  for (int64_t i = 0; i < idx.numel(); ++i) idx.data<int32_t>()[i] = static_cast<int32_t>((i * 7) % N);
  const ops::RopeFreqs f = ops::rope_freqs(8, 10000.0, 1.0, 0, 32, 1);
  const std::vector<int64_t> pos = {5, 900, 17};
  const ops::AttnDerotate derot{pos.data(), &f, 8};
  const Tensor plain = ops::sparse_attention(q, kv, idx, sink, 0.5f, false, false);
  Tensor o = ops::sparse_attention(q, kv, idx, sink, 0.5f, false, false, &derot);
  int64_t moved = 0;
  for (int64_t i = 0; i < o.numel(); ++i) moved += o.data<float>()[i] != plain.data<float>()[i];
  EXPECT_GT(moved, 0);  // the rope dims changed
  ops::apply_rope(o, D, 8, pos.data(), f, false, false);
  for (int64_t i = 0; i < o.numel(); ++i) EXPECT_NEAR(o.data<float>()[i], plain.data<float>()[i], 1e-5) << i;
  // Into a caller's buffer (the next graph piece's input slot): the same values, returned as [T, H, D] over it.
  const Tensor want = ops::sparse_attention(q, kv, idx, sink, 0.5f, false, false, &derot);
  Tensor buf = Tensor::zeros({T, H * D}, DType::kF32);
  const Tensor into = ops::sparse_attention(q, kv, idx, sink, 0.5f, false, false, &derot, buf);
  EXPECT_EQ(into.raw(), buf.raw());
  EXPECT_EQ(into.shape(), want.shape());
  for (int64_t i = 0; i < buf.numel(); ++i) EXPECT_EQ(buf.data<float>()[i], want.data<float>()[i]) << i;
  EXPECT_THROW(ops::sparse_attention(q, kv, idx, sink, 0.5f, false, false, nullptr, Tensor::zeros({T, H}, DType::kF32)),
               Error);
  const ops::AttnDerotate odd{pos.data(), &f, 7}, wide{pos.data(), &f, 18};
  EXPECT_THROW(ops::sparse_attention(q, kv, idx, sink, 0.5f, false, false, &odd), Error);
  EXPECT_THROW(ops::sparse_attention(q, kv, idx, sink, 0.5f, false, false, &wide), Error);
}

namespace {

// The rows of `table` [N, width] as runs stored out of order in `store` (a new [N, width] tensor): run {at, from, len}
// holds rows [from, from + len) at store row `at`. Returns the runs in table order (what the *_segments ops read).
std::vector<ops::RowSegment> stored_runs(const Tensor& table, const std::vector<std::array<int64_t, 3>>& runs,
                                         Tensor& store) {
  const int64_t w = table.size(1);
  store = Tensor::empty(table.shape(), DType::kF32);
  std::vector<ops::RowSegment> segs;
  for (const auto& [at, from, len] : runs) {
    std::copy(table.data<float>() + from * w, table.data<float>() + (from + len) * w, store.data<float>() + at * w);
    segs.push_back({store.data<float>() + at * w, len});
  }
  return segs;
}

}  // namespace

// The table read where its rows live (the CPU's attend_chunks: ring runs, new rows, pages): runs of a shuffled copy of
// the table, laid end to end, give the bits of the gathered table, with and without the de-rotation.
TEST(Ops, SparseAttentionSegmentsReadsRowsInPlace) {
  const int64_t T = 4, H = 3, D = 32, N = 37;
  Tensor q = randn({T, H, D}, 21), kv = randn({N, D}, 22), sink = randn({H}, 23);
  Tensor idx = Tensor::empty({T, 9}, DType::kI32);
  for (int64_t i = 0; i < idx.numel(); ++i)
    idx.data<int32_t>()[i] = i % 5 == 3 ? -1 : static_cast<int32_t>((i * 11) % N);
  // The table's rows in three runs stored out of order elsewhere: [0, 10) at the end, [10, 30) first, [30, 37) between.
  Tensor store;
  std::vector<ops::RowSegment> segs = stored_runs(kv, {{27, 0, 10}, {0, 10, 20}, {20, 30, 7}}, store);
  const ops::RopeFreqs f = ops::rope_freqs(8, 10000.0, 1.0, 0, 32, 1);
  const std::vector<int64_t> pos = {3, 4, 5, 6};
  const ops::AttnDerotate derot{pos.data(), &f, 8};
  for (const ops::AttnDerotate* d : {static_cast<const ops::AttnDerotate*>(nullptr), &derot}) {
    const Tensor want = ops::sparse_attention(q, kv, idx, sink, 0.25f, true, true, d);
    const Tensor got = ops::sparse_attention_segments(q, segs, idx, sink, 0.25f, true, true, d);
    ASSERT_EQ(got.shape(), want.shape());
    for (int64_t i = 0; i < want.numel(); ++i) EXPECT_EQ(got.data<float>()[i], want.data<float>()[i]) << i;
  }
  segs.pop_back();  // 30 rows: index 30+ is out of range
  EXPECT_THROW(ops::sparse_attention_segments(q, segs, idx, sink, 0.25f, true, true), Error);
}

// Only the listed rows gathered (attend_chunks on CUDA past a short context): the attention over them and the
// rewritten lists gives the bits of the whole table's; empty entries (-1, -4) become -1; an entry past the runs is
// refused before any entry is rewritten.
TEST(Ops, GatherListedGivesTheWholeTablesAttention) {
  const int64_t T = 4, H = 3, D = 32, N = 37, K = 9;
  Tensor q = randn({T, H, D}, 31), kv = randn({N, D}, 32), sink = randn({H}, 33);
  Tensor idx = Tensor::empty({T, K}, DType::kI32);
  for (int64_t i = 0; i < idx.numel(); ++i)
    idx.data<int32_t>()[i] = i % 5 == 3 ? -1 : i % 7 == 2 ? -4 : static_cast<int32_t>((i * 11) % N);
  Tensor store;
  const std::vector<ops::RowSegment> segs = stored_runs(kv, {{27, 0, 10}, {0, 10, 20}, {20, 30, 7}}, store);
  const Tensor want = ops::sparse_attention(q, kv, idx, sink, 0.25f, true, true);
  Tensor listed = idx.clone();
  Tensor rows = Tensor::zeros({T * K, D}, DType::kF32);
  ops::gather_listed(segs, listed, rows);
  for (int64_t e = 0; e < idx.numel(); ++e) {
    const int32_t j = idx.data<int32_t>()[e];
    EXPECT_EQ(listed.data<int32_t>()[e], j < 0 ? -1 : e) << e;
    if (j >= 0)
      for (int64_t d = 0; d < D; ++d) EXPECT_EQ(rows.data<float>()[e * D + d], kv.data<float>()[j * D + d]);
  }
  const Tensor got = ops::sparse_attention(q, rows, listed, sink, 0.25f, true, true);
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t i = 0; i < want.numel(); ++i) EXPECT_EQ(got.data<float>()[i], want.data<float>()[i]) << i;

  Tensor bad = idx.clone();
  bad.data<int32_t>()[idx.numel() - 1] = static_cast<int32_t>(N);  // one past the runs, in the last entry
  EXPECT_THROW(ops::gather_listed(segs, bad, rows), Error);
  for (int64_t e = 0; e + 1 < idx.numel(); ++e) EXPECT_EQ(bad.data<int32_t>()[e], idx.data<int32_t>()[e]) << e;
  EXPECT_THROW(ops::gather_listed(segs, idx.clone(), Tensor::zeros({T * K - 1, D}, DType::kF32)), Error);
}

// A paged store (ops::RowSegment's paged form: rows found through page addresses) reads as its pages' runs: the
// *_segments ops, gather_segments and gather_listed over [a run, a store of pages of 8 laid out of order, a run] give
// the bits of the table; flat_runs lists the pages' runs; a page size that is not a power of two is refused.
TEST(Ops, PagedSegmentReadsAsItsPagesRuns) {
  const int64_t T = 2, H = 3, D = 32, N = 37, K = 9, P = 8;
  Tensor q = randn({T, H, D}, 41), kv = randn({N, D}, 42), sink = randn({H}, 43);
  // Rows [2, 34) in 4 pages of 8 stored in reverse order; rows [0, 2) and [34, 37) as runs of kv itself.
  Tensor store = Tensor::empty({32, D}, DType::kF32);
  std::vector<float*> pages;
  for (int64_t p = 0; p < 4; ++p) {
    float* page = store.data<float>() + (3 - p) * P * D;
    std::copy(kv.data<float>() + (2 + p * P) * D, kv.data<float>() + (2 + (p + 1) * P) * D, page);
    pages.push_back(page);
  }
  ops::RowSegment paged{nullptr, 32};
  paged.pages = pages.data();
  paged.page_rows = P;
  const std::vector<ops::RowSegment> segs{{kv.data<float>(), 2}, paged, {kv.data<float>() + 34 * D, 3}};
  const std::vector<ops::RowSegment> runs = ops::flat_runs(segs, "test");
  ASSERT_EQ(runs.size(), 6u);
  for (int64_t p = 0; p < 4; ++p) EXPECT_EQ(runs[1 + p].src, pages[p]);

  Tensor table = Tensor::zeros({N, D}, DType::kF32);
  ops::gather_segments(segs, table);
  for (int64_t i = 0; i < kv.numel(); ++i) ASSERT_EQ(table.data<float>()[i], kv.data<float>()[i]) << i;

  Tensor idx = Tensor::empty({T, K}, DType::kI32);
  for (int64_t i = 0; i < idx.numel(); ++i)
    idx.data<int32_t>()[i] = i % 5 == 3 ? -1 : static_cast<int32_t>((i * 11) % N);
  const Tensor want = ops::sparse_attention(q, kv, idx, sink, 0.25f, true, true);
  const Tensor got = ops::sparse_attention_segments(q, segs, idx, sink, 0.25f, true, true);
  for (int64_t i = 0; i < want.numel(); ++i) EXPECT_EQ(got.data<float>()[i], want.data<float>()[i]) << i;
  Tensor listed = idx.clone(), rows = Tensor::zeros({T * K, D}, DType::kF32);
  ops::gather_listed(segs, listed, rows);
  const Tensor via_rows = ops::sparse_attention(q, rows, listed, sink, 0.25f, true, true);
  for (int64_t i = 0; i < want.numel(); ++i) EXPECT_EQ(via_rows.data<float>()[i], want.data<float>()[i]) << i;

  const ops::KeyVisibility vis{Tensor(), N - 1, 1};  // a decode row seeing every key
  const Tensor q1 = randn({1, H, D}, 45), w1 = randn({1, H}, 46);
  const Tensor s_want = ops::index_scores(q1, kv, w1, vis, true);
  const Tensor s_got = ops::index_scores_segments(q1, segs, w1, vis, true);
  ASSERT_EQ(s_got.shape(), s_want.shape());
  for (int64_t i = 0; i < s_want.numel(); ++i) EXPECT_EQ(s_got.data<float>()[i], s_want.data<float>()[i]) << i;

  ops::RowSegment odd = paged;
  odd.page_rows = 6;
  EXPECT_THROW(ops::flat_runs({odd}, "test"), Error);
  EXPECT_THROW(ops::gather_segments({odd}, Tensor::zeros({32, D}, DType::kF32)), Error);
}

// YaRN table for compress_rope_theta 160000, factor 16, original 65536: dims i <= 15 keep their
// frequency, i >= 25 are divided by 16, 16..24 blend with ramp (i - 15) / 10 (spec §2.1).
TEST(Ops, RopeYarnCorrectionRange) {
  auto plain = ops::rope_freqs(64, 160000.0, 1.0, 0, 32, 1);
  auto yarn = ops::rope_freqs(64, 160000.0, 16.0, 65536, 32, 1);
  for (int i = 0; i < 32; ++i) {
    double f = plain.freq[i];
    double want = i <= 15 ? f : (i >= 25 ? f / 16 : f / 16 * ((i - 15) / 10.0) + f * (1 - (i - 15) / 10.0));
    EXPECT_NEAR(yarn.freq[i], want, 1e-6 * f) << i;
    EXPECT_NEAR(plain.freq[i], std::pow(160000.0, -2.0 * i / 64), 1e-6 * f);
  }
}

TEST(Ops, RopeInverseUndoesRotation) {
  Tensor x = randn({5, 2 * 128}, 9);
  Tensor y = x.clone();
  const int64_t pos[] = {0, 1, 17, 1000, 65535};
  auto f = ops::rope_freqs(64, 10000.0, 1.0, 0, 32, 1);
  ops::apply_rope(y, 128, 64, pos, f, false, false);
  for (int64_t c = 0; c < 64; ++c) EXPECT_EQ(y.data<float>()[c], x.data<float>()[c]);  // NoPE dims untouched
  EXPECT_NEAR(y.data<float>()[64], x.data<float>()[64], 0);                            // position 0: identity
  ops::apply_rope(y, 128, 64, pos, f, true, false);
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_NEAR(y.data<float>()[i], x.data<float>()[i], 1e-4);
}

TEST(Ops, HadamardIsOrthonormalAndSelfInverse) {
  Tensor x = randn({3, 128}, 5);
  Tensor y = x.clone();
  ops::hadamard(y, 128, false);
  double nx = 0, ny = 0;
  for (int64_t i = 0; i < 128; ++i) {
    nx += x.data<float>()[i] * x.data<float>()[i];
    ny += y.data<float>()[i] * y.data<float>()[i];
  }
  EXPECT_NEAR(nx, ny, 1e-4 * nx);
  ops::hadamard(y, 128, false);
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_NEAR(y.data<float>()[i], x.data<float>()[i], 1e-5);
  EXPECT_THROW(ops::hadamard(y, 96, false), Error);
}

TEST(Ops, RmsNormMatchesDefinition) {
  Tensor x = randn({4, 64}, 6, 3.0f), w = randn({64}, 7);
  Tensor y = ops::rms_norm(x, w, 1e-6f, false);
  for (int64_t r = 0; r < 4; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < 64; ++c) ss += double(x.data<float>()[r * 64 + c]) * x.data<float>()[r * 64 + c];
    double inv = 1 / std::sqrt(ss / 64 + 1e-6);
    for (int64_t c = 0; c < 64; ++c)
      EXPECT_NEAR(y.data<float>()[r * 64 + c], w.data<float>()[c] * x.data<float>()[r * 64 + c] * inv, 1e-5);
  }
  Tensor yb = ops::rms_norm(x, w, 1e-6f, true);
  for (int64_t i = 0; i < yb.numel(); ++i) EXPECT_EQ(yb.data<float>()[i], round_bf16(yb.data<float>()[i]));
}

// Sinkhorn output is (nearly) doubly stochastic; pre/post lie in their sigmoid ranges.
TEST(Ops, HcMixesSinkhornIsDoublyStochastic) {
  const int64_t hc = 4, dim = 32, T = 3, M = (2 + hc) * hc;
  Tensor stream = randn({T, hc, dim}, 8), fn = randn({M, hc * dim}, 9, 0.1f), base = randn({M}, 10);
  Tensor scale = Tensor::full({3}, 0.5f);
  ops::HcMix m = ops::hc_mixes(stream, fn, scale, base, hc, 20, 1e-6f, 1e-6f);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < hc; ++j) {
      double row = 0, col = 0;
      for (int64_t k = 0; k < hc; ++k) {
        row += m.comb.data<float>()[(t * hc + j) * hc + k];
        col += m.comb.data<float>()[(t * hc + k) * hc + j];
      }
      EXPECT_NEAR(row, 1.0, 1e-3);
      EXPECT_NEAR(col, 1.0, 1e-5);
      EXPECT_GT(m.pre.data<float>()[t * hc + j], 0.0f);
      EXPECT_LT(m.post.data<float>()[t * hc + j], 2.0f);
    }
  }
  // Collapse / expand follow their definitions.
  Tensor x = ops::hc_collapse(stream, m.pre, false);
  Tensor y = randn({T, dim}, 11);
  Tensor e = ops::hc_expand(y, stream, m.post, m.comb, false);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < dim; d += 7) {
      double want = 0;
      for (int64_t j = 0; j < hc; ++j)
        want += m.pre.data<float>()[t * hc + j] * stream.data<float>()[(t * hc + j) * dim + d];
      EXPECT_NEAR(x.data<float>()[t * dim + d], want, 1e-5);
      for (int64_t k = 0; k < hc; ++k) {
        double w2 = m.post.data<float>()[t * hc + k] * y.data<float>()[t * dim + d];
        for (int64_t j = 0; j < hc; ++j)
          w2 += m.comb.data<float>()[(t * hc + j) * hc + k] * stream.data<float>()[(t * hc + j) * dim + d];
        EXPECT_NEAR(e.data<float>()[(t * hc + k) * dim + d], w2, 1e-5);
      }
    }
  // The fused sublayer input is the norm of the collapse, bit for bit (both roundings).
  const Tensor nw = randn({dim}, 12);
  for (bool round : {false, true}) {
    const Tensor want = ops::rms_norm(ops::hc_collapse(stream, m.pre, round), nw, 1e-6f, round);
    const Tensor got = ops::hc_collapse_norm(stream, m.pre, nw, 1e-6f, round);
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>(), want.nbytes()), 0) << "round " << round;
  }
}

// The attention's fused input op is the composition of its four ops bit for bit: both weight dtypes, rounding on
// and off, quantisation off / over the NoPE part (V4) / over the whole row (V4.1), row-strided column slices of one
// stacked [T, q_lora + D] projection as the model passes them, positions that are not a progression.
TEST(Ops, AttnInputNormsAreTheComposition) {
  struct Shape3 {
    int64_t T, q_lora, D, rd;
  };
  uint32_t seed = 300;
  for (const Shape3 sh : {Shape3{1, 96, 64, 16}, Shape3{5, 100, 36, 8}, Shape3{3, 1024, 512, 64}}) {
    const Tensor stacked = randn({sh.T, sh.q_lora + sh.D}, seed++, 3.0f);
    const Tensor qa = stacked.slice(1, 0, sh.q_lora), kva = stacked.slice(1, sh.q_lora, sh.q_lora + sh.D);
    ASSERT_FALSE(kva.is_contiguous());
    const ops::RopeFreqs f = ops::rope_freqs(sh.rd, 10000.0, 16.0, 65536, 32.0, 1.0);
    std::vector<int64_t> pos(static_cast<size_t>(sh.T));
    for (int64_t t = 0; t < sh.T; ++t) pos[t] = 70000 + 3 * t + (t % 2) * 1000;
    for (DType wdt : {DType::kF32, DType::kBF16}) {
      Tensor qw = randn({sh.q_lora}, seed++), kw = randn({sh.D}, seed++);
      if (wdt == DType::kBF16) {
        auto to_bf16 = [](const Tensor& w) {
          Tensor b = Tensor::empty(w.shape(), DType::kBF16);
          for (int64_t i = 0; i < w.numel(); ++i) b.data<uint16_t>()[i] = f32_to_bf16(w.data<float>()[i]);
          return b;
        };
        qw = to_bf16(qw);
        kw = to_bf16(kw);
      }
      for (bool round : {false, true}) {
        const std::pair<int64_t, int64_t> quants[] = {{0, 0}, {sh.D - sh.rd, 64}, {sh.D, 32}};
        for (const auto& [qend, block] : quants) {
          const Tensor qr = ops::rms_norm(qa, qw, 1e-6f, round);
          Tensor kv = ops::rms_norm(kva, kw, 1e-6f, round);
          ops::apply_rope(kv, sh.D, sh.rd, pos.data(), f, false, round);
          if (block > 0) ops::fake_quant_fp8(kv, 0, qend, block);
          const ops::AttnInputs got =
              ops::attn_input_norms(qa, qw, kva, kw, 1e-6f, round, sh.rd, pos.data(), f, qend, block);
          const std::string what = "T " + std::to_string(sh.T) + " D " + std::to_string(sh.D) + " bf16 weights " +
                                   std::to_string(wdt == DType::kBF16) + " round " + std::to_string(round) +
                                   " quant block " + std::to_string(block);
          ASSERT_EQ(got.qr.shape(), qr.shape()) << what;
          ASSERT_EQ(got.kv.shape(), kv.shape()) << what;
          EXPECT_EQ(std::memcmp(got.qr.data<float>(), qr.data<float>(), qr.nbytes()), 0) << what;
          EXPECT_EQ(std::memcmp(got.kv.data<float>(), kv.data<float>(), kv.nbytes()), 0) << what;
        }
      }
    }
  }
}

TEST(Ops, AttnInputNormsRejectBadShapes) {
  const Tensor qa = randn({3, 32}, 1), kva = randn({3, 16}, 2), kv2 = randn({2, 16}, 3);
  const ops::RopeFreqs f = ops::rope_freqs(8, 10000.0, 1.0, 0, 32.0, 1.0);
  const int64_t pos[] = {0, 1, 2};
  auto expect_error = [&](const std::function<void()>& call, const char* needle) {
    try {
      call();
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("attn_input_norms"), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
  };
  // Rows that do not pair up, a table for another rope dim, a quant range past the row, no positions, 3-D input.
  expect_error([&] { ops::attn_input_norms(qa, Tensor(), kv2, Tensor(), 1e-6f, false, 8, pos, f, 16, 32); }, "[T, D]");
  expect_error([&] { ops::attn_input_norms(qa, Tensor(), kva, Tensor(), 1e-6f, false, 4, pos, f, 16, 32); },
               "rope dim 4");
  expect_error([&] { ops::attn_input_norms(qa, Tensor(), kva, Tensor(), 1e-6f, false, 8, pos, f, 17, 32); },
               "quant columns");
  expect_error([&] { ops::attn_input_norms(qa, Tensor(), kva, Tensor(), 1e-6f, false, 8, nullptr, f, 16, 32); },
               "positions");
  expect_error(
      [&] {
        ops::attn_input_norms(qa.view({3, 2, 16}), Tensor(), kva, Tensor(), 1e-6f, false, 8, pos, f, 16, 0);
      },
      "[T, q_lora]");
  // A weight of the wrong width is the norm's own error.
  EXPECT_THROW(ops::attn_input_norms(qa, randn({31}, 4), kva, Tensor(), 1e-6f, false, 8, pos, f, 16, 0), Error);
}

// The op layer dispatches on the device: a CUDA tensor reaching an op without a CUDA kernel is a
// clear error naming the op (the fake device pointer is never dereferenced).
TEST(Ops, DispatchRejectsDevicesWithoutKernel) {
  float dummy[4];
  Tensor x = Tensor::borrow(dummy, {1, 4}, DType::kF32, nullptr, Device::kCUDA);
  // Every op has a CUDA kernel now: a CUDA tensor reaches it (CUDA build: its argument check, which runs
  // before anything touches the device, rejects n = 3) or, in a build without CUDA, the dispatcher's
  // no-kernel error; never the CPU kernel.
  try {
    ops::hadamard(x, 3, false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("ops::hadamard") != std::string::npos || what.find("cuda::hadamard") != std::string::npos)
        << what;
  }
  EXPECT_THROW(ops::linear(x, ops::QWeight{}, {}), Error);
}

// The indexer score as the model computed it per (query, key) before ops::index_scores (the
// contract's operation order): fp32 dots in ascending i, FP64 head sum, bf16 roundings.
static float index_score_ref(const float* q, const float* key, const float* w, int64_t nh, int64_t d, bool bf16) {
  auto rd = [&](float v) { return bf16 ? round_bf16(v) : v; };
  double total = 0;
  for (int64_t h = 0; h < nh; ++h) {
    float dot = 0.0f;
    for (int64_t i = 0; i < d; ++i) dot += q[h * d + i] * key[i];
    dot = rd(dot);
    if (dot > 0) total += rd(dot * w[h]);
  }
  return rd(static_cast<float>(total));
}

TEST(Ops, IndexScoresReplayTheScalarOrderBitForBit) {
  struct Case {
    int64_t T, N, nh, d, start_pos, ratio;
    bool counts, bf16;
  };
  for (const Case c : {Case{5, 70, 64, 128, 200, 4, false, true}, Case{9, 37, 16, 32, 0, 1, true, false},
                       Case{4, 23, 6, 40, 10, 2, false, true}, Case{3, 11, 5, 24, 0, 1, true, false}}) {
    const Tensor q = randn({c.T, c.nh, c.d}, 1), keys = randn({c.N, c.d}, 2), w = randn({c.T, c.nh}, 3, 0.1f);
    ops::KeyVisibility vis{Tensor(), c.start_pos, c.ratio};
    if (c.counts) {
      vis.counts = Tensor::empty({c.T}, DType::kI32);
      for (int64_t t = 0; t < c.T; ++t) vis.counts.data<int32_t>()[t] = static_cast<int32_t>((t * 7) % (c.N + 1));
    }
    const Tensor s = ops::index_scores(q, keys, w, vis, c.bf16);
    ASSERT_EQ(s.shape(), (Shape{c.T, c.N}));
    for (int64_t t = 0; t < c.T; ++t) {
      const int64_t visible = c.counts ? vis.counts.data<int32_t>()[t] : std::min(c.N, (c.start_pos + t + 1) / c.ratio);
      for (int64_t j = 0; j < c.N; ++j) {
        const float got = s.data<float>()[t * c.N + j];
        if (j >= visible) {
          EXPECT_EQ(got, -INFINITY);
          continue;
        }
        const float want = index_score_ref(q.data<float>() + t * c.nh * c.d, keys.data<float>() + j * c.d,
                                           w.data<float>() + t * c.nh, c.nh, c.d, c.bf16);
        ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "t " << t << " j " << j << ": " << got << " vs " << want;
      }
    }
  }
}

// Rows over their own keys of one stacked table (offsets, counts, width): each row's scores are those of the row
// alone over its keys (the batched decode indexer relies on it), -inf past its keys and to the width.
TEST(Ops, IndexScoresWithOffsetsEqualEachRowAlone) {
  const int64_t T = 6, nh = 8, d = 16, W = 13;
  const int64_t n[T] = {5, 13, 1, 9, 0, 12};
  int64_t N = 0;
  ops::KeyVisibility vis;
  vis.counts = Tensor::empty({T}, DType::kI32);
  vis.offsets = Tensor::empty({T}, DType::kI32);
  vis.width = W;
  for (int64_t t = 0; t < T; ++t) {
    vis.offsets.data<int32_t>()[t] = static_cast<int32_t>(N);
    vis.counts.data<int32_t>()[t] = static_cast<int32_t>(t == 3 ? 100 : n[t]);  // row 3: count above its keys
    N += n[t];
  }
  const Tensor q = randn({T, nh, d}, 11), keys = randn({N, d}, 12), w = randn({T, nh}, 13, 0.1f);
  const Tensor s = ops::index_scores(q, keys, w, vis, true);
  ASSERT_EQ(s.shape(), (Shape{T, W}));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t off = vis.offsets.data<int32_t>()[t];
    const int64_t visible = std::min(n[t], static_cast<int64_t>(vis.counts.data<int32_t>()[t]));
    // The row alone: its query against its own keys (t == 3 sees the rest of the table past its 9 keys, capped by W).
    const int64_t own = t == 3 ? std::min(N - off, W) : visible;
    if (own > 0) {
      ops::KeyVisibility one{Tensor::empty({1}, DType::kI32), 0, 1};
      one.counts.data<int32_t>()[0] = static_cast<int32_t>(own);
      const Tensor alone =
          ops::index_scores(q.slice(0, t, t + 1), keys.slice(0, off, off + own), w.slice(0, t, t + 1), one, true);
      ASSERT_EQ(std::memcmp(alone.data<float>(), s.data<float>() + t * W, static_cast<size_t>(own) * 4), 0) << t;
    }
    for (int64_t j = own; j < W; ++j) EXPECT_EQ(s.data<float>()[t * W + j], -INFINITY) << t << " " << j;
  }
  vis.counts = Tensor();
  EXPECT_THROW(ops::index_scores(q, keys, w, vis, true), Error);  // offsets without counts
}

// The indexer reading its keys where they live (runs out of order, as a paged store's pages): the same bits as the
// table gathered first, with the causal rule and with per-row offsets; a run at null is refused.
TEST(Ops, IndexScoresSegmentsReadKeysInPlace) {
  const int64_t T = 5, nh = 16, d = 24, N = 41;
  const Tensor q = randn({T, nh, d}, 31), keys = randn({N, d}, 32), w = randn({T, nh}, 33, 0.1f);
  Tensor store;
  std::vector<ops::RowSegment> segs = stored_runs(keys, {{30, 0, 11}, {0, 11, 17}, {17, 28, 13}}, store);
  ops::KeyVisibility offs;
  offs.counts = Tensor::empty({T}, DType::kI32);
  offs.offsets = Tensor::empty({T}, DType::kI32);
  offs.width = 19;
  for (int64_t t = 0; t < T; ++t) {
    offs.offsets.data<int32_t>()[t] = static_cast<int32_t>(7 * t);
    offs.counts.data<int32_t>()[t] = static_cast<int32_t>(3 + 4 * t);
  }
  for (const ops::KeyVisibility& vis : {ops::KeyVisibility{Tensor(), 150, 4}, offs})
    for (bool round : {false, true}) {
      const Tensor want = ops::index_scores(q, keys, w, vis, round);
      const Tensor got = ops::index_scores_segments(q, segs, w, vis, round);
      ASSERT_EQ(got.shape(), want.shape());
      ASSERT_EQ(std::memcmp(got.data<float>(), want.data<float>(), static_cast<size_t>(want.numel()) * 4), 0)
          << "round " << round;
    }
  segs.push_back({nullptr, 2});
  EXPECT_THROW(ops::index_scores_segments(q, segs, w, offs, true), Error);
}

TEST(Ops, MoeRouteSelectsByBiasAndWeighsByScore) {
  Tensor logits = Tensor::empty({1, 4}, DType::kF32), bias = Tensor::empty({4}, DType::kF32);
  const float l[] = {1.0f, 2.0f, 0.5f, -1.0f}, b[] = {0.0f, 0.0f, 5.0f, 0.0f};
  for (int i = 0; i < 4; ++i) logits.data<float>()[i] = l[i], bias.data<float>()[i] = b[i];
  ops::RouteOpts o;
  o.route_scale = 2.0f;
  const ops::Routing r = ops::moe_route(logits, bias, Tensor(), Tensor(), 2, o);
  EXPECT_EQ(r.ids.data<int32_t>()[0], 2);  // the bias decides the selection
  EXPECT_EQ(r.ids.data<int32_t>()[1], 1);
  auto score = [](float x) { return std::sqrt(std::log1p(std::exp(x))); };
  const float s2 = score(0.5f), s1 = score(2.0f);
  EXPECT_FLOAT_EQ(r.weights.data<float>()[0], s2 / (s2 + s1) * 2.0f);  // but not the weights
  EXPECT_FLOAT_EQ(r.weights.data<float>()[1], s1 / (s2 + s1) * 2.0f);
  // Hash routing takes the table's ids.
  Tensor table = Tensor::empty({3, 2}, DType::kI32), tokens = Tensor::empty({1}, DType::kI32);
  const int32_t tv[] = {0, 1, 3, 2, 1, 0};
  for (int i = 0; i < 6; ++i) table.data<int32_t>()[i] = tv[i];
  tokens.data<int32_t>()[0] = 1;
  const ops::Routing h = ops::moe_route(logits, Tensor(), table, tokens, 2, o);
  EXPECT_EQ(h.ids.data<int32_t>()[0], 3);
  EXPECT_EQ(h.ids.data<int32_t>()[1], 2);
  tokens.data<int32_t>()[0] = 3;
  EXPECT_THROW(ops::moe_route(logits, Tensor(), table, tokens, 2, o), Error);
}

TEST(Ops, SwigluClampsAndEmbeddingGathers) {
  Tensor g = Tensor::full({1, 3}, 12.0f), u = Tensor::full({1, 3}, -30.0f);
  const Tensor h = ops::swiglu(g, u, Tensor(), 10.0f, false);
  EXPECT_FLOAT_EQ(h.data<float>()[0], 10.0f / (1.0f + std::exp(-10.0f)) * -10.0f);
  Tensor table = Tensor::empty({3, 2}, DType::kBF16), ids = Tensor::empty({2}, DType::kI32);
  for (int i = 0; i < 6; ++i) table.data<uint16_t>()[i] = f32_to_bf16(static_cast<float>(i));
  ids.data<int32_t>()[0] = 2;
  ids.data<int32_t>()[1] = 0;
  const Tensor e = ops::embedding(table, ids, 2);
  ASSERT_EQ(e.shape(), (Shape{2, 2, 2}));
  const float want[] = {4, 5, 4, 5, 0, 1, 0, 1};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(e.data<float>()[i], want[i]);
  const Tensor r = ops::gather_rows(e, ids.slice(0, 1, 2).contiguous());
  EXPECT_EQ(r.shape(), (Shape{1, 2, 2}));
  EXPECT_EQ(r.data<float>()[0], 4.0f);  // row 0 of e: table row 2
}

// gather_rows / swiglu with quant_block: the rows come out on the FP8 grid of their 32-column groups (values that
// fake_quant_fp8 leaves as they are: 1.3 -> 1.25 at scale 1 or 2^-8), and bad arguments are refused.
TEST(Ops, GatherAndSwigluQuantiseWhenAsked) {
  Tensor x = Tensor::full({3, 64}, 1.3f), rows = Tensor::empty({2}, DType::kI32);
  x.data<float>()[64 + 5] = 448.0f;  // row 1, group 0: a large amax gives that group a coarse scale
  rows.data<int32_t>()[0] = 1;
  rows.data<int32_t>()[1] = 2;
  const Tensor q = ops::gather_rows(x, rows, 32);
  EXPECT_EQ(q.data<float>()[5], 448.0f);
  EXPECT_EQ(q.data<float>()[0], 1.25f);  // 1.3 at scale 1: e4m3 step 0.125
  Tensor again = q.clone();
  ops::fake_quant_fp8(again, 0, 64, 32);
  EXPECT_EQ(std::memcmp(again.raw(), q.raw(), q.nbytes()), 0);  // already on the grid
  EXPECT_NE(q.data<float>()[64 + 40], 1.3f);                    // row 2, group 1 quantised too
  const Tensor h = ops::swiglu(Tensor::full({1, 40}, 1.3f), Tensor::full({1, 40}, 0.7f), Tensor(), 0.0f, false, 32);
  Tensor h2 = h.clone();
  ops::fake_quant_fp8(h2, 0, 40, 32);
  EXPECT_EQ(std::memcmp(h2.raw(), h.raw(), h.nbytes()), 0);
  EXPECT_THROW(ops::gather_rows(x, rows, -1), Error);
  EXPECT_THROW(ops::gather_rows(Tensor::full({3, 2, 4}, 1.0f), rows, 32), Error);
}

// moe_group + moe_combine against the per-expert host loop they replaced (bit for bit), with an
// expert repeated within a token (hash routing) and the shared expert added before the rounding.
TEST(Ops, MoeGroupAndCombineReplayThePerExpertLoop) {
  const int64_t T = 5, k = 3, E = 4, dim = 7;
  const int32_t iv[] = {2, 0, 3, 1, 1, 2, 3, 2, 0, 0, 1, 2, 3, 3, 3};
  Tensor ids = Tensor::empty({T, k}, DType::kI32), w = Tensor::empty({T, k}, DType::kF32);
  for (int i = 0; i < T * k; ++i) ids.data<int32_t>()[i] = iv[i], w.data<float>()[i] = 0.1f * static_cast<float>(i + 1);
  const ops::MoeGroups g = ops::moe_group(ids, w, E);
  ASSERT_EQ(g.offsets, (std::vector<int64_t>{0, 3, 6, 10, 15}));
  const int32_t want_rows[] = {0, 2, 3, 1, 1, 3, 0, 1, 2, 3, 0, 2, 4, 4, 4};
  for (int i = 0; i < T * k; ++i) {
    EXPECT_EQ(g.rows.data<int32_t>()[i], want_rows[i]);
    const int32_t s = g.slots.data<int32_t>()[i];
    EXPECT_EQ(g.rows.data<int32_t>()[s], i / k);
    EXPECT_EQ(g.weights.data<float>()[s], w.data<float>()[i]);
    EXPECT_EQ(g.row_expert.data<int32_t>()[s], iv[i]);
  }
  // The replaced loop: per expert ascending, its (token, slot) pairs in order, acc[t] += y.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Tensor y = Tensor::empty({T * k, dim}, DType::kF32), shared = Tensor::empty({T, dim}, DType::kF32);
  for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = nd(rng) * 100.0f;
  for (int64_t i = 0; i < shared.numel(); ++i) shared.data<float>()[i] = nd(rng);
  for (bool round : {false, true}) {
    std::vector<float> acc(T * dim, 0.0f);
    for (int64_t e = 0, pos = 0; e < E; ++e)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j)
          if (iv[t * k + j] == e) {
            for (int64_t d = 0; d < dim; ++d) acc[t * dim + d] += y.data<float>()[pos * dim + d];
            ++pos;
          }
    const Tensor out = ops::moe_combine(y, g.slots, shared, round);
    for (int64_t i = 0; i < T * dim; ++i) {
      const float v = acc[i] + shared.data<float>()[i];
      EXPECT_EQ(out.data<float>()[i], round ? round_bf16(v) : v) << i;
    }
  }
  ids.data<int32_t>()[4] = 4;
  EXPECT_THROW(ops::moe_group(ids, w, E), Error);
  Tensor dst = Tensor::zeros({4, dim}, DType::kF32);
  ops::copy_into(dst.slice(0, 1, 3), y.slice(0, 5, 7));
  EXPECT_EQ(dst.data<float>()[dim], y.data<float>()[5 * dim]);
  EXPECT_EQ(dst.data<float>()[0], 0.0f);
}

// ---- sparse-attention index lists: candidate_blocks, mask_to_blocks, sparse_index ------------------
namespace {

// Scores with ties (a small value set), -inf holes, -0 / +0, an all -inf row (2) and the causal
// visibility (-inf past it) on the even rows; the odd rows score every entry.
Tensor index_list_scores(int64_t T, int64_t n, int64_t start_pos, int64_t ratio, uint32_t seed) {
  std::mt19937 g(seed);
  Tensor s = Tensor::empty({T, n}, DType::kF32);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t visible = t % 2 ? n : std::min(n, (start_pos + t + 1) / ratio);
    for (int64_t j = 0; j < n; ++j) {
      float v = static_cast<float>(static_cast<int>(g() % 9) - 4) * 0.5f;
      if (v == 0.0f && (g() & 1)) v = -0.0f;
      if (g() % 7 == 0) v = -INFINITY;
      s.data<float>()[t * n + j] = (j < visible && t != 2) ? v : -INFINITY;  // row 2: nothing finite
    }
  }
  return s;
}

// The candidate blocks by their definition: block maxima, the newest visible block at +inf, the
// best min(keep, nb) finite-or-+inf maxima by (max desc, block asc), listed ascending, -1 padded.
std::vector<int32_t> candidate_ref(const float* score, int64_t n, int64_t visible, int64_t bs, int64_t keep) {
  const int64_t nb = (n + bs - 1) / bs;
  std::vector<float> mx(nb, -INFINITY);
  for (int64_t j = 0; j < n; ++j)
    if (score[j] > mx[j / bs]) mx[j / bs] = score[j];
  if (visible > 0) mx[(visible - 1) / bs] = INFINITY;
  std::vector<std::pair<float, int32_t>> c;
  for (int64_t b = 0; b < nb; ++b)
    if (mx[b] != -INFINITY) c.push_back({mx[b], static_cast<int32_t>(b)});
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  std::vector<int32_t> out;
  for (size_t i = 0; i < c.size() && static_cast<int64_t>(i) < std::min(keep, nb); ++i) out.push_back(c[i].second);
  std::sort(out.begin(), out.end());
  out.resize(keep, -1);
  return out;
}

}  // namespace

TEST(Ops, CandidateBlocksAndMaskMatchTheirDefinition) {
  struct Case {
    int64_t T, n, start_pos, ratio, bs, keep;
  };
  const Case cases[] = {
      {6, 40, 0, 1, 4, 3},      // prefill: visible = t + 1 (row 0 sees one entry)
      {5, 40, 0, 8, 4, 3},      // visible = 0 for rows 0..6: no pinned block
      {4, 37, 70, 2, 4, 20},    // keep > blocks (10 blocks), partial last block
      {3, 300, 600, 2, 8, 32},  // decode-like rows
      {4, 16, 0, 1, 8, 0},      // keep 0
  };
  uint32_t seed = 900;
  for (const Case& c : cases) {
    const Tensor s = index_list_scores(c.T, c.n, c.start_pos, c.ratio, seed++);
    const Tensor blocks = ops::candidate_blocks(s, c.start_pos, c.ratio, c.bs, c.keep);
    ASSERT_EQ(blocks.shape(), (Shape{c.T, c.keep}));
    for (int64_t t = 0; t < c.T; ++t) {
      const int64_t visible = std::min(c.n, (c.start_pos + t + 1) / c.ratio);
      const std::vector<int32_t> want = candidate_ref(s.data<float>() + t * c.n, c.n, visible, c.bs, c.keep);
      for (int64_t i = 0; i < c.keep; ++i)
        EXPECT_EQ(blocks.data<int32_t>()[t * c.keep + i], want[i]) << "n " << c.n << " row " << t << " col " << i;
    }
    // The mask: -inf outside the kept blocks, the score unchanged inside.
    Tensor m = s.contiguous();
    ops::mask_to_blocks(m, blocks, c.bs);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t j = 0; j < c.n; ++j) {
        const int32_t* row = blocks.data<int32_t>() + t * c.keep;
        const bool kept = std::find(row, row + c.keep, static_cast<int32_t>(j / c.bs)) != row + c.keep;
        const float want = kept ? s.data<float>()[t * c.n + j] : -INFINITY;
        EXPECT_EQ(std::memcmp(&m.data<float>()[t * c.n + j], &want, 4), 0) << t << ", " << j;
      }
  }
}

// topk_rows(.., sort_by_index) is the model's former ops::topk + std::sort per row, -1 padded, also
// for rows with fewer finite scores than k (and none at all).
TEST(Ops, TopkRowsByIndexIsTopkThenSort) {
  const int64_t T = 6, n = 50, k = 16;
  const Tensor s = index_list_scores(T, n, 3, 4, 77);
  const Tensor got = ops::topk_rows(s, k, /*sort_by_index=*/true);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> want(k, -1);
    const int64_t m = ops::topk(s.data<float>() + t * n, n, k, want.data());
    std::sort(want.begin(), want.begin() + m);
    for (int64_t i = 0; i < k; ++i) EXPECT_EQ(got.data<int32_t>()[t * k + i], want[i]) << t << ", " << i;
  }
}

// sparse_index against the host loops it replaced: V4.1's window_row (prefill left-aligned, decode
// right-aligned, the bounded-replay floor) + picks, V4's window + picks / every visible C128 entry.
TEST(Ops, SparseIndexReplaysTheHostLists) {
  struct Case {
    int64_t start_pos, T, W, floor, kcols, ratio;
    bool v41, with_picks;
  };
  const Case cases[] = {
      {0, 5, 8, 0, 4, 2, true, true},         {0, 12, 8, 0, 6, 2, true, true},  {13, 1, 8, 0, 6, 1, true, true},
      {3, 1, 8, 0, 2, 1, true, true},         {20, 6, 8, 17, 6, 1, true, true}, {9, 1, 8, 5, 0, 1, true, false},
      {0, 10, 4, 0, 3, 4, false, true},       {30, 1, 4, 0, 7, 4, false, true}, {0, 300, 128, 0, 2, 128, false, false},
      {500, 1, 128, 0, 3, 128, false, false}, {7, 3, 4, 0, 0, 0, false, false},
  };
  std::mt19937 g(5);
  for (const Case& c : cases) {
    const int64_t T = c.T, W = c.W, sp = c.start_pos;
    const int64_t wstart = std::max<int64_t>({0, sp - W + 1, c.floor}), nwin = sp + T - wstart;
    const int64_t wcols = c.v41 ? (sp == 0 ? std::min(T, W) : W) : W;
    Tensor picks;
    if (c.with_picks) {
      picks = Tensor::empty({T, c.kcols}, DType::kI32);
      for (int64_t i = 0; i < picks.numel(); ++i)
        picks.data<int32_t>()[i] = g() % 3 == 0 ? -1 : static_cast<int32_t>(g() % 50);
    }
    ops::IndexLayout lay;
    lay.start_pos = sp;
    lay.window = W;
    lay.floor = c.floor;
    lay.wstart = wstart;
    lay.wcols = wcols;
    lay.pad_front = c.v41 && sp > 0 && T == 1;
    lay.offset = nwin;
    lay.kcols = c.kcols;
    lay.ratio = c.ratio;
    const Tensor idx = ops::sparse_index(lay, T, picks, Device::kCPU);
    ASSERT_EQ(idx.shape(), (Shape{T, wcols + c.kcols}));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = sp + t, lo = std::max<int64_t>({0, p - W + 1, c.floor}), count = p - lo + 1;
      std::vector<int32_t> row;
      if (lay.pad_front) row.assign(wcols - count, -1);
      for (int64_t s = lo; s <= p; ++s) row.push_back(static_cast<int32_t>(s - wstart));
      row.resize(wcols, -1);
      for (int64_t i = 0; i < c.kcols; ++i) {
        const int64_t j = c.with_picks ? picks.data<int32_t>()[t * c.kcols + i] : (i < (p + 1) / c.ratio ? i : -1);
        row.push_back(j < 0 ? -1 : static_cast<int32_t>(nwin + j));
      }
      for (int64_t i = 0; i < wcols + c.kcols; ++i)
        EXPECT_EQ(idx.data<int32_t>()[t * (wcols + c.kcols) + i], row[i])
            << "start " << sp << " row " << t << " col " << i;
    }
    // Inside a batch's stacked table (attend_chunks): every listed row shifted by base, -1 past the
    // chunk's own columns up to width.
    ops::IndexLayout shifted = lay;
    shifted.base = 37;
    shifted.width = wcols + c.kcols + 5;
    const Tensor sidx = ops::sparse_index(shifted, T, picks, Device::kCPU);
    ASSERT_EQ(sidx.shape(), (Shape{T, shifted.width}));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < shifted.width; ++i) {
        const int32_t want = i < wcols + c.kcols ? idx.data<int32_t>()[t * (wcols + c.kcols) + i] : -1;
        EXPECT_EQ(sidx.data<int32_t>()[t * shifted.width + i], want < 0 ? -1 : want + 37)
            << "row " << t << " col " << i;
      }
    // Written in place into a row slice of a stacked list (`into`): the same lists, the rows around untouched.
    Tensor stacked = Tensor::empty({T + 2, shifted.width}, DType::kI32);
    std::fill(stacked.data<int32_t>(), stacked.data<int32_t>() + stacked.numel(), 12345);
    const Tensor rows = stacked.slice(0, 1, 1 + T);
    const Tensor back = ops::sparse_index(shifted, T, picks, Device::kCPU, rows);
    EXPECT_EQ(back.data<int32_t>(), rows.data<int32_t>());
    for (int64_t i = 0; i < T * shifted.width; ++i)
      EXPECT_EQ(stacked.data<int32_t>()[shifted.width + i], sidx.data<int32_t>()[i]) << "element " << i;
    for (int64_t i = 0; i < shifted.width; ++i) {
      EXPECT_EQ(stacked.data<int32_t>()[i], 12345);
      EXPECT_EQ(stacked.data<int32_t>()[(T + 1) * shifted.width + i], 12345);
    }
    // An output of the wrong shape is refused.
    EXPECT_THROW(ops::sparse_index(shifted, T, picks, Device::kCPU, stacked), Error);
  }
  // A window wider than its columns is refused.
  ops::IndexLayout bad;
  bad.start_pos = 10;
  bad.window = 8;
  bad.wstart = 3;
  bad.wcols = 4;
  EXPECT_THROW(ops::sparse_index(bad, 1, Tensor(), Device::kCPU), Error);
  // So is a width below the lists' own columns.
  ops::IndexLayout narrow;
  narrow.start_pos = 2;
  narrow.window = 8;
  narrow.wcols = 8;
  narrow.width = 4;
  EXPECT_THROW(ops::sparse_index(narrow, 1, Tensor(), Device::kCPU), Error);
}

// gather_segments: runs of rows one after the other, empty runs skipped; the row count must match.

// sparse_index_many: several chunks' lists in one call equal one sparse_index per chunk into the same rows; a chunk
// whose width is not the output's is refused.
TEST(Ops, SparseIndexManyEqualsOneCallPerChunk) {
  std::vector<ops::IndexChunk> chunks;
  const int64_t width = 12;
  int64_t rows = 0, base = 0;
  for (int64_t i = 0; i < 5; ++i) {
    ops::IndexLayout l;
    l.start_pos = 3 + 5 * i;
    l.window = 4;
    l.wstart = std::max<int64_t>(0, l.start_pos - 3);
    l.wcols = 4;
    l.pad_front = true;
    l.offset = l.start_pos + 1 - l.wstart;
    l.kcols = i % 2 == 0 ? 3 : 0;
    l.ratio = 2;
    l.base = base;
    l.width = width;
    Tensor picks;
    if (l.kcols > 0) {
      picks = Tensor::empty({1, l.kcols}, DType::kI32);
      for (int64_t k = 0; k < l.kcols; ++k) picks.data<int32_t>()[k] = k == 1 ? -1 : static_cast<int32_t>(k + i);
    }
    chunks.push_back({l, 1, picks});
    rows += 1;
    base += 10;
  }
  Tensor want = Tensor::empty({rows, width}, DType::kI32), got = Tensor::empty({rows, width}, DType::kI32);
  for (int64_t i = 0; i < rows; ++i)
    ops::sparse_index(chunks[i].layout, 1, chunks[i].picks, Device::kCPU, want.slice(0, i, i + 1));
  ops::sparse_index_many(chunks, Device::kCPU, got);
  EXPECT_EQ(std::memcmp(want.data<int32_t>(), got.data<int32_t>(), want.nbytes()), 0);
  chunks[2].layout.width = width + 1;
  EXPECT_THROW(ops::sparse_index_many(chunks, Device::kCPU, got), Error);
}
TEST(Ops, GatherSegmentsConcatenatesTheRuns) {
  const int64_t width = 4;
  std::vector<float> a(3 * width), b(2 * width);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(100 + i);
  Tensor dst = Tensor::zeros({5, width}, DType::kF32);
  ops::gather_segments({{b.data(), 2}, {a.data(), 0}, {a.data(), 3}}, dst);
  for (int64_t i = 0; i < 2 * width; ++i) EXPECT_EQ(dst.data<float>()[i], b[i]);
  for (int64_t i = 0; i < 3 * width; ++i) EXPECT_EQ(dst.data<float>()[2 * width + i], a[i]);
  Tensor wrong = Tensor::zeros({6, width}, DType::kF32);
  EXPECT_THROW(ops::gather_segments({{a.data(), 3}}, wrong), Error);
}

// On the CPU the decode step's pieces run as they are: SegmentGraphs never captures, and the device-positions binding
// and the table reservation do nothing (the CUDA side is tested by make test-cuda: graphs against eager, bit for bit).
TEST(Ops, SegmentGraphsRunThePiecesOnTheCpu) {
  ops::SegmentGraphs graphs(Device::kCPU);
  EXPECT_FALSE(ops::graphs_enabled(Device::kCPU, 1));
  for (int step = 0; step < 3; ++step) {
    EXPECT_FALSE(graphs.begin_step(4));
    Tensor x = Tensor::full({2, 3}, 1.5f);
    int calls = 0;
    const std::vector<Tensor> out = graphs.run(0, {x, Tensor()}, [&](const std::vector<Tensor>& in) {
      ++calls;
      EXPECT_FALSE(in[1].defined());
      Tensor y = in[0].clone();
      ops::scale(y, 2.0f, false);
      return std::vector<Tensor>{y, in[0]};
    });
    graphs.end_step();
    EXPECT_EQ(calls, 1);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].data<float>()[5], 3.0f);
    EXPECT_EQ(out[1].raw(), x.raw());
  }
  const ops::SegmentGraphs::Stats st = graphs.stats();
  EXPECT_EQ(st.captures + st.replays + st.eager + st.failures, 0);

  const std::vector<int64_t> pos = {7, 3};
  const ops::DevicePositions none(pos.data(), 2, Tensor());  // no device tensor on the CPU: nothing bound
  const ops::RopeFreqs f = ops::rope_freqs(4, 10000.0, 1.0, 0, 32.0, 1.0);
  Tensor a = Tensor::full({2, 4}, 0.5f), b = a.clone();
  ops::rope_reserve(f, 1 << 20, Device::kCPU);
  ops::apply_rope(a, 4, 4, pos.data(), f, false, false);
  ops::apply_rope(b, 4, 4, std::vector<int64_t>{7, 3}.data(), f, false, false);
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}
