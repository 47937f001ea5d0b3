// A kernel launch as data, and the hook through which launch_pdl (fp_decode.cuh) hands its launches to a recorder:
// how SegmentGraphs (graph.cu) folds a decode step's eager middles and its piece graphs into one graph. CUDA header
// (cuda_runtime types); device.h declares the flush that the backend's other GPU work calls first.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "cuda/device.h"

namespace deepinfer::cuda {

// Sets cfg's programmatic stream serialisation (PDL) on or off, attr being the storage of its one attribute: how
// launch_pdl (fp_decode.cuh) and LaunchRecord::launch configure a launch.
inline void set_pdl(cudaLaunchConfig_t& cfg, cudaLaunchAttribute& attr, bool on) {
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = on ? 1 : 0;
}

// One launch: the kernel, its shape, whether it was launched with programmatic dependent launch, and a copy of its
// arguments (each at its offset in `args`, aligned as its type), enough to launch it later or to set a graph kernel
// node's parameters.
struct LaunchRecord {
  const void* func = nullptr;
  dim3 grid, block;
  size_t smem = 0;
  bool pdl = false;
  std::unique_ptr<unsigned char[]> storage;  // args, 64-byte aligned inside (CUtensorMap arguments need 64)
  unsigned char* args = nullptr;
  size_t size = 0, capacity = 0;
  std::vector<size_t> offsets;
  std::vector<void*> params;  // pointers to each argument (kernelParams), filled by finish()

  template <typename T>
  void add(const T& v) {
    const size_t at = (size + alignof(T) - 1) / alignof(T) * alignof(T);
    reserve(at + sizeof(T));
    std::memcpy(args + at, &v, sizeof(T));
    offsets.push_back(at);
    size = at + sizeof(T);
  }
  void finish() {
    params.clear();
    for (size_t o : offsets) params.push_back(args + o);
  }
  cudaKernelNodeParams node_params() {
    cudaKernelNodeParams p = {};
    p.func = const_cast<void*>(func);
    p.gridDim = grid;
    p.blockDim = block;
    p.sharedMemBytes = static_cast<unsigned>(smem);
    p.kernelParams = params.empty() ? nullptr : params.data();
    return p;
  }
  // Launches it on `stream` as launch_pdl would have.
  void launch(cudaStream_t stream) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr;
    set_pdl(cfg, attr, pdl);
    DI_CUDA_CHECK(cudaLaunchKernelExC(&cfg, func, params.data()));
  }

 private:
  void reserve(size_t n) {
    if (n <= capacity) return;
    const size_t cap = n < 256 ? 256 : 2 * n;
    std::unique_ptr<unsigned char[]> s(new unsigned char[cap + 64]);
    unsigned char* a = s.get() + (64 - reinterpret_cast<uintptr_t>(s.get()) % 64) % 64;
    if (size > 0) std::memcpy(a, args, size);
    storage = std::move(s);
    args = a;
    capacity = cap;
  }
};

// Receives the launches of launch_pdl while installed on this thread (set_launch_recorder).
class LaunchRecorder {
 public:
  virtual ~LaunchRecorder() = default;
  // Called before launch_pdl launches `r` on `stream`: true when the recorder took it (the caller then does not
  // launch it: it is deferred), false when the caller launches it as usual.
  virtual bool on_launch(cudaStream_t stream, LaunchRecord&& r) = 0;
  // Called before GPU work that is not a launch_pdl (copies, memsets, events, synchronisation, frees): anything
  // deferred must be launched first, so that the stream order stays the host's.
  virtual void flush() = 0;
};

// The recorder installed on this thread, or null.
LaunchRecorder* launch_recorder();
void set_launch_recorder(LaunchRecorder* r);

template <typename... KArgs>
LaunchRecord make_launch_record(void (*kernel)(KArgs...), const cudaLaunchConfig_t& cfg, bool pdl,
                                const KArgs&... args) {
  LaunchRecord r;
  r.func = reinterpret_cast<const void*>(kernel);
  r.grid = cfg.gridDim;
  r.block = cfg.blockDim;
  r.smem = cfg.dynamicSmemBytes;
  r.pdl = pdl;
  (r.add(args), ...);
  r.finish();
  return r;
}

}  // namespace deepinfer::cuda
