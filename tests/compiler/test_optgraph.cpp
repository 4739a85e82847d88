// The optimizer's update in the traced graph: the registry ops sgd_update_/adamw_update_
// (core/ops/optim_ops.h) against hand-written updates, and whole training steps (zero_grad,
// forward, loss, backward, optimizer step) traced and compiled as one graph, with the
// learning rate changed by a schedule between compiled calls as a runtime input.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "compiler/compile.h"
#include "compiler/trace.h"
#include "core/ops/optim_ops.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "compiler_testing.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using kiln::testing::count_ops;
using Catch::Matchers::Contains;

namespace {

Tensor f64_scalar(double v) { return scalar_tensor(v, DType::f64); }

// The SGD update of one element in T, as torch's single-tensor SGD writes it.
template <class T>
void sgd_reference(T& p, T g, T& buf, bool has_buf, double lr, double momentum, double dampening,
                   double wd, SGDFlags f) {
  T d = f.maximize ? -g : g;
  if (wd != 0) d = d + static_cast<T>(wd) * p;
  if (has_buf) {
    buf = f.first ? d : static_cast<T>(momentum) * buf + static_cast<T>(1.0 - dampening) * d;
    d = f.nesterov ? d + static_cast<T>(momentum) * buf : buf;
  }
  p = p - static_cast<T>(lr) * d;
}

template <class T>
void adamw_reference(T& p, T g, T& m, T& v, T& vmax, bool amsgrad, double t, double lr, double b1,
                     double b2, double eps, double wd, bool maximize) {
  const T grad = maximize ? -g : g;
  p = p * static_cast<T>(1.0 - lr * wd);
  m = m + static_cast<T>(1.0 - b1) * (grad - m);
  v = v * static_cast<T>(b2) + static_cast<T>(1.0 - b2) * grad * grad;
  T second = v;
  if (amsgrad) second = vmax = std::max(vmax, v);
  const T denom = std::sqrt(second) / static_cast<T>(std::sqrt(1.0 - std::pow(b2, t))) + static_cast<T>(eps);
  p = p - static_cast<T>(lr / (1.0 - std::pow(b1, t))) * (m / denom);
}

template <class T>
std::vector<T> elements(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::vector<T>(c.data_ptr<T>(), c.data_ptr<T>() + c.numel());
}

template <class T>
void require_elements(const Tensor& t, const std::vector<T>& expected, double tol) {
  const std::vector<T> got = elements<T>(t);
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", expected " << expected[i]);
    REQUIRE(std::abs(static_cast<double>(got[i]) - static_cast<double>(expected[i])) <= tol);
  }
}

template <class T>
void check_sgd_op(DType dtype, double momentum, double dampening, double wd, SGDFlags flags) {
  const double lr = 0.05;
  const Tensor p = randn({5, 7}, {.dtype = dtype}), g = randn({5, 7}, {.dtype = dtype});
  const Tensor buf = momentum != 0 ? randn({5, 7}, {.dtype = dtype}) : Tensor();
  const SGDHyper hyper{f64_scalar(lr), f64_scalar(momentum), f64_scalar(dampening), f64_scalar(wd)};
  std::vector<T> ep = elements<T>(p), eg = elements<T>(g);
  std::vector<T> ebuf = buf.defined() ? elements<T>(buf) : std::vector<T>(ep.size());
  for (size_t i = 0; i < ep.size(); ++i)
    sgd_reference<T>(ep[i], eg[i], ebuf[i], buf.defined(), lr, momentum, dampening, wd, flags);

  const Tensor p0 = p.clone(), buf0 = buf.defined() ? buf.clone() : Tensor();
  const SGDUpdate pure = sgd_update(p, g, buf, hyper, flags);
  KILN_CHECK_EQUAL(p, p0);  // the pure form leaves its arguments alone
  REQUIRE(pure.momentum_buffer.defined() == buf.defined());
  sgd_update_(p, g, buf, hyper, flags);
  const double tol = dtype == DType::f64 ? 1e-12 : 1e-6;
  require_elements<T>(p, ep, tol);
  KILN_CHECK_EQUAL(pure.param, p);  // bit for bit: one shared loop
  if (buf.defined()) {
    require_elements<T>(buf, ebuf, tol);
    KILN_CHECK_EQUAL(pure.momentum_buffer, buf);
  }
}

