// Named-tensor dumps for debugging numerics against a reference, in the spirit of llama.cpp's
// cb(tensor, name, layer): when DEEPINFER_DUMP_DIR is set, dump("attn_out", 3, t) writes
// t's float32 values to $DEEPINFER_DUMP_DIR/attn_out.L3.f32 (overwriting). Off by default.
#pragma once

#include <string>

#include "deepinfer/tensor.h"

namespace deepinfer {

bool dump_enabled();
void dump(const std::string& name, int64_t layer, const Tensor& t);

}  // namespace deepinfer
