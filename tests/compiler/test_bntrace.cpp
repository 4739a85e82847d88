// Tracing training steps of models with batch norm (compiler/trace.h): batch_norm's in-place
// update of its running statistics becomes the pure batch_norm_update, whose last two
// outputs are written back, so the step is one pure graph.
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


// Running statistics that differ from their defaults and from one another.
void randomize_running_stats(nn::Module& m) {
  NoGradGuard no_grad;
  for (const auto& [name, b] : m.named_buffers())
    if (is_floating(b.dtype())) b.detach().copy_(rand(b.shape(), {.dtype = b.dtype()}) + 0.5);
}

int64_t count_batch_norms(const nn::Module& m) {
  int64_t n = 0;
  for (const auto& [name, b] : m.named_buffers()) n += name.ends_with("running_mean");
  return n;
}

// Every parameter's gradient and every buffer of `actual` against `expected`'s, by name.
void check_same_state(const nn::Module& actual, const nn::Module& expected, double rtol) {
  const auto params = actual.named_parameters(), expected_params = expected.named_parameters();
  REQUIRE(params.size() == expected_params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].first);
    REQUIRE(params[i].second.grad().defined());
    REQUIRE(expected_params[i].second.grad().defined());
    KILN_CHECK_CLOSE(params[i].second.grad(), expected_params[i].second.grad(), rtol, rtol);
  }
  const auto buffers = actual.named_buffers(), expected_buffers = expected.named_buffers();
  REQUIRE(buffers.size() == expected_buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    INFO(buffers[i].first);
    KILN_CHECK_CLOSE(buffers[i].second, expected_buffers[i].second, rtol, rtol);
  }
}

// One training step: forward, cross entropy, backward (gradients into undefined .grads).
Tensor train_step(nn::Module& model, const Tensor& x, const Tensor& y) {
  model.zero_grad();
  Tensor loss = cross_entropy(model.forward(x), y);
  loss.backward();
  return loss;
}

// Traces a training step of `model` and replays it `replays` times, against the same steps
// run eagerly on a copy: same loss, gradients and buffers (running statistics and
// num_batches_tracked) after each.
void check_traced_training(nn::Module& model, nn::Module& copy, Shape input_shape,
                           int64_t classes, DType dtype, double rtol, int replays = 2) {
  model.to(dtype);
  randomize_running_stats(model);
  copy.to(dtype);
  copy.load_state_dict(model.state_dict());
  model.train();
  copy.train();
  const int64_t batch = input_shape[0];
  auto data = [&] {
    return std::pair{randn(input_shape, {.dtype = dtype}) * 2.0 + 0.5,
                     randint(0, classes, {batch}, {.dtype = DType::i64})};
  };

  auto fn = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    return {train_step(model, a[0], a[1])};
  };
  model.zero_grad();  // the trace sees undefined .grads: they become grad effects
  const auto [x, y] = data();
  const Trace t = trace(fn, {x, y}, module_names(model));
  const Graph& g = t.graph;
  REQUIRE_FALSE(t.broken());
  verify(g);

  const int64_t norms = count_batch_norms(model);
  REQUIRE(norms > 0);
  CHECK(count_ops(g, "batch_norm_update") == norms);
  CHECK(count_ops(g, "batch_norm") == 0);
  CHECK(count_ops(g, "batch_norm_stats_update") == 0);
  // The batch_norm_update nodes read the running statistics and write nothing: their new
  // values are outputs 3 and 4.
  for (const compiler::Node& n : g.nodes())
    if (n.kind == NodeKind::op && n.op == "batch_norm_update") {
      REQUIRE(n.inputs.size() == 5);
      CHECK(n.inputs[3].defined());
      CHECK(n.inputs[4].defined());
      CHECK(n.outputs.size() == 5);
      CHECK(n.attrs.b("training"));
      CHECK(n.def->mutated_inputs.empty());
    }
  // running_mean, running_var and num_batches_tracked of every batch norm are written back.
  CHECK(static_cast<int64_t>(g.write_backs().size()) == 3 * norms);
  for (const auto& [input, value] : g.write_backs()) {
    const compiler::Node& target = g.node(input);
    CHECK(target.role == InputRole::state);
    const std::string& op = g.node(value).op;
    if (target.name.ends_with("num_batches_tracked"))
      CHECK(op == "add");
    else
      CHECK((op == "batch_norm_update" && value.output >= 3));
  }
  // The text form round-trips with the new op.
  CHECK(print(parse(print(g))) == print(g));

  // The eager run inside the trace was the first step: the copy takes it too.
  Tensor expected_loss = train_step(copy, x, y);
  KILN_CHECK_CLOSE(t.results.at(0), expected_loss, rtol, rtol);
  check_same_state(model, copy, rtol);

  for (int replay = 0; replay < replays; ++replay) {
    INFO("replay " << replay);
    const auto [xr, yr] = data();
    model.zero_grad();
    const std::vector<Tensor> loss = t.replay({xr, yr});
    expected_loss = train_step(copy, xr, yr);
    REQUIRE(loss.size() == 1);
    KILN_CHECK_CLOSE(loss[0], expected_loss, rtol, rtol);
    check_same_state(model, copy, rtol);
  }
  for (const auto& [name, b] : model.named_buffers())
    if (name.ends_with("num_batches_tracked")) CHECK(b.item<int64_t>() == 1 + replays);
}

}  // namespace

