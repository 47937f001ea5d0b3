// CUDA graphs of a decode step's dense pieces. See graph.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/logging.h"
#include "cuda/fp_decode.cuh"
#include "cuda/graph.h"
#include "cuda/launch_record.h"
#include "cuda/model_ops.cuh"
#include "deepinfer/error.h"

namespace deepinfer::cuda {

namespace {

std::atomic<int> g_middles{-1};  // set_graph_middles; -1: DEEPINFER_CUDA_GRAPH_MIDDLES

// 0: middles eager; 1: spans end after a piece; 2: spans open with a piece (graph.h).
int graph_middles() {
  static const int env_mode = env_switch("DEEPINFER_CUDA_GRAPH_MIDDLES", 2);
  const int v = g_middles.load(std::memory_order_relaxed);
  return v < 0 ? env_mode : v;
}

// Whether piece k ends a span of fourfold growth: pieces 0, 1, 5, 21, ... (k -> 4 k + 1).
bool fourfold_end(size_t k) {
  size_t end = 0;
  while (end < k) end = 4 * end + 1;
  return end == k;
}

// Span graphs per piece (variants of the middle before it), and how many failures to build or update one end the tries.
constexpr size_t kSpanVariants = 4;
constexpr int kSpanFailures = 3;

std::vector<cudaGraphNode_t> graph_nodes(cudaGraph_t g) {
  size_t n = 0;
  DI_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> v(n);
  if (n > 0) DI_CUDA_CHECK(cudaGraphGetNodes(g, v.data(), &n));
  return v;
}

struct Edges {
  std::vector<cudaGraphNode_t> from, to;
  std::vector<cudaGraphEdgeData> data;
};
Edges graph_edges(cudaGraph_t g) {
  Edges e;
  size_t n = 0;
  DI_CUDA_CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n));
  e.from.resize(n), e.to.resize(n), e.data.resize(n);
  if (n > 0) DI_CUDA_CHECK(cudaGraphGetEdges(g, e.from.data(), e.to.data(), e.data.data(), &n));
  return e;
}

// A copy of node n of another graph in g (no edges), or null for a node type this does not copy.
cudaGraphNode_t copy_node(cudaGraph_t g, cudaGraphNode_t n, bool& kernel) {
  cudaGraphNodeType type;
  DI_CUDA_CHECK(cudaGraphNodeGetType(n, &type));
  cudaGraphNode_t m = nullptr;
  kernel = type == cudaGraphNodeTypeKernel;
  if (type == cudaGraphNodeTypeKernel) {
    cudaKernelNodeParams p = {};
    DI_CUDA_CHECK(cudaGraphKernelNodeGetParams(n, &p));
    DI_CUDA_CHECK(cudaGraphAddKernelNode(&m, g, nullptr, 0, &p));
    DI_CUDA_CHECK(cudaGraphKernelNodeCopyAttributes(m, n));
  } else if (type == cudaGraphNodeTypeMemset) {
    cudaMemsetParams p = {};
    DI_CUDA_CHECK(cudaGraphMemsetNodeGetParams(n, &p));
    DI_CUDA_CHECK(cudaGraphAddMemsetNode(&m, g, nullptr, 0, &p));
  } else if (type == cudaGraphNodeTypeMemcpy) {
    cudaMemcpy3DParms p = {};
    DI_CUDA_CHECK(cudaGraphMemcpyNodeGetParams(n, &p));
    DI_CUDA_CHECK(cudaGraphAddMemcpyNode(&m, g, nullptr, 0, &p));
  } else if (type == cudaGraphNodeTypeEmpty) {
    DI_CUDA_CHECK(cudaGraphAddEmptyNode(&m, g, nullptr, 0));
  }
  return m;
}

}  // namespace

int set_graph_middles(int on) {
  DI_CHECK(on >= -1 && on <= 2, "set_graph_middles: {} is not -1, 0, 1 or 2", on);
  return g_middles.exchange(on, std::memory_order_relaxed);
}

