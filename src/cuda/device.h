// The CUDA backend's device layer: initialisation, the kCUDA allocator (a caching pool), host<->device copies and
// error checking.
//
// This header is plain C++ (no CUDA headers), so host code compiled by the C++ compiler can
// include it. Kernels and their launchers live in the other files of src/cuda.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "deepinfer/tensor.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace deepinfer::cuda {

// Registers the kCUDA allocator with core (Tensor::empty(..., Device::kCUDA) then works).
// Idempotent and thread-safe. Throws deepinfer::Error when no CUDA device is usable.
void init();

// Number of visible CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();

// Blocks until all work queued on the current device has finished; throws on a pending error.
void synchronize();

// Launches what a decode step's recorder has deferred (launch_record.h, SegmentGraphs in graph.cu), if any: called
// first by every GPU operation that is not a launch_pdl (copies, memsets, events, synchronisation, frees), so that
// the device sees the work in the host's order. A no-op when nothing is deferred.
void flush_deferred();

// The stream the backend's work goes to: the legacy default stream (nullptr), unless a StreamScope on this thread
// named another. Every launch (launch_pdl with a null stream), upload, memset, side-stream fork / join and the
// sampler's round trip resolve it here, so that a decode step's pieces can be issued into a capturable stream (CUDA
// graphs, graph.cu: the legacy stream cannot be captured) and side work into the side stream (SideScope) without
// touching the ops. Copies to the host still run on the legacy stream (a StreamScope user synchronises its stream
// first; inside a capture or side work they are refused).
::CUstream_st* current_stream();
class StreamScope {
 public:
  explicit StreamScope(::CUstream_st* s);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  ::CUstream_st* prev_;
};

// A contiguous copy of `t` on the current CUDA device (a CPU tensor is made contiguous first).
Tensor copy_to_device(const Tensor& t);
// A contiguous CPU copy of `t` (synchronous). A CPU tensor is cloned.
Tensor copy_to_host(const Tensor& t);

// DEEPINFER_OP_PROFILE=gpu: an event recorded on the stream every kernel runs on (no synchronisation),
// from a pool that grows on demand; op_event_ms(a, b) waits for b and returns the GPU time between them.
// op_events_reset() returns every event to the pool (after their times were read).
int op_event_record();
double op_event_ms(int a, int b);
void op_events_reset();

// The side stream: a second (non-blocking) stream for small work that need not delay the default
// stream's (the hyper-connections' mixes and Sinkhorn, needed only at the sublayer's end). side_fork() makes the
// side stream wait for everything queued so far on the default stream and returns it; after queuing the
// side work, side_pending(buffer, bytes, keep) records its end, names the bytes it writes and holds the tensors it
// reads (and its scratch) until the join, so that their memory is not handed to default-stream work meanwhile.
// side_join() makes the default stream wait for that end (no host wait; a no-op when nothing is pending); it runs
// before any copy to the host, before a device copy or a free that touches the pending bytes, and where the
// consumer starts; side_join_if_reads(p, n) joins when [p, p + n) overlaps the pending bytes (an op's input).
// Several pieces may be pending: they run in order on the one side stream, and a join waits for all of them.
::CUstream_st* side_fork();
void side_pending(const void* buffer, size_t bytes, std::vector<Tensor> keep = {});
void side_join();
void side_join_if_reads(const void* p, size_t n);

// Side work in a scope: while a SideScope lives on this thread, everything it queues (launches, uploads, memsets) goes
// to the side stream, after all the work queued before it (side_fork); done(writes) ends the scope: `reads` (given at
// construction) are held and `writes` are pending until the join (side_join, or an op that reads them). Blocks
// allocated inside the scope go back to their free list only after the join, however early their tensors are freed
// (side kernels may still use them). No nesting. The destructor ends an open scope with no writes.
class SideScope {
 public:
  explicit SideScope(std::vector<Tensor> reads = {});
  ~SideScope();
  void done(const std::vector<Tensor>& writes);
  SideScope(const SideScope&) = delete;
  SideScope& operator=(const SideScope&) = delete;

 private:
  std::vector<Tensor> reads_;
  std::optional<StreamScope> on_side_;  // engaged while the scope is open
};

// Drops the pending side work without waiting for it (a capture that failed: its events belong to the abandoned
// graph).
void side_reset();

// ---- support for CUDA graphs (graph.cu) ----
// GraphPool: the memory of captured graphs, a caching pool of its own. While a PoolScope names it on this thread,
// every kCUDA allocation comes from it and a freed block goes back to it, never to the shared cache: a graph writes
// the same addresses at every replay, so no work outside the graphs may be handed them. Its blocks return to the
// shared cache when the pool and every tensor in it are gone.
class GraphPool;
std::shared_ptr<GraphPool> make_graph_pool();
bool graph_pool_owns(const GraphPool& pool, const void* p);  // p inside one of the pool's blocks
class PoolScope {
 public:
  explicit PoolScope(GraphPool* pool);
  ~PoolScope();
  PoolScope(const PoolScope&) = delete;
  PoolScope& operator=(const PoolScope&) = delete;

 private:
  GraphPool* prev_;
};
// While a CaptureFlag lives, this thread is capturing a graph: a copy to or from the host then fails with a clear
// error, since the graph would replay the value of that moment, and so does anything that waits for the device.
class CaptureFlag {
 public:
  CaptureFlag();
  ~CaptureFlag();
  CaptureFlag(const CaptureFlag&) = delete;
  CaptureFlag& operator=(const CaptureFlag&) = delete;

 private:
  bool prev_;
};
// Bumped whenever a device buffer that captured kernels may name is replaced (a RoPE table grown, an expert pointer
// table rebuilt, the mixes' counters grown): graphs captured before a bump are dropped and captured again.
uint64_t graph_epoch();
void bump_graph_epoch();

namespace detail {
[[noreturn]] void throw_cuda_error(int code, const char* expr, const char* file, int line);
}  // namespace detail

}  // namespace deepinfer::cuda

// DI_CUDA_CHECK(cudaMalloc(...)): throws deepinfer::Error("file:line: expr failed: <cuda error
// name>: <cudaGetErrorString>") unless the call returned cudaSuccess (0). Kernel launches are
// checked with DI_CUDA_CHECK(cudaGetLastError()).
#define DI_CUDA_CHECK(expr)                                                                                            \
  do {                                                                                                                 \
    const int di_cuda_status_ = static_cast<int>(expr);                                                                \
    if (di_cuda_status_ != 0) ::deepinfer::cuda::detail::throw_cuda_error(di_cuda_status_, #expr, __FILE__, __LINE__); \
  } while (0)
