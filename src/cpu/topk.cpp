// Deterministic top-k: (score desc, index asc); -inf never selected.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cpu/cpu_ops.h"

namespace deepinfer::cpu {

int64_t topk(const float* scores, int64_t n, int64_t k, int32_t* out) {
  std::vector<int32_t> cand;
  cand.reserve(n);
  for (int64_t i = 0; i < n; ++i)
    if (scores[i] != -INFINITY) cand.push_back(static_cast<int32_t>(i));
  const int64_t m = std::min<int64_t>(k, static_cast<int64_t>(cand.size()));
  auto better = [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
  std::partial_sort(cand.begin(), cand.begin() + m, cand.end(), better);
  std::copy(cand.begin(), cand.begin() + m, out);
  return m;
}

}  // namespace deepinfer::cpu
