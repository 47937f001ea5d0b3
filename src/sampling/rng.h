// Counter-based random numbers for sampling: Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel
// random numbers: as easy as 1, 2, 3", SC'11; the Random123 library's philox4x32 with 10 rounds),
// written from its published definition and checked against Random123's known-answer vectors
// (tests/cpp/test_sampler.cpp, Philox.*).
//
// A draw is a pure function of (key, counter): no state, so a value never depends on what was drawn
// before, on the batch, on the thread, or on the calling order. Sampling keys it with the sequence's
// 64-bit seed and builds the counter from (output position, draw index).
#pragma once

#include <array>
#include <cstdint>

namespace deepinfer {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// The Philox4x32 bijection with `rounds` rounds (10 is the standard, crush-resistant variant).
PhiloxCounter philox4x32(PhiloxCounter ctr, PhiloxKey key, int rounds = 10);

// Philox4x32-10 keyed by `seed` (key = {low 32 bits, high 32 bits}) at counter
// {position low, position high, draw low, draw high}: four independent uniform 32-bit words.
PhiloxCounter philox_draw(uint64_t seed, uint64_t position, uint64_t draw);

// A 32-bit word mapped to a uniform double strictly inside (0, 1): (x + 0.5) / 2^32 (exact in double).
inline double u32_to_open01(uint32_t x) { return (static_cast<double>(x) + 0.5) * 0x1p-32; }

// splitmix64's finaliser (Steele, Lea, Flood 2014): a fixed 64-bit bijective mix.
inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace deepinfer
