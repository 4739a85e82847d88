// Split runs (compiler/split.cpp) under stress, autograd and training: retain_graph, hooks,
// in-place ops on non-leaves, accumulation, optimizers and batch norm across breaks, an lr
// set mid-step. Each case runs the compiled function against the same function run eagerly
// on identical copies of its state (helpers: split_testing.h).
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "compiler/compile.h"
#include "compiler/trace.h"
#include "compiler_testing.h"
#include "split_testing.h"
#include "core/storage.h"
#include "models/layers.h"
#include "models/norm_layers.h"
#include "models/small_models.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using Catch::Matchers::Contains;

using namespace kiln::testing::split;

TEST_CASE("split edge: two backward calls with retain_graph across breaks", "[split]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  const std::string backend = GENERATE("generated", "interpreter");
  INFO(fmt::format("{} {}", dtype, backend));
  manual_seed(3);
  Tensor w = randn({4}, {.dtype = dtype});
  w.requires_grad_();
  Tensor w_ref = leaf_copy(w);
  auto step_of = [](Tensor& p) {
    return [&p](const Args& a) -> Args {
      const Tensor y = sum(exp(a[0] * p) * p);
      const double v = y.item<double>();
      y.backward({}, true);
      const Tensor first = p.grad().clone();
      (void)sum(first).item<double>();  // another break between the two backward calls
      y.backward();                      // reuses the saved (once pending) activations
      return {y * v, first, p.grad()};
    };
  };
  CompiledFunction f = compile(step_of(w), {.backend = backend});
  auto eager = step_of(w_ref);
  for (int i = 0; i < 3; ++i) {
    INFO("call " << i);
    const Tensor x = randn({4}, {.dtype = dtype});
    w.set_grad({});
    w_ref.set_grad({});
    const Args got = f({x});
    const Args want = eager({x});
    for (size_t k = 0; k < got.size(); ++k) {
      CHECK_FALSE(pending(got[k]));
      KILN_CHECK_CLOSE(got[k], want[k], rtol_for(dtype), atol_for(dtype));
    }
    KILN_CHECK_CLOSE(got[2], got[1] * 2, rtol_for(dtype), atol_for(dtype));
    if (i > 0) CHECK(kiln::testing::split_piece_ends(f) == std::vector<std::string>{"item", "item", "return"});
  }
  CHECK(f.split_calls() == 2);
}

TEST_CASE("split edge: gradient hooks and post-accumulate hooks run inside a split run", "[split]") {
  const std::string backend = GENERATE("generated", "interpreter");
  INFO(backend);
  manual_seed(4);
  Tensor w = randn({3}, f64);
  w.requires_grad_();
  Tensor w_ref = leaf_copy(w);
  // Per side: the norms the hooks read on the host (breaks inside the backward pass).
  std::vector<double> seen, seen_ref;
  auto install = [](Tensor& p, std::vector<double>& log) {
    p.register_post_accumulate_grad_hook([&log](const Tensor& leaf) {
      NoGradGuard no_grad;
      Tensor g = leaf.grad();
      g.mul_(0.5);  // an in-place write into the fresh .grad, deferred
      log.push_back(sum(g * g).item<double>());
    });
  };
  install(w, seen);
  install(w_ref, seen_ref);
  auto step_of = [](Tensor& p, std::vector<double>& log) {
    return [&p, &log](const Args& a) -> Args {
      const Tensor h = a[0] * p;
      h.register_hook([&log](const Tensor& g) {
        log.push_back(sum(g).item<double>());
        return g * 3;  // replaces the gradient flowing to p
      });
      const Tensor loss = sum(h * h);
      log.push_back(loss.item<double>());
      loss.backward();
      return {loss, p.grad()};
    };
  };
  CompiledFunction f = compile(step_of(w, seen), {.backend = backend});
  auto eager = step_of(w_ref, seen_ref);
  for (int i = 0; i < 3; ++i) {
    INFO("call " << i);
    const Tensor x = randn({3}, f64);
    w.set_grad({});
    w_ref.set_grad({});
    const Args got = f({x});
    const Args want = eager({x});
    KILN_CHECK_CLOSE(got[0], want[0], 1e-12, 1e-12);
    KILN_CHECK_CLOSE(got[1], want[1], 1e-12, 1e-12);
    KILN_CHECK_CLOSE(w.grad(), x * x * w * 3, 1e-12, 1e-12);  // 2 x^2 w, times 3, halved
    REQUIRE(seen.size() == seen_ref.size());
    for (size_t k = 0; k < seen.size(); ++k) CHECK(seen[k] == Approx(seen_ref[k]).epsilon(1e-12));
  }
  CHECK(f.split_calls() == 2);
}

