#include "core/debug_dump.h"

#include <cstdio>
#include <cstdlib>

namespace deepinfer {

static const char* dump_dir() {
  static const char* d = std::getenv("DEEPINFER_DUMP_DIR");
  return d;
}

bool dump_enabled() { return dump_dir() != nullptr; }

static void fits_read(FILE* f, Tensor& t) {
  if (std::fread(t.raw(), sizeof(float), static_cast<size_t>(t.numel()), f) != static_cast<size_t>(t.numel()))
    std::abort();  // the size was checked just before: a short read is an I/O failure
}

void dump(const std::string& name, int64_t layer, const Tensor& t) {
  if (!dump_enabled() || t.dtype() != DType::kF32) return;
  std::string path = std::string(dump_dir()) + "/" + name + (layer >= 0 ? ".L" + std::to_string(layer) : "") + ".f32";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    Tensor c = t.device() == Device::kCPU ? t.contiguous() : t.to(Device::kCPU);
    std::fwrite(c.raw(), sizeof(float), static_cast<size_t>(c.numel()), f);
    std::fclose(f);
  }
}

static const char* force_dir() {
  static const char* d = std::getenv("DEEPINFER_FORCE_DIR");
  return d;
}

static int64_t force_call = -1;

void force_begin_forward() {
  if (force_dir() != nullptr) ++force_call;
}

bool force(const std::string& name, int64_t layer, Tensor& t) {
  if (force_dir() == nullptr || t.dtype() != DType::kF32 || t.device() != Device::kCPU || !t.is_contiguous())
    return false;
  const std::string file = name + (layer >= 0 ? ".L" + std::to_string(layer) : "") + ".f32";
  // The forward's own folder (<dir>/<call index>/) first, then the shared one.
  std::string path = std::string(force_dir()) + "/" + std::to_string(force_call) + "/" + file;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    path = std::string(force_dir()) + "/" + file;
    f = std::fopen(path.c_str(), "rb");
  }
  if (f == nullptr) return false;
  std::fseek(f, 0, SEEK_END);
  const long bytes = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  const bool fits = bytes == static_cast<long>(t.numel() * sizeof(float));
  if (fits) fits_read(f, t);
  std::fclose(f);
  return fits;
}

}  // namespace deepinfer