template <class T>
void check_adamw_op(DType dtype, bool amsgrad, double wd, bool maximize) {
  const double t = 3, lr = 0.01, b1 = 0.8, b2 = 0.95, eps = 1e-6;
  const Tensor p = randn({4, 6}, {.dtype = dtype}), g = randn({4, 6}, {.dtype = dtype});
  const AdamWState state{randn({4, 6}, {.dtype = dtype}) * 0.1, rand({4, 6}, {.dtype = dtype}),
                         amsgrad ? rand({4, 6}, {.dtype = dtype}) : Tensor(), f64_scalar(t)};
  const AdamWHyper hyper{f64_scalar(lr), f64_scalar(b1), f64_scalar(b2), f64_scalar(eps), f64_scalar(wd)};
  std::vector<T> ep = elements<T>(p), eg = elements<T>(g), em = elements<T>(state.exp_avg),
                 ev = elements<T>(state.exp_avg_sq);
  std::vector<T> evmax = amsgrad ? elements<T>(state.max_exp_avg_sq) : std::vector<T>(ep.size());
  for (size_t i = 0; i < ep.size(); ++i)
    adamw_reference<T>(ep[i], eg[i], em[i], ev[i], evmax[i], amsgrad, t, lr, b1, b2, eps, wd, maximize);

  const AdamWUpdate pure = adamw_update(p, g, state, hyper, {amsgrad, maximize});
  REQUIRE(pure.max_exp_avg_sq.defined() == amsgrad);
  adamw_update_(p, g, state, hyper, {amsgrad, maximize});
  const double tol = dtype == DType::f64 ? 1e-12 : 1e-6;
  require_elements<T>(p, ep, tol);
  require_elements<T>(state.exp_avg, em, tol);
  require_elements<T>(state.exp_avg_sq, ev, tol);
  KILN_CHECK_EQUAL(pure.param, p);
  KILN_CHECK_EQUAL(pure.exp_avg, state.exp_avg);
  KILN_CHECK_EQUAL(pure.exp_avg_sq, state.exp_avg_sq);
  if (amsgrad) {
    require_elements<T>(state.max_exp_avg_sq, evmax, tol);
    KILN_CHECK_EQUAL(pure.max_exp_avg_sq, state.max_exp_avg_sq);
  }
}

}  // namespace

TEST_CASE("sgd_update ops equal the hand-written update", "[optgraph]") {
  manual_seed(11);
  for (const kiln::testing::SgdVariant& v : kiln::testing::sgd_variants()) {
    INFO(kiln::testing::sgd_variant_text(v));
    check_sgd_op<double>(DType::f64, v.momentum, v.dampening, v.weight_decay, v.flags);
    check_sgd_op<float>(DType::f32, v.momentum, v.dampening, v.weight_decay, v.flags);
  }
}

TEST_CASE("adamw_update ops equal the hand-written update", "[optgraph]") {
  manual_seed(12);
  for (bool amsgrad : {false, true})
    for (double wd : {0.0, 0.1})
      for (bool maximize : {false, true}) {
        INFO("amsgrad " << amsgrad << " weight_decay " << wd << " maximize " << maximize);
        check_adamw_op<double>(DType::f64, amsgrad, wd, maximize);
        check_adamw_op<float>(DType::f32, amsgrad, wd, maximize);
      }
}

TEST_CASE("optimizer update ops refuse mismatched inputs", "[optgraph]") {
  const Tensor p = zeros({3}, {.dtype = DType::f64});
  const SGDHyper hyper{f64_scalar(0.1), f64_scalar(0), f64_scalar(0), f64_scalar(0)};
  REQUIRE_THROWS_WITH(sgd_update_(p, zeros({3}), {}, hyper, {}), Contains("sgd_update_") && Contains("grad"));
  REQUIRE_THROWS_WITH(sgd_update_(p, zeros({4}, {.dtype = DType::f64}), {}, hyper, {}), Contains("grad"));
  const SGDHyper bad{zeros({2}, {.dtype = DType::f64}), f64_scalar(0), f64_scalar(0), f64_scalar(0)};
  REQUIRE_THROWS_WITH(sgd_update_(p, p.clone(), {}, bad, {}), Contains("lr"));
  const AdamWHyper adam{f64_scalar(0.1), f64_scalar(0.9), f64_scalar(0.99), f64_scalar(1e-8), f64_scalar(0)};
  const AdamWState state{zeros_like(p), zeros_like(p), Tensor(), f64_scalar(1)};
  REQUIRE_THROWS_WITH(adamw_update_(p, p.clone(), state, adam, {.amsgrad = true}),
                      Contains("max_exp_avg_sq"));
}

namespace {

using Args = std::vector<Tensor>;
using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>&)>;

// A model, its optimizer (after one eager warm-up step, so that its state exists) and a
// training step over them.
struct Trainer {
  std::shared_ptr<models::MLP> model;
  std::unique_ptr<optim::Optimizer> optimizer;

  Trainer(const MakeOptimizer& make, DType dtype) {
    manual_seed(21);
    model = std::make_shared<models::MLP>(std::vector<int64_t>{4, 8, 3});
    model->to(dtype);
    optimizer = make(model->parameters());
    step({batch(0, dtype), target(0, dtype)});
  }

