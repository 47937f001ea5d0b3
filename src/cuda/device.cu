// CUDA device layer: allocator registration, copies, error reporting. See device.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "cuda/device.h"
#include "cuda/fp_decode.cuh"
#include "deepinfer/error.h"

namespace deepinfer::cuda {

namespace detail {
void throw_cuda_error(int code, const char* expr, const char* file, int line) {
  const auto err = static_cast<cudaError_t>(code);
  fail("{}:{}: {} failed: {}: {}", file, line, expr, cudaGetErrorName(err), cudaGetErrorString(err));
}
}  // namespace detail

namespace {

// The side stream's state (side_fork / side_pending / side_join). `pending` is read by every free (the
// allocator joins before a pending buffer can be handed out again), hence the atomic fast path. Pieces of side work
// queue one after the other on the one stream, so `done` (recorded after the latest) covers them all.
struct SideStream {
  std::mutex mu;
  cudaStream_t stream = nullptr;
  cudaEvent_t forked = nullptr, done = nullptr;
  std::atomic<bool> pending{false};
  std::vector<std::pair<const char*, size_t>> buffers;  // what the pending work writes
  std::vector<Tensor> keep;                             // what it reads, held until the join
  uint64_t joins = 0;                                   // joins so far (a SideScope block's generation)
  std::vector<std::function<void()>> deferred;          // frees of side-scope blocks, run at the join
};

SideStream& side() {
  static SideStream* s = new SideStream();  // never destroyed: blocks may be freed during exit
  return *s;
}

// Whether [p, p + n) overlaps a pending side work's buffer (then a reader must join first).
bool reads_side_buffer(const void* p, size_t n) {
  SideStream& s = side();
  if (!s.pending.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(s.mu);
  const char* a = static_cast<const char*>(p);
  for (const auto& [b, bytes] : s.buffers)
    if (a < b + bytes && b < a + n) return true;
  return false;
}

thread_local int t_side_scope = 0;  // SideScope's depth on this thread

// A block allocated inside a SideScope (generation: the joins so far) may still be used by side work after its
// tensor is freed: until the next join its free is deferred (give_back runs then). False: joined already.
bool defer_side_free(uint64_t generation, std::function<void()> give_back) {
  SideStream& s = side();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.joins != generation) return false;
  s.deferred.push_back(std::move(give_back));
  return true;
}
uint64_t side_generation() {
  SideStream& s = side();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.joins;
}

// The kCUDA allocator: a caching pool over cudaMalloc. A freed block goes back to a free list keyed
// by its rounded size and is handed to the next allocation of that size; memory returns to the
// driver only when a cudaMalloc fails (then every cached block is freed and the call retried).
// cudaFree would synchronise the device, and cudaMalloc costs tens of microseconds: an op's output
// per call must not pay either. Reuse needs no events: every kernel and copy of the backend runs on the
// legacy default stream, so work on a reused block is ordered after the work of its previous owner; the
// one exception, the side stream's pending buffer, is joined before that block is cached again.
// Sizes round up to a power of two below 1 MiB (512 bytes at least) and to whole MiB above.
struct BlockCache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free;
};

BlockCache& block_cache() {
  static BlockCache* c = new BlockCache();  // never destroyed: blocks may be freed during exit
  return *c;
}

size_t rounded_size(size_t n) {
  constexpr size_t kMiB = size_t{1} << 20;
  if (n <= 512) return 512;
  if (n < kMiB) {
    size_t r = 512;
    while (r < n) r <<= 1;
    return r;
  }
  return (n + kMiB - 1) / kMiB * kMiB;
}

void* cached_malloc(size_t size) {
  BlockCache& c = block_cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free.find(size);
    if (it != c.free.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return p;
    }
  }
  void* p = nullptr;
  if (cudaMalloc(&p, size) == cudaSuccess) return p;
  (void)cudaGetLastError();
  {                    // out of memory: give the cached blocks back and retry once
    flush_deferred();  // deferred launches may still name cached blocks
    std::lock_guard<std::mutex> lock(c.mu);
    for (auto& [sz, list] : c.free)
      for (void* q : list) (void)cudaFree(q);
    c.free.clear();
  }
  DI_CUDA_CHECK(cudaMalloc(&p, size));
  return p;
}

}  // namespace