// A deferred launch: a kernel of a middle (launched by launch_pdl) or a piece's graph (seg >= 0).
struct SpanItem {
  int seg = -1;
  LaunchRecord k;
};

// A span of a step (middles and the pieces between them) as one graph (SegmentGraphs::build_span).
struct SpanGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<int> seg;                // per item
  std::vector<const void*> func;       // per item (null for a piece)
  std::vector<bool> pdl;               // per item
  std::vector<cudaGraphNode_t> nodes;  // per kernel item: its node in `graph`
  ~SpanGraph() {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }
  // True when the deferred launches are the ones this graph was built from (the same kernels and pieces, in order).
  bool matches(const std::vector<SpanItem>& items) const {
    if (items.size() != seg.size()) return false;
    for (size_t i = 0; i < items.size(); ++i)
      if (items[i].seg != seg[i] || (seg[i] < 0 && (items[i].k.func != func[i] || items[i].k.pdl != pdl[i])))
        return false;
    return true;
  }
};

// A replay's deferred launches on its stream (SegmentGraphs::launch_span decides where a span ends). flush() sends
// them out in order and lets the rest of the span launch as usual: GPU work that is not a launch_pdl, or side-stream
// work, must see the work queued before it.
class SpanRecorder final : public LaunchRecorder {
 public:
  SpanRecorder(cudaStream_t main, const std::vector<SegmentGraphs::Segment>& segs) : main_(main), segs_(segs) {}

  bool on_launch(cudaStream_t stream, LaunchRecord&& r) override {
    if (flushed_) return false;
    if (stream != main_) {
      flush();
      return false;
    }
    items_.push_back(SpanItem{-1, std::move(r)});
    return true;
  }
  void flush() override {
    if (flushed_) return;
    flushed_ = true;
    launch(items_);
    items_.clear();
  }
  // A piece: deferred, or launched now when the span was flushed.
  void piece(int seg) {
    if (flushed_)
      DI_CUDA_CHECK(cudaGraphLaunch(segs_[static_cast<size_t>(seg)].exec, main_));
    else
      items_.push_back(SpanItem{seg, LaunchRecord{}});
  }
  // Ends the span: what it deferred (empty when it was flushed); deferring starts again.
  std::vector<SpanItem> take() {
    flushed_ = false;
    std::vector<SpanItem> out;
    out.swap(items_);
    return out;
  }
  // Sends launches out one by one, in order.
  void launch(std::vector<SpanItem>& items) {
    for (SpanItem& it : items) {
      if (it.seg >= 0)
        DI_CUDA_CHECK(cudaGraphLaunch(segs_[static_cast<size_t>(it.seg)].exec, main_));
      else
        it.k.launch(main_);
    }
  }
  cudaStream_t stream() const { return main_; }

 private:
  cudaStream_t main_;
  const std::vector<SegmentGraphs::Segment>& segs_;
  bool flushed_ = false;
  std::vector<SpanItem> items_;
};

SegmentGraphs::SegmentGraphs() : pool_(make_graph_pool()) {}

SegmentGraphs::~SegmentGraphs() {
  try {
    if (launch_recorder() == rec_.get()) set_launch_recorder(nullptr);  // a step still deferring: dropped with it
    rec_.reset();
    for (auto& [size, b] : buckets_) drop(b);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  } catch (...) {  // a destructor does not throw; the device is lost anyway
  }
}

void SegmentGraphs::drop(Bucket& b) {
  stop_recording();  // what is deferred names these graphs: it goes out first
  if (b.segs.empty()) return;
  DI_CUDA_CHECK(cudaDeviceSynchronize());  // a replay may still run; its static inputs go back to the pool
  for (Segment& s : b.segs) {
    s.spans.clear();
    if (s.exec != nullptr) (void)cudaGraphExecDestroy(s.exec);
    if (s.graph != nullptr) (void)cudaGraphDestroy(s.graph);
  }
  b.segs.clear();
  b.ready = false;
}

void SegmentGraphs::start_recording() {
  span_mode_ = graph_middles();
  if (span_mode_ == 0) return;
  rec_ = std::make_unique<SpanRecorder>(current_stream(), cur_->segs);
  set_launch_recorder(rec_.get());
}

