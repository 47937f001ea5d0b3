// CUDA graphs of a decode step's dense pieces (the ops::SegmentGraphs of src/ops/ops.h on CUDA).
//
// A decode step of one batch size runs the same kernels with the same shapes every time, except the attention's
// middle, whose shapes follow each sequence's length. The forward hands the pieces between two attentions
// (`segments`: a layer's input mixing and projections, its output projection, mixing and MoE) to `run`, keyed; the
// first step of a batch size runs them as they are (warm-up: one-time uploads and tables), the second captures each
// into a graph and launches it, later steps launch the graphs. Plain C++ header (no CUDA types).
//
// Memory: everything a segment allocates while captured comes from one GraphPool of the set (device.h). A block
// freed inside a capture is reused by later captures: graphs run one after the other on one stream, so that is safe
// as long as every step of a batch size runs its segments in the order they were captured (checked: a step that
// strays drops that batch size's graphs and finishes eagerly). A segment's outputs are handed out at every replay as
// views that do not own the pool's memory; they are valid until the same segment runs again, and what the caller
// keeps between steps must be copies (the model's state is).
//
// Middles inside the graphs (DEEPINFER_CUDA_GRAPH_MIDDLES: 2 by default, 1, or 0 for eager middles). Between the
// pieces run the attention's middles, whose launches' parameters follow each sequence's length. An eager middle and
// the graph launch after it cost ~5 us of idle GPU per layer (H100 ktraces), and the next piece's first kernel could
// not start under the middle's last one (PDL). So a replay defers its launches (every launch_pdl, launch_record.h, and
// each piece's graph) in spans: where a span ends, if its launches are those of a span graph built before (the same
// kernels and pieces in the same order) the kernels' nodes take this step's parameters (grids, arguments) and that one
// graph is launched; otherwise they go out one by one, as without spans, and a span graph of them is built for the
// next steps of that variant (a few per span: e.g. the steps where a compressor emits): the kernels as kernel nodes,
// the pieces' nodes copied in, the stream order as edges (programmatic where the launches were PDL).
// The spans grow fourfold because the host builds a span while the GPU runs the ones before it (the engine waits for
// a step's tokens before it builds the next, so at a step's start the GPU waits for the host: piece 0 goes out
// alone). Form 1 ends them after pieces 0, 1, 5, 21, ...; form 2 after piece 0 and before pieces 2, 6, 22, ..., so
// that every span but the second opens with a piece: a graph's second node starts ~4 us late when its first is short,
// as a middle's first kernels are, and a piece opens with wo_a (bench/RESULTS.md, forty-ninth session: both forms
// +0.5% at batch 1 on the H100, form 2 the shorter queued step).
// GPU work that is not a launch_pdl (a copy, a memset, an event, a synchronisation, a free) calls flush_deferred()
// first, which sends out what is deferred in order; the rest of that span runs as without spans.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "cuda/device.h"
#include "deepinfer/tensor.h"

struct CUgraphExec_st;
struct CUgraph_st;

namespace deepinfer::cuda {

using SegmentFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct GraphStats {
  int64_t captures = 0, replays = 0, eager = 0, failures = 0;
  int64_t spans_merged = 0, spans_split = 0;  // deferred spans launched as one graph / one by one
};

// Sets the middles inside the graphs (0 off, 1 or 2 a span form, as DEEPINFER_CUDA_GRAPH_MIDDLES) for the steps that
// begin after it, or back to DEEPINFER_CUDA_GRAPH_MIDDLES (-1); returns the setting before (tests).
int set_graph_middles(int on);

class SpanRecorder;  // graph.cu: a middle's deferred launches
struct SpanItem;     // graph.cu: one of them, or the piece
struct SpanGraph;    // graph.cu: a middle and its piece as one graph

class SegmentGraphs {
 public:
  SegmentGraphs();
  ~SegmentGraphs();
  SegmentGraphs(const SegmentGraphs&) = delete;
  SegmentGraphs& operator=(const SegmentGraphs&) = delete;

  // Starts a step of batch size `bucket`: its first step runs eagerly (false), the next captures, later ones replay
  // (true). A batch size whose capture failed twice stays eager.
  bool begin_step(int64_t bucket);
  // fn(inputs) eagerly, captured or replayed (see above). Inputs: tensors on CUDA (or undefined); those that are not
  // the pool's own are copied into static buffers of the segment first.
  std::vector<Tensor> run(int64_t key, const std::vector<Tensor>& inputs, const SegmentFn& fn);
  // During a replay, the static buffer that the next segment (if its key is `key`) copies its input i into, else
  // undefined. A caller that computes that input into this buffer saves the copy: run() finds it in place.
  Tensor input_buffer(int64_t key, size_t i) const;
  // Ends the step begun by begin_step (a capture step makes its batch size's graphs ready; a replay launches the step).
  void end_step();
  // Closes a step that end_step did not (an exception): what it deferred goes out in order. A no-op otherwise.
  void abort_step();
  const GraphStats& stats() const { return stats_; }

 private:
  struct Segment {
    int64_t key = 0;
    ::CUgraphExec_st* exec = nullptr;
    ::CUgraph_st* graph = nullptr;                  // kept to build span graphs from
    std::vector<std::shared_ptr<SpanGraph>> spans;  // the spans whose first piece it is, one per launches' variant
    int span_failures = 0;                          // span graphs that could not be built or updated
    std::vector<const void*> in_ptr;                // each input's address in the graph (null: undefined)
    std::vector<Shape> in_shape;
    std::vector<DType> in_dtype;
    std::vector<Tensor> statics;  // the segment's copies of inputs from outside the pool (undefined: direct)
    std::vector<Tensor> outs;     // views of the outputs, not owning the pool's memory
  };
  struct Bucket {
    int64_t size = 0;
    bool seen = false, ready = false, failed = false;
    int failures = 0;
    uint64_t epoch = 0;
    std::vector<Segment> segs;  // in capture order
  };
  enum class Mode { kEager, kCapture, kReplay };

  std::vector<Tensor> capture(const std::vector<Tensor>& inputs, const SegmentFn& fn, Segment& seg);
  void drop(Bucket& b);
  // The replay's recorder: installed by begin_step, uninstalled (what it deferred launched) by end_step.
  void start_recording();
  void stop_recording();
  // A replayed segment's launch: deferred with the middle before it; where a span ends, its launches go out as one
  // graph when one matches (close_span).
  void launch_span(size_t seg);
  void close_span();
  std::shared_ptr<SpanGraph> build_span(std::vector<SpanItem>& items);
  friend class SpanRecorder;

  std::shared_ptr<GraphPool> pool_;
  ::CUstream_st* stream_ = nullptr;  // the capture stream (non-blocking: the legacy stream cannot be captured)
  std::map<int64_t, Bucket> buckets_;
  Bucket* cur_ = nullptr;
  Mode mode_ = Mode::kEager;
  size_t next_ = 0;  // the replay's position in cur_->segs
  GraphStats stats_;
  std::unique_ptr<SpanRecorder> rec_;
  int span_mode_ = 0;  // the step's DEEPINFER_CUDA_GRAPH_MIDDLES
};

}  // namespace deepinfer::cuda
