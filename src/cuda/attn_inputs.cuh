// CUDA attention inputs: the contract of ops::attn_input_norms in src/ops/ops.h on tensors that live on kCUDA.
#pragma once

#include <cstdint>

#include "deepinfer/tensor.h"
#include "ops/ops.h"

namespace deepinfer::cuda {

// qr = rms_norm(qa, q_w) and kv = rms_norm(kva, kv_w) (rms_norm.cuh), then apply_rope(kv, kv's width, rope_dim,
// positions, f) (rope.cuh) and, when quant_block > 0, fake_quant_fp8(kv, 0, quant_end, quant_block) (quant.cuh):
// one kernel (a block per (row, half)) with the bits of those ops where both rows take rms_norm's register-held
// kernel (width % 4 == 0, <= 8,192, 16-byte aligned rows); those ops otherwise. qa [T, q_lora], kva [T, D]:
// float32 on kCUDA with dense rows (column slices of one wider output work); weights BF16 / F32 or undefined.
// positions: T host values. Returns new contiguous tensors. Asynchronous on the default stream.
ops::AttnInputs attn_input_norms(const Tensor& qa, const Tensor& q_w, const Tensor& kva, const Tensor& kv_w, float eps,
                                 bool round, int64_t rope_dim, const int64_t* positions, const ops::RopeFreqs& f,
                                 int64_t quant_end, int64_t quant_block);

}  // namespace deepinfer::cuda
