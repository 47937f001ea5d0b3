#include "deepinfer/tensor.h"

#include <cstdlib>
#include <cstring>

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

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, float value) {
  Tensor t = empty(shape, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = value;
  return t;
}

Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                      Device device) {
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
  DI_CHECK(0 <= begin && begin <= end && end <= shape_[d], "slice({}, {}, {}) out of range for {}", d, begin,
           end, describe());
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

Tensor Tensor::clone() const {
  DI_CHECK(device() == Device::kCPU, "clone() is CPU-only, got {}", describe());
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
