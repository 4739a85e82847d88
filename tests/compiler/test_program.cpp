// Fusion (compiler/fusion.h), Program (compiler/program.h) and kiln::compile running the
// generated program: replays equal eager, dumps, the kernel cache. Each distinct kernel costs
// ~0.5 s of g++, so the tests share few kernel structures.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include "compiler/codegen/cpp_jit.h"
#include "compiler/compile.h"
#include "compiler/fusion.h"
#include "compiler/passes/passes.h"
#include "compiler/program.h"
#include "compiler_testing.h"
#include "models/small_models.h"
#include "optim/sgd.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using Catch::Matchers::Contains;

namespace {

using kiln::testing::TempCache;

using Args = std::vector<Tensor>;


// The traced graph of fn(args), simplified as kiln::compile does.
Graph simplified_trace(const TracedFunction& fn, const Args& args) {
  const Trace t = trace(fn, args);
  return run_pipeline(t.graph, default_simplify_passes(), nullptr, false);
}

int64_t op_nodes(const Graph& g) {
  int64_t n = 0;
  for (const compiler::Node& node : g.nodes()) n += node.kind == NodeKind::op;
  return n;
}

// (x*w+b).relu()*2 - y
Args pointwise_fn(const Args& a) { return {relu(a[0] * a[1] + a[2]) * 2 - a[3]}; }

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs g's program on `inputs`: it writes the first input in place (its describe() names
// `op` and says so), keeping that tensor's memory, and leaves it equal to `expected`.
void check_in_place_run(const Graph& g, const std::string& op, const Args& inputs, const Tensor& expected,
                        double tol) {
  const Program program(g);
  const std::string text = program.describe();
  INFO(text);
  CHECK(text.find(op) != std::string::npos);
  CHECK(text.find("(in place into %") != std::string::npos);
  const Tensor target = inputs.at(0);
  void* const data = target.data_ptr();
  program.run(inputs);
  CHECK(target.data_ptr() == data);
  KILN_CHECK_CLOSE(target, expected, tol, tol);
}

}  // namespace

TEST_CASE("program fuses a pointwise chain into one kernel equal to eager in f32 and f64", "[program]") {
  TempCache cache;
  manual_seed(21);
  for (DType dtype : {DType::f32, DType::f64}) {
    INFO(fmt::format("{}", dtype));
    const double tol = dtype == DType::f32 ? 1e-6 : 1e-12;
    const TensorOptions o{.dtype = dtype};
    const Args args = {randn({4, 5}, o), randn({5}, o), randn({4, 1}, o), randn({4, 5}, o)};
    const Graph g = simplified_trace(pointwise_fn, args);
    const Program p(g);
    CHECK(p.num_kernels() == 1);
    CHECK(p.num_steps() < op_nodes(g));
    CHECK(p.steps().back().kind == ScheduleStep::pointwise);
    CHECK_THAT(p.describe(), Contains("pointwise") && Contains("k0_mul_add_relu"));
    CHECK_THAT(p.kernel_ir(0), Contains("kernel mul_add_relu"));
    CHECK_THAT(p.kernel_source(0), Contains("k_mul_add_relu"));
    const Args out = p.run(args);
    REQUIRE(out.size() == 1);
    KILN_CHECK_CLOSE(out[0], pointwise_fn(args)[0], tol, tol);

    // Through kiln::compile: the traced call and the replays equal eager.
    CompiledFunction f = compile(pointwise_fn);
    for (int call = 0; call < 3; ++call) {
      const Args fresh = {randn({4, 5}, o), randn({5}, o), randn({4, 1}, o), randn({4, 5}, o)};
      KILN_CHECK_CLOSE(f(fresh).at(0), pointwise_fn(fresh)[0], tol, tol);
    }
    CHECK(f.recompiles() == 0);
  }
}

