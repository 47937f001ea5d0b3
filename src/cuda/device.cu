// CUDA device layer: allocator registration, copies, error reporting. See device.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "cuda/device.h"
#include "deepinfer/error.h"

namespace deepinfer::cuda {

namespace detail {
void throw_cuda_error(int code, const char* expr, const char* file, int line) {
  const auto err = static_cast<cudaError_t>(code);
  fail("{}:{}: {} failed: {}: {}", file, line, expr, cudaGetErrorName(err), cudaGetErrorString(err));
}
}  // namespace detail

namespace {

// The kCUDA allocator: one cudaMalloc per storage, freed by the storage's shared owner when the
// last tensor viewing it goes away.
std::shared_ptr<Storage> cuda_alloc(size_t nbytes) {
  void* p = nullptr;
  // cudaMalloc(0) may return nullptr; keep every storage non-null so views stay well-formed.
  DI_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(nbytes, 1)));
  auto st = std::make_shared<Storage>();
  st->data = p;
  st->nbytes = nbytes;
  st->device = Device::kCUDA;
  // A deleter cannot throw; errors here (e.g. at process exit, after the runtime has unloaded)
  // are ignored.
  st->owner = std::shared_ptr<void>(p, [](void* q) { (void)cudaFree(q); });
  return st;
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
  });
}

void synchronize() { DI_CUDA_CHECK(cudaDeviceSynchronize()); }

Tensor copy_to_device(const Tensor& t) {
  DI_CHECK(t.defined(), "copy_to_device: undefined tensor");
  init();
  if (t.device() == Device::kCUDA) {
    DI_CHECK(t.is_contiguous(), "copy_to_device: non-contiguous CUDA tensor {}", t.describe());
    Tensor out = Tensor::empty(t.shape(), t.dtype(), Device::kCUDA);
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
  DI_CHECK(t.is_contiguous(), "copy_to_host: non-contiguous CUDA tensor {}", t.describe());
  Tensor out = Tensor::empty(t.shape(), t.dtype(), Device::kCPU);
  DI_CUDA_CHECK(cudaMemcpy(out.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace deepinfer::cuda
