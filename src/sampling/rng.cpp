#include "sampling/rng.h"

namespace deepinfer {

namespace {
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // multipliers
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // Weyl key increments (golden ratio, sqrt(3) - 1)
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
}  // namespace

PhiloxCounter philox4x32(PhiloxCounter c, PhiloxKey k, int rounds) {
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) {  // the key schedule bumps the key before every round but the first
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

PhiloxCounter philox_draw(uint64_t seed, uint64_t position, uint64_t draw) {
  const PhiloxCounter ctr = {static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32),
                             static_cast<uint32_t>(draw), static_cast<uint32_t>(draw >> 32)};
  const PhiloxKey key = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  return philox4x32(ctr, key, 10);
}

}  // namespace deepinfer