TEST_CASE("batch_norm_update gives batch_norm's outputs and its in-place update, bit for bit", "[bntrace]") {
  manual_seed(12);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    for (const MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
      const Shape shape{4, 3, 5, 5};
      INFO(std::string(name(dtype)) << (format == MemoryFormat::channels_last ? " nhwc" : " nchw"));
      const DType stats = dtype == DType::f64 ? DType::f64 : DType::f32;
      const Tensor x = (randn(shape) * 1e-3 + 100.0).to(dtype).contiguous(format);
      const Tensor weight = rand({3}, {.dtype = stats}), bias = randn({3}, {.dtype = stats});
      const Tensor running_mean = rand({3}, {.dtype = stats}), running_var = rand({3}, {.dtype = stats}) + 0.5;
      const Tensor mean_before = running_mean.clone(), var_before = running_var.clone();
      const std::vector<Tensor> out =
          call_op(find_op("batch_norm_update"), {x, weight, bias, running_mean, running_var},
                  {{"training", true}, {"momentum", 0.3}, {"eps", 1e-5}});
      REQUIRE(out.size() == 5);
      KILN_CHECK_EQUAL(running_mean, mean_before);  // a pure op
      KILN_CHECK_EQUAL(running_var, var_before);
      CHECK(out[0].suggest_memory_format() == format);

      const Tensor written_mean = mean_before.clone(), written_var = var_before.clone();
      const BatchNormResult expected =
          batch_norm_with_stats(x, weight, bias, written_mean, written_var, true, 0.3, 1e-5);
      // The same arithmetic on the same values: equal bit for bit (tolerance 0).
      KILN_CHECK_EQUAL(out[0], expected.output);
      KILN_CHECK_EQUAL(out[1], expected.save_mean);
      KILN_CHECK_EQUAL(out[2], expected.save_invstd);
      KILN_CHECK_EQUAL(out[3], written_mean);
      KILN_CHECK_EQUAL(out[4], written_var);
    }
  }
  const Tensor x = randn({4, 3, 2});
  CHECK_THROWS_WITH(call_op(find_op("batch_norm_update"), {x, {}, {}, {}, {}}, {{"training", true}, {"momentum", 0.1}}),
                    Contains("batch_norm_update") && Contains("required"));
  CHECK_THROWS_WITH(call_op(find_op("batch_norm_update"), {x, {}, {}, zeros({3}), ones({3})},
                            {{"training", false}, {"momentum", 0.1}}),
                    Contains("batch_norm_update") && Contains("training"));
}

TEST_CASE("batch_norm_stats_update gives what batch_norm writes into its running statistics",
          "[bntrace]") {
  manual_seed(11);
  for (DType dtype : {DType::f32, DType::f64}) {
    for (const Shape& shape : {Shape{4, 3, 5, 5}, Shape{6, 5}, Shape{2, 4, 1, 1}}) {
      INFO(std::string(name(dtype)) << " " << shape_str(shape));
      const int64_t channels = shape[1];
      // A large mean and a tiny variance in some channels: where a variance recovered from
      // the saved invstd would lose digits.
      const Tensor x = randn(shape, {.dtype = dtype}) * 1e-3 + 100.0;
      const Tensor running_mean = rand({channels}, {.dtype = dtype});
      const Tensor running_var = rand({channels}, {.dtype = dtype}) + 0.5;
      const Tensor mean_before = running_mean.clone(), var_before = running_var.clone();
      const RunningStats updated = batch_norm_stats_update(x, running_mean, running_var, 0.3);
      KILN_CHECK_EQUAL(running_mean, mean_before);  // a pure op
      KILN_CHECK_EQUAL(running_var, var_before);
      CHECK(updated.mean.dtype() == dtype);
      CHECK(updated.var.dtype() == dtype);

      const Tensor written_mean = mean_before.clone(), written_var = var_before.clone();
      (void)batch_norm(x, {}, {}, written_mean, written_var, true, 0.3);
      // The same f64 arithmetic on the same values: equal bit for bit (tolerance 0).
      KILN_CHECK_EQUAL(updated.mean, written_mean);
      KILN_CHECK_EQUAL(updated.var, written_var);
    }
  }
}

