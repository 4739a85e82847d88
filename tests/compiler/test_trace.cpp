// The tracer and the reference interpreter (compiler/trace.h).
#include <algorithm>
#include <string>

#include "compiler/trace.h"
#include "compiler_testing.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using kiln::testing::count_ops;
using Catch::Matchers::Contains;

namespace {

int64_t count_kind(const Graph& g, NodeKind kind) {
  return std::count_if(g.nodes().begin(), g.nodes().end(),
                       [&](const compiler::Node& n) { return n.kind == kind; });
}

const compiler::Node* input_named(const Graph& g, const std::string& name) {
  for (Value v : g.inputs())
    if (g.node(v).name == name) return &g.node(v);
  return nullptr;
}


}  // namespace

TEST_CASE("trace records a pointwise function and interpret replays it", "[trace]") {
  manual_seed(1);
  const Tensor x = randn({3, 4}), y = randn({3, 4});
  auto fn = [](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    return {relu(a[0] * 2 + a[1])};
  };
  const Trace t = trace(fn, {x, y});
  const Graph& g = t.graph;
  REQUIRE(g.inputs().size() == 2);
  CHECK(g.node(g.inputs()[0]).name == "arg0");
  CHECK(g.node(g.inputs()[1]).role == InputRole::data);
  CHECK(count_kind(g, NodeKind::constant) == 1);
  CHECK(count_kind(g, NodeKind::op) == 3);
  CHECK(count_ops(g, "mul") == 1);
  CHECK(count_ops(g, "add") == 1);
  CHECK(count_ops(g, "relu") == 1);
  CHECK(g.node(g.outputs().at(0)).op == "relu");
  CHECK(g.type(g.outputs()[0]).str() == "f32[3,4]");
  CHECK(g.write_backs().empty());
  CHECK(t.captured.empty());

  const std::vector<Tensor> out = interpret(g, t.inputs_for({x, y}));
  REQUIRE(out.size() == 1);
  KILN_CHECK_EQUAL(out[0], relu(x * 2 + y));
  KILN_CHECK_EQUAL(out[0], t.results.at(0));
  // New data through the same graph.
  const Tensor x2 = randn({3, 4}), y2 = randn({3, 4});
  KILN_CHECK_EQUAL(interpret(g, t.inputs_for({x2, y2}))[0], relu(x2 * 2 + y2));
}

TEST_CASE("interpret checks its inputs against the graph", "[trace]") {
  const Tensor x = ones({2, 3});
  auto fn = [](const std::vector<Tensor>& a) -> std::vector<Tensor> { return {a[0] + 1}; };
  const Trace t = trace(fn, {x});
  CHECK_THROWS_WITH(interpret(t.graph, {ones({2, 4})}), Contains("arg0") && Contains("f32[2,3]"));
  CHECK_THROWS_WITH(interpret(t.graph, {ones({2, 3}, {.dtype = DType::f64})}), Contains("arg0"));
  CHECK_THROWS_WITH(interpret(t.graph, {}), Contains("1 inputs"));
  CHECK_THROWS_WITH(t.inputs_for({x, x}), Contains("1 arguments"));
}

TEST_CASE("trace records an MLP's forward and backward with named parameters", "[trace]") {
  manual_seed(2);
  models::MLP mlp({4, 8, 3});
  mlp.to(DType::f64);
  const Tensor w1 = mlp.named_parameters().at(0).second, w2 = mlp.named_parameters().at(2).second;
  const Tensor x = randn({5, 4}, {.dtype = DType::f64}), y = randn({5, 3}, {.dtype = DType::f64});
  auto fn = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    Tensor loss = mse_loss(mlp(a[0]), a[1]);
    loss.backward();
    return {loss, w1.grad(), w2.grad()};
  };
  auto forward_only = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    NoGradGuard no_grad;
    return {mse_loss(mlp(a[0]), a[1])};
  };
  const TraceOptions options = module_names(mlp);
  const Trace forward = trace(forward_only, {x, y}, options);

  mlp.zero_grad();  // undefined grads: AccumulateGrad sets them instead of adding in place
  const Trace t = trace(fn, {x, y}, options);
  const Graph& g = t.graph;
  CHECK(t.num_args == 2);
  CHECK(t.captured.size() == 4);
  for (const char* name : {"0.weight", "0.bias", "2.weight", "2.bias"}) {
    const compiler::Node* n = input_named(g, name);
    REQUIRE(n);
    CHECK(n->role == InputRole::param);
  }
  CHECK(input_named(g, "0.weight")->outputs.at(0).str() == "f64[8,4]");
  // The backward formulas are ops like any other.
  CHECK(count_kind(g, NodeKind::op) > count_kind(forward.graph, NodeKind::op) + 4);
  CHECK(g.write_backs().empty());
  REQUIRE(g.outputs().size() == 7);  // loss, two grads, then four grad effects
  CHECK(count_ops(g, "mse_loss_backward") == 1);
  // AccumulateGrad keeps each parameter's first gradient without a copy: nothing else holds
  // it (test_engine_edges.cpp covers the gradients it must copy).
  CHECK(count_ops(g, "clone") == 0);

  mlp.zero_grad();
  const std::vector<Tensor> out = interpret(g, t.inputs_for({x, y}));
  REQUIRE(out.size() == 7);
  for (size_t i = 0; i < 3; ++i) KILN_CHECK_CLOSE(out[i], t.results[i], 1e-12, 1e-12);
  CHECK_FALSE(w1.grad().defined());  // interpret records no autograd

  // Eager again on fresh gradients: the same numbers.
  Tensor loss = mse_loss(mlp(x), y);
  loss.backward();
  KILN_CHECK_CLOSE(out[0], loss, 1e-12, 1e-12);
  KILN_CHECK_CLOSE(out[1], w1.grad(), 1e-12, 1e-12);
  KILN_CHECK_CLOSE(out[2], w2.grad(), 1e-12, 1e-12);
}

