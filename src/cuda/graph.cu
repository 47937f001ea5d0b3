// CUDA graphs of a decode step's dense pieces. See graph.h.
#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "core/logging.h"
#include "cuda/graph.h"
#include "cuda/model_ops.cuh"
#include "deepinfer/error.h"

namespace deepinfer::cuda {

SegmentGraphs::SegmentGraphs() : pool_(make_graph_pool()) {}

SegmentGraphs::~SegmentGraphs() {
  try {
    for (auto& [size, b] : buckets_) drop(b);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  } catch (...) {  // a destructor does not throw; the device is lost anyway
  }
}

void SegmentGraphs::drop(Bucket& b) {
  if (b.segs.empty()) return;
  DI_CUDA_CHECK(cudaDeviceSynchronize());  // a replay may still run; its static inputs go back to the pool
  for (Segment& s : b.segs)
    if (s.exec != nullptr) (void)cudaGraphExecDestroy(s.exec);
  b.segs.clear();
  b.ready = false;
}

bool SegmentGraphs::begin_step(int64_t bucket) {
  mode_ = Mode::kEager;
  next_ = 0;
  Bucket& b = buckets_[bucket];
  b.size = bucket;
  cur_ = &b;
  if (!b.seen || b.failed) {  // the warm-up step (first uploads, tables), or a batch size that cannot be captured
    b.seen = true;
    return false;
  }
  if (b.ready && b.epoch == graph_epoch()) {
    mode_ = Mode::kReplay;
    return true;
  }
  drop(b);  // stale (a buffer the graphs name was replaced) or an unfinished capture step
  b.epoch = graph_epoch();
  mode_ = Mode::kCapture;
  return true;
}

void SegmentGraphs::end_step() {
  if (mode_ == Mode::kCapture && cur_ != nullptr) cur_->ready = cur_->epoch == graph_epoch();
  if (mode_ == Mode::kReplay && cur_ != nullptr && next_ != cur_->segs.size()) drop(*cur_);  // the step ran fewer
  mode_ = Mode::kEager;
  cur_ = nullptr;
}

Tensor SegmentGraphs::input_buffer(int64_t key, size_t i) const {
  if (mode_ != Mode::kReplay || cur_ == nullptr || next_ >= cur_->segs.size()) return Tensor();
  const Segment& s = cur_->segs[next_];
  return s.key == key && i < s.statics.size() ? s.statics[i] : Tensor();
}

std::vector<Tensor> SegmentGraphs::capture(const std::vector<Tensor>& inputs, const SegmentFn& fn, Segment& seg) {
  // The graph's inputs: the pool's own tensors (an earlier segment's outputs) as they are, others copied into static
  // buffers, which a replay refills.
  std::vector<Tensor> ins(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    seg.in_ptr.push_back(nullptr);
    seg.in_shape.push_back(t.defined() ? t.shape() : Shape{});
    seg.in_dtype.push_back(t.defined() ? t.dtype() : DType::kF32);
    seg.statics.emplace_back();
    if (!t.defined()) continue;
    DI_CHECK(t.device() == Device::kCUDA, "graph segment: input {} is not on the GPU", t.describe());
    if (graph_pool_owns(*pool_, t.raw())) {
      ins[i] = t;
    } else {
      {
        PoolScope scope(pool_.get());
        seg.statics[i] = Tensor::empty(t.shape(), t.dtype(), Device::kCUDA);
      }
      copy_tensor(seg.statics[i], t);
      ins[i] = seg.statics[i];
    }
    seg.in_ptr[i] = ins[i].raw();
  }
  side_join();  // the capture may not wait for work queued outside it

  if (stream_ == nullptr) DI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DI_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  std::vector<Tensor> outs;
  cudaGraph_t graph = nullptr;
  try {
    StreamScope on(stream_);
    PoolScope pool(pool_.get());
    CaptureFlag flag;
    outs = fn(ins);
    side_join();  // every fork joins inside the graph
    for (const Tensor& o : outs)
      DI_CHECK(!o.defined() || graph_pool_owns(*pool_, o.raw()),
               "graph segment: output {} is not the segment's own memory (a weight or a tensor from outside)",
               o.describe());
  } catch (...) {
    (void)cudaStreamEndCapture(stream_, &graph);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    side_reset();
    throw;
  }
  DI_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  DI_CUDA_CHECK(inst);
  seg.exec = exec;
  DI_CUDA_CHECK(cudaGraphLaunch(exec, current_stream()));
  for (const Tensor& o : outs) seg.outs.push_back(o.defined() ? o.with_owner(pool_) : Tensor());
  return outs;
}

std::vector<Tensor> SegmentGraphs::run(int64_t key, const std::vector<Tensor>& inputs, const SegmentFn& fn) {
  if (mode_ == Mode::kReplay) {
    Bucket& b = *cur_;
    bool match = next_ < b.segs.size() && b.segs[next_].key == key && b.segs[next_].in_ptr.size() == inputs.size();
    if (match) {
      Segment& s = b.segs[next_];
      for (size_t i = 0; i < inputs.size() && match; ++i) {
        const Tensor& t = inputs[i];
        if (!t.defined() || s.in_ptr[i] == nullptr) {
          match = !t.defined() && s.in_ptr[i] == nullptr;
          continue;
        }
        match = t.device() == Device::kCUDA && t.shape() == s.in_shape[i] && t.dtype() == s.in_dtype[i] &&
                (t.raw() == s.in_ptr[i] || s.statics[i].defined());
      }
      if (match) {
        // The inputs from outside the pool into the static buffers: one launch for the contiguous ones.
        std::vector<ByteCopy> copies;
        for (size_t i = 0; i < inputs.size(); ++i) {
          if (!inputs[i].defined() || inputs[i].raw() == s.in_ptr[i]) continue;
          if (inputs[i].is_contiguous())
            copies.push_back({s.statics[i].raw(), inputs[i].raw(), static_cast<int64_t>(inputs[i].nbytes())});
          else
            copy_tensor(s.statics[i], inputs[i]);
        }
        copy_bytes_many(copies);
        DI_CUDA_CHECK(cudaGraphLaunch(s.exec, current_stream()));
        ++next_;
        ++stats_.replays;
        return s.outs;
      }
    }
    // The step strayed from the captured order or shapes: its batch size is captured again at its next step.
    log_warn("cuda graphs: a step of batch size {} did not match its captured segments; capturing it again", b.size);
    drop(b);
    mode_ = Mode::kEager;
  }
  if (mode_ == Mode::kCapture) {
    Bucket& b = *cur_;
    b.segs.emplace_back();
    b.segs.back().key = key;
    try {
      std::vector<Tensor> outs = capture(inputs, fn, b.segs.back());
      ++stats_.captures;
      return outs;
    } catch (const std::exception& e) {
      b.segs.pop_back();
      drop(b);
      b.failed = ++b.failures >= 2;
      ++stats_.failures;
      log_warn("cuda graphs: capturing a decode segment failed ({}); {}", e.what(),
               b.failed ? "this batch size runs eagerly from now on" : "trying again at its next step");
      mode_ = Mode::kEager;
    }
  }
  ++stats_.eager;
  return fn(inputs);
}

}  // namespace deepinfer::cuda