TEST_CASE("program returns a copy of a folded constant, which later runs still read", "[program]") {
  // The program makes its constants once; a result that views one is the caller's to
  // change, and the next run still gives (and computes with) the constant.
  CompiledFunction f = compile([](const Args& a) -> Args {
    const Tensor three = full({}, 3.0);
    return {a[0] * 2 + three, three.unsqueeze(0)};
  });
  for (int call = 0; call < 4; ++call) {
    const Args r = f({ones({2})});
    INFO("call " << call);
    CHECK(testing::values(r[0]) == std::vector<double>{5, 5});
    CHECK(testing::values(r[1]) == std::vector<double>{3});
    Tensor(r[1]).add_(10);
  }
}

TEST_CASE("program fuses a pointwise prologue into the reduction after it", "[program]") {
  TempCache cache;
  manual_seed(22);
  auto fn = [](const Args& a) -> Args {
    const Tensor d = a[0] - a[1];
    return {sum(d * d, {1})};
  };
  const Args args = {randn({6, 7}, {.dtype = DType::f64}), randn({6, 7}, {.dtype = DType::f64})};
  const Graph g = simplified_trace(fn, args);
  const Program p(g);
  REQUIRE(p.num_kernels() == 1);
  CHECK(p.steps().size() == 1);
  CHECK(p.steps()[0].kind == ScheduleStep::reduction);
  CHECK(p.steps()[0].nodes.size() == 3);
  KILN_CHECK_CLOSE(p.run(args).at(0), fn(args)[0], 1e-12, 1e-12);

  // A prologue value also used elsewhere stays in a pointwise kernel before the reduction.
  auto shared = [](const Args& a) -> Args {
    const Tensor d = a[0] - a[1];
    return {sum(d * d, {1}), d};
  };
  const Program q(simplified_trace(shared, args));
  REQUIRE(q.steps().size() == 2);
  CHECK(q.steps()[0].kind == ScheduleStep::pointwise);
  CHECK(q.steps()[1].kind == ScheduleStep::reduction);
  const Args out = q.run(args), want = shared(args);
  KILN_CHECK_CLOSE(out.at(0), want[0], 1e-12, 1e-12);
  KILN_CHECK_CLOSE(out.at(1), want[1], 0.0, 0.0);
}

TEST_CASE("program of an MLP training step matches eager loss and grads over calls", "[program]") {
  TempCache cache;
  manual_seed(23);
  const TensorOptions f64{.dtype = DType::f64};
  models::MLP model({4, 8, 3}), reference({4, 8, 3});
  model.to(DType::f64);
  reference.to(DType::f64);
  kiln::testing::copy_parameters(model, reference);
  auto step_of = [](models::MLP& m) {
    return [&m](const Args& a) -> Args {
      Tensor loss = mse_loss(m(a[0]), a[1]);
      loss.backward();
      return {loss};
    };
  };
  CompiledFunction step = compile(step_of(model), {.trace = module_names(model)});
  auto eager = step_of(reference);
  // Grads: none (traced, grads cloned), kept (recompiled: added into in place), cleared
  // (the first program replays), kept (the second program replays with write-backs).
  const bool clear_before[] = {false, false, true, false};
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call);
    if (clear_before[call]) {
      model.zero_grad(true);
      reference.zero_grad(true);
    }
    const Tensor x = randn({6, 4}, f64), y = randn({6, 3}, f64);
    const Args out = step({x, y});
    KILN_CHECK_CLOSE(out.at(0), eager({x, y})[0], 1e-10, 1e-12);
    const auto params = model.named_parameters(), ref_params = reference.named_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      INFO(params[i].first);
      REQUIRE(params[i].second.grad().defined());
      CHECK(params[i].second.grad().is_contiguous());
      KILN_CHECK_CLOSE(params[i].second.grad(), ref_params[i].second.grad(), 1e-10, 1e-12);
    }
  }
  CHECK(step.recompiles() == 1);
  CHECK(step.cache_size() == 2);
}

