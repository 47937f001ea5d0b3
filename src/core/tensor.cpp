#include "deepinfer/tensor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/env.h"
#include "deepinfer/error.h"

namespace deepinfer {

namespace {
DeviceAllocFn g_allocators[2] = {nullptr, nullptr};

std::shared_ptr<Storage> cpu_alloc(size_t nbytes) {
  auto st = std::make_shared<Storage>();
  size_t padded = ((nbytes + 63) / 64) * 64;
  if (padded == 0) padded = 64;
  void* p = std::aligned_alloc(64, padded);
  if (!p) fail("out of host memory allocating {} bytes", nbytes);
  st->data = p;
  st->nbytes = nbytes;
  st->device = Device::kCPU;
  st->owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return st;
}
}  // namespace

const char* device_name(Device d) { return d == Device::kCPU ? "cpu" : "cuda"; }

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

void register_device_allocator(Device d, DeviceAllocFn fn) { g_allocators[static_cast<int>(d)] = fn; }

namespace {
DeviceCopyFn g_copy = nullptr;
DeviceMemsetFn g_memset = nullptr;
}  // namespace

void register_device_copy(Device d, DeviceCopyFn copy, DeviceMemsetFn memset) {
  DI_CHECK(d != Device::kCPU, "register_device_copy: the CPU copies need no registration");
  g_copy = copy;
  g_memset = memset;
}

namespace {
// DEEPINFER_OP_PROFILE=1 (see src/ops/ops.cpp): counts and times the copies that involve a device, by
// direction, printed at exit.
struct CopyProfile {
  std::mutex mu;
  double seconds[3] = {0, 0, 0};
  int64_t calls[3] = {0, 0, 0}, bytes[3] = {0, 0, 0};
  ~CopyProfile() {
    static const char* names[3] = {"host->device", "device->host", "device->device"};
    for (int i = 0; i < 3; ++i)
      if (calls[i] > 0)
        std::fprintf(stderr, "copies %-15s %10lld calls %12.3f ms %14lld bytes\n", names[i],
                     static_cast<long long>(calls[i]), seconds[i] * 1e3, static_cast<long long>(bytes[i]));
  }
};
CopyProfile* copy_profile() {
  static std::unique_ptr<CopyProfile> p(env_value("DEEPINFER_OP_PROFILE") == "1" ? new CopyProfile() : nullptr);
  return p.get();
}
}  // namespace

void copy_bytes_2d(void* dst, size_t dpitch, Device dst_dev, const void* src, size_t spitch, Device src_dev,
                   size_t row_bytes, size_t rows) {
  if (row_bytes == 0 || rows == 0) return;
  if (dst_dev == Device::kCPU && src_dev == Device::kCPU) {
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, row_bytes);
    return;
  }
  DI_CHECK(g_copy != nullptr, "no copy registered for device {}: build with CUDA and initialise it",
           device_name(dst_dev == Device::kCPU ? src_dev : dst_dev));
  CopyProfile* prof = copy_profile();
  const auto t0 = prof ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
  g_copy(dst, dpitch, dst_dev, src, spitch, src_dev, row_bytes, rows);
  if (!prof) return;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int dir = dst_dev == Device::kCPU ? 1 : (src_dev == Device::kCPU ? 0 : 2);
  std::lock_guard<std::mutex> lock(prof->mu);
  prof->seconds[dir] += dt;
  prof->calls[dir] += 1;
  prof->bytes[dir] += static_cast<int64_t>(row_bytes * rows);
}

void zero_bytes(void* dst, Device dev, size_t nbytes) {
  if (nbytes == 0) return;
  if (dev == Device::kCPU) {
    std::memset(dst, 0, nbytes);
    return;
  }
  DI_CHECK(g_memset != nullptr, "no memset registered for device {}", device_name(dev));
  g_memset(dst, 0, nbytes);
}

namespace {
// The (rows, row elements, row stride) of a tensor whose last dimension is contiguous and whose
// rows are equally spaced; false otherwise.
bool as_rows(const Tensor& t, int64_t& rows, int64_t& cols, int64_t& stride) {
  if (t.dim() == 0 || t.is_contiguous()) {
    cols = t.dim() == 0 ? 1 : t.shape().back();
    rows = cols == 0 ? 0 : t.numel() / cols;
    stride = cols;
    return true;
  }
  const int nd = t.dim();
  if (t.strides()[nd - 1] != 1 || nd < 2) return false;
  // Leading dimensions must collapse into one with a constant stride.
  for (int k = nd - 2; k > 0; --k)
    if (t.strides()[k - 1] != t.strides()[k] * t.shape()[k]) return false;
  cols = t.shape().back();
  rows = t.numel() / std::max<int64_t>(cols, 1);
  stride = t.strides()[nd - 2];
  return true;
}
}  // namespace

