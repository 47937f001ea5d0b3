// Checkpoint: one name -> tensor map over the safetensors files of a directory.
#include "io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "deepinfer/error.h"

namespace deepinfer {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

std::string base_name(const std::string& path) { return fs::path(path).filename().string(); }

std::string dtypes_str(std::initializer_list<DType> dtypes) {
  std::string out;
  size_t i = 0;
  for (DType d : dtypes) {
    if (i) out += i + 1 == dtypes.size() ? " or " : ", ";
    out += dtype_name(d);
    ++i;
  }
  return out;
}

// weight_map of an index file: tensor -> shard file name.
std::map<std::string, std::string> read_weight_map(const std::string& dir, const fs::path& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  DI_CHECK(in.good(), "checkpoint {}: cannot read {}", dir, index_path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    fail("checkpoint {}: {} is not valid JSON: {}", dir, kIndexName, e.what());
  }
  DI_CHECK(j.is_object(), "checkpoint {}: {} is not a JSON object", dir, kIndexName);
  auto wm = j.find("weight_map");
  DI_CHECK(wm != j.end() && wm->is_object(), "checkpoint {}: {} has no weight_map object", dir, kIndexName);
  std::map<std::string, std::string> out;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    DI_CHECK(it->is_string(), "checkpoint {}: {} maps tensor {} to {}, expected a file name", dir, kIndexName, it.key(),
             it->dump());
    const std::string file = it->get<std::string>();
    DI_CHECK(!file.empty() && fs::path(file).filename() == fs::path(file),
             "checkpoint {}: {} maps tensor {} to '{}', expected a file name in the directory", dir, kIndexName,
             it.key(), file);
    out[it.key()] = file;
  }
  return out;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  std::error_code ec;
  const fs::path root(dir);
  DI_CHECK(fs::exists(root, ec), "checkpoint directory {} does not exist", dir);
  DI_CHECK(fs::is_directory(root, ec), "checkpoint {} is not a directory", dir);

  auto add_file = [&](const fs::path& p) {
    auto f = SafetensorsFile::open(p.string());
    const size_t slot = ck.files_.size();
    for (const auto& [name, ti] : f->tensors()) {
      auto [it, inserted] = ck.index_.emplace(name, slot);
      if (!inserted) {
        fail("checkpoint {}: tensor {} is in two files, {} and {}", dir, name, base_name(ck.files_[it->second]->path()),
             p.filename().string());
      }
    }
    ck.files_.push_back(std::move(f));
  };

  const fs::path index_path = root / kIndexName;
  if (fs::exists(index_path, ec)) {
    const auto weight_map = read_weight_map(dir, index_path);
    // Shards in name order; each is opened once.
    std::map<std::string, std::string> shards;  // file -> first tensor naming it
    for (const auto& [name, file] : weight_map) shards.emplace(file, name);
    for (const auto& [file, first] : shards) {
      DI_CHECK(fs::exists(root / file, ec), "checkpoint {}: shard {} (listed in {} for tensor {}) does not exist", dir,
               file, kIndexName, first);
    }
    for (const auto& [file, first] : shards) add_file(root / file);
    for (const auto& [name, file] : weight_map) {
      auto it = ck.index_.find(name);
      DI_CHECK(it != ck.index_.end(), "checkpoint {}: {} lists tensor {} in file {}, but {} does not contain it", dir,
               kIndexName, name, file, file);
      const std::string& held_by = base_name(ck.files_[it->second]->path());
      DI_CHECK(held_by == file, "checkpoint {}: {} lists tensor {} in file {}, but it is in {}", dir, kIndexName, name,
               file, held_by);
    }
    for (const auto& [name, slot] : ck.index_) {
      DI_CHECK(weight_map.count(name) != 0, "checkpoint {}, file {}: tensor {} is not listed in {}", dir,
               base_name(ck.files_[slot]->path()), name, kIndexName);
    }
  } else if (fs::exists(root / kSingleName, ec)) {
    add_file(root / kSingleName);
  } else {
    std::vector<fs::path> found;
    for (const auto& e : fs::directory_iterator(root)) {
      // engram_hash.safetensors is V4.1 hash data (tools/engram/hash_data.py), not weights.
      if (e.path().extension() == ".safetensors" && e.is_regular_file(ec) &&
          e.path().filename() != "engram_hash.safetensors")
        found.push_back(e.path());
    }
    DI_CHECK(!found.empty(), "no safetensors files in {}", dir);
    std::sort(found.begin(), found.end());
    for (const auto& p : found) add_file(p);
  }
  return ck;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, slot] : index_) out.push_back(name);
  return out;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = index_.find(name);
  DI_CHECK(it != index_.end(), "missing tensor {} in checkpoint {}", name, dir_);
  return files_[it->second]->tensors().at(name);
}

const std::string& Checkpoint::file_of(const std::string& name) const {
  auto it = index_.find(name);
  DI_CHECK(it != index_.end(), "missing tensor {} in checkpoint {}", name, dir_);
  return files_[it->second]->path();
}

Tensor Checkpoint::take(const std::string& name) {
  auto it = index_.find(name);
  DI_CHECK(it != index_.end(), "missing tensor {} in checkpoint {}", name, dir_);
  Tensor t = files_[it->second]->get(name);
  taken_.insert(name);
  return t;
}

Tensor Checkpoint::take(const std::string& name, const Shape& shape, std::initializer_list<DType> dtypes) {
  const TensorInfo& ti = info(name);
  bool dtype_ok = std::find(dtypes.begin(), dtypes.end(), ti.dtype) != dtypes.end();
  bool shape_ok = ti.shape == shape;
  // Packed FP4 ships as I8 [..., k/2]; asked for as kE2M1x2 [..., k] it is viewed as such.
  bool as_fp4 = false;
  if (!(dtype_ok && shape_ok) && std::find(dtypes.begin(), dtypes.end(), DType::kE2M1x2) != dtypes.end() &&
      ti.dtype == DType::kI8 && !shape.empty() && ti.shape.size() == shape.size() && shape.back() % 2 == 0) {
    Shape packed = shape;
    packed.back() /= 2;
    as_fp4 = ti.shape == packed;
  }
  if (!as_fp4 && !(dtype_ok && shape_ok)) {
    fail("checkpoint {}, file {}: tensor {} has shape {} ({}), expected {} ({})", dir_, base_name(file_of(name)), name,
         shape_str(ti.shape), dtype_name(ti.dtype), shape_str(shape), dtypes_str(dtypes));
  }
  Tensor t = take(name);
  return as_fp4 ? t.reinterpret(DType::kE2M1x2, shape) : t;
}

std::vector<std::string> Checkpoint::unused() const {
  std::vector<std::string> out;
  for (const auto& [name, slot] : index_) {
    if (!taken_.count(name)) out.push_back(name);
  }
  return out;
}

}  // namespace deepinfer
