#pragma once
// What the compiler's transformer tests share: the small GPT-2 they trace (60 tokens, width
// 32, 4 heads, 16 positions, tiny's layers), and compiled-against-eager steps of f64 models
// compared to a relative tolerance.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "compiler_testing.h"
#include "core/generator.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "models/gpt2.h"

namespace kiln::testing {

inline models::GPT2Config small_gpt2() {
  models::GPT2Config c = models::GPT2Config::tiny(/*vocab_size=*/60);
  c.n_embd = 32;
  c.n_head = 4;
  c.n_positions = 16;
  return c;
}

// Makes the language model of `c`, its parameters drawn after manual_seed(seed): the same
// model at every call.
inline std::function<models::GPT2LMHeadModel()> make_gpt2(const models::GPT2Config& c, uint64_t seed) {
  return [c, seed] {
    manual_seed(seed);
    return models::GPT2LMHeadModel(c);
  };
}

// compare_steps on f64 models (built by `make`, then converted), compiled with `options`:
// every output and parameter within rtol of the largest magnitude of its eager twin, and of
// at least 1e-2 (the attention's key bias gets a gradient that is zero but for rounding:
// softmax ignores a shift common to a row's scores, so its values after a step are rounding
// noise on both sides).
template <class Model>
compiler::CompiledFunction check_step_close(
    const std::function<Model()>& make,
    const std::function<std::vector<Tensor>(Model&, const std::vector<Tensor>&)>& outputs_of,
    const std::vector<Tensor>& args, double rtol, compiler::CompileOptions options = {}) {
  const std::function<Model()> make_f64 = [make] {
    Model m = make();
    m.to(DType::f64);
    return m;
  };
  const auto close = [rtol](const Tensor& got, const Tensor& want) {
    const double scale = std::max(1e-2, amax(abs(want.to(DType::f64))).item<double>());
    return allclose(got, want, 0, rtol * scale);
  };
  return compare_steps<Model>(make_f64, outputs_of, args, std::move(options), close);
}

}  // namespace kiln::testing