TEST_CASE("batch_norm_stats_update keeps the running statistics' dtypes and records no graph",
          "[bntrace]") {
  Tensor x = randn({3, 2, 4}, {.dtype = DType::f32});
  x.requires_grad_();
  const Tensor mean64 = zeros({2}, {.dtype = DType::f64});
  const Tensor var32 = ones({2});
  const RunningStats updated = batch_norm_stats_update(x, mean64, var32, 0.1);
  CHECK(updated.mean.dtype() == DType::f64);
  CHECK(updated.var.dtype() == DType::f32);
  CHECK_FALSE(updated.mean.requires_grad());
  CHECK_FALSE(updated.var.requires_grad());
  const Tensor written_mean = mean64.clone(), written_var = var32.clone();
  {
    NoGradGuard no_grad;
    (void)batch_norm(x, {}, {}, written_mean, written_var, true, 0.1);
  }
  KILN_CHECK_EQUAL(updated.mean, written_mean);
  KILN_CHECK_EQUAL(updated.var, written_var);

  CHECK_THROWS_WITH(batch_norm_stats_update(x, {}, {}),
                    Contains("batch_norm_stats_update") && Contains("required"));
  CHECK_THROWS_WITH(batch_norm_stats_update(x, zeros({3}), ones({3})),
                    Contains("batch_norm_stats_update") && Contains("running_mean"));
  CHECK_THROWS_WITH(batch_norm_stats_update(randn({1, 2}), zeros({2}), ones({2})),
                    Contains("more than 1 value per channel"));
}

TEST_CASE("trace records a SmallCNN training step with batch norm as a pure graph", "[bntrace]") {
  const models::SmallCNNOptions options{
      .in_channels = 1, .num_classes = 5, .image_size = 8, .channels1 = 4, .channels2 = 6};
  SECTION("f32") {
    manual_seed(21);
    models::SmallCNN model(options), copy(options);
    check_traced_training(model, copy, {3, 1, 8, 8}, 5, DType::f32, 1e-5);
  }
  SECTION("f64") {
    manual_seed(22);
    models::SmallCNN model(options), copy(options);
    check_traced_training(model, copy, {3, 1, 8, 8}, 5, DType::f64, 1e-10);
  }
}

TEST_CASE("trace records a ResNet-18 training step at 32x32 as a pure graph", "[bntrace]") {
  SECTION("f32") {
    manual_seed(31);
    models::ResNet model = models::resnet18({.num_classes = 10});
    models::ResNet copy = models::resnet18({.num_classes = 10});
    check_traced_training(model, copy, {2, 3, 32, 32}, 10, DType::f32, 1e-5);
  }
  SECTION("f64") {
    manual_seed(32);
    models::ResNet model = models::resnet18({.num_classes = 10});
    models::ResNet copy = models::resnet18({.num_classes = 10});
    // One replay: f64 convolutions are slow, and f32 replays twice.
    check_traced_training(model, copy, {2, 3, 32, 32}, 10, DType::f64, 1e-10, 1);
  }
}

TEST_CASE("trace records batch norm in eval mode without the running statistics' update",
          "[bntrace]") {
  manual_seed(41);
  models::SmallCNN cnn(
      {.in_channels = 1, .num_classes = 5, .image_size = 8, .channels1 = 4, .channels2 = 6});
  randomize_running_stats(cnn);
  cnn.eval();
  const std::map<std::string, Tensor> before = cnn.state_dict();
  std::map<std::string, Tensor> saved;
  for (const auto& [name, b] : before) saved[name] = b.clone();
  const Tensor x = randn({2, 1, 8, 8}), y = randint(0, 5, {2}, {.dtype = DType::i64});
  auto fn = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    return {train_step(cnn, a[0], a[1])};
  };
  const Trace t = trace(fn, {x, y}, module_names(cnn));
  const Graph& g = t.graph;
  CHECK(count_ops(g, "batch_norm") == 2);
  CHECK(count_ops(g, "batch_norm_stats_update") == 0);
  CHECK(g.write_backs().empty());
  for (const compiler::Node& n : g.nodes())
    if (n.kind == NodeKind::op && n.op == "batch_norm") {
      CHECK(n.inputs.at(3).defined());
      CHECK_FALSE(n.attrs.b("training"));
    }
  (void)t.replay({x, y});
  for (const auto& [name, b] : cnn.named_buffers()) KILN_CHECK_EQUAL(b, saved.at(name));
}

TEST_CASE("trace records a batch norm whose running statistics the function made itself",
          "[bntrace]") {
  // Running statistics that are not graph inputs: their new values are ordinary values
  // (no write-back), and a second batch norm reads them.
  const Tensor x = randn({4, 3, 2}, {.dtype = DType::f64});
  auto fn = [](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    const Tensor mean = zeros({3}, {.dtype = DType::f64}), var = ones({3}, {.dtype = DType::f64});
    (void)batch_norm(a[0], {}, {}, mean, var, true, 0.5);
    (void)batch_norm(a[0] * 2.0, {}, {}, mean, var, true, 0.5);
    return {mean, var};
  };
  const Trace t = trace(fn, {x});
  CHECK(t.graph.write_backs().empty());
  CHECK(count_ops(t.graph, "batch_norm_update") == 2);
  const Tensor x2 = randn({4, 3, 2}, {.dtype = DType::f64});
  const std::vector<Tensor> replayed = t.replay({x2});
  const std::vector<Tensor> expected = fn({x2});
  KILN_CHECK_EQUAL(replayed.at(0), expected.at(0));
  KILN_CHECK_EQUAL(replayed.at(1), expected.at(1));
}
