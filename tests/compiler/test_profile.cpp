// CompiledFunction::profile: where a compiled replay's time goes.
#include "compiler/compile.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/linalg.h"
#include "testing.h"

using namespace kiln;

TEST_CASE("profile lists the kernels and library ops of a compiled function", "[profile]") {
  manual_seed(0);
  Tensor w = randn({8, 8});
  compiler::CompiledFunction f = compiler::compile(
      [&](const std::vector<Tensor>& a) -> std::vector<Tensor> { return {relu(matmul(a[0], w) * 2 + 1)}; },
      {.profile = true});
  const Tensor x = randn({4, 8});
  f({x});  // the first call traces; replays are profiled
  f({x});
  CHECK_THAT(f.profile(), Catch::Contains("(1 run)"));
  // From the second replay on, the first one's times (page faults, first library calls) are
  // left out.
  f({x});
  f({x});
  const std::string table = f.profile();
  INFO(table);
  CHECK_THAT(table, Catch::Contains("eager matmul"));
  CHECK_THAT(table, Catch::Contains("kernel "));
  CHECK_THAT(table, Catch::Contains("(2 runs after the first)"));

  compiler::CompiledFunction quiet = compiler::compile(
      [&](const std::vector<Tensor>& a) -> std::vector<Tensor> { return {relu(a[0])}; });
  quiet({x});
  quiet({x});
  CHECK_THAT(quiet.profile(), Catch::Contains("no profiled runs"));
}
