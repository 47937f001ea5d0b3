// A sampler row's owned inputs for the tests (test_sampler.cpp, test_sample_rows.cpp): SampleInput only points
// at its params, token histories and mask, so the test row keeps them alive and builds the SampleInput on demand.
#pragma once

#include <cstdint>
#include <vector>

#include "sampling/sampler.h"

namespace deepinfer {

struct SampleRowInputs {
  SamplingParams p;
  std::vector<int32_t> prompt, output;
  std::vector<uint32_t> mask;  // empty: no mask
  int32_t eos = -1;
  SampleInput input(const float* logits, int64_t vocab, uint64_t seed, int64_t position) const {
    SampleInput in;
    in.logits = logits;
    in.vocab = vocab;
    in.params = &p;
    in.seed = seed;
    in.position = position;
    in.prompt_ids = &prompt;
    in.output_ids = &output;
    in.eos_id = eos;
    in.allowed_mask = mask.empty() ? nullptr : &mask;
    return in;
  }
};

}  // namespace deepinfer
