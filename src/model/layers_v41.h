// The V4.1 sublayers, one function per block of docs/v4-architecture.md §2.6 and §2.9. The linear
// contracts, the attention output and the MoE are shared with V4 (layers_v4.h).
#pragma once

#include <vector>

#include "model/layers_v4.h"

namespace deepinfer {

// What the source layers of one forward hand down to the later layers of the same sequence (the
// reference's SharedAttentionRuntime, kept per sequence): the latest index source's picks and the
// candidate source's kept blocks, both on the model's device (no host copy between layers). Rebuilt
// every forward; nothing here outlives it.
struct SharedAttnV41 {
  Tensor picks;  // int32 [T, k]: compressed-entry ids ascending, then -1 (undefined: no list yet / none)
  int64_t k = 0;
  Tensor candidate_blocks;      // int32 [T, candidate_topk_blocks]: kept block ids ascending, then -1
  int64_t candidate_width = 0;  // the index keys the blocks cover
};

// CSA2 attention of one layer, in the three steps of layers_v4.h: attention_rows_v41 projects every
// stacked row (x [T, dim] collapsed and normalised, positions[T]); compress_batch_v41 has a kv source
// compress and publish every sequence's compressed KV and index keys; attention_seq_v41 runs one
// sequence's chunk at positions start_pos..start_pos+T-1 of `seq` (rows: its AttnRows): window KV of
// this layer; index sources score and publish top-k lists (the candidate source also its candidate
// blocks); every compressed layer attends to the latest list; returns the chunk for attend_chunks
// (layers_v4.h), whose o [T, H*D] goes to attention_output. window_floor: the first position whose
// window KV this layer holds (bounded replay; else 0).
AttnRows attention_rows_v41(const AttentionWeightsV41& w, const Tensor& x, const int64_t* positions,
                            const ops::RopeFreqs& rope, const LayerCtx& c);
// The kv source's part of attention_seq_v41 for every sequence of the forward at once, before their attention_seq_v41
// calls (rows: the forward's stacked AttnRows; sequence b's are offset[b]..offset[b + 1], at positions start[b].., its
// state at this layer *states[b]): the groups each chunk completes are pooled (ratio 2; ratio 1: every token its own
// entry), normed, turned into index keys when the layer owns them, rotated, quantised and appended to each sequence's
// compressed entries and index keys. Every op works row by row, so each sequence gets the bits it gets alone; on CUDA
// the launches are per layer, not per sequence (a decode step of 256 sequences spent ~11 ms in per-sequence ones).
void compress_batch_v41(const AttentionWeightsV41& w, const AttnRows& rows, const std::vector<int64_t>& offset,
                        const std::vector<int64_t>& start, const std::vector<LayerState*>& states,
                        const ops::RopeFreqs& rope, const LayerCtx& c);
// jobs: when given, an index source's indexer is not run here but recorded (the chunk's picks and kcols are then set
// by index_batch_v41, with the layer's other sequences).
struct IndexJobV41;
AttnChunk attention_seq_v41(const AttentionWeightsV41& w, const AttnRows& rows, int64_t start_pos, int64_t window_floor,
                            SequenceState& seq, SharedAttnV41& shared, const LayerCtx& c,
                            std::vector<IndexJobV41>* jobs = nullptr);

// One sequence's deferred indexer (IndexJob: its rows, keys and chunk) and the sequence's shared lists.
struct IndexJobV41 : IndexJob {
  SharedAttnV41* shared = nullptr;
};
// The deferred indexers of one layer at once (iq [rows, nh*hd], iw [rows, nh]: the batch's stacked rows, the jobs'
// rows in ascending order): every sequence's keys gathered into one table, one ops::index_scores over the rows with
// their own keys (KeyVisibility offsets), the candidate blocks or their mask per sequence, one ops::topk_rows; then
// each job's SharedAttnV41 and chunk. Each row's picks are the ones indexer_v41 gives the sequence alone, followed by
// -1 up to k = min(index_topk, the most keys of any job) (the attention's lists gain only empty slots). One job: the
// sequence's own indexer_v41, unchanged.
void index_batch_v41(const std::vector<IndexJobV41>& jobs, std::vector<AttnChunk>& chunks, const Tensor& iq,
                     const Tensor& iw, const LayerCtx& c);

// Engram (§2.9): stream [T, hc, dim] plus the gated n-gram lookup; rows [T, n_cols] are the table
// rows of every token. Returns the new stream.
Tensor engram_forward(const EngramWeights& w, const Tensor& stream, const std::vector<int64_t>& rows, int64_t n_cols,
                      const LayerCtx& c);

}  // namespace deepinfer