TEST_CASE("trace records in-place ops on inputs as write-backs", "[trace]") {
  manual_seed(3);
  const Tensor x0 = randn({2, 3}), y = randn({2, 3});

  SECTION("add_ on an argument") {
    Tensor x = x0.clone();
    auto fn = [](const std::vector<Tensor>& a) -> std::vector<Tensor> {
      Tensor x = a[0];
      x.add_(a[1]);
      x.mul_(2);
      return {x + 1};
    };
    const Trace t = trace(fn, {x, y});
    KILN_CHECK_CLOSE(x, (x0 + y) * 2, 1e-6, 1e-6);
    const Graph& g = t.graph;
    REQUIRE(g.write_backs().size() == 1);
    CHECK(g.write_backs()[0].first == g.inputs()[0]);
    CHECK(g.node(g.write_backs()[0].second).op == "mul");

    Tensor x2 = x0.clone();
    const std::vector<Tensor> out = interpret(g, t.inputs_for({x2, y}));
    KILN_CHECK_EQUAL(x2, x);
    KILN_CHECK_EQUAL(out[0], t.results[0]);
  }

  SECTION("an in-place result of a wider dtype is cast back") {
    Tensor x = x0.clone();
    const Tensor y64 = y.to(DType::f64);
    auto fn = [](const std::vector<Tensor>& a) -> std::vector<Tensor> {
      Tensor x = a[0];
      x.add_(a[1]);
      return {};
    };
    const Trace t = trace(fn, {x, y64});
    REQUIRE(t.graph.write_backs().size() == 1);
    const compiler::Node& written = t.graph.node(t.graph.write_backs()[0].second);
    CHECK(written.op == "cast");
    CHECK(t.graph.type(t.graph.write_backs()[0].second).str() == "f32[2,3]");
    Tensor x2 = x0.clone();
    interpret(t.graph, t.inputs_for({x2, y64}));
    KILN_CHECK_EQUAL(x2, x);
  }

  SECTION("copy_ into captured state") {
    Tensor state = zeros({2, 3});
    auto fn = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
      state.copy_(a[0] * 3);
      return {};
    };
    const Trace t = trace(fn, {x0});
    REQUIRE(t.captured.size() == 1);
    CHECK(t.captured[0].same(state));
    const compiler::Node& in = t.graph.node(t.graph.inputs()[1]);
    CHECK(in.name == "captured0");
    CHECK(in.role == InputRole::state);
    REQUIRE(t.graph.write_backs().size() == 1);
    CHECK(t.graph.write_backs()[0].first == t.graph.inputs()[1]);
    state.zero_();
    interpret(t.graph, t.inputs_for({y}));
    KILN_CHECK_EQUAL(state, y * 3);
  }

  SECTION("a view read after its base was written in place is refused") {
    auto fn = [](const std::vector<Tensor>& a) -> std::vector<Tensor> {
      Tensor flat = a[0].reshape({6});
      Tensor x = a[0];
      x.add_(1);
      return {flat * 2};
    };
    Tensor x = x0.clone();
    CHECK_THROWS_WITH(trace(fn, {x}),
                      Contains("mul") && Contains("written in place through another view"));
  }

  SECTION("an in-place write into a view is refused") {
    auto fn = [](const std::vector<Tensor>& a) -> std::vector<Tensor> {
      Tensor row = a[0].select(0, 1);
      row.add_(1);
      return {};
    };
    Tensor x = x0.clone();
    CHECK_THROWS_WITH(trace(fn, {x}), Contains("add") && Contains("view"));
  }
}