void copy_tensor(const Tensor& dst, const Tensor& src) {
  DI_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype(), "copy_tensor: {} into {}", src.describe(),
           dst.describe());
  if (src.numel() == 0) return;
  if (dst.is_contiguous() && src.is_contiguous()) {
    copy_bytes(dst.raw(), dst.device(), src.raw(), src.device(), src.nbytes());
    return;
  }
  int64_t dr = 0, dc = 0, ds = 0, sr = 0, sc = 0, ss = 0;
  const bool ok = as_rows(dst, dr, dc, ds) && as_rows(src, sr, sc, ss);
  DI_CHECK(ok && dst.dtype() != DType::kE2M1x2, "copy_tensor: {} -> {}: rows must be contiguous and equally spaced",
           src.describe(), dst.describe());
  const size_t es = dtype_bits(dst.dtype()) / 8;
  copy_bytes_2d(dst.raw(), ds * es, dst.device(), src.raw(), ss * es, src.device(), dc * es, dr);
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

static int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto v : s) {
    DI_CHECK(v >= 0, "negative dimension in shape {}", shape_str(s));
    n *= v;
  }
  return n;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  size_t nb = dtype_nbytes(dtype, shape_numel(shape));
  if (device == Device::kCPU) {
    t.storage_ = cpu_alloc(nb);
  } else {
    auto fn = g_allocators[static_cast<int>(device)];
    DI_CHECK(fn != nullptr, "no allocator registered for device {}: build with CUDA and initialise it",
             device_name(device));
    t.storage_ = fn(nb);
  }
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  zero_bytes(t.raw(), device, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, float value) {
  Tensor t = empty(shape, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = value;
  return t;
}

Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner, Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->data = data;
  t.storage_->nbytes = dtype_nbytes(dtype, shape_numel(shape));
  t.storage_->device = device;
  t.storage_->owner = std::move(owner);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::with_owner(std::shared_ptr<void> owner) const {
  DI_CHECK(defined(), "with_owner: undefined tensor");
  Tensor t = *this;
  t.storage_ = std::make_shared<Storage>(*storage_);
  t.storage_->owner = std::move(owner);
  return t;
}

int64_t Tensor::size(int d) const {
  if (d < 0) d += dim();
  DI_CHECK(d >= 0 && d < dim(), "dimension {} out of range for {}", d, describe());
  return shape_[d];
}

int64_t Tensor::numel() const { return shape_numel(shape_); }

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

Tensor Tensor::view(const Shape& shape) const {
  DI_CHECK(is_contiguous(), "view() needs a contiguous tensor, got {}", describe());
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      DI_CHECK(infer < 0, "view(): more than one -1 in {}", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    DI_CHECK(known > 0 && numel() % known == 0, "view(): cannot infer {} from {}", shape_str(shape), describe());
    s[infer] = numel() / known;
  }
  DI_CHECK(shape_numel(s) == numel(), "view(): {} does not match {}", shape_str(s), describe());
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::slice(int d, int64_t begin, int64_t end) const {
  if (d < 0) d += dim();
  DI_CHECK(d >= 0 && d < dim(), "slice(): dimension {} out of range for {}", d, describe());
  DI_CHECK(0 <= begin && begin <= end && end <= shape_[d], "slice({}, {}, {}) out of range for {}", d, begin, end,
           describe());
  DI_CHECK(dtype_ != DType::kE2M1x2 || d != dim() - 1, "cannot slice packed fp4 along its last dimension");
  Tensor t = *this;
  t.offset_ += dtype_nbytes(dtype_, begin * strides_[d]);
  t.shape_[d] = end - begin;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  if (d < 0) d += dim();
  Tensor t = slice(d, index, index + 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::to(Device d) const {
  if (device() == d && is_contiguous()) return *this;
  Tensor out = empty(shape_, dtype_, d);
  copy_tensor(out, *this);
  return out;
}

Tensor Tensor::clone() const {
  if (device() != Device::kCPU) {
    Tensor out = empty(shape_, dtype_, device());
    copy_tensor(out, *this);
    return out;
  }
  Tensor out = empty(shape_, dtype_);
  if (is_contiguous()) {
    std::memcpy(out.raw(), raw(), nbytes());
    return out;
  }
  DI_CHECK(dtype_ != DType::kE2M1x2, "cannot copy a strided packed fp4 tensor");
  const size_t es = dtype_bits(dtype_) / 8;
  const int nd = dim();
  std::vector<int64_t> idx(nd, 0);
  const int64_t n = numel();
  char* dst = static_cast<char*>(out.raw());
  const char* src = static_cast<const char*>(raw());
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (int k = 0; k < nd; ++k) off += idx[k] * strides_[k];
    std::memcpy(dst + i * es, src + off * es, es);
    for (int k = nd - 1; k >= 0; --k) {
      if (++idx[k] < shape_[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

Tensor Tensor::reinterpret(DType dtype, const Shape& shape) const {
  DI_CHECK(is_contiguous(), "reinterpret() needs a contiguous tensor, got {}", describe());
  DI_CHECK(dtype_nbytes(dtype, shape_numel(shape)) == nbytes(), "reinterpret(): {} {} does not cover {}",
           dtype_name(dtype), shape_str(shape), describe());
  Tensor t = *this;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " " + device_name(device());
}

}  // namespace deepinfer