  // zero_grad keeps the gradients (zeros, in place): a .grad cleared inside the compiled
  // function would change its guard on every call (compiler/compile.h).
  Args step(const Args& a) {
    optimizer->zero_grad(false);
    Tensor loss = mse_loss((*model)(a[0]), a[1]);
    loss.backward();
    optimizer->step();
    return {loss.detach()};
  }
  TracedFunction function() {
    return [this](const Args& a) { return step(a); };
  }

  // Parameter, state and hyperparameter names ("0.weight", "0.weight.exp_avg", "lr") for
  // graphs and checks.
  TraceOptions names() {
    TraceOptions options;
    for (const auto& [name, t] : optimizer->param_groups()[0].hyper) options.names[t.impl()] = name;
    for (const auto& [name, p] : model->named_parameters()) {
      options.names[p.impl()] = name;
      for (const auto& [key, t] : optimizer->state(p)) options.names[t.impl()] = name + "." + key;
    }
    return options;
  }

  static Tensor batch(int s, DType dtype) {
    return sin(arange(24, {.dtype = dtype}).reshape({6, 4}) * (0.3 + 0.1 * s));
  }
  static Tensor target(int s, DType dtype) {
    return cos(arange(18, {.dtype = dtype}).reshape({6, 3}) * (0.2 + 0.05 * s));
  }
};

// The traced step holds one pure multi-tensor update for the model's one parameter group
// (no per-parameter update) and writes back every parameter and every state tensor (by the
// names Trainer::names gave them).
void check_graph(Trainer& trainer, const Graph& g, const std::string& update) {
  INFO(print(g));
  const auto params = trainer.model->named_parameters();
  const std::string multi = update + "_multi";
  CHECK(count_ops(g, multi) == 1);
  CHECK(count_ops(g, update) == 0);
  CHECK(count_ops(g, update + "_") == 0);
  CHECK(count_ops(g, multi + "_") == 0);
  // The lr is a scalar input that the update reads: the first input after the N tensors of
  // each of the 3 (sgd_update_multi) or 6 (adamw_update_multi) roles.
  const size_t lr_index = (update == "sgd_update" ? 3 : 6) * params.size();
  for (const compiler::Node& n : g.nodes()) {
    if (n.kind != NodeKind::op || n.op != multi) continue;
    CHECK(n.attrs.i("count") == static_cast<int64_t>(params.size()));
    const compiler::Node& lr = g.node(n.inputs.at(lr_index));
    CHECK(lr.kind == NodeKind::input);
    CHECK(lr.name == "lr");
    CHECK(lr.role == InputRole::scalar);
  }
  std::set<std::string> written;
  for (const auto& [input, value] : g.write_backs()) written.insert(g.node(input).name);
  for (const auto& [name, p] : params) {
    CHECK(written.count(name));
    for (const auto& [key, t] : trainer.optimizer->state(p)) {
      INFO(name << "." << key);
      CHECK(written.count(name + "." + key));
    }
  }
}

// Every parameter and state tensor of `actual` against `expected`'s, to `tol`.
void check_same(Trainer& actual, Trainer& expected, double tol) {
  const auto params = actual.model->named_parameters(), expected_params = expected.model->named_parameters();
  REQUIRE(params.size() == expected_params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].first);
    KILN_CHECK_CLOSE(params[i].second, expected_params[i].second, tol, tol);
    const auto& state = actual.optimizer->state(params[i].second);
    const auto& expected_state = expected.optimizer->state(expected_params[i].second);
    REQUIRE(state.size() == expected_state.size());
    for (const auto& [key, t] : state) {
      INFO(key);
      KILN_CHECK_CLOSE(t, expected_state.at(key), tol, tol);
    }
  }
}

// Five training steps compiled against the same five run eagerly on a copy, with the lr
// changed by a cosine schedule between steps when `schedule` is set: no recompile, no
// graph break, equal parameters and state after each step.
void check_compiled_steps(const MakeOptimizer& make, const std::string& update, DType dtype,
                          bool schedule, double tol) {
  Trainer compiled_trainer(make, dtype), eager_trainer(make, dtype);
  CompileOptions options{.fullgraph = true, .trace = compiled_trainer.names()};
  CompiledFunction compiled = compile(compiled_trainer.function(), options);
  std::unique_ptr<optim::Scheduler> compiled_schedule, eager_schedule;
  if (schedule) {
    compiled_schedule = std::make_unique<optim::Scheduler>(*compiled_trainer.optimizer,
                                                           std::make_shared<optim::Cosine>(6));
    eager_schedule = std::make_unique<optim::Scheduler>(*eager_trainer.optimizer,
                                                        std::make_shared<optim::Cosine>(6));
  }
  for (int s = 1; s <= 5; ++s) {
    INFO("step " << s);
    const Args args{Trainer::batch(s, dtype), Trainer::target(s, dtype)};
    const Tensor loss = compiled(args)[0];
    const Tensor expected = eager_trainer.step(args)[0];
    KILN_CHECK_CLOSE(loss, expected, tol, tol);
    check_same(compiled_trainer, eager_trainer, tol);
    if (schedule) {
      compiled_schedule->step();
      eager_schedule->step();
    }
  }
  if (schedule)
    CHECK(compiled_trainer.optimizer->param_groups()[0].lr() ==
          eager_trainer.optimizer->param_groups()[0].lr());
  CHECK(compiled.recompiles() == 0);
  CHECK(compiled.graph_breaks() == 0);
  CHECK(compiled.calls() == 5);
  REQUIRE(compiled.traces().size() == 1);
  check_graph(compiled_trainer, compiled.traces()[0]->graph, update);
}

