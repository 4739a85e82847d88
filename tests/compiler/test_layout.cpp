// Layouts in the compiler: generated kernels over channels_last values walk memory in order,
// the program allocates the layout the graph says, and the layout pass
// (compiler/passes/layout.cpp) runs a CNN's convolution region channels-last with the values
// eager code gives.
#include "compiler/codegen/lower.h"
#include "compiler/compile.h"
#include "compiler/passes/passes.h"
#include "compiler/program.h"
#include "compiler_testing.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using kiln::testing::TempCache;

namespace {

// y = relu(x * s + b) over a channels_last x, as IR text.
constexpr const char* kChannelsLastPointwise = R"(%0 = input "x" : f32[2,3,4,5] nhwc
%1 = input "s" : f32[1,3,1,1]
%2 = input "b" : f32[2,3,4,5] nhwc
%3 = mul(%0, %1) : f32[2,3,4,5] nhwc
%4 = add(%3, %2) : f32[2,3,4,5] nhwc
%5 = relu(%4) : f32[2,3,4,5] nhwc
return %5
)";

}  // namespace

TEST_CASE("a channels_last pointwise kernel walks N H W C with C innermost", "[layout][codegen]") {
  const Graph g = parse(kChannelsLastPointwise);
  const codegen::Kernel k = codegen::lower_pointwise(g, {3, 4, 5});
  REQUIRE(k.rank == 4);
  CHECK(k.shape == Shape{2, 4, 5, 3});
  CHECK(k.buffers[0].output);
  CHECK(k.buffers[0].dim_of == std::vector<int32_t>{0, 2, 3, 1});
  // The per-channel operand walks only C, the innermost loop.
  for (const codegen::Buffer& b : k.buffers)
    if (b.node == 1) CHECK(b.dim_of == std::vector<int32_t>{-1, -1, -1, 1});
}

TEST_CASE("the program allocates channels_last outputs and computes eager's values", "[layout][program]") {
  TempCache cache;
  manual_seed(3);
  const Program p(parse(kChannelsLastPointwise));
  const Tensor x = randn({2, 3, 4, 5}), s = randn({1, 3, 1, 1}), b = randn({2, 3, 4, 5});
  const Tensor xn = x.contiguous(MemoryFormat::channels_last), bn = b.contiguous(MemoryFormat::channels_last);
  const Tensor y = p.run({xn, s, bn}).at(0);
  CHECK(y.suggest_memory_format() == MemoryFormat::channels_last);
  KILN_CHECK_CLOSE(y, relu(x * s + b), 1e-6, 0);
  // Other strides than the graph's still give the right values (layouts are a speed hint).
  KILN_CHECK_CLOSE(p.run({x, s, b}).at(0), relu(x * s + b), 1e-6, 0);
}

TEST_CASE("the layout pass leaves graphs without convolutions alone", "[layout][passes]") {
  const Graph g = parse(kChannelsLastPointwise);
  CHECK(print(channels_last(g)) == print(g));
  const Graph mlp = parse(R"(%0 = input "x" : f32[4,8]
%1 = relu(%0) : f32[4,8]
return %1
)");
  CHECK(print(choose_layout(mlp, LayoutPolicy::channels_last)) == print(mlp));
}
