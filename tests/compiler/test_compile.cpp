// kiln::compile and kiln::explain (compiler/compile.h): guards, the cache, grad effects,
// graph breaks, dumps.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include "compiler/compile.h"
#include "compiler_testing.h"
#include "models/small_models.h"
#include "optim/sgd.h"
#include "testing.h"

using namespace kiln;
using Catch::Matchers::Contains;

namespace {

using Args = std::vector<Tensor>;


const TensorOptions f64{.dtype = DType::f64};

}  // namespace

TEST_CASE("compile reads 0-d hyperparameters as graph inputs without recompiling", "[compile]") {
  manual_seed(11);
  Tensor lr = full({}, 0.1, f64);
  auto fn = [&](const Args& a) -> Args { return {a[0] - lr * a[1]}; };
  CompiledFunction step = compile(fn);
  for (int i = 0; i < 4; ++i) {
    lr.fill_(0.1 * (i + 1));
    const Tensor w = randn({5}, f64), g = randn({5}, f64);
    const Args out = step({w, g});
    REQUIRE(out.size() == 1);
    KILN_CHECK_CLOSE(out[0], w - g * (0.1 * (i + 1)), 1e-15, 1e-15);
  }
  CHECK(step.recompiles() == 0);
  CHECK(step.cache_size() == 1);
  CHECK(step.calls() == 4);
  const compiler::Graph& g = step.traces().at(0)->graph;
  REQUIRE(g.inputs().size() == 3);
  CHECK(g.node(g.inputs()[2]).role == compiler::InputRole::scalar);
}

TEST_CASE("compile replays write-backs into captured state", "[compile]") {
  const Tensor total = zeros({3});
  auto fn = [&](const Args& a) -> Args {
    Tensor t = total;
    t.add_(a[0]);
    return {t * 2, t};
  };
  CompiledFunction accumulate = compile(fn);
  for (int i = 1; i <= 3; ++i) {
    const Args out = accumulate({full({3}, static_cast<float>(i))});
    KILN_CHECK_EQUAL(out.at(0), full({3}, static_cast<float>(i * (i + 1))));
    CHECK(out.at(1).same(total));  // the in-place result is the tensor itself, as eagerly
  }
  KILN_CHECK_EQUAL(total, full({3}, 6.0f));
  CHECK(accumulate.recompiles() == 0);
}

TEST_CASE("compile of an MLP step matches eager loss and grads with grad effects", "[compile]") {
  manual_seed(12);
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

  // Grads: none -> traced (clones); kept -> recompiled (adds in place); cleared -> replay of
  // the first graph; kept -> replay of the second; cleared -> first again.
  const bool clear_before[] = {false, false, true, false, true};
  for (int call = 0; call < 5; ++call) {
    INFO("call " << call);
    if (clear_before[call]) {
      model.zero_grad(true);
      reference.zero_grad(true);
    }
    const Tensor x = randn({6, 4}, f64), y = randn({6, 3}, f64);
    const Args out = step({x, y});
    const Tensor loss = eager({x, y})[0];
    REQUIRE(out.size() == 1);
    KILN_CHECK_CLOSE(out[0], loss, 1e-12, 1e-12);
    const auto params = model.named_parameters(), ref_params = reference.named_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      INFO(params[i].first);
      REQUIRE(params[i].second.grad().defined());
      KILN_CHECK_CLOSE(params[i].second.grad(), ref_params[i].second.grad(), 1e-12, 1e-12);
    }
  }
  CHECK(step.calls() == 5);
  CHECK(step.recompiles() == 1);
  CHECK(step.cache_size() == 2);
  CHECK_THAT(step.last_recompile_reason(),
             Contains("0.weight's .grad changed from undefined to defined"));
  const std::vector<const compiler::Trace*> traces = step.traces();
  CHECK(traces[0]->grad_effects.size() == 4);
  CHECK(traces[0]->graph.write_backs().empty());
  CHECK(traces[1]->grad_effects.empty());
  CHECK(traces[1]->graph.write_backs().size() == 4);

  const std::string report = explain(step_of(model), {randn({6, 4}, f64), randn({6, 3}, f64)},
                                     {.trace = module_names(model)});
  CHECK_THAT(report, Contains("1 graph, 0 graph breaks") && Contains("param \"0.weight\" f64[8,4]") &&
                         Contains("write-backs: 4") && Contains("mse_loss_backward"));
}

