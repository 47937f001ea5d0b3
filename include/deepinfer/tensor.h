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

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::kCPU);
  static Tensor zeros(const Shape& shape, DType dtype);  // CPU
  static Tensor full(const Shape& shape, float value);   // CPU float32
  // Wraps bytes owned elsewhere; `owner` keeps them alive as long as any view exists.
  static Tensor borrow(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                       Device device = Device::kCPU);

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
  T* data() const { return static_cast<T*>(raw()); }

  // Views share storage. `view` needs a contiguous tensor; -1 infers one dimension.
  Tensor view(const Shape& shape) const;
  Tensor slice(int dim, int64_t begin, int64_t end) const;
  Tensor select(int dim, int64_t index) const;
  // A dense copy (CPU only) if not already contiguous.
  Tensor contiguous() const;
  Tensor clone() const;
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

}  // namespace deepinfer