TEST_CASE("trace records a SmallCNN in eval mode and in training", "[trace]") {
  manual_seed(4);
  models::SmallCNN cnn(
      {.in_channels = 1, .num_classes = 5, .image_size = 8, .channels1 = 4, .channels2 = 6});
  // Running statistics that differ from their defaults, so that eval really uses them.
  for (const auto& [name, b] : cnn.named_buffers())
    if (is_floating(b.dtype())) b.detach().copy_(rand(b.shape()) + 0.5);
  cnn.eval();
  const Tensor x = randn({2, 1, 8, 8});
  auto fn = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    NoGradGuard no_grad;
    return {cnn.forward(a[0])};
  };
  const Trace t = trace(fn, {x}, module_names(cnn));
  const Graph& g = t.graph;
  CHECK(count_ops(g, "batch_norm") == 2);
  const compiler::Node* running_mean = input_named(g, "features.1.running_mean");
  REQUIRE(running_mean);
  CHECK(running_mean->role == InputRole::state);
  CHECK(input_named(g, "fc.weight"));
  CHECK(g.write_backs().empty());
  const std::vector<Tensor> out = interpret(g, t.inputs_for({x}));
  KILN_CHECK_CLOSE(out.at(0), t.results.at(0), 1e-6, 1e-6);
  const Tensor x2 = randn({2, 1, 8, 8});
  Tensor expected;
  {
    NoGradGuard no_grad;
    expected = cnn.forward(x2);
  }
  KILN_CHECK_CLOSE(interpret(g, t.inputs_for({x2}))[0], expected, 1e-6, 1e-6);

  // In training the running statistics' update is recorded too ([bntrace] tests it).
  cnn.train();
  CHECK(count_ops(trace(fn, {x}, module_names(cnn)).graph, "batch_norm_update") == 2);
}

TEST_CASE("trace refuses random ops given another generator", "[trace]") {
  const Tensor x = ones({4, 4});
  Generator other(3);
  auto fn = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    return {dropout(a[0], 0.5, true, &other)};
  };
  CHECK_THROWS_WITH(trace(fn, {x}), Contains("dropout") && Contains("random"));
  auto eval = [](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    return {dropout(a[0], 0.5, false) * 2};
  };
  CHECK(count_ops(trace(eval, {x}).graph, "mul") == 1);
}

TEST_CASE("trace records an optimizer step and refuses writes outside the registry", "[trace]") {
  manual_seed(5);
  models::MLP mlp({3, 4, 2});
  optim::SGD sgd(mlp.parameters(), {.lr = 0.1});
  const Tensor x = randn({6, 3}), y = randn({6, 2});
  auto fn = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    Tensor loss = mse_loss(mlp(a[0]), a[1]);
    loss.backward();
    sgd.step();
    return {loss};
  };
  // The optimizer's update of its one group is a registry op: recorded as one pure
  // sgd_update_multi over every parameter plus a write-back into each parameter.
  const Trace t = trace(fn, {x, y}, module_names(mlp));
  CHECK(count_ops(t.graph, "sgd_update_multi") == 1);
  CHECK(count_ops(t.graph, "sgd_update") == 0);
  CHECK(t.graph.write_backs().size() == mlp.parameters().size());
  // A write outside the registry that a later op reads is caught at that op.
  const Tensor w = ones({3});
  auto raw = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    Tensor s = a[0] * w;
    w.data_ptr<float>()[0] = 5;
    bump_version(w);
    return {s + w};
  };
  CHECK_THROWS_WITH(trace(raw, {x.select(0, 0).contiguous()}),
                    Contains("captured0 was modified outside the op registry"));
}

TEST_CASE("trace hash-conses identical computations", "[trace]") {
  const Tensor x = ones({3});
  auto fn = [](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    Tensor p = a[0] * 2;
    Tensor q = a[0] * 2;
    return {p + q, p, q};
  };
  const Trace t = trace(fn, {x});
  CHECK(count_ops(t.graph, "mul") == 1);
  CHECK(count_kind(t.graph, NodeKind::constant) == 1);
  CHECK(t.graph.outputs()[1] == t.graph.outputs()[2]);
  KILN_CHECK_EQUAL(interpret(t.graph, {x})[0], full({3}, 4.0f));
}

TEST_CASE("trace maps results that are inputs or untouched captured tensors", "[trace]") {
  const Tensor x = ones({2}), kept = full({2}, 7.0f);
  auto fn = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> { return {a[0], kept}; };
  const Trace t = trace(fn, {x});
  const Graph& g = t.graph;
  REQUIRE(g.outputs().size() == 2);
  CHECK(g.outputs()[0] == g.inputs()[0]);
  REQUIRE(g.inputs().size() == 2);
  CHECK(g.outputs()[1] == g.inputs()[1]);
  CHECK(count_kind(g, NodeKind::op) == 0);
  const Tensor x2 = full({2}, 3.0f);
  const std::vector<Tensor> out = interpret(g, t.inputs_for({x2}));
  KILN_CHECK_EQUAL(out[0], x2);
  KILN_CHECK_EQUAL(out[1], kept);
}
