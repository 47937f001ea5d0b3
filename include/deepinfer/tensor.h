// Tensor: shape, strides, dtype, device and a shared storage that either owns its bytes or
// borrows them (an mmap'd checkpoint region kept alive by a shared owner).
//
// Shapes are logical element counts; for the packed e2m1 type the last dimension counts codes
// (two per byte) and such tensors are always contiguous.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/dtype.h"

namespace deepinfer {

enum class Device : uint8_t { kCPU, kCUDA };
const char* device_name(Device d);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);

// Raw bytes on one device. `owner` keeps whatever backs `data` alive (an allocation, a mapping).
struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device = Device::kCPU;
  std::shared_ptr<void> owner;
};

// Device allocators are registered by the backend that provides them (the CUDA module registers
// kCUDA), so core never links against a GPU runtime.
using DeviceAllocFn = std::shared_ptr<Storage> (*)(size_t nbytes);
void register_device_allocator(Device d, DeviceAllocFn fn);

// Byte copies between any two devices, registered by the backend like the allocator: `rows` rows of
// `row_bytes` bytes, the rows `dpitch` / `spitch` bytes apart (a 2D copy; rows = 1 for a plain one).
// Copies involving a device finish before the call returns (ordered after the work already queued).
using DeviceCopyFn = void (*)(void* dst, size_t dpitch, Device dst_dev, const void* src, size_t spitch, Device src_dev,
                              size_t row_bytes, size_t rows);
using DeviceMemsetFn = void (*)(void* dst, int value, size_t nbytes);
void register_device_copy(Device d, DeviceCopyFn copy, DeviceMemsetFn memset);
void copy_bytes_2d(void* dst, size_t dpitch, Device dst_dev, const void* src, size_t spitch, Device src_dev,
                   size_t row_bytes, size_t rows);
inline void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) {
  copy_bytes_2d(dst, nbytes, dst_dev, src, nbytes, src_dev, nbytes, 1);
}
void zero_bytes(void* dst, Device dev, size_t nbytes);

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::kCPU);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::kCPU);
  static Tensor full(const Shape& shape, float value);  // CPU float32
  // Wraps bytes owned elsewhere; `owner` keeps them alive as long as any view exists.
  static Tensor borrow(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                       Device device = Device::kCPU);
  // The same view of the same bytes, kept alive by `owner` instead of its storage's owner (a CUDA graph's outputs
  // are handed out again at every replay as views that do not own the graph's memory).
  Tensor with_owner(std::shared_ptr<void> owner) const;

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const;
  int64_t numel() const;
  size_t nbytes() const { return dtype_nbytes(dtype_, numel()); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::kCPU; }
  bool is_contiguous() const;

  void* raw() const { return static_cast<char*>(storage_->data) + offset_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  // Views share storage. `view` needs a contiguous tensor; -1 infers one dimension.
  Tensor view(const Shape& shape) const;
  Tensor slice(int dim, int64_t begin, int64_t end) const;
  Tensor select(int dim, int64_t index) const;
  // A dense copy on the same device if not already contiguous (on a device: a view whose rows are
  // contiguous, e.g. a select() on a middle dimension).
  Tensor contiguous() const;
  Tensor clone() const;
  // A contiguous copy on `d` (this tensor itself when it is already contiguous there).
  Tensor to(Device d) const;
  // Same dtype reinterpreted with another element type of equal total size (e.g. I8 -> E2M1x2).
  Tensor reinterpret(DType dtype, const Shape& shape) const;

  std::string describe() const;  // "bfloat16[4096, 512] cpu"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  Shape strides_;  // in elements
  DType dtype_ = DType::kF32;
};

Shape contiguous_strides(const Shape& shape);

// dst = src for two tensors of one shape and dtype on any devices, each either contiguous or a
// view whose rows (last dimension) are contiguous and equally spaced (a 2D copy), e.g. a column
// slice of a matrix. Exact.
void copy_tensor(const Tensor& dst, const Tensor& src);

}  // namespace deepinfer
