#include "data/sample_rng.h"

#include "core/philox.h"

namespace kiln::data {

// The key mixes the three numbers through Philox itself, so that nearby (epoch, index)
// pairs get unrelated streams.
SampleRng::SampleRng(uint64_t seed, uint64_t epoch, uint64_t index)
    : key_(philox::bits64(philox::random4(seed ^ 0x6b696c6e64617461ull, (epoch << 40) ^ index))) {}

uint64_t SampleRng::bits() { return philox::bits64(philox::random4(key_, counter_++)); }

double SampleRng::uniform() { return static_cast<double>(bits() >> 11) * 0x1.0p-53; }

uint64_t SampleRng::below(uint64_t n) {
  // Rejection sampling keeps every value equally likely.
  const uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % n);
  uint64_t r;
  do r = bits();
  while (r >= limit);
  return r % n;
}

}  // namespace kiln::data