TEST_CASE("compile adds into the gradient its leaf holds at each call", "[compile]") {
  Tensor w = ones({3});
  w.requires_grad_();
  auto fn = [&](const Args& a) -> Args {
    sum(w * a[0]).backward();
    return {w.grad() * 1};
  };
  CompiledFunction f = compile(fn);
  const Tensor x = full({3}, 2.0f);
  f({x});                    // traced: .grad undefined, a clone
  KILN_CHECK_EQUAL(f({x})[0], full({3}, 4.0f));  // traced: added in place
  w.set_grad(full({3}, 10.0f));
  const Tensor before = w.grad();
  KILN_CHECK_EQUAL(f({x})[0], full({3}, 12.0f));  // replayed into the new .grad
  CHECK(w.grad().same(before));
  KILN_CHECK_EQUAL(w.grad(), full({3}, 12.0f));
  w.set_grad({});
  f({x});                    // replayed: a new .grad
  KILN_CHECK_EQUAL(w.grad(), x);
  CHECK(f.recompiles() == 1);
}

TEST_CASE("compile recompiles on a shape change and warns past the limit", "[compile]") {
  auto fn = [](const Args& a) -> Args { return {a[0] * 2 + 1}; };
  CompiledFunction f = compile(fn, {.recompile_limit = 1});
  KILN_CHECK_EQUAL(f({ones({8, 3})})[0], full({8, 3}, 3.0f));
  KILN_CHECK_EQUAL(f({ones({9, 3})})[0], full({9, 3}, 3.0f));
  CHECK(f.recompiles() == 1);
  CHECK(f.cache_size() == 2);
  CHECK(f.last_recompile_reason() == "arg0's shape changed from [8,3] to [9,3]");
  CHECK(f.warning().empty());
  KILN_CHECK_EQUAL(f({zeros({8, 3})})[0], full({8, 3}, 1.0f));  // cached
  CHECK(f.recompiles() == 1);
  f({ones({10, 3})});
  CHECK(f.warning() == "kiln::compile: recompiled 2 times; last because arg0's shape changed "
                       "from [9,3] to [10,3]");
  f({ones({10, 3}, {.dtype = DType::f64})});
  CHECK(f.last_recompile_reason() == "arg0's dtype changed from f32 to f64");
  CHECK(f.warning() == "kiln::compile: recompiled 2 times; last because arg0's shape changed "
                       "from [9,3] to [10,3]");  // printed once
  f({ones({3, 8}).t()});
  CHECK(f.last_recompile_reason() == "arg0's layout changed from contiguous to non-contiguous");
  CHECK(f.cache_size() == 5);
}

TEST_CASE("compile recompiles when grad mode changes", "[compile]") {
  manual_seed(13);
  Tensor w = randn({3});
  w.requires_grad_();
  auto fn = [&](const Args& a) -> Args { return {relu(a[0] * w)}; };
  CompiledFunction f = compile(fn);
  const Tensor x = randn({3});
  const Tensor with_grad = f({x})[0];
  Tensor without_grad;
  {
    NoGradGuard no_grad;
    without_grad = f({x})[0];
  }
  CHECK(f.recompiles() == 1);
  CHECK(f.last_recompile_reason() == "grad mode changed from enabled to disabled");
  KILN_CHECK_EQUAL(with_grad.detach(), without_grad);
  f({x});
  CHECK(f.recompiles() == 1);
}

TEST_CASE("compile with fullgraph throws the refusal naming the op", "[compile]") {
  Generator other(3);  // random ops are traced only from the default generator
  auto fn = [&](const Args& a) -> Args { return {dropout(a[0], 0.5, true, &other)}; };
  CompiledFunction f = compile(fn, {.fullgraph = true});
  CHECK_THROWS_WITH(f({ones({4, 4})}), Contains("dropout") && Contains("random"));
  CHECK(f.cache_size() == 0);
}

