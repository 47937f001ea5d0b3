// Named-tensor dumps for debugging numerics against a reference, in the spirit of llama.cpp's
// cb(tensor, name, layer): when DEEPINFER_DUMP_DIR is set, dump("attn_out", 3, t) writes
// t's float32 values to $DEEPINFER_DUMP_DIR/attn_out.L3.f32 (overwriting). Off by default.
#pragma once

#include <string>

#include "deepinfer/tensor.h"

namespace deepinfer {

bool dump_enabled();
void dump(const std::string& name, int64_t layer, const Tensor& t);

// Teacher forcing, for layer-by-layer comparison with a reference: when DEEPINFER_FORCE_DIR is set
// and holds <name>.L<layer>.f32 with exactly t's element count, t's values are replaced by the
// file's (so the next sublayer starts from the reference's input). Returns whether it replaced.
// Files in <dir>/<k>/ apply to the k-th forward only (counted from 0 by force_begin_forward()), so a
// prefill and each following decode step can be forced with their own values.
bool force(const std::string& name, int64_t layer, Tensor& t);
void force_begin_forward();

}  // namespace deepinfer