TEST_CASE("split edge: two accumulated micro-steps with a host read between them", "[split]") {
  const DType dtype = GENERATE(DType::f32, DType::f64);
  INFO(fmt::format("{}", dtype));
  manual_seed(5);
  models::MLP model({3, 8, 2}), reference({3, 8, 2});
  model.to(dtype);
  reference.to(dtype);
  kiln::testing::copy_parameters(model, reference);
  optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  optim::SGD ref_opt(reference.parameters(), {.lr = 0.05, .momentum = 0.9});
  std::vector<double> logged, ref_logged;
  auto step_of = [](models::MLP& m, optim::SGD& o, std::vector<double>& log) {
    return [&m, &o, &log](const Args& a) -> Args {
      Tensor total = zeros({}, {.dtype = a[0].dtype()});
      for (int64_t k = 0; k < 2; ++k) {
        const Tensor loss = mse_loss(m(a[0].narrow(0, 4 * k, 4)), a[1].narrow(0, 4 * k, 4)) / 2;
        loss.backward();
        log.push_back(loss.item<double>());  // between the micro-steps: .grad half accumulated
        total = total + loss.detach();
      }
      o.step();
      return {total};
    };
  };
  CompiledFunction step = compile(step_of(model, opt, logged));
  auto eager = step_of(reference, ref_opt, ref_logged);
  for (int i = 0; i < 4; ++i) {
    INFO("step " << i);
    const Tensor x = randn({8, 3}, {.dtype = dtype}), y = randn({8, 2}, {.dtype = dtype});
    opt.zero_grad();
    ref_opt.zero_grad();
    const Tensor got = step({x, y})[0];
    const Tensor want = eager({x, y})[0];
    CHECK_FALSE(pending(got));
    KILN_CHECK_CLOSE(got, want, rtol_for(dtype), atol_for(dtype));
    check_modules_close(model, reference, rtol_for(dtype), atol_for(dtype));
  }
  REQUIRE(logged.size() == ref_logged.size());
  for (size_t k = 0; k < logged.size(); ++k) CHECK(logged[k] == Approx(ref_logged[k]).epsilon(rtol_for(dtype)));
  CHECK(step.split_calls() == 3);
}

