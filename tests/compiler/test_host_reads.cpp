// Values read on the host inside a traced function (Tensor::item()): a guard when the value
// is a graph input the function has not written, a graph break (an error with fullgraph)
// when the step computed it; and the cache limit past which misses run eagerly.
#include "compiler/compile.h"
#include "compiler/trace.h"
#include "models/norm_layers.h"
#include "optim/clip.h"
#include "optim/sgd.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using Catch::Matchers::Contains;

namespace {
using Args = std::vector<Tensor>;
}  // namespace

TEST_CASE("a host read of a captured flag is a guard: another value traces again", "[host-reads]") {
  Tensor flag = scalar_tensor(1.0, DType::f64);
  auto fn = [&flag](const Args& a) -> Args {
    // Eager code branches on the flag: the graph holds for one branch only.
    return {flag.item<double>() > 0 ? a[0] * 2 : a[0] * 3};
  };
  CompiledFunction f = compile(fn, {.fullgraph = true});
  const Tensor x = randn({4});
  KILN_CHECK_EQUAL(f({x})[0], x * 2);
  KILN_CHECK_EQUAL(f({x})[0], x * 2);
  CHECK(f.recompiles() == 0);
  REQUIRE(f.traces().size() == 1);
  REQUIRE(f.traces()[0]->host_reads.size() == 1);
  CHECK(f.traces()[0]->host_reads[0].value.to_double() == 1.0);

  flag.fill_(-1.0);
  KILN_CHECK_EQUAL(f({x})[0], x * 3);  // replaying the first graph would give x * 2
  CHECK(f.recompiles() == 1);
  CHECK_THAT(f.last_recompile_reason(), Contains("read on the host by item()") && Contains("from 1 to -1"));
  flag.fill_(1.0);
  KILN_CHECK_EQUAL(f({x})[0], x * 2);  // the first entry again
  CHECK(f.recompiles() == 1);
}

TEST_CASE("a host read of a value computed in the step is a graph break", "[host-reads]") {
  auto fn = [](const Args& a) -> Args {
    const Tensor s = sum(a[0]);
    return {s.item<double>() > 0 ? a[0] : -a[0]};  // depends on the data: no graph holds it
  };
  SECTION("fullgraph: an error naming item") {
    CompiledFunction f = compile(fn, {.fullgraph = true});
    CHECK_THROWS_WITH(f({ones({3})}), Contains("item()") && Contains("computed in the step"));
  }
  SECTION("without fullgraph: the step runs eagerly, with the right branch every call") {
    CompiledFunction f = compile(fn);
    KILN_CHECK_EQUAL(f({ones({3})})[0], ones({3}));
    KILN_CHECK_EQUAL(f({-ones({3})})[0], ones({3}));
    CHECK(f.graph_breaks() == 1);
    CHECK(f.recompiles() == 0);
    CHECK_THAT(explain(fn, {ones({3})}), Contains("graph break at item"));
  }
}

TEST_CASE("batch norm with a cumulative average compiles as a graph break and equals eager", "[host-reads]") {
  // momentum = None: the factor is 1 / num_batches_tracked, which the layer reads on the
  // host after adding 1 to it. Baked into a graph, every replay would use the traced count.
  manual_seed(3);
  nn::BatchNorm2d compiled_bn(3, {.momentum = std::nullopt}), eager_bn(3, {.momentum = std::nullopt});
  auto step = [](nn::BatchNorm2d& bn) {
    return [&bn](const Args& a) -> Args { return {bn(a[0])}; };
  };
  CompiledFunction f = compile(step(compiled_bn));
  for (int i = 0; i < 3; ++i) {
    const Tensor x = randn({2, 3, 4, 4}) + static_cast<double>(i);
    KILN_CHECK_CLOSE(f({x})[0], step(eager_bn)({x})[0], 1e-6, 1e-6);
    KILN_CHECK_CLOSE(compiled_bn.running_mean(), eager_bn.running_mean(), 1e-6, 1e-6);
    KILN_CHECK_CLOSE(compiled_bn.running_var(), eager_bn.running_var(), 1e-6, 1e-6);
  }
  CHECK(f.graph_breaks() == 1);
  CompiledFunction strict = compile(step(compiled_bn), {.fullgraph = true});
  CHECK_THROWS_WITH(strict({randn({2, 3, 4, 4})}), Contains("item()"));
}

