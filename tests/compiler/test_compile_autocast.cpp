// Autocast's state is part of a compiled function's guards: the casts it adds are ops of
// the traced graph, so a call under another autocast state traces again.
#include "compiler/compile.h"
#include "core/autocast.h"
#include "testing.h"

using namespace kiln;
using Catch::Matchers::Contains;
using Args = std::vector<Tensor>;

TEST_CASE("compile guards on autocast and matches eager autocast", "[compile][autocast]") {
  manual_seed(3);
  const Tensor x = randn({4, 8}), w = randn({8, 5});
  auto fn = [](const Args& a) -> Args { return {relu(mm(a[0], a[1]))}; };
  CompiledFunction f = compile(fn, {.fullgraph = true});
  CHECK(f({x, w})[0].dtype() == DType::f32);
  Tensor compiled, eager;
  {
    autocast amp;
    compiled = f({x, w})[0];
    eager = fn({x, w})[0];
  }
  CHECK(f.recompiles() == 1);
  CHECK_THAT(f.last_recompile_reason(), Contains("autocast changed from off to bf16 on cpu"));
  REQUIRE(compiled.dtype() == DType::bf16);
  // The same casts, the same bf16 product (f32 accumulation either way), the same relu.
  KILN_CHECK_EQUAL(compiled.to(DType::f32), eager.to(DType::f32));
  int casts = 0;
  for (const compiler::Node& n : f.traces().at(1)->graph.nodes()) casts += n.op == "cast";
  CHECK(casts == 2);
  // Back outside the scope: the first graph again, no third trace.
  CHECK(f({x, w})[0].dtype() == DType::f32);
  CHECK(f.recompiles() == 1);
}