void SegmentGraphs::stop_recording() {
  if (!rec_) return;
  if (launch_recorder() == rec_.get()) set_launch_recorder(nullptr);
  std::unique_ptr<SpanRecorder> r = std::move(rec_);
  r->flush();
}

void SegmentGraphs::launch_span(size_t seg) {
  if (!rec_) {
    DI_CUDA_CHECK(cudaGraphLaunch(cur_->segs[seg].exec, current_stream()));
    return;
  }
  // Spans grow fourfold: the host, several times faster than the GPU, builds a span while the GPU runs the ones
  // before it, about four times its work; piece 0 goes out at once (at a step's start the GPU has nothing else).
  // Form 1 ends them after pieces 0, 1, 5, 21, ...; form 2 after piece 0 and before pieces 2, 6, 22, ..., so that
  // a span but the second opens with a piece, whose first node is long. end_step ends the last span.
  if (span_mode_ == 2 && seg >= 2 && fourfold_end(seg - 1)) close_span();
  rec_->piece(static_cast<int>(seg));
  if (span_mode_ == 2 ? seg == 0 : fourfold_end(seg)) close_span();
}

void SegmentGraphs::close_span() {
  std::vector<SpanItem> items = rec_->take();
  if (items.empty()) return;
  const auto first = std::find_if(items.begin(), items.end(), [](const SpanItem& it) { return it.seg >= 0; });
  if (items.size() == 1 || first == items.end()) {  // one launch, or a middle's kernels alone: as they are
    rec_->launch(items);
    return;
  }
  Segment& owner = cur_->segs[static_cast<size_t>(first->seg)];  // a span's graphs live with its first piece
  for (size_t v = 0; v < owner.spans.size(); ++v) {
    SpanGraph& g = *owner.spans[v];
    if (!g.matches(items)) continue;
    bool ok = true;
    for (size_t i = 0, j = 0; ok && i < items.size(); ++i) {
      if (items[i].seg >= 0) continue;
      const cudaKernelNodeParams p = items[i].k.node_params();
      ok = cudaGraphExecKernelNodeSetParams(g.exec, g.nodes[j++], &p) == cudaSuccess;
    }
    if (ok) {
      DI_CUDA_CHECK(cudaGraphLaunch(g.exec, rec_->stream()));
      ++stats_.spans_merged;
      return;
    }
    (void)cudaGetLastError();
    log_warn("cuda graphs: a span graph of batch size {} could not take a step's parameters; dropped", cur_->size);
    owner.spans.erase(owner.spans.begin() + static_cast<std::ptrdiff_t>(v));
    ++owner.span_failures;
    break;
  }
  // No graph for these launches: one by one, and a graph of them for the next time.
  rec_->launch(items);
  ++stats_.spans_split;
  if (owner.spans.size() >= kSpanVariants || owner.span_failures >= kSpanFailures) return;
  try {
    std::shared_ptr<SpanGraph> g = build_span(items);
    if (g)
      owner.spans.push_back(std::move(g));
    else
      owner.span_failures = kSpanFailures;
  } catch (const std::exception& e) {
    (void)cudaGetLastError();
    ++owner.span_failures;
    log_warn("cuda graphs: building a span graph of batch size {} failed ({})", cur_->size, e.what());
  }
}