TEST_CASE("an SGD step reads no hyperparameter value it would have to guard", "[host-reads]") {
  // Validation (lr >= 0) reads on the host in an UnguardedHostReads scope, and momentum is
  // not read once the buffers exist: a schedule of lr and momentum recompiles nothing.
  manual_seed(5);
  Tensor w = randn({3, 2}).requires_grad_(true);
  optim::SGD sgd({w}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  auto fn = [&](const Args& a) -> Args {
    Tensor loss = sum(mm(a[0], w) * mm(a[0], w));
    loss.backward();
    sgd.step();
    return {loss.detach()};
  };
  fn({randn({4, 3})});  // the first step makes the momentum buffers, eagerly
  CompiledFunction f = compile(fn, {.fullgraph = true});
  for (int i = 0; i < 4; ++i) {
    w.set_grad({});
    f({randn({4, 3})});
    sgd.param_groups()[0].set("lr", 0.1 / (i + 2));
    sgd.param_groups()[0].set("momentum", 0.9 - 0.1 * i);
  }
  INFO(f.last_recompile_reason());
  CHECK(f.recompiles() == 0);
  REQUIRE(f.traces().size() == 1);
  // Whatever the graph guards (nesterov, maximize), not a value a schedule sets.
  for (const Trace::HostRead& read : f.traces()[0]->host_reads) {
    const Tensor guarded = f.traces()[0]->inputs_for({randn({4, 3})}).at(static_cast<size_t>(read.input));
    CHECK_FALSE(guarded.same(sgd.param_groups()[0].hyper.at("lr")));
    CHECK_FALSE(guarded.same(sgd.param_groups()[0].hyper.at("momentum")));
  }
}

TEST_CASE("past the cache limit a call that matches no graph runs eagerly", "[host-reads]") {
  auto fn = [](const Args& a) -> Args { return {a[1] * a[0].item<double>()}; };  // guards a[0]'s value
  CompiledFunction f = compile(fn, {.fullgraph = true, .cache_limit = 3});
  const Tensor y = randn({5});
  for (int i = 0; i < 6; ++i) {
    const Tensor s = scalar_tensor(static_cast<double>(i), DType::f64);
    KILN_CHECK_CLOSE(f({s, y})[0], y * static_cast<double>(i), 1e-12, 1e-12);
  }
  CHECK(f.cache_size() == 3);
  CHECK(f.eager_fallbacks() == 3);
  KILN_CHECK_CLOSE(f({scalar_tensor(1.0, DType::f64), y})[0], y, 1e-12, 1e-12);  // still cached
  CHECK(f.eager_fallbacks() == 3);
}

TEST_CASE("clip_grad_norm_ inside a traced step is part of the graph, not a baked scale", "[host-reads]") {
  // The norm and the clipping factor are tensors of the graph, so one trace serves batches
  // whose gradients are clipped and batches whose are not, with no read on the host.
  manual_seed(9);
  Tensor w = randn({3, 2}).requires_grad_(true);
  auto fn = [&](const Args& a) -> Args {
    Tensor loss = sum(mm(a[0], w) * mm(a[0], w));
    loss.backward();
    return {loss.detach(), optim::clip_grad_norm_({w}, 2.0)};
  };
  CompiledFunction f = compile(fn, {.fullgraph = true});
  bool clipped = false, unclipped = false;
  for (int i = 0; i < 4; ++i) {
    const Tensor x = randn({4, 3}) * (i == 0 ? 0.05 : static_cast<double>(i + 1));
    w.set_grad(zeros({3, 2}));
    const Tensor norm = f({x})[1];
    const Tensor compiled_grad = w.grad().clone();
    w.set_grad(zeros({3, 2}));
    KILN_CHECK_CLOSE(norm, fn({x})[1], 1e-12, 1e-12);
    KILN_CHECK_CLOSE(compiled_grad, w.grad(), 1e-6, 1e-7);
    (norm.item<double>() > 2.0 ? clipped : unclipped) = true;
  }
  CHECK(clipped);
  CHECK(unclipped);
  CHECK(f.graph_breaks() == 0);
  CHECK(f.recompiles() == 0);
}
