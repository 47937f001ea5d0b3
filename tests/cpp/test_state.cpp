// The per-sequence state stores (src/model/state.h): RowPages' two ways of appending rows give the same store, and a
// bad append is a clear error.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "deepinfer/error.h"
#include "model/state.h"

using namespace deepinfer;

namespace {

// Rows [n, width] whose values name their row and column.
Tensor rows_of(int64_t n, int64_t width, float tag) {
  Tensor t = Tensor::empty({n, width}, DType::kF32);
  for (int64_t i = 0; i < n * width; ++i) t.data<float>()[i] = tag + static_cast<float>(i);
  return t;
}

std::vector<float> contents(const RowPages& p) {
  Tensor out = Tensor::empty({p.rows(), p.width()}, DType::kF32);
  p.copy_to(out);
  return std::vector<float>(out.data<float>(), out.data<float>() + out.numel());
}

}  // namespace

// Appends that start mid-page and cross page ends, with and without a pool: the copies append_copies hands out (run
// afterwards, as the model runs them in one launch) leave the store append_rows leaves, a run per page.
TEST(RowPages, AppendCopiesGiveTheStoreAppendRowsGives) {
  constexpr int64_t kWidth = 3, kPage = RowPages::kRowsPerPage;
  for (bool pooled : {false, true}) {
    auto pool = pooled ? std::make_shared<PagePool>(kPage * kWidth, 16) : nullptr;
    RowPages direct(kWidth, pool), copied(kWidth, pool);
    std::vector<ops::RowCopy> copies;
    std::vector<Tensor> keep;  // the sources live until the copies run
    int64_t runs = 0;
    for (int64_t n : {int64_t{5}, kPage - 5 + 2, int64_t{0}, 2 * kPage + 1, int64_t{1}}) {
      keep.push_back(rows_of(n, kWidth, static_cast<float>(1000 * keep.size())));
      direct.append_rows(keep.back());
      const size_t before = copies.size();
      copied.append_copies(keep.back(), copies);
      EXPECT_EQ(copied.rows(), direct.rows());
      runs += static_cast<int64_t>(copies.size() - before);
    }
    ops::copy_rows(copies, kWidth, Device::kCPU);
    EXPECT_EQ(contents(copied), contents(direct)) << "pooled " << pooled;
    EXPECT_EQ(copied.num_pages(), direct.num_pages());
    // 5 rows (one run); 61 rows (59 to the first page's end, 2 on the next); none; 129 rows from row 2 of a page (62,
    // 64, 3); one row: 7 runs.
    EXPECT_EQ(runs, 7);
  }
}

// paged_segment: one entry naming the store's pages (no device copy on the CPU) that reads as the store; nothing for an
// empty store.
TEST(RowPages, PagedSegmentNamesTheStoresPages) {
  constexpr int64_t kWidth = 3, kPage = RowPages::kRowsPerPage;
  RowPages p(kWidth);
  std::vector<ops::RowSegment> segs;
  p.paged_segment(segs);
  EXPECT_TRUE(segs.empty());
  p.append_rows(rows_of(2 * kPage + 5, kWidth, 7.0f));
  p.paged_segment(segs);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_TRUE(segs[0].paged());
  EXPECT_EQ(segs[0].rows, 2 * kPage + 5);
  EXPECT_EQ(segs[0].page_rows, kPage);
  EXPECT_EQ(segs[0].device_pages, nullptr);
  for (int64_t pg = 0; pg < p.num_pages(); ++pg) EXPECT_EQ(segs[0].pages[pg], p.row(pg * kPage));
  Tensor out = Tensor::empty({p.rows(), kWidth}, DType::kF32);
  ops::gather_segments(segs, out);
  EXPECT_EQ(std::vector<float>(out.data<float>(), out.data<float>() + out.numel()), contents(p));
}

TEST(RowPages, AppendCopiesRejectsRowsOfAnotherWidth) {
  RowPages p(4);
  std::vector<ops::RowCopy> copies;
  EXPECT_THROW(p.append_copies(rows_of(2, 3, 0.0f), copies), Error);
  EXPECT_EQ(p.rows(), 0);
  EXPECT_TRUE(copies.empty());
}