TEST_CASE("program of SmallCNN forward in eval mode equals eager", "[program]") {
  TempCache cache;
  manual_seed(24);
  models::SmallCNN model;
  model.eval();
  auto forward = [&model](const Args& a) -> Args { return {model(a[0])}; };
  NoGradGuard no_grad;
  CompiledFunction f = compile(forward, {.trace = module_names(model)});
  for (int call = 0; call < 2; ++call) {
    const Tensor x = randn({2, 1, 28, 28});
    KILN_CHECK_CLOSE(f({x}).at(0), forward({x})[0], 1e-5, 1e-5);
  }
  CHECK(f.recompiles() == 0);
}

TEST_CASE("compile writes every stage to the dump folder and reuses cached kernels", "[program]") {
  TempCache cache;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kiln-test-program-dump-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  const Args args = {ones({3, 2}), ones({2}), ones({3, 1}), ones({3, 2})};
  CompiledFunction f = compile(pointwise_fn, {.dump_dir = dir});
  f(args);
  std::vector<std::string> stages;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    INFO(name);
    CHECK(!read_text(e.path()).empty());
    stages.push_back(name.substr(4));
  }
  std::sort(stages.begin(), stages.end());
  CHECK(stages == std::vector<std::string>{"fused.txt", "kernels.txt", "passes.txt", "simplified.ir", "source.cpp",
                                           "trace.ir"});
  std::filesystem::remove_all(dir);

  // The same function compiled again: the kernel comes from the cache, g++ does not run.
  const int64_t before = codegen::compiler_invocations();
  CompiledFunction again = compile(pointwise_fn);
  const Args out = again(args);
  KILN_CHECK_CLOSE(again(args).at(0), pointwise_fn(args)[0], 0.0, 0.0);
  CHECK(codegen::compiler_invocations() == before);

  // The interpreter backend, the reference, gives the same; unknown backends are refused.
  CompiledFunction reference = compile(pointwise_fn, {.backend = "interpreter"});
  reference(args);
  KILN_CHECK_CLOSE(reference(args).at(0), out[0], 0.0, 0.0);
  CHECK_THROWS_WITH(compile(pointwise_fn, {.backend = "cuda-graphs"}), Contains("unknown backend"));
}

TEST_CASE("fusion keeps eager ops and views as their own steps in node order", "[program]") {
  Graph g;
  const TensorType t{.dtype = DType::f32, .shape = {3, 4}};
  const Value x = g.add_input("x", t), w = g.add_input("w", TensorType{.dtype = DType::f32, .shape = {4, 4}});
  const Value a = g.add_op1("relu", {x});
  const Value wt = g.add_op1("permute", {w}, {{"dims", std::vector<int64_t>{1, 0}}});
  const Value b = g.add_op1("exp", {a});  // joins relu's run: the permute reads an input
  const Value m = g.add_op1("matmul", {b, wt});
  const Value c = g.add_op1("add", {m, a});
  g.set_outputs({c});
  const std::vector<ScheduleStep> steps = fuse(g);
  REQUIRE(steps.size() == 4);
  CHECK(steps[0].kind == ScheduleStep::view);
  CHECK(steps[1].kind == ScheduleStep::pointwise);
  CHECK(steps[1].nodes == std::vector<int32_t>{a.node, b.node});
  CHECK(steps[1].kernel.num_outputs() == 2);  // relu is read by the add after the matmul
  CHECK(steps[2].kind == ScheduleStep::eager);
  CHECK(steps[3].kind == ScheduleStep::pointwise);
}

TEST_CASE("program computes write-backs in place when no later step reads the old value", "[program]") {
  TempCache cache;
  auto update = [](const Args& a) -> Args {
    Tensor p = a[0];
    p.sub_(a[1] * 0.5);  // reads p at the element it writes: in place
    return {};
  };
  auto update_transposed = [](const Args& a) -> Args {
    Tensor p = a[0];
    p.sub_(a[1] * p.t());  // reads other elements of p: a fresh output, then the copy
    return {};
  };
  for (bool transposed : {false, true}) {
    INFO((transposed ? "transposed read" : "elementwise read"));
    const TracedFunction fn = transposed ? TracedFunction(update_transposed) : TracedFunction(update);
    const Tensor p0 = randn({6, 6}), g = randn({6, 6});
    const Program program(simplified_trace(fn, {p0.clone(), g}));
    const std::string text = program.describe();
    INFO(text);
    CHECK((text.find("in place into") != std::string::npos) == !transposed);
    Tensor p = p0.clone();
    void* const data = p.data_ptr();
    program.run({p, g});
    Tensor expected = p0.clone();
    fn({expected, g});
    CHECK(p.data_ptr() == data);
    KILN_CHECK_EQUAL(p, expected);
  }
}