// A graph pool: blocks taken from the shared cache (or cudaMalloc) and kept, with free lists of their own.
class GraphPool : public std::enable_shared_from_this<GraphPool> {
 public:
  ~GraphPool() {  // every tensor in the pool is gone: its blocks go back to the shared cache
    BlockCache& c = block_cache();
    std::lock_guard<std::mutex> lock(c.mu);
    for (const auto& [p, size] : blocks_) c.free[size].push_back(p);
  }
  void* take(size_t size) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        return p;
      }
    }
    void* p = cached_malloc(size);
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.emplace(p, size);
    return p;
  }
  void give_back(void* p, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[size].push_back(p);
  }
  bool owns(const void* p) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.upper_bound(const_cast<void*>(p));
    if (it == blocks_.begin()) return false;
    --it;
    return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<void*, size_t> blocks_;  // every block the pool holds, by address
  std::unordered_map<size_t, std::vector<void*>> free_;
};

std::shared_ptr<GraphPool> make_graph_pool() { return std::make_shared<GraphPool>(); }
bool graph_pool_owns(const GraphPool& pool, const void* p) { return pool.owns(p); }

namespace {

thread_local GraphPool* t_pool = nullptr;  // PoolScope's
thread_local bool t_capturing = false;     // CaptureFlag's
std::atomic<uint64_t> g_graph_epoch{0};

void cache_give_back(void* q, size_t size) {
  BlockCache& c = block_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.free[size].push_back(q);
}

// A block's storage; `give_back` returns it to its free list (the shared cache or a graph pool). Side work may still
// write it (a pending buffer: join first) or, for a block allocated inside a SideScope, still use it (deferred).
std::shared_ptr<Storage> block_storage(void* p, size_t nbytes, size_t size, std::function<void(void*)> give_back) {
  auto st = std::make_shared<Storage>();
  st->data = p;
  st->nbytes = nbytes;
  st->device = Device::kCUDA;
  const bool in_side = t_side_scope > 0;
  const uint64_t generation = in_side ? side_generation() : 0;
  st->owner = std::shared_ptr<void>(p, [size, in_side, generation, give_back = std::move(give_back)](void* q) {
    if (reads_side_buffer(q, size)) {  // side work may still write it
      if (t_side_scope == 0)
        side_join();
      else if (defer_side_free(side_generation(), [q, give_back] { give_back(q); }))
        return;  // inside a scope the join waits: free it then
    }
    if (in_side && defer_side_free(generation, [q, give_back] { give_back(q); })) return;
    give_back(q);
  });
  return st;
}

std::shared_ptr<Storage> pool_alloc(GraphPool& pool, size_t nbytes) {
  const size_t size = rounded_size(nbytes);
  return block_storage(pool.take(size), nbytes, size,
                       [size, keep = pool.shared_from_this()](void* q) { keep->give_back(q, size); });
}

std::shared_ptr<Storage> cuda_alloc(size_t nbytes) {
  if (t_pool != nullptr) return pool_alloc(*t_pool, nbytes);
  const size_t size = rounded_size(nbytes);
  return block_storage(cached_malloc(size), nbytes, size, [size](void* q) { cache_give_back(q, size); });
}

void check_not_capturing(const char* what) {
  DI_CHECK(!t_capturing,
           "{} inside a CUDA graph capture: the graph would replay this moment's value (the captured "
           "work must take its inputs from device buffers)",
           what);
}

// Copies to the device go to the backend's stream (current_stream()), ordered after the work already queued
// there; a copy to the host is synchronous on the legacy stream and returns once done. A copy from the host is
// queued with the async call: the driver stages the pageable source before it returns (so the caller may free it),
// without the stream synchronisation that cudaMemcpy performs first, which would drain the GPU on every upload of a
// step (index lists, positions, token ids).
void cuda_copy(void* dst, size_t dpitch, Device dst_dev, const void* src, size_t spitch, Device src_dev,
               size_t row_bytes, size_t rows) {
  flush_deferred();
  if (src_dev == Device::kCPU || dst_dev == Device::kCPU) check_not_capturing("a copy between the host and the device");
  DI_CHECK(dst_dev != Device::kCPU || t_side_scope == 0,
           "a copy to the host inside side work (it would not wait for the side stream)");
  if (src_dev != Device::kCPU && reads_side_buffer(src, spitch * (rows - 1) + row_bytes)) side_join();
  if (dst_dev == Device::kCPU) {
    if (rows == 1)
      DI_CUDA_CHECK(cudaMemcpy(dst, src, row_bytes, cudaMemcpyDefault));
    else
      DI_CUDA_CHECK(cudaMemcpy2D(dst, dpitch, src, spitch, row_bytes, rows, cudaMemcpyDefault));
    return;
  }
  if (rows == 1)
    DI_CUDA_CHECK(cudaMemcpyAsync(dst, src, row_bytes, cudaMemcpyDefault, current_stream()));
  else
    DI_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, row_bytes, rows, cudaMemcpyDefault, current_stream()));
}

