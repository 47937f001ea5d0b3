#include "engine/engine_args.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "deepinfer/error.h"

namespace deepinfer {

ops::Numerics EngineArgs::numerics() const {
  DI_CHECK(dtype == "bfloat16" || dtype == "float32", "dtype must be 'bfloat16' or 'float32' (got '{}')", dtype);
  ops::Numerics n;
  n.bf16 = dtype == "bfloat16";
  n.simulate_qat = simulate_qat;
  return n;
}

int64_t EngineArgs::replay_keep_tokens() const {
  DI_CHECK(prefill_truncation == "compact" || prefill_truncation == "off",
           "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE must be 'compact' or 'off' (got '{}')", prefill_truncation);
  int64_t keep = 0;
  size_t used = 0;
  try {
    keep = std::stoll(prefill_keep_tokens, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DI_CHECK(used == prefill_keep_tokens.size() && used > 0 && keep >= 1,
           "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS must be a positive integer (got '{}')", prefill_keep_tokens);
  return prefill_truncation == "off" ? 0 : keep;
}

Device resolve_device(const std::string& name) {
  if (name == "cpu") return Device::kCPU;
  if (name == "auto" || name.empty()) return ops::device_available(Device::kCUDA) ? Device::kCUDA : Device::kCPU;
  DI_CHECK(name == "cuda", "device must be 'cuda', 'cpu' or 'auto' (got '{}')", name);
  DI_CHECK(ops::device_available(Device::kCUDA),
           "device 'cuda': no CUDA device is usable (a build configured without nvcc has no CUDA backend; else "
           "check the driver and CUDA_VISIBLE_DEVICES)");
  return Device::kCUDA;
}

int64_t read_max_position_embeddings(const std::string& model_dir) {
  namespace fs = std::filesystem;
  for (const char* rel : {"config.json", "inference/config.json"}) {
    const fs::path p = fs::path(model_dir) / rel;
    std::ifstream f(p);
    if (!f) continue;
    const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) continue;
    const nlohmann::json& c = j.contains("text_config") ? j["text_config"] : j;
    for (const char* key : {"max_position_embeddings", "max_seq_len"})
      if (c.contains(key) && c[key].is_number_integer()) return c[key].get<int64_t>();
  }
  return 0;
}

}  // namespace deepinfer
