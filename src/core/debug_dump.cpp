#include "core/debug_dump.h"

#include <cstdio>
#include <cstdlib>

namespace deepinfer {

static const char* dump_dir() {
  static const char* d = std::getenv("DEEPINFER_DUMP_DIR");
  return d;
}

bool dump_enabled() { return dump_dir() != nullptr; }

void dump(const std::string& name, int64_t layer, const Tensor& t) {
  if (!dump_enabled() || t.dtype() != DType::kF32 || t.device() != Device::kCPU) return;
  std::string path = std::string(dump_dir()) + "/" + name + (layer >= 0 ? ".L" + std::to_string(layer) : "") + ".f32";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    Tensor c = t.contiguous();
    std::fwrite(c.raw(), sizeof(float), static_cast<size_t>(c.numel()), f);
    std::fclose(f);
  }
}

}  // namespace deepinfer
