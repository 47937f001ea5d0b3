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
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "cuda/device.h"
#include "deepinfer/tensor.h"

struct CUgraphExec_st;

namespace deepinfer::cuda {

using SegmentFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct GraphStats {
  int64_t captures = 0, replays = 0, eager = 0, failures = 0;
};

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
  // Ends the step begun by begin_step (a capture step makes its batch size's graphs ready).
  void end_step();
  const GraphStats& stats() const { return stats_; }

 private:
  struct Segment {
    int64_t key = 0;
    ::CUgraphExec_st* exec = nullptr;
    std::vector<const void*> in_ptr;  // each input's address in the graph (null: undefined)
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

  std::shared_ptr<GraphPool> pool_;
  ::CUstream_st* stream_ = nullptr;  // the capture stream (non-blocking: the legacy stream cannot be captured)
  std::map<int64_t, Bucket> buckets_;
  Bucket* cur_ = nullptr;
  Mode mode_ = Mode::kEager;
  size_t next_ = 0;  // the replay's position in cur_->segs
  GraphStats stats_;
};

}  // namespace deepinfer::cuda