void cuda_memset(void* dst, int value, size_t nbytes) {
  flush_deferred();
  DI_CUDA_CHECK(cudaMemsetAsync(dst, value, nbytes, current_stream()));  // device memory: async as cudaMemset is
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return n;
}

void init() {
  static std::once_flag once;
  std::call_once(once, [] {
    DI_CHECK(device_count() > 0, "no CUDA device is visible: check the driver and CUDA_VISIBLE_DEVICES");
    DI_CUDA_CHECK(cudaFree(nullptr));  // creates the primary context now rather than on first use
    register_device_allocator(Device::kCUDA, &cuda_alloc);
    register_device_copy(Device::kCUDA, &cuda_copy, &cuda_memset);
  });
}

void synchronize() {
  flush_deferred();
  check_not_capturing("a device synchronisation");
  DI_CUDA_CHECK(cudaDeviceSynchronize());
}

PoolScope::PoolScope(GraphPool* pool) : prev_(t_pool) { t_pool = pool; }
PoolScope::~PoolScope() { t_pool = prev_; }
CaptureFlag::CaptureFlag() : prev_(t_capturing) { t_capturing = true; }
CaptureFlag::~CaptureFlag() { t_capturing = prev_; }
uint64_t graph_epoch() { return g_graph_epoch.load(std::memory_order_acquire); }
void bump_graph_epoch() { g_graph_epoch.fetch_add(1, std::memory_order_acq_rel); }

namespace {
thread_local cudaStream_t t_stream = nullptr;  // StreamScope's, per thread
}  // namespace

cudaStream_t current_stream() { return t_stream; }

namespace {
thread_local LaunchRecorder* t_recorder = nullptr;
}  // namespace

LaunchRecorder* launch_recorder() { return t_recorder; }
void set_launch_recorder(LaunchRecorder* r) { t_recorder = r; }
void flush_deferred() {
  if (t_recorder != nullptr) t_recorder->flush();
}
StreamScope::StreamScope(cudaStream_t s) : prev_(t_stream) { t_stream = s; }
StreamScope::~StreamScope() { t_stream = prev_; }

cudaStream_t side_fork() {
  flush_deferred();  // the side stream must wait for everything queued before, deferred launches included
  SideStream& s = side();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.stream == nullptr) {
    DI_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));  // no implicit sync with stream 0
    DI_CUDA_CHECK(cudaEventCreateWithFlags(&s.forked, cudaEventDisableTiming));
    DI_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  }
  DI_CUDA_CHECK(cudaEventRecord(s.forked, current_stream()));
  DI_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.forked, 0));
  return s.stream;
}

namespace {
// side_pending for a piece that writes several buffers: one event record after it.
void pend(const std::vector<std::pair<const char*, size_t>>& writes, std::vector<Tensor> keep) {
  SideStream& s = side();
  std::lock_guard<std::mutex> lock(s.mu);
  DI_CHECK(s.stream != nullptr, "side_pending: no side stream (side_fork first)");
  DI_CUDA_CHECK(cudaEventRecord(s.done, s.stream));  // after every piece queued so far
  for (const auto& w : writes)
    if (w.first != nullptr && w.second > 0) s.buffers.push_back(w);
  for (Tensor& t : keep) s.keep.push_back(std::move(t));
  s.pending.store(true, std::memory_order_release);
}
}  // namespace

void side_pending(const void* buffer, size_t bytes, std::vector<Tensor> keep) {
  pend({{static_cast<const char*>(buffer), bytes}}, std::move(keep));
}

namespace {
// Ends every pending piece of side work: the default stream first waits for them when `wait` (a join; a reset
// abandons them), then their buffers stop being pending and what they read and the blocks freed meanwhile are
// released (after the lock: a free asks reads_side_buffer, which takes it).
void end_side_work(bool wait) {
  SideStream& s = side();
  std::vector<Tensor> release;
  std::vector<std::function<void()>> frees;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (wait) {
      if (!s.pending.load(std::memory_order_relaxed)) return;
      flush_deferred();
      DI_CUDA_CHECK(cudaStreamWaitEvent(current_stream(), s.done, 0));
    }
    s.buffers.clear();
    release.swap(s.keep);
    frees.swap(s.deferred);
    ++s.joins;
    s.pending.store(false, std::memory_order_release);
  }
  for (auto& f : frees) f();
}
}  // namespace

