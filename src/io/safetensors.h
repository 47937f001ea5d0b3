// safetensors reader: mmaps a file, parses its JSON header and hands out tensors that borrow the
// mapping (no copy). Every malformed input throws deepinfer::Error naming the file and tensor.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/tensor.h"

namespace deepinfer {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  size_t begin = 0;  // byte offsets into the data section
  size_t end = 0;
};

class SafetensorsFile {
 public:
  // Opens and validates: header length and JSON, known dtypes, offsets inside the file, sizes
  // matching shape x dtype, no overlapping tensors.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // A tensor borrowing the mapping; throws if absent.
  Tensor get(const std::string& name) const;

 private:
  std::string path_;
  std::shared_ptr<void> mapping_;  // munmap on release
  const char* data_ = nullptr;     // start of the data section
  size_t data_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace deepinfer
