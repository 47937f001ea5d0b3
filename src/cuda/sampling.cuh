// CUDA sampling: sample() of src/sampling/sampler.h for a batch of logits rows that live on the GPU, with
// exactly the CPU's results (token, logprob, rank, top_logprobs: the same bits) and the same errors.
//
// One call = one H2D copy (every row's params, penalty lists and grammar masks packed in one pinned
// buffer), one kernel with one 512-thread block per row (before it, a scan of the plain greedy rows over 32
// blocks each; after it, a small kernel only when some row asks for logprobs), one D2H copy of the results.
// Rows sampled with temperature / min_p only (no penalty, mask, top_k, top_p or logprobs), in calls of up to
// 32 rows, take the same scan, and their race runs over 64 blocks per row before that kernel (the slices'
// minima, then the near-tied keys against the row's minimum), which then only reduces them.
// Per row:
//   - penalties and min_tokens come as a compact list of distinct (token, output count, flags); the block
//     marks them in a shared-memory bitmap and writes their processed logits to a per-row overlay, so every
//     later pass reads the raw row plus (for marked tokens) the overlay instead of a processed copy;
//   - greedy: one pass, the argmax by (logit desc, id asc) as one 64-bit integer max (rows with no penalty,
//     mask or logprobs: that pass split over 32 blocks, row_scan_kernel, and the row's block reduces them);
//   - top_k, the top_p cut inside its mass bucket and the top logprobs are one radix select on the CPU's
//     64-bit (value desc, id asc) keys, weighted by 1 (top_k) or by the exact integer masses (top_p): 11-bit
//     digit histograms over the row until the candidates fit in shared memory, then an exact finish there;
//   - the race: every survivor's key -log(u_i) / w_i with the E_i >= 1 - u_i skip, a block min, then every
//     token whose key is within 2^-30 (relative) of the min is sent back; the host picks among them with
//     glibc's log, so the CUDA log's last-ulp differences can never change the token;
//   - logprobs: the raw row's FP64 sum of exp(x - max) in the CPU's exact order (8 lanes, sequential) on the
//     GPU; the log and the final roundings on the host with the CPU's expressions.
// Rows the GPU cannot settle exactly (more than 8 near-tied race keys, logprobs > 32, a temperature that
// overflows the logits to +inf, vocab > 2^20, or a near tie resolved to another token when logprobs are
// asked) are sampled by the CPU sample() on a host copy of that row: rare, and exact by construction.
//
// Not thread-safe per se, but calls from several threads are serialised (one workspace). Runs on the legacy
// default stream like every kernel of the backend and returns after the results are on the host.
#pragma once

#include <vector>

#include "deepinfer/tensor.h"
#include "sampling/sampler.h"

namespace deepinfer::cuda {

// logits: float32 [R, V] on kCUDA (last dimension dense); rows: R inputs whose `logits` is ignored (may be
// null) and whose `vocab` is V or 0. Returns what sample() returns for each row. Throws deepinfer::Error on
// the inputs sample() rejects (the first bad row, in row order, with sample()'s message for it).
std::vector<SampleResult> sample_rows(const Tensor& logits, const std::vector<SampleInput>& rows);

}  // namespace deepinfer::cuda