std::shared_ptr<SpanGraph> SegmentGraphs::build_span(std::vector<SpanItem>& items) {
  auto g = std::make_shared<SpanGraph>();
  DI_CUDA_CHECK(cudaGraphCreate(&g->graph, 0));
  // The programmatic edge data of the pieces' captures (what a PDL launch after a kernel becomes), else the
  // documented form of it.
  cudaGraphEdgeData prog = {};
  bool have_prog = false;
  for (const SpanItem& it : items) {
    if (it.seg < 0 || have_prog) continue;
    const Edges e = graph_edges(cur_->segs[static_cast<size_t>(it.seg)].graph);
    for (size_t i = 0; i < e.data.size() && !have_prog; ++i)
      if (e.data[i].type == cudaGraphDependencyTypeProgrammatic) prog = e.data[i], have_prog = true;
  }
  if (!have_prog) {
    prog.from_port = cudaGraphKernelNodePortProgrammatic;
    prog.type = cudaGraphDependencyTypeProgrammatic;
  }
  // Every kernel of the backend is launched by launch_pdl: a kernel node may follow a kernel under PDL.
  const bool pdl = pdl_enabled();
  std::vector<cudaGraphNode_t> frontier;  // the nodes the next item waits for (the stream's order)
  std::vector<bool> frontier_kernel;
  auto connect = [&](cudaGraphNode_t to, bool to_pdl) {
    for (size_t i = 0; i < frontier.size(); ++i) {
      const cudaGraphEdgeData d = pdl && to_pdl && frontier_kernel[i] ? prog : cudaGraphEdgeData{};
      DI_CUDA_CHECK(cudaGraphAddDependencies(g->graph, &frontier[i], &to, &d, 1));
    }
  };
  for (SpanItem& it : items) {
    g->seg.push_back(it.seg);
    g->func.push_back(it.seg >= 0 ? nullptr : it.k.func);
    g->pdl.push_back(it.seg >= 0 ? false : it.k.pdl);
    if (it.seg < 0) {  // a middle's kernel
      const cudaKernelNodeParams p = it.k.node_params();
      cudaGraphNode_t n = nullptr;
      DI_CUDA_CHECK(cudaGraphAddKernelNode(&n, g->graph, nullptr, 0, &p));
      connect(n, it.k.pdl);
      frontier = {n};
      frontier_kernel = {true};
      g->nodes.push_back(n);
      continue;
    }
    // A piece: its nodes and edges copied in; its sources wait for the frontier, its sinks become it.
    const cudaGraph_t src = cur_->segs[static_cast<size_t>(it.seg)].graph;
    const std::vector<cudaGraphNode_t> nodes = graph_nodes(src);
    const Edges e = graph_edges(src);
    std::unordered_map<cudaGraphNode_t, size_t> at;
    std::vector<cudaGraphNode_t> copy(nodes.size());
    std::vector<bool> kernel(nodes.size()), has_in(nodes.size()), has_out(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      bool k = false;
      copy[i] = copy_node(g->graph, nodes[i], k);
      if (copy[i] == nullptr) {
        log_warn("cuda graphs: a piece of batch size {} holds a node type a span graph does not copy", cur_->size);
        return nullptr;
      }
      kernel[i] = k;
      at[nodes[i]] = i;
    }
    for (size_t i = 0; i < e.data.size(); ++i) {
      const size_t f = at.at(e.from[i]), t = at.at(e.to[i]);
      has_out[f] = true, has_in[t] = true;
      DI_CUDA_CHECK(cudaGraphAddDependencies(g->graph, &copy[f], &copy[t], &e.data[i], 1));
    }
    for (size_t i = 0; i < nodes.size(); ++i)
      if (!has_in[i]) connect(copy[i], kernel[i]);
    frontier.clear();
    frontier_kernel.clear();
    for (size_t i = 0; i < nodes.size(); ++i)
      if (!has_out[i]) frontier.push_back(copy[i]), frontier_kernel.push_back(kernel[i]);
  }
  DI_CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
  return g;
}

bool SegmentGraphs::begin_step(int64_t bucket) {
  stop_recording();  // a step that ended without end_step (an error) sends out what it deferred
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
    start_recording();
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
  if (rec_ && mode_ == Mode::kReplay && cur_ != nullptr) close_span();                       // the step's last span
  stop_recording();
  mode_ = Mode::kEager;
  cur_ = nullptr;
}

void SegmentGraphs::abort_step() {
  stop_recording();
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
  if (inst != cudaSuccess) (void)cudaGraphDestroy(graph);
  DI_CUDA_CHECK(inst);
  seg.exec = exec;
  seg.graph = graph;
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
        launch_span(next_);  // with the middle deferred before it
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