std::unique_ptr<optim::Optimizer> make_sgd(const std::vector<Tensor>& params) {
  return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.1, .momentum = 0.9,
                                                                .dampening = 0.1, .weight_decay = 0.01});
}
std::unique_ptr<optim::Optimizer> make_nesterov(const std::vector<Tensor>& params) {
  return std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.1, .momentum = 0.8, .nesterov = true});
}
std::unique_ptr<optim::Optimizer> make_adamw(const std::vector<Tensor>& params) {
  return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 0.02, .weight_decay = 0.1});
}
std::unique_ptr<optim::Optimizer> make_amsgrad(const std::vector<Tensor>& params) {
  return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 0.02, .amsgrad = true});
}
// Step counts on the parameters' device (the CPU here) and bumped there: the same graph.
std::unique_ptr<optim::Optimizer> make_capturable(const std::vector<Tensor>& params) {
  return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = 0.02, .weight_decay = 0.1, .capturable = true});
}

}  // namespace

TEST_CASE("a whole SGD training step compiles to one graph equal to eager", "[optgraph]") {
  check_compiled_steps(make_sgd, "sgd_update", DType::f64, false, 1e-12);
  check_compiled_steps(make_nesterov, "sgd_update", DType::f64, false, 1e-12);
  check_compiled_steps(make_sgd, "sgd_update", DType::f32, false, 1e-5);
}

TEST_CASE("a whole AdamW training step compiles to one graph equal to eager", "[optgraph]") {
  check_compiled_steps(make_adamw, "adamw_update", DType::f64, false, 1e-12);
  check_compiled_steps(make_amsgrad, "adamw_update", DType::f64, false, 1e-12);
  check_compiled_steps(make_capturable, "adamw_update", DType::f64, false, 1e-12);
}

TEST_CASE("an lr schedule between compiled steps recompiles nothing", "[optgraph]") {
  check_compiled_steps(make_sgd, "sgd_update", DType::f64, true, 1e-12);
  check_compiled_steps(make_adamw, "adamw_update", DType::f64, true, 1e-12);
  check_compiled_steps(make_capturable, "adamw_update", DType::f64, true, 1e-12);
}

TEST_CASE("the traced AdamW step counts steps in the graph", "[optgraph]") {
  Trainer trainer(make_adamw, DType::f64);
  const Tensor p = trainer.model->parameters()[0];
  const Tensor step = trainer.optimizer->state(p).at("step");
  Trace t = trace(trainer.function(), {Trainer::batch(1, DType::f64), Trainer::target(1, DType::f64)},
                  trainer.names());
  CHECK(step.item<double>() == 2.0);  // the warm-up step and the traced one
  const Graph& g = t.graph;
  INFO(print(g));
  // Each parameter's "step" is a scalar input whose add(1) is written back and read by the update.
  for (const auto& [input, value] : g.write_backs())
    if (g.node(input).name.ends_with(".step")) {
      CHECK(g.node(input).role == InputRole::scalar);
      CHECK(g.node(value).op == "add");
    }
  interpret(g, t.inputs_for({Trainer::batch(2, DType::f64), Trainer::target(2, DType::f64)}));
  CHECK(step.item<double>() == 3.0);
}

TEST_CASE("tracing an optimizer's first step is refused with advice", "[optgraph]") {
  manual_seed(3);
  models::MLP model({4, 3});
  model.to(DType::f64);
  optim::SGD sgd(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  auto fn = [&](const Args& a) -> Args {
    Tensor loss = mse_loss(model(a[0]), a[1]);
    loss.backward();
    sgd.step();
    return {loss.detach()};
  };
  REQUIRE_THROWS_WITH(trace(fn, {Trainer::batch(0, DType::f64), zeros({6, 3}, {.dtype = DType::f64})}),
                      Contains("sgd_update_") && Contains("first step"));
}
