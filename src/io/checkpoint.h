// Checkpoint: a directory of safetensors files (one `model.safetensors`, a sharded set listed by
// `model.safetensors.index.json`, or every *.safetensors file) seen as one name -> tensor map.
// Tracks which tensors were taken so a loader can report unexpected (extra) ones.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace deepinfer {

class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  std::vector<std::string> names() const;
  const TensorInfo& info(const std::string& name) const;
  const std::string& file_of(const std::string& name) const;

  // Returns the tensor and marks it used. Throws "missing tensor NAME in DIR" if absent.
  Tensor take(const std::string& name);
  // Like take(), and checks dtype is one of `dtypes` and the shape equals `shape`; the error names
  // the file, the tensor, what was found and what was expected. Packed FP4: when `dtypes` holds
  // kE2M1x2, an I8 tensor whose shape is `shape` with the last dimension halved (how the
  // checkpoints ship FP4 experts) is accepted and returned viewed as kE2M1x2 `shape`.
  Tensor take(const std::string& name, const Shape& shape, std::initializer_list<DType> dtypes);
  // Names never taken, sorted.
  std::vector<std::string> unused() const;

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> index_;  // tensor -> files_ slot
  std::set<std::string> taken_;
};

}  // namespace deepinfer