TEST_CASE("compile falls back to eager code at a graph break", "[compile]") {
  manual_seed(14);
  int runs = 0;
  Generator other(15);  // random ops are traced only from the default generator
  auto fn = [&](const Args& a) -> Args {
    ++runs;
    return {dropout(relu(a[0] * 2), 0.5, true, &other) * 3};
  };
  CompiledFunction f = compile(fn);
  const Tensor x = randn({16});
  for (int call = 1; call <= 3; ++call) {
    const Tensor out = f({x})[0];
    CHECK(runs == call);  // fn ran exactly once per call, the traced call included
    const Tensor kept = relu(x * 2) * 6;
    for (int64_t i = 0; i < 16; ++i) {
      const double v = testing::at(out, {i});
      CHECK((v == 0 || v == Approx(testing::at(kept, {i}))));
    }
  }
  CHECK(f.cache_size() == 1);
  CHECK(f.graph_breaks() == 1);
  CHECK(f.recompiles() == 0);
  CHECK(f.traces().at(0)->break_op == "dropout");

  const std::string report = explain(fn, {x});
  // The graph before the break (mul, relu), the break, the graph after it (mul).
  CHECK_THAT(report, Contains("2 graphs, 1 graph break") && Contains("graph break at dropout") &&
                         Contains("random") && Contains("graph 1 (1 ops)"));
}

TEST_CASE("compile writes the trace of each new graph into the dump folder", "[compile]") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("kiln-test-compile-dump-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  auto fn = [](const Args& a) -> Args { return {exp(a[0]) + 1}; };
  CompiledFunction f = compile(fn, {.backend = "interpreter", .dump_dir = dir / "sub"});  // the trace only
  f({ones({2})});
  f({ones({2})});
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir / "sub")) files.push_back(e.path());
  REQUIRE(files.size() == 1);
  const std::string name = files[0].filename().string();
  CHECK(name.size() == 12);
  CHECK(name.ends_with("-trace.ir"));
  std::ifstream in(files[0]);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str() == compiler::print(f.traces().at(0)->graph));
  CHECK(compiler::print(compiler::parse(text.str()), false) ==
        compiler::print(f.traces().at(0)->graph, false));
  std::filesystem::remove_all(dir);
}

TEST_CASE("compile of a step that calls zero_grad itself replays without recompiling", "[compile]") {
  // opt.zero_grad() (set_to_none) first thing in the step, as PyTorch code writes it: the
  // graph's guard is .grad as it is when the step is called, not after fn cleared it.
  manual_seed(31);
  models::MLP model({4, 8, 3}), reference({4, 8, 3});
  kiln::testing::copy_parameters(model, reference);
  optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_opt(reference.parameters(), {.lr = 0.1, .momentum = 0.9});
  auto step_of = [](models::MLP& m, optim::SGD& o) {
    return [&m, &o](const Args& a) -> Args {
      o.zero_grad();
      Tensor loss = mse_loss(m(a[0]), a[1]);
      loss.backward();
      o.step();
      return {loss.detach()};
    };
  };
  auto eager = step_of(reference, ref_opt);
  const Tensor x0 = randn({6, 4}), y0 = randn({6, 3});
  step_of(model, opt)({x0, y0});  // the optimizer's first step creates its state: eagerly
  eager({x0, y0});
  CompiledFunction step = compile(step_of(model, opt), {.trace = module_names(model)});
  for (int i = 0; i < 5; ++i) {
    INFO("call " << i);
    const Tensor x = randn({6, 4}), y = randn({6, 3});
    KILN_CHECK_CLOSE(step({x, y})[0], eager({x, y})[0], 1e-5, 1e-6);
    const auto params = model.parameters(), ref_params = reference.parameters();
    for (size_t k = 0; k < params.size(); ++k) KILN_CHECK_CLOSE(params[k], ref_params[k], 1e-5, 1e-6);
  }
  CHECK(step.recompiles() == 0);
  CHECK(step.cache_size() == 1);
  CHECK(step.graph_breaks() == 0);
}
