// Split runs (compiler/trace.h, run_split): a compiled function with a graph break runs its
// ops deferred, in pieces that run compiled between the breaks, and equals eager code.
#include <stdexcept>

#include "compiler/compile.h"
#include "compiler/trace.h"
#include "compiler_testing.h"
#include "models/small_models.h"
#include "optim/sgd.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using Catch::Matchers::Contains;

namespace {

using Args = std::vector<Tensor>;
const TensorOptions f64{.dtype = DType::f64};

}  // namespace

TEST_CASE("split: a host read of a computed value splits the function into compiled pieces", "[split]") {
  int64_t items = 0;
  auto fn = [&items](const Args& a) -> Args {
    const Tensor s = sum(a[0] * 2);
    ++items;
    // Eager code branches on a number the step computed: no single graph holds this.
    const Tensor r = s.item<double>() > 0 ? exp(a[0]) * 3 + 1 : a[0] - 1;
    return {r, s};
  };
  CompiledFunction f = compile(fn);
  const Tensor x = randn({5}, f64);
  f({x});  // traced: finds the break, runs eagerly
  CHECK(f.graph_breaks() == 1);
  for (double sign : {1.0, 1.0, -1.0, -1.0}) {
    INFO("sign " << sign);
    const Tensor y = abs(randn({5}, f64)) * sign;
    const Args got = f({y});
    const Args want = fn({y});
    KILN_CHECK_CLOSE(got[0], want[0], 1e-15, 1e-15);
    KILN_CHECK_CLOSE(got[1], want[1], 1e-15, 1e-15);
    CHECK(kiln::testing::split_piece_ends(f) == std::vector<std::string>{"item", "return"});
    REQUIRE(f.last_split().size() == 2);
    CHECK(f.last_split()[0].ops == 2);  // mul, sum
    CHECK(f.last_split()[1].ops > 0);
  }
  CHECK(f.split_calls() == 4);
  CHECK(f.recompiles() == 0);
  // The first piece, and one second piece per branch: compiled once each.
  CHECK(f.piece_programs() == 3);
  CHECK_THAT(explain(fn, {x}), Contains("graph break at item") && Contains("run the function split"));
}

TEST_CASE("split: a training step that logs its loss mid-step equals eager", "[split]") {
  // loss.item() between the forward and the backward: the forward (with the activations
  // autograd saved) is one piece, the backward and the SGD update another.
  manual_seed(21);
  models::MLP model({4, 16, 3}), reference({4, 16, 3});
  kiln::testing::copy_parameters(model, reference);
  optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_opt(reference.parameters(), {.lr = 0.1, .momentum = 0.9});
  std::vector<double> logged;
  auto step_of = [&logged](models::MLP& m, optim::SGD& o) {
    return [&m, &o, &logged](const Args& a) -> Args {
      o.zero_grad();
      Tensor loss = mse_loss(m(a[0]), a[1]);
      logged.push_back(loss.item<double>());
      loss.backward();
      o.step();
      return {loss};
    };
  };
  CompiledFunction step = compile(step_of(model, opt), {.trace = module_names(model)});
  auto eager = step_of(reference, ref_opt);
  for (int i = 0; i < 4; ++i) {
    INFO("step " << i);
    const Tensor x = randn({8, 4}), y = randn({8, 3});
    const Tensor loss = step({x, y})[0];
    const double compiled_logged = logged.back();
    const Tensor want = eager({x, y})[0];
    KILN_CHECK_CLOSE(loss, want, 1e-5, 1e-6);
    CHECK(compiled_logged == Approx(logged.back()).epsilon(1e-5));
    const auto params = model.parameters(), ref_params = reference.parameters();
    for (size_t k = 0; k < params.size(); ++k) KILN_CHECK_CLOSE(params[k], ref_params[k], 1e-5, 1e-6);
  }
  CHECK(step.graph_breaks() == 1);
  CHECK(step.split_calls() >= 2);
  CHECK(kiln::testing::split_piece_ends(step) == std::vector<std::string>{"item", "return"});
}

TEST_CASE("split: an op the tracer refuses runs eagerly between compiled pieces", "[split]") {
  // An in-place write into a view is refused by the tracer; the ops around it still compile.
  auto fn = [](const Args& a) -> Args {
    Tensor t = a[0] * 2;
    Tensor row = t.narrow(0, 1, 1);
    row.add_(10);
    return {exp(t) + 1};
  };
  CompiledFunction f = compile(fn);
  f({randn({3, 4}, f64)});
  CHECK(f.graph_breaks() == 1);
  for (int i = 0; i < 2; ++i) {
    const Tensor x = randn({3, 4}, f64);
    KILN_CHECK_CLOSE(f({x})[0], fn({x})[0], 1e-15, 1e-15);
    const std::vector<SplitPiece> pieces = f.last_split();
    REQUIRE(pieces.size() == 2);
    CHECK(pieces[0].end == "add");  // add_: the in-place form of add
    CHECK_THAT(pieces[0].reason, Contains("writes into a view"));
    CHECK(pieces[1].end == "return");
  }
  CompiledFunction strict = compile(fn, {.fullgraph = true});
  CHECK_THROWS_WITH(strict({randn({3, 4}, f64)}), Contains("writes into a view"));
}