TEST_CASE("program lets an eager op write its written-back result into the input", "[program]") {
  TempCache cache;
  auto fn = [](const Args& a) -> Args {
    Tensor p = a[0];
    p.copy_(mm(a[1], a[2]));  // p's old value is never read: mm writes into p
    return {};
  };
  const Tensor p0 = randn({4, 5}), x = randn({4, 3}), w = randn({3, 5});
  check_in_place_run(simplified_trace(fn, {p0.clone(), x, w}), "mm %", {p0.clone(), x, w}, mm(x, w), 1e-6);
}

TEST_CASE("program accumulates a product into the input it is written back to, in the GEMM", "[program]") {
  TempCache cache;
  auto accumulate = [](const Args& a) -> Args {
    Tensor p = a[0];
    p.add_(mm(a[1], a[2]));  // grad += g: addmm(p, x, w) writing p in place
    return {};
  };
  auto reads_target = [](const Args& a) -> Args {
    Tensor p = a[0];
    p.add_(mm(p, a[2]));  // the product reads p itself: addmm into a fresh output, then the copy
    return {};
  };
  for (bool operand_reads_target : {false, true}) {
    INFO((operand_reads_target ? "an operand reads the target" : "accumulation"));
    const TracedFunction fn = operand_reads_target ? TracedFunction(reads_target) : TracedFunction(accumulate);
    const Tensor p0 = randn({4, 4}), x = randn({4, 6}), w = randn({operand_reads_target ? 4 : 6, 4});
    const Graph g = run_pipeline(trace(fn, {p0.clone(), x, w}).graph, default_compile_passes(), nullptr, false);
    CHECK(kiln::testing::count_ops(g, "addmm") == 1);
    CHECK(kiln::testing::count_ops(g, "add") == 0);
    const Program program(g);
    const std::string text = program.describe();
    INFO(text);
    CHECK((text.find("(in place into %") != std::string::npos) == !operand_reads_target);
    Tensor p = p0.clone();
    void* const data = p.data_ptr();
    program.run({p, x, w});
    CHECK(p.data_ptr() == data);
    Tensor expected = p0.clone();
    fn({expected, x, w});
    KILN_CHECK_CLOSE(p, expected, 1e-6, 1e-6);  // the GEMM adds p among its sums: rounding
  }
}

TEST_CASE("program accumulates a convolution's weight gradient into the gradient in place", "[program]") {
  TempCache cache;
  auto accumulate = [](const Args& a) -> Args {
    Tensor grad = a[0];
    grad.add_(conv2d_backward_weight(a[1], a[2], grad.shape(), {.padding = {1, 1}}));
    return {};
  };
  const Tensor grad0 = randn({4, 3, 3, 3}), dy = randn({2, 4, 5, 5}), x = randn({2, 3, 5, 5});
  const Graph g = run_pipeline(trace(accumulate, {grad0.clone(), dy, x}).graph, default_compile_passes(), nullptr, false);
  CHECK(kiln::testing::count_ops(g, "add") == 0);
  Tensor expected = grad0.clone();
  accumulate({expected, dy, x});
  // The sum starts from the gradient: rounding.
  check_in_place_run(g, "conv2d_backward_weight", {grad0.clone(), dy, x}, expected, 1e-5);
}

