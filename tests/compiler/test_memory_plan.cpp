// The memory plan (compiler/passes/memory_plan.h) over small hand-written graphs: which
// values die where, which outputs take a dying input's memory or a graph input's, and the
// peak. No kernel is compiled: fuse() lowers, plan_memory only reads the schedule.
#include <algorithm>
#include <string>
#include <vector>

#include "compiler/fusion.h"
#include "compiler/passes/memory_plan.h"
#include "compiler_testing.h"
#include "core/ops/optim_ops.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;

namespace {

struct Planned {
  Graph graph;
  std::vector<ScheduleStep> steps;
  MemoryPlan plan;
};

Planned plan_of(const std::string& text) {
  Planned p{.graph = parse(text)};
  p.steps = fuse(p.graph);
  p.plan = plan_memory(p.graph, p.steps);
  INFO(print(p.graph));
  REQUIRE(p.plan.release_after.size() == p.steps.size());
  REQUIRE(p.plan.in_place_outputs.size() == p.steps.size());
  REQUIRE(p.plan.in_place_op.size() == p.steps.size());
  REQUIRE(p.plan.in_place_eager.size() == p.steps.size());
  REQUIRE(p.plan.reuse_input.size() == p.steps.size());
  return p;
}

// The step that computes value %n (the node numbered n in the text), or -1.
int step_of(const Planned& p, int32_t node) {
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const std::vector<int32_t>& nodes = p.steps[s].nodes;
    if (std::find(nodes.begin(), nodes.end(), node) != nodes.end()) return static_cast<int>(s);
  }
  return -1;
}

bool released_after(const Planned& p, int step, Value v) {
  const std::vector<Value>& dead = p.plan.release_after.at(static_cast<size_t>(step));
  return std::find(dead.begin(), dead.end(), v) != dead.end();
}

bool ever_released(const Planned& p, Value v) {
  for (size_t s = 0; s < p.steps.size(); ++s)
    if (released_after(p, static_cast<int>(s), v)) return true;
  return false;
}

constexpr int64_t kF32 = 4;

}  // namespace

TEST_CASE("memory plan: a pointwise kernel writes over the library result that dies there", "[memory_plan]") {
  // mm is an eager step, relu a kernel; mm's product is read by relu alone.
  const Planned p = plan_of(R"(
%0 = input "a" : f32[4,3]
%1 = input "b" : f32[3,5]
%2 = mm(%0, %1) : f32[4,5]
%3 = relu(%2) : f32[4,5]
return %3
)");
  REQUIRE(p.steps.size() == 2);
  const int relu = step_of(p, 3);
  REQUIRE(relu == 1);
  REQUIRE(p.steps[1].kind == ScheduleStep::pointwise);
  CHECK(released_after(p, relu, {2, 0}));
  CHECK(p.plan.reuse_input[1] == std::vector<int32_t>{0});  // over the kernel's input 0: %2
  CHECK(p.plan.in_place_outputs[1] == std::vector<int32_t>{-1});
  CHECK_FALSE(ever_released(p, {3, 0}));  // the output lives to the end
  CHECK(p.plan.peak_bytes == 4 * 5 * kF32);  // one buffer: relu's output is mm's
}