void side_join() {
  // Inside a SideScope the work queued so far is on the side stream already (in order): joining would release
  // deferred blocks to the default stream's work too early.
  if (t_side_scope > 0 || !side().pending.load(std::memory_order_acquire)) return;
  end_side_work(true);
}

void side_reset() { end_side_work(false); }

SideScope::SideScope(std::vector<Tensor> reads) : reads_(std::move(reads)) {
  DI_CHECK(t_side_scope == 0, "SideScope: side work does not nest");
  on_side_.emplace(side_fork());
  ++t_side_scope;
}

void SideScope::done(const std::vector<Tensor>& writes) {
  if (!on_side_) return;
  on_side_.reset();
  --t_side_scope;
  std::vector<std::pair<const char*, size_t>> bufs;
  for (const Tensor& w : writes)
    if (w.defined()) bufs.emplace_back(static_cast<const char*>(w.raw()), w.nbytes());
  pend(bufs, std::move(reads_));
}

SideScope::~SideScope() {
  try {
    done({});
  } catch (...) {  // a destructor does not throw (done's event record failing means the device is lost anyway)
  }
}

void side_join_if_reads(const void* p, size_t n) {
  if (reads_side_buffer(p, n)) side_join();
}

namespace {
struct EventPool {
  std::mutex mu;
  std::vector<cudaEvent_t> events;
  size_t used = 0;
};
EventPool& event_pool() {
  static EventPool p;
  return p;
}
}  // namespace

int op_event_record() {
  flush_deferred();
  EventPool& p = event_pool();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.used == p.events.size()) {
    cudaEvent_t e;
    DI_CUDA_CHECK(cudaEventCreate(&e));
    p.events.push_back(e);
  }
  DI_CUDA_CHECK(cudaEventRecord(p.events[p.used], current_stream()));
  return static_cast<int>(p.used++);
}

double op_event_ms(int a, int b) {
  EventPool& p = event_pool();
  std::lock_guard<std::mutex> lock(p.mu);
  DI_CHECK(a >= 0 && b >= 0 && static_cast<size_t>(std::max(a, b)) < p.used, "op_event_ms: unknown event");
  DI_CUDA_CHECK(cudaEventSynchronize(p.events[b]));
  float ms = 0.0f;
  DI_CUDA_CHECK(cudaEventElapsedTime(&ms, p.events[a], p.events[b]));
  return ms;
}

void op_events_reset() {
  EventPool& p = event_pool();
  std::lock_guard<std::mutex> lock(p.mu);
  p.used = 0;
}

Tensor copy_to_device(const Tensor& t) {
  DI_CHECK(t.defined(), "copy_to_device: undefined tensor");
  init();
  flush_deferred();
  check_not_capturing("copy_to_device");
  if (t.device() == Device::kCUDA) {
    DI_CHECK(t.is_contiguous(), "copy_to_device: non-contiguous CUDA tensor {}", t.describe());
    Tensor out = Tensor::empty(t.shape(), t.dtype(), Device::kCUDA);
    if (reads_side_buffer(t.raw(), t.nbytes())) side_join();
    DI_CUDA_CHECK(cudaMemcpy(out.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToDevice));
    return out;
  }
  const Tensor src = t.contiguous();
  Tensor out = Tensor::empty(src.shape(), src.dtype(), Device::kCUDA);
  DI_CUDA_CHECK(cudaMemcpy(out.raw(), src.raw(), src.nbytes(), cudaMemcpyHostToDevice));
  return out;
}

Tensor copy_to_host(const Tensor& t) {
  DI_CHECK(t.defined(), "copy_to_host: undefined tensor");
  if (t.device() == Device::kCPU) return t.clone();
  flush_deferred();
  check_not_capturing("copy_to_host");
  DI_CHECK(t.is_contiguous(), "copy_to_host: non-contiguous CUDA tensor {}", t.describe());
  Tensor out = Tensor::empty(t.shape(), t.dtype(), Device::kCPU);
  side_join();
  DI_CUDA_CHECK(cudaMemcpy(out.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost));
  return out;
}

bool pdl_enabled() {
  static const bool on = env_switch("DEEPINFER_CUDA_PDL", 1) == 1;
  return on;
}

}  // namespace deepinfer::cuda