TEST_CASE("split: reading a pending tensor's memory runs its piece first", "[split]") {
  auto fn = [](const Args& a) -> Args {
    const Tensor s = sum(a[0]);
    (void)s.item<double>();  // the break that makes later calls split
    const Tensor t = a[0] * 3;
    // A raw read of the memory: the value must be there, not an empty buffer.
    const double first = t.data_ptr<double>()[0];
    return {t + first};
  };
  CompiledFunction f = compile(fn);
  f({randn({4}, f64)});
  for (int i = 0; i < 2; ++i) {
    const Tensor x = randn({4}, f64);
    KILN_CHECK_CLOSE(f({x})[0], fn({x})[0], 1e-15, 1e-15);
    CHECK(kiln::testing::split_piece_ends(f) == std::vector<std::string>{"item", "data_ptr", "return"});
  }
}

TEST_CASE("split: what the function did before it threw has happened", "[split]") {
  Tensor counter = zeros({2}, f64);
  auto fn = [&counter](const Args& a) -> Args {
    counter.add_(a[0]);
    if (sum(counter).item<double>() > 5) throw std::runtime_error("counter past 5");
    return {counter * 2};
  };
  CompiledFunction f = compile(fn);
  const Tensor one = ones({2}, f64);
  KILN_CHECK_EQUAL(f({one})[0], full({2}, 2.0, f64));  // traced, eagerly
  KILN_CHECK_EQUAL(f({one})[0], full({2}, 4.0, f64));  // split
  CHECK_THROWS_WITH(f({one}), Contains("counter past 5"));
  KILN_CHECK_EQUAL(counter, full({2}, 3.0, f64));
  // A throw after deferred ops, before any host read: they still run.
  auto late = [&counter](const Args& a) -> Args {
    (void)sum(counter).item<double>();
    counter.mul_(a[0]);
    if (a[0].dim() == 1) throw std::runtime_error("late");
    return {};
  };
  CompiledFunction g = compile(late);
  CHECK_THROWS_WITH(g({full({2}, 2.0, f64)}), Contains("late"));  // traced
  CHECK_THROWS_WITH(g({full({2}, 2.0, f64)}), Contains("late"));  // split
  KILN_CHECK_EQUAL(counter, full({2}, 12.0, f64));
}

TEST_CASE("split: random ops draw the numbers eager code draws", "[split]") {
  auto fn = [](const Args& a) -> Args {
    const Tensor h = dropout(a[0] * 2, 0.5);
    const double total = sum(h).item<double>();
    return {dropout(h, 0.25) * total};
  };
  const Tensor x = randn({64});
  manual_seed(5);
  (void)fn({x});
  const Tensor want = fn({x})[0];
  CompiledFunction f = compile(fn);
  manual_seed(5);
  (void)f({x});  // traced
  KILN_CHECK_CLOSE(f({x})[0], want, 1e-6, 1e-6);
  CHECK(f.split_calls() == 1);
}

TEST_CASE("split: results that are one value come back as tensors of their own", "[split]") {
  auto fn = [](const Args& a) -> Args {
    (void)sum(a[0]).item<double>();
    Tensor t = a[0] * 2;
    return {t, t.clone(), a[0].clone()};
  };
  CompiledFunction f = compile(fn);
  f({randn({3}, f64)});
  const Tensor x = randn({3}, f64);
  Args out = f({x});
  KILN_CHECK_EQUAL(out[0], x * 2);
  KILN_CHECK_EQUAL(out[1], x * 2);
  KILN_CHECK_EQUAL(out[2], x);
  out[1].add_(1);
  out[2].add_(1);
  KILN_CHECK_EQUAL(out[0], x * 2);  // the clone is not the same memory
  KILN_CHECK_CLOSE(out[2], x + 1, 1e-15, 1e-15);
  KILN_CHECK_CLOSE(x + 1, out[2], 1e-15, 1e-15);
  CHECK_FALSE(out[2].storage() == x.storage());
}

TEST_CASE("split: explain reports every graph and break of a call", "[split]") {
  auto fn = [](const Args& a) -> Args {
    const Tensor s = sum(a[0] * 2);
    const double first = s.item<double>();   // a break
    const Tensor t = exp(a[0]) + first;
    const double second = max(t).item<double>();  // another
    return {t * second};
  };
  const std::string report = explain(fn, {randn({4}, f64)});
  CHECK_THAT(report, Contains("3 graphs, 2 graph breaks") && Contains("graph 0 (2 ops)") &&
                         Contains("graph 2 (1 ops)") && Contains("graph break at item"));
  // The same pieces as a split run makes of a later call.
  CompiledFunction f = compile(fn);
  f({randn({4}, f64)});
  f({randn({4}, f64)});
  CHECK(kiln::testing::split_piece_ends(f) == std::vector<std::string>{"item", "item", "return"});
}

TEST_CASE("split: reseeding the generator inside the function", "[split]") {
  // A trace refuses manual_seed inside fn (replay could not repeat it); a split run records
  // each random op with the counters it drew, so it follows eager code's reseed.
  auto fn = [](const Args& a) -> Args {
    const Tensor h = dropout(a[0], 0.5);
    (void)sum(h).item<double>();
    manual_seed(77);
    return {dropout(h * 2, 0.5) + rand({64})};
  };
  const Tensor x = randn({64});
  CompiledFunction f = compile(fn);
  f({x});  // traced: the reseed is a break
  for (int i = 0; i < 2; ++i) {
    manual_seed(100 + i);
    const Tensor got = f({x})[0];
    manual_seed(100 + i);
    KILN_CHECK_EQUAL(got, fn({x})[0]);
  }
  CHECK(f.split_calls() == 2);
}