TEST_CASE("memory plan: no reuse of a value that is still live or returned", "[memory_plan]") {
  SECTION("read by a later step") {
    const Planned p = plan_of(R"(
%0 = input "a" : f32[4,3]
%1 = input "b" : f32[3,5]
%2 = mm(%0, %1) : f32[4,5]
%3 = relu(%2) : f32[4,5]
%4 = input "c" : f32[5,2]
%5 = mm(%2, %4) : f32[4,2]
return %3, %5
)");
    const int relu = step_of(p, 3), mm2 = step_of(p, 5);
    REQUIRE(relu >= 0);
    REQUIRE(mm2 > relu);
    CHECK(p.plan.reuse_input[static_cast<size_t>(relu)] == std::vector<int32_t>{-1});
    CHECK_FALSE(released_after(p, relu, {2, 0}));
    CHECK(released_after(p, mm2, {2, 0}));  // dies at its last reader
    CHECK(p.plan.peak_bytes == (4 * 5 + 4 * 5 + 4 * 2) * kF32);
  }
  SECTION("an output") {
    const Planned p = plan_of(R"(
%0 = input "a" : f32[4,3]
%1 = input "b" : f32[3,5]
%2 = mm(%0, %1) : f32[4,5]
%3 = relu(%2) : f32[4,5]
return %2, %3
)");
    CHECK(p.plan.reuse_input[static_cast<size_t>(step_of(p, 3))] == std::vector<int32_t>{-1});
    CHECK_FALSE(ever_released(p, {2, 0}));
    CHECK(p.plan.peak_bytes == 2 * 4 * 5 * kF32);
  }
  SECTION("of another type") {
    // (A cast of a GEMM's result would be the GEMM's own step: fusion.h, "eager".)
    const Planned p = plan_of(R"(
%0 = input "a" : f32[4,3]
%1 = log_softmax(%0) {dim=1} : f32[4,3]
%2 = cast(%1) {dtype=f64} : f64[4,3]
return %2
)");
    const int cast = step_of(p, 2);
    CHECK(p.plan.reuse_input[static_cast<size_t>(cast)] == std::vector<int32_t>{-1});
    CHECK(released_after(p, cast, {1, 0}));
  }
  SECTION("read through a view by the same kernel") {
    // relu(x) + x^T: x is read at other elements than the one written.
    const Planned p = plan_of(R"(
%0 = input "a" : f32[4,3]
%1 = input "b" : f32[3,4]
%2 = mm(%0, %1) : f32[4,4]
%3 = permute(%2) {dims=[1,0]} : f32[4,4]
%4 = relu(%2) : f32[4,4]
%5 = add(%4, %3) : f32[4,4]
return %5
)");
    const int add = step_of(p, 5);
    REQUIRE(add >= 0);
    REQUIRE(p.steps[static_cast<size_t>(add)].is_kernel());
    CHECK(p.plan.reuse_input[static_cast<size_t>(add)] == std::vector<int32_t>{-1});
  }
}

TEST_CASE("memory plan: a write-back is computed in place when the old value is not read after", "[memory_plan]") {
  SECTION("a kernel reading the input only at the element it writes") {
    const Planned p = plan_of(R"(
%0 = state "w" : f32[4,5]
%1 = input "g" : f32[4,5]
%2 = sub(%0, %1) : f32[4,5]
return
write %0 <- %2
)");
    REQUIRE(p.steps.size() == 1);
    CHECK(p.plan.in_place_outputs[0] == std::vector<int32_t>{0});  // into graph input 0, w
    CHECK(p.plan.reuse_input[0] == std::vector<int32_t>{-1});
    CHECK_FALSE(ever_released(p, {2, 0}));  // a written-back value is never released
    CHECK(p.plan.peak_bytes == 0);          // nothing allocated
  }
  SECTION("not when a later step reads the old value") {
    const Planned p = plan_of(R"(
%0 = state "w" : f32[4,5]
%1 = input "g" : f32[4,5]
%2 = sub(%0, %1) : f32[4,5]
%3 = input "x" : f32[5,2]
%4 = mm(%0, %3) : f32[4,2]
return %4
write %0 <- %2
)");
    const int sub = step_of(p, 2);
    REQUIRE(sub < step_of(p, 4));
    CHECK(p.plan.in_place_outputs[static_cast<size_t>(sub)] == std::vector<int32_t>{-1});
    CHECK(p.plan.peak_bytes == (4 * 5 + 4 * 2) * kF32);
  }
  SECTION("not when the kernel reads the input through a view") {
    const Planned p = plan_of(R"(
%0 = state "w" : f32[4,4]
%1 = permute(%0) {dims=[1,0]} : f32[4,4]
%2 = add(%0, %1) : f32[4,4]
return
write %0 <- %2
)");
    const int add = step_of(p, 2);
    CHECK(p.plan.in_place_outputs[static_cast<size_t>(add)] == std::vector<int32_t>{-1});
  }
  SECTION("not when the old value is returned") {
    const Planned p = plan_of(R"(
%0 = state "w" : f32[4,5]
%1 = input "g" : f32[4,5]
%2 = sub(%0, %1) : f32[4,5]
return %0
write %0 <- %2
)");
    CHECK(p.plan.in_place_outputs[0] == std::vector<int32_t>{-1});
  }
}

