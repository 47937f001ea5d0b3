// Binding checkpoint tensors to weight fields, shared by the V4 and V4.1 loaders: the three ways a
// linear weight ships (FP8 tiles, packed FP4 experts, BF16), each accepting its BF16 dequantisation.
#pragma once

#include <string>

#include "deepinfer/error.h"
#include "deepinfer/model_config.h"
#include "io/checkpoint.h"
#include "model/weights.h"

namespace deepinfer {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The three ways a checkpoint ships a linear weight; each also accepts its BF16 dequantisation.
enum class LinearKind { kFp8, kFp4, kBf16 };

struct WeightBinder {
  Checkpoint& ckpt;
  const ModelConfig& cfg;

  Tensor take(const std::string& name, const Shape& shape, std::initializer_list<DType> dtypes) {
    return ckpt.take(name, shape, dtypes);
  }

  ops::QWeight linear(const std::string& prefix, int64_t out, int64_t in, LinearKind kind) {
    const std::string wname = prefix + ".weight", sname = prefix + ".scale";
    ops::QWeight q;
    DI_CHECK(ckpt.has(wname), "checkpoint {}: missing tensor {}", ckpt.dir(), wname);
    const DType dt = ckpt.info(wname).dtype;
    const bool dense = dt == DType::kBF16 || dt == DType::kF32;
    if (kind == LinearKind::kBf16 || dense) {
      q.w = take(wname, {out, in}, {DType::kBF16, DType::kF32});
      DI_CHECK(!ckpt.has(sname), "checkpoint {}: {} is dense ({}) but {} exists", ckpt.dir(), wname, dtype_name(dt),
               sname);
      return q;
    }
    if (kind == LinearKind::kFp8) {
      const int64_t b = cfg.fp8_block;
      q.w = take(wname, {out, in}, {DType::kE4M3});
      q.scale = take(sname, {ceil_div(out, b), ceil_div(in, b)}, {DType::kE8M0});
      q.block = b;
      return q;
    }
    // FP4 experts ship as I8 [out, in/2], two e2m1 codes per byte, with E8M0 scales per 32 along K.
    DI_CHECK(in % 32 == 0, "FP4 weight {} needs in_features divisible by 32, got {}", wname, in);
    Tensor packed = take(wname, {out, in / 2}, {DType::kI8, DType::kU8});
    q.w = packed.reinterpret(DType::kE2M1x2, {out, in});
    q.scale = take(sname, {out, in / 32}, {DType::kE8M0});
    return q;
  }

  ExpertWeights expert(const std::string& p, LinearKind kind) {
    ExpertWeights e;
    e.w1 = linear(p + ".w1", cfg.moe_inter_dim, cfg.dim, kind);
    e.w2 = linear(p + ".w2", cfg.dim, cfg.moe_inter_dim, kind);
    e.w3 = linear(p + ".w3", cfg.moe_inter_dim, cfg.dim, kind);
    return e;
  }
};

// Fails naming the tensors nobody took, except those starting with one of `skip` (modules loaded
// separately or not supported, e.g. the speculative `mtp.*` stages).
inline void reject_unused(const Checkpoint& ckpt, const ModelConfig& cfg, const char* family,
                          std::initializer_list<const char*> skip) {
  std::vector<std::string> extra;
  for (const auto& n : ckpt.unused()) {
    bool skipped = false;
    for (const char* s : skip) skipped = skipped || n.rfind(s, 0) == 0;
    if (!skipped) extra.push_back(n);
  }
  if (extra.empty()) return;
  std::string list;
  for (size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + extra[i];
  fail("checkpoint {}: {} unexpected tensor(s) not used by a {}-layer {} model: {}{}", ckpt.dir(), extra.size(),
       cfg.n_layers, family, list, extra.size() > 8 ? ", ..." : "");
}

}  // namespace deepinfer