TEST_CASE("split edge: a conv net with batch norm averaging all batches and SGD momentum", "[split]") {
  // momentum nullopt: the layer adds 1 to num_batches_tracked and reads it on the host for the
  // update's weight, a break in every forward.
  manual_seed(6);
  auto make = [] {
    return nn::Sequential(nn::Conv2d(2, 4, 3, {.padding = 1}), nn::BatchNorm2d(4, {.momentum = std::nullopt}),
                          nn::ReLU(), nn::Flatten(), nn::Linear(4 * 4 * 4, 3));
  };
  nn::Sequential net = make(), reference = make();
  kiln::testing::copy_parameters(net, reference);
  optim::SGD opt(net.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
  optim::SGD ref_opt(reference.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
  auto step_of = [](nn::Sequential& m, optim::SGD& o) {
    return [&m, &o](const Args& a) -> Args {
      const Tensor loss = mse_loss(m(a[0]), a[1]);
      loss.backward();
      o.step();
      return {loss};
    };
  };
  CompiledFunction step = compile(step_of(net, opt), {.trace = module_names(net)});
  auto eager = step_of(reference, ref_opt);
  for (int i = 0; i < 4; ++i) {
    INFO("step " << i);
    const Tensor x = randn({3, 2, 4, 4}), y = randn({3, 3});
    opt.zero_grad();
    ref_opt.zero_grad();
    const Tensor got = step({x, y})[0];
    const Tensor want = eager({x, y})[0];
    KILN_CHECK_CLOSE(got, want, 1e-5, 1e-6);
    check_modules_close(net, reference, 1e-5, 1e-6);
  }
  CHECK(step.graph_breaks() == 1);
  CHECK(step.split_calls() == 3);
  CHECK(kiln::testing::split_piece_ends(step).front() == "item");
}

TEST_CASE("split edge: AdamW steps with the loss logged mid-step", "[split]") {
  const std::string backend = GENERATE("generated", "interpreter");
  INFO(backend);
  manual_seed(7);
  models::MLP model({4, 6, 2}), reference({4, 6, 2});
  model.to(DType::f64);
  reference.to(DType::f64);
  kiln::testing::copy_parameters(model, reference);
  optim::AdamW opt(model.parameters(), {.lr = 0.01, .weight_decay = 0.1, .amsgrad = true});
  optim::AdamW ref_opt(reference.parameters(), {.lr = 0.01, .weight_decay = 0.1, .amsgrad = true});
  // The traced call does not step: the optimizer's first step (which makes its state, a
  // refused call) comes in a split call.
  bool stepping = false;
  auto step_of = [&stepping](models::MLP& m, optim::AdamW& o) {
    return [&m, &o, &stepping](const Args& a) -> Args {
      o.zero_grad();
      const Tensor loss = mse_loss(m(a[0]), a[1]);
      if (loss.item<double>() < 0) throw std::logic_error("a squared error below zero");
      loss.backward();
      if (stepping) o.step();
      return {loss};
    };
  };
  CompiledFunction step = compile(step_of(model, opt), {.backend = backend});
  auto eager = step_of(reference, ref_opt);
  for (int i = 0; i < 4; ++i) {
    INFO("step " << i);
    stepping = i > 0;
    const Tensor x = randn({5, 4}, f64), y = randn({5, 2}, f64);
    KILN_CHECK_CLOSE(step({x, y})[0], eager({x, y})[0], 1e-12, 1e-12);
    check_modules_close(model, reference, 1e-12, 1e-12);
  }
  CHECK(step.split_calls() == 3);
  CHECK(step.recompiles() == 0);
}

TEST_CASE("split edge: an in-place op on a non-leaf that requires grad", "[split]") {
  const bool with_break = GENERATE(false, true);
  INFO("with a break: " << with_break);
  manual_seed(8);
  Tensor p = randn({4}, f64);
  p.requires_grad_();
  Tensor p_ref = leaf_copy(p);
  auto step_of = [with_break](Tensor& w) {
    return [&w, with_break](const Args& a) -> Args {
      Tensor x = a[0] * w;
      x.mul_(3);
      if (with_break) (void)sum(x).item<double>();
      x.add_(w);
      const Tensor loss = sum(x * x * w);
      loss.backward();
      return {loss, x};
    };
  };
  CompiledFunction f = compile(step_of(p));
  auto eager = step_of(p_ref);
  for (int i = 0; i < 3; ++i) {
    INFO("call " << i);
    const Tensor a = randn({4}, f64);
    p.set_grad({});
    p_ref.set_grad({});
    const Args got = f({a});
    const Args want = eager({a});
    KILN_CHECK_CLOSE(got[0], want[0], 1e-12, 1e-12);
    KILN_CHECK_CLOSE(got[1], want[1], 1e-12, 1e-12);
    KILN_CHECK_CLOSE(p.grad(), p_ref.grad(), 1e-12, 1e-12);
  }
  CHECK(f.graph_breaks() == (with_break ? 1 : 0));
}

TEST_CASE("split edge: an in-place write over a saved activation fails as in eager code", "[split]") {
  // exp saves its output; writing into it before backward must be caught by autograd's
  // version check in a split run too (the run puts back the versions the deferred calls made).
  Tensor p = randn({3}, f64);
  p.requires_grad_();
  auto fn = [&p](const Args& a) -> Args {
    Tensor y = exp(a[0] * p);
    (void)sum(y).item<double>();
    y.mul_(2);
    sum(y).backward();
    return {y};
  };
  const Tensor x = randn({3}, f64);
  std::string eager_error;
  try {
    fn({x});
  } catch (const Error& e) {
    eager_error = e.what();
  }
  REQUIRE_FALSE(eager_error.empty());
  CompiledFunction f = compile(fn);
  for (int i = 0; i < 2; ++i) {
    p.set_grad({});
    CHECK_THROWS_WITH(f({x}), Contains("modified by an inplace operation") || Contains("version"));
  }
  // The function is still usable afterwards: eager ops outside compute at once.
  const Tensor after = exp(x) + 1;
  CHECK_FALSE(pending(after));
}

TEST_CASE("split edge: a tensor written in place then saved for backward across a break", "[split]") {
  // The piece's write-back into `scale` is the deferred add_ itself: autograd saved scale
  // after that write, so its version check must still pass at backward.
  Tensor scale = ones({3}, f64);
  Tensor p = randn({3}, f64);
  p.requires_grad_();
  Tensor scale_ref = scale.clone();
  Tensor p_ref = leaf_copy(p);
  auto step_of = [](Tensor& s, Tensor& w) {
    return [&s, &w](const Args& a) -> Args {
      s.add_(a[0]);
      const Tensor loss = sum(s * w * w);
      (void)loss.item<double>();
      loss.backward();
      return {loss};
    };
  };
  CompiledFunction f = compile(step_of(scale, p));
  auto eager = step_of(scale_ref, p_ref);
  for (int i = 0; i < 3; ++i) {
    INFO("call " << i);
    const Tensor x = randn({3}, f64);
    p.set_grad({});
    p_ref.set_grad({});
    Tensor got;
    REQUIRE_NOTHROW(got = f({x})[0]);
    KILN_CHECK_CLOSE(got, eager({x})[0], 1e-12, 1e-12);
    KILN_CHECK_CLOSE(scale, scale_ref, 1e-12, 1e-12);
    KILN_CHECK_CLOSE(p.grad(), p_ref.grad(), 1e-12, 1e-12);
  }
  CHECK(f.split_calls() == 2);
}