TEST_CASE("compile leaves x + mm alone when the product broadcasts or the add promotes", "[program]") {
  TempCache cache;
  auto fn = [](const Args& a) -> Args { return {a[0] + mm(a[1], a[2]), a[3] + mm(a[4], a[2])}; };
  const Args args{randn({4, 3}, {.dtype = DType::f64}), randn({4, 5}), randn({5, 3}), randn({4, 3}), randn({1, 5})};
  CompiledFunction compiled = compile(fn);
  compiled(args);  // traces and compiles (the pass used to throw here)
  const Args got = compiled(args), want = fn(args);  // replays the program
  CHECK(got[0].dtype() == DType::f64);
  KILN_CHECK_CLOSE(got[0], want[0], 1e-6, 1e-6);
  KILN_CHECK_CLOSE(got[1], want[1], 1e-6, 1e-6);
}

TEST_CASE("a compiled Linear step accumulates its weight gradient in the GEMM", "[program]") {
  TempCache cache;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kiln-test-accumulate-dump-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  manual_seed(3);
  Tensor w = randn({5, 8}).requires_grad_(), b = randn({5}).requires_grad_();
  auto step = [&](const Args& a) -> Args {
    const Tensor y = addmm(b, a[0], w.t());
    Tensor loss = mean(y * y);
    loss.backward();
    return {loss.detach()};
  };
  CompiledFunction compiled = compile(step, {.dump_dir = dir});
  const Tensor x1 = randn({3, 8}), x2 = randn({3, 8});
  compiled({x1});  // .grad undefined: the first micro-step
  compiled({x2});  // .grad defined: the second accumulates
  const Tensor gw = w.grad().clone(), gb = b.grad().clone();
  w.set_grad(Tensor());
  b.set_grad(Tensor());
  step({x1});
  step({x2});
  KILN_CHECK_CLOSE(gw, w.grad(), 1e-6, 1e-6);
  KILN_CHECK_CLOSE(gb, b.grad(), 1e-6, 1e-6);
  bool accumulated_in_gemm = false;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 9 && name.substr(name.size() - 9) == "fused.txt") {
      const std::string text = read_text(e.path());
      accumulated_in_gemm |= text.find("addmm") != std::string::npos && text.find("in place into") != std::string::npos;
    }
  }
  CHECK(accumulated_in_gemm);
  std::filesystem::remove_all(dir);
}

TEST_CASE("program runs an optimizer's pure update in place through its in-place twin", "[program]") {
  TempCache cache;
  Tensor w = randn({5, 4}).requires_grad_(), b = randn({4}).requires_grad_();
  optim::SGD sgd({w, b}, {.lr = 0.1, .momentum = 0.9});
  const Tensor x = randn({3, 5});
  auto step = [&](const Args& a) -> Args {
    sgd.zero_grad();
    sum(relu(addmm(b, a[0], w))).backward();
    sgd.step();
    return {};
  };
  step({x});  // the first step creates the momentum buffers eagerly
  const Graph g = simplified_trace(step, {x});
  const Program program(g);
  const std::string text = program.describe();
  INFO(text);
  // w and b are one group: one multi-tensor update.
  CHECK(text.find("(in place: sgd_update_multi_)") != std::string::npos);
}

TEST_CASE("program drops each output of a node after its own last use", "[program]") {
  // sort makes values and indices; only the indices are returned. The values (4 MiB) must
  // go when nothing reads them, not live on beside the indices until the end of the run.
  TempCache cache;
  auto fn = [](const Args& a) -> Args {
    const auto [values, indices] = sort(a[0], 1);
    return {indices, a[0] * 2};  // the product's 4 MiB come after the sort
  };
  const Tensor x = randn({1024, 1024});
  const Program program(simplified_trace(fn, {x}));
  const int64_t before = memory_stats(DeviceType::cpu).allocated;
  reset_peak_memory(DeviceType::cpu);
  Args out = program.run({x});
  const int64_t peak = memory_stats(DeviceType::cpu).peak - before;
  const int64_t mib = 1 << 20;
  // Live at once at most: the sort's values and indices (4 + 8 MiB, plus the sort's own
  // scratch), then the indices and the product (8 + 4 MiB). Held per node, the values would
  // stay alive beside the product: 16 MiB.
  INFO("peak above the inputs: " << peak << " bytes");
  CHECK(peak < 14 * mib);
  CHECK(program.planned_peak_bytes() == 12 * mib);  // the plan knows it: 4 + 8, then 8 + 4
  REQUIRE(out.size() == 2);
  KILN_CHECK_EQUAL(out[0], sort(x, 1).second);
  KILN_CHECK_EQUAL(out[1], x * 2);
}