TEST_CASE("memory plan: an eager op writes its write-back into the input", "[memory_plan]") {
  SECTION("an input it does not read") {
    const Planned p = plan_of(R"(
%0 = state "p" : f32[4,5]
%1 = input "x" : f32[4,3]
%2 = input "w" : f32[3,5]
%3 = mm(%1, %2) : f32[4,5]
return
write %0 <- %3
)");
    REQUIRE(p.steps.size() == 1);
    CHECK(p.plan.in_place_eager[0] == 0);
    CHECK(p.plan.peak_bytes == 0);
  }
  SECTION("the accumulator it adds to, read by no other operand") {
    const Planned p = plan_of(R"(
%0 = state "grad" : f32[4,3]
%1 = input "g" : f32[4,5]
%2 = input "x" : f32[5,3]
%3 = addmm(%0, %1, %2) : f32[4,3]
return
write %0 <- %3
)");
    CHECK(p.plan.in_place_eager[0] == 0);
  }
  SECTION("not when another operand reads the accumulator") {
    const Planned p = plan_of(R"(
%0 = state "grad" : f32[3,3]
%1 = input "g" : f32[3,3]
%2 = addmm(%0, %1, %0) : f32[3,3]
return
write %0 <- %2
)");
    CHECK(p.plan.in_place_eager[0] == -1);
    CHECK(p.plan.peak_bytes == 3 * 3 * kF32);
  }
}

TEST_CASE("memory plan: an optimizer's pure update runs as its in-place twin", "[memory_plan]") {
  const Tensor lr = scalar_tensor(0.1, DType::f64), zero = scalar_tensor(0.0, DType::f64);
  const compiler::Trace t = compiler::trace(
      [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
        sgd_update_(a[0], a[1], Tensor(), SGDHyper{lr, zero, zero, zero}, {});
        return {};
      },
      {randn({4, 5}), randn({4, 5})});
  const std::vector<ScheduleStep> steps = fuse(t.graph);
  const MemoryPlan plan = plan_memory(t.graph, steps);
  INFO(print(t.graph));
  const auto update = std::find_if(steps.begin(), steps.end(), [](const ScheduleStep& s) { return !s.is_kernel(); });
  REQUIRE(update != steps.end());
  const auto s = static_cast<size_t>(update - steps.begin());
  REQUIRE(plan.in_place_op[s] != nullptr);
  CHECK(plan.in_place_op[s]->name == "sgd_update_");
  CHECK(plan.peak_bytes == 0);
}

TEST_CASE("memory plan: values die after their last reader, per output", "[memory_plan]") {
  // sort makes values and indices; only the indices are read on: the values die at sort
  // (node 1's output 0), not with the indices at the cast.
  const Planned p = plan_of(R"(
%0 = input "x" : f32[8]
%1, %2 = sort(%0) {dim=0, descending=false} : f32[8], i64[8]
%3 = cast(%2) {dtype=f32} : f32[8]
return %3
)");
  REQUIRE(p.steps.size() == 2);
  CHECK(released_after(p, 0, {1, 0}));
  CHECK(released_after(p, 1, {1, 1}));
  CHECK(p.plan.reuse_input[1] == std::vector<int32_t>{-1});  // i64 indices, f32 result
  CHECK(p.plan.peak_bytes == 8 * kF32 + 8 * 8);  // the values are gone when the cast allocates
}