TEST_CASE("program writes a kernel's output over an input value that dies there", "[program]") {
  TempCache cache;
  const Tensor x = randn({1024, 64}), w = randn({64, 1024});
  const int64_t mib = 1 << 20;
  {
    // mm's product (4 MiB) dies at the kernel, which reads it where it writes: one buffer.
    auto fn = [](const Args& a) -> Args { return {relu(mm(a[0], a[1])) + 1}; };
    const Program program(simplified_trace(fn, {x, w}));
    INFO(program.describe());
    CHECK(program.describe().find("(over %") != std::string::npos);
    const int64_t before = memory_stats(DeviceType::cpu).allocated;
    reset_peak_memory(DeviceType::cpu);
    Args out = program.run({x, w});
    CHECK(memory_stats(DeviceType::cpu).peak - before < 5 * mib);
    CHECK(program.planned_peak_bytes() == 4 * mib);
    KILN_CHECK_EQUAL(out.at(0), relu(mm(x, w)) + 1);
  }
  // The product is also returned, or viewed by a returned tensor: it keeps its memory.
  auto returned = [](const Args& a) -> Args {
    Tensor t = mm(a[0], a[1]);
    return {relu(t) + 1, t};
  };
  auto viewed = [](const Args& a) -> Args {
    Tensor t = mm(a[0], a[1]);
    Tensor v = t.t();
    return {relu(t) + 1, v};
  };
  for (const TracedFunction& fn : {TracedFunction(returned), TracedFunction(viewed)}) {
    const Program program(simplified_trace(fn, {x, w}));
    INFO(program.describe());
    const Args out = program.run({x, w});
    const Args expected = fn({x, w});
    REQUIRE(out.size() == 2);
    KILN_CHECK_EQUAL(out[0], expected[0]);
    KILN_CHECK_EQUAL(out[1], expected[1]);
    CHECK(out[0].data_ptr() != out[1].data_ptr());
  }
}

TEST_CASE("a compiled training step takes no memory from the system after its first calls", "[program]") {
  // The program's buffers follow the memory plan (released at their last use, reused in
  // place); the allocator keeps freed blocks by size class, so from the second call on
  // every buffer the step needs comes from memory the first calls gave back.
  TempCache cache;
  manual_seed(24);
  models::SmallCNN model({.in_channels = 3, .num_classes = 10, .image_size = 16});
  optim::SGD sgd(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  const Tensor x = randn({4, 3, 16, 16}), y = randint(0, 10, {4});
  auto train_step = [&](const Args& a) -> Args {
    sgd.zero_grad(/*set_to_none=*/false);
    Tensor loss = cross_entropy(model(a[0]), a[1]);
    loss.backward();
    sgd.step();
    return {loss.detach()};
  };
  train_step({x, y});  // the optimizer's first step creates its state: eagerly
  CompiledFunction step = compile(train_step, {.trace = module_names(model)});
  empty_cpu_cache();  // what other tests left cached could be at the cache's limit
  for (int i = 0; i < 2; ++i) step({x, y});
  const int64_t before = cpu_system_allocations();
  const MemoryStats stats_before = memory_stats();
  for (int i = 0; i < 3; ++i) (void)step({x, y})[0].item<double>();
  CHECK(cpu_system_allocations() == before);
  CHECK(memory_stats().allocations > stats_before.allocations);  // it did allocate, from the cache
  CHECK(step.cache_size() == 1);
}
