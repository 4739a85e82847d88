// Split runs (compiler/split.cpp) under stress, what they hand out: results that alias
// pending memory or arguments, pieces that change between calls, throws, printing, memory,
// nested compiled functions. Each case runs the compiled function against the same
// function run eagerly on identical copies of its state (helpers: split_testing.h).
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

TEST_CASE("split edge: views of pending results modified by the caller", "[split]") {
  const std::string backend = GENERATE("generated", "interpreter");
  INFO(backend);
  auto fn = [](const Args& a) -> Args {
    (void)sum(a[0] * 2).item<double>();
    Tensor t = a[0] * 2 + 1;
    Tensor front = t.narrow(0, 0, 2);
    t.add_(a[0]);  // after the view was taken: the view sees it
    Tensor only_view = (a[0] - 1).transpose(0, 1);  // its base dies here
    return {t.narrow(0, 1, 2), t.transpose(0, 1), t, front, only_view};
  };
  CompiledFunction f = compile(fn, {.backend = backend});
  f({randn({3, 4}, f64)});
  for (int i = 0; i < 2; ++i) {
    const Tensor x = randn({3, 4}, f64);
    Args got = f({x});
    Args want = fn({x});
    for (size_t k = 0; k < got.size(); ++k) {
      INFO("result " << k);
      CHECK_FALSE(pending(got[k]));
      KILN_CHECK_EQUAL(got[k], want[k]);
    }
    CHECK(got[0].storage() == got[2].storage());
    CHECK(got[1].storage() == got[2].storage());
    CHECK(got[3].storage() == got[2].storage());
    CHECK(got[4].strides() == want[4].strides());
    got[0].add_(100);
    want[0].add_(100);
    got[4].mul_(-1);
    want[4].mul_(-1);
    for (size_t k = 0; k < got.size(); ++k) {
      INFO("result " << k << " after the caller wrote into it");
      KILN_CHECK_EQUAL(got[k], want[k]);
    }
  }
  CHECK(f.split_calls() == 2);
}

TEST_CASE("split edge: results that are arguments or in-place-modified arguments", "[split]") {
  auto fn = [](const Args& a) -> Args {
    (void)sum(a[0] * 2).item<double>();
    Tensor second = a[1];
    second.mul_(2);
    Tensor detached = a[2].detach();
    detached.add_(a[0]);  // written through another handle on the same memory
    return {a[0], a[1], a[2], a[1] * 1};
  };
  CompiledFunction f = compile(fn);
  {
    Args warm = {randn({3}, f64), randn({3}, f64), randn({3}, f64)};
    f(warm);
  }
  for (int i = 0; i < 2; ++i) {
    const Tensor x = randn({3}, f64), y = randn({3}, f64), z = randn({3}, f64);
    Args args = {x.clone(), y.clone(), z.clone()};
    Args ref_args = {x.clone(), y.clone(), z.clone()};
    const Args got = f(args);
    const Args want = fn(ref_args);
    for (size_t k = 0; k < 3; ++k) {
      INFO("argument " << k);
      CHECK(got[k].same(args[k]));
      KILN_CHECK_EQUAL(args[k], ref_args[k]);
    }
    KILN_CHECK_EQUAL(got[3], want[3]);
    KILN_CHECK_EQUAL(args[1], y * 2);
    KILN_CHECK_EQUAL(args[2], z + x);
    CHECK(kiln::testing::split_piece_ends(f) == std::vector<std::string>{"item", "return"});
  }
}

TEST_CASE("split edge: pieces that differ between calls compile once each", "[split]") {
  // The number of doublings depends on a value computed in the call: 1 or 3 pieces of the
  // same loop body.
  auto fn = [](const Args& a) -> Args {
    const int64_t rounds = sum(a[0]).item<double>() > 0 ? 1 : 3;
    Tensor t = a[0];
    for (int64_t r = 0; r < rounds; ++r) {
      t = t * 2 + 1;
      if (sum(t).item<double>() > 1e9) t = t * 0;
    }
    return {exp(t)};
  };
  CompiledFunction f = compile(fn);
  const Tensor positive = abs(randn({4}, f64)) + 0.5, negative = -abs(randn({4}, f64)) - 0.5;
  f({positive});  // traced
  KILN_CHECK_CLOSE(f({positive})[0], fn({positive})[0], 1e-12, 1e-12);
  CHECK(kiln::testing::split_piece_ends(f) == std::vector<std::string>{"item", "item", "return"});
  // first sum; (the first loop body, whose input is an argument); exp of a pending-then-computed value
  const int64_t after_positive = f.piece_programs();
  KILN_CHECK_CLOSE(f({negative})[0], fn({negative})[0], 1e-12, 1e-12);
  CHECK(kiln::testing::split_piece_ends(f) == std::vector<std::string>{"item", "item", "item", "item", "return"});
  // Later loop bodies read a computed value rather than an argument: at most one new
  // program for them; the return piece is the same as before.
  CHECK(f.piece_programs() <= after_positive + 1);
  const int64_t after_both = f.piece_programs();
  for (int i = 0; i < 3; ++i) {
    const Tensor x = i % 2 ? positive * (i + 1) : negative * (i + 1);
    KILN_CHECK_CLOSE(f({x})[0], fn({x})[0], 1e-12, 1e-12);
  }
  CHECK(f.piece_programs() == after_both);
  CHECK(f.recompiles() == 0);
}

TEST_CASE("split edge: a throw midway leaves what fn kept computed", "[split]") {
  Tensor kept;
  Tensor counter = zeros({2}, f64);
  auto fn = [&kept, &counter](const Args& a) -> Args {
    (void)sum(a[0] * 2).item<double>();
    counter.add_(1);
    kept = a[0] * 3;  // escapes fn through the capture, pending when the throw comes
    // matmul of [2] with [3]: its shape rule fails at the call, as eagerly
    return {matmul(a[0], a[1])};
  };
  CompiledFunction f = compile(fn);
  const Tensor x = randn({2}, f64), bad = randn({3}, f64);
  CHECK_THROWS_WITH(f({x, bad}), Contains("matmul"));  // traced
  CHECK_THROWS_WITH(f({x, bad}), Contains("matmul"));  // split
  KILN_CHECK_EQUAL(counter, full({2}, 2.0, f64));
  REQUIRE(kept.defined());
  CHECK_FALSE(pending(kept));
  KILN_CHECK_EQUAL(kept, x * 3);
  // No hook is left installed: eager code afterwards computes at once.
  CHECK_FALSE(pending(exp(x)));
  // And the compiled function still works for good arguments (guards differ: a new entry).
  const Tensor good = randn({2}, f64);
  KILN_CHECK_CLOSE(f({x, good})[0], matmul(x, good), 1e-12, 1e-12);
}

TEST_CASE("split edge: printing a pending tensor inside fn", "[split]") {
  std::vector<std::string> printed;
  auto fn = [&printed](const Args& a) -> Args {
    (void)sum(a[0] * 2).item<double>();
    const Tensor t = a[0] * 3 - 1;
    printed.push_back(t.str());
    printed.push_back(t.transpose(0, 1).str());
    return {t + 1};
  };
  CompiledFunction f = compile(fn);
  f({randn({2, 3}, f64)});
  const Tensor x = randn({2, 3}, f64);
  printed.clear();
  const Tensor got = f({x})[0];
  const std::vector<std::string> compiled = printed;
  printed.clear();
  KILN_CHECK_CLOSE(got, fn({x})[0], 1e-15, 1e-15);
  CHECK(compiled == printed);
  CHECK(kiln::testing::split_piece_ends(f) == std::vector<std::string>{"item", "str", "return"});
}

TEST_CASE("split edge: printing a parameter a deferred update wrote", "[split]") {
  // str() reports a host read: the pending piece that updates the parameter runs first.
  Tensor p = ones({3}, f64);
  std::vector<std::string> printed;
  auto fn = [&p, &printed](const Args& a) -> Args {
    (void)sum(a[0] * 2).item<double>();
    p.add_(a[0]);
    printed.push_back(p.str());
    return {};
  };
  CompiledFunction f = compile(fn);
  f({ones({3}, f64)});  // traced: p = 2
  printed.clear();
  f({ones({3}, f64)});  // split: p = 3
  KILN_CHECK_EQUAL(p, full({3}, 3.0, f64));
  REQUIRE(printed.size() == 1);
  CHECK(printed[0] == full({3}, 3.0, f64).str());
}

TEST_CASE("split edge: equal values from one piece stay separate tensors", "[split]") {
  auto fn = [](const Args& a) -> Args {
    (void)sum(a[0] * 2).item<double>();
    Tensor t = a[0] * 2, u = a[0] * 2;  // one value after common subexpressions merge
    return {t, u, t};
  };
  CompiledFunction f = compile(fn);
  f({randn({3}, f64)});
  const Tensor x = randn({3}, f64);
  Args got = f({x});
  CHECK(got[0].same(got[2]));
  CHECK_FALSE(got[0].storage() == got[1].storage());
  got[1].add_(1);
  KILN_CHECK_EQUAL(got[0], x * 2);
  KILN_CHECK_EQUAL(got[1], x * 2 + 1);
}

TEST_CASE("split edge: a refused random op with its own generator between pieces", "[split]") {
  auto fn = [](const Args& a) -> Args {
    Generator mine(99);
    const Tensor h = dropout(a[0] * 2, 0.5, true, &mine);  // refused: runs eagerly
    const Tensor d = dropout(h + 1, 0.25);                  // the default generator: traced
    return {d * sum(h).item<double>()};
  };
  const Tensor x = randn({32});
  manual_seed(11);
  (void)fn({x});
  const Tensor want = fn({x})[0];
  CompiledFunction f = compile(fn);
  manual_seed(11);
  (void)f({x});  // traced
  KILN_CHECK_CLOSE(f({x})[0], want, 1e-6, 1e-6);
  CHECK(f.split_calls() == 1);
  CHECK(kiln::testing::split_piece_ends(f).front() == "dropout");
}

TEST_CASE("split edge: memory returns to its baseline after split calls", "[split]") {
  manual_seed(12);
  models::MLP model({4, 8, 2});
  optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  auto step = compile([&model, &opt](const Args& a) -> Args {
    const Tensor loss = mse_loss(model(a[0]), a[1]);
    (void)loss.item<double>();
    loss.backward();
    opt.step();
    Tensor hidden = relu(a[0] * 2);
    return {loss, hidden.narrow(1, 0, 2)};
  });
  const Tensor x = randn({6, 4}), y = randn({6, 2});
  for (int i = 0; i < 2; ++i) {  // trace, then a split call that compiles the pieces
    opt.zero_grad();
    (void)step({x, y});
  }
  opt.zero_grad();
  const int64_t baseline = memory_stats().allocated;
  for (int i = 0; i < 3; ++i) {
    INFO("call " << i);
    {
      const Args out = step({x, y});
      for (const Tensor& t : out) CHECK_FALSE(pending(t));
      for (const Tensor& p : model.parameters()) {
        CHECK_FALSE(pending(p));
        CHECK_FALSE(pending(p.grad()));
      }
      (void)out[1].data_ptr<float>()[0];
    }
    opt.zero_grad();
    CHECK(memory_stats().allocated == baseline);
  }
  CHECK(step.split_calls() == 4);
}

TEST_CASE("split edge: results of earlier split calls keep their values", "[split]") {
  // A piece's result memory goes to the pending tensor (take_memory): a later call of the
  // same program must not write into it again.
  const std::string backend = GENERATE("generated", "interpreter");
  INFO(backend);
  manual_seed(13);
  Tensor p = randn({4}, f64);
  p.requires_grad_();
  auto fn = [&p](const Args& a) -> Args {
    const Tensor h = tanh(a[0] * p) + 1;
    const double s = sum(h).item<double>();
    const Tensor loss = sum(h * h) / s;
    loss.backward();
    return {h, loss, exp(a[0]) * 2, p.grad()};
  };
  CompiledFunction f = compile(fn, {.backend = backend});
  std::vector<Args> kept, wanted;
  for (int i = 0; i < 4; ++i) {
    const Tensor x = randn({4}, f64);
    p.set_grad({});
    kept.push_back(f({x}));
    p.set_grad({});
    Args want = fn({x});
    for (Tensor& t : want) t = t.detach().clone();
    wanted.push_back(want);
  }
  for (size_t i = 0; i < kept.size(); ++i)
    for (size_t k = 0; k < kept[i].size(); ++k) {
      INFO("call " << i << " result " << k);
      KILN_CHECK_CLOSE(kept[i][k], wanted[i][k], 1e-12, 1e-12);
    }
  CHECK(f.split_calls() == 3);
}

TEST_CASE("split edge: a number read on the host that shapes the next piece", "[split]") {
  // narrow lengths from item(): pieces of one structure but other shapes must not share a
  // program.
  auto fn = [](const Args& a) -> Args {
    const auto n = static_cast<int64_t>(sum(a[0] * 0 + 1).item<double>() * a[1].numel() / a[0].numel()) % 5 + 1;
    const Tensor head = a[1].narrow(0, 0, n) * 2;
    return {head + 1, sum(head).reshape({1})};
  };
  CompiledFunction f = compile(fn);
  const Tensor y = randn({8}, f64);
  f({randn({3}, f64), y});
  for (int64_t len : {3, 4, 5, 3, 6}) {
    INFO("length " << len);
    const Tensor x = randn({len}, f64);
    const Args got = f({x, y});
    const Args want = fn({x, y});
    REQUIRE(got[0].shape() == want[0].shape());
    KILN_CHECK_CLOSE(got[0], want[0], 1e-12, 1e-12);
    KILN_CHECK_CLOSE(got[1], want[1], 1e-12, 1e-12);
  }
}

TEST_CASE("split edge: one argument passed twice and written through one of them", "[split]") {
  auto fn = [](const Args& a) -> Args {
    (void)sum(a[0] * 2).item<double>();
    Tensor second = a[1];
    second.mul_(2);
    return {a[0] + 1, a[1] * 3};
  };
  CompiledFunction f = compile(fn);
  {
    const Tensor warm = randn({3}, f64);
    f({warm, warm});
  }
  for (int i = 0; i < 2; ++i) {
    const Tensor x = randn({3}, f64);
    const Tensor mine = x.clone(), theirs = x.clone();
    const Args got = f({mine, mine});
    const Args want = fn({theirs, theirs});
    KILN_CHECK_EQUAL(mine, theirs);
    KILN_CHECK_EQUAL(got[0], want[0]);
    KILN_CHECK_EQUAL(got[1], want[1]);
  }
  CHECK(f.split_calls() == 2);
}

TEST_CASE("split edge: retain_grad on a non-leaf and host reads of views of pending tensors", "[split]") {
  Tensor p = randn({2, 3}, f64);
  p.requires_grad_();
  Tensor p_ref = leaf_copy(p);
  Tensor kept, kept_ref;
  std::vector<double> read, read_ref;
  auto step_of = [](Tensor& w, Tensor& keep, std::vector<double>& log) {
    return [&w, &keep, &log](const Args& a) -> Args {
      Tensor h = a[0] * w;
      h.retain_grad();
      const Tensor t = exp(h);
      log.push_back(t[1][2].item<double>());           // a 0-d view of a pending tensor
      log.push_back(t.transpose(0, 1)[0][1].item<double>());
      sum(t * t).backward();
      log.push_back(h.grad()[0][0].item<double>());    // a .grad autograd made pending
      keep = h;
      return {};
    };
  };
  CompiledFunction f = compile(step_of(p, kept, read));
  auto eager = step_of(p_ref, kept_ref, read_ref);
  for (int i = 0; i < 3; ++i) {
    const Tensor x = randn({2, 3}, f64);
    p.set_grad({});
    p_ref.set_grad({});
    f({x});
    eager({x});
    REQUIRE(kept.grad().defined());
    CHECK_FALSE(pending(kept.grad()));
    KILN_CHECK_CLOSE(kept.grad(), kept_ref.grad(), 1e-12, 1e-12);
    KILN_CHECK_CLOSE(p.grad(), p_ref.grad(), 1e-12, 1e-12);
  }
  REQUIRE(read.size() == read_ref.size());
  for (size_t k = 0; k < read.size(); ++k) CHECK(read[k] == Approx(read_ref[k]).epsilon(1e-12));
  CHECK(f.split_calls() == 2);
}

TEST_CASE("split edge: values that alias a written-back parameter stay separate", "[split]") {
  Tensor p = zeros({3}, f64);
  auto fn = [&p](const Args& a) -> Args {
    (void)sum(a[0] * 2).item<double>();
    p.add_(a[0]);
    return {p * 1, p + 0, p};  // simplification may make the first two p's new value itself
  };
  CompiledFunction f = compile(fn);
  f({ones({3}, f64)});
  const Tensor x = randn({3}, f64);
  const Tensor before = p.clone();
  const Args got = f({x});
  CHECK(got[2].same(p));
  KILN_CHECK_EQUAL(p, before + x);
  p.add_(100);  // the caller writes the parameter: the copies must not follow
  KILN_CHECK_EQUAL(got[0], before + x);
  KILN_CHECK_EQUAL(got[1], before + x);
  KILN_CHECK_EQUAL(got[2], before + x + 100);
}

TEST_CASE("split edge: a kernel error inside a piece", "[split]") {
  // The target's class is out of range: cross_entropy's shape rule cannot see it, its kernel
  // does, so a split run meets it when the piece runs (at item()). The error must still come
  // out, and the compiled function stay usable.
  auto fn = [](const Args& a) -> Args {
    const Tensor logits = a[0] * 2;
    (void)sum(logits).item<double>();
    const Tensor loss = cross_entropy(logits * 3, a[1]);
    return {loss * loss.item<double>()};
  };
  CompiledFunction f = compile(fn, {.backend = "interpreter"});
  const Tensor x = randn({2, 3}, f64);
  const Tensor good = from_vector<int64_t>({0, 2}), bad = from_vector<int64_t>({0, 7});
  KILN_CHECK_CLOSE(f({x, good})[0], fn({x, good})[0], 1e-12, 1e-12);  // traced
  KILN_CHECK_CLOSE(f({x, good})[0], fn({x, good})[0], 1e-12, 1e-12);  // split
  CHECK_THROWS(fn({x, bad}));
  CHECK_THROWS(f({x, bad}));
  CHECK_FALSE(pending(exp(x)));
  KILN_CHECK_CLOSE(f({x, good})[0], fn({x, good})[0], 1e-12, 1e-12);
}

TEST_CASE("split edge: a learning rate set inside the step after the deferred update", "[split]") {
  // ParamGroup::set writes the 0-d lr tensor with fill_ (an op): deferred after the SGD
  // update that reads the old lr, as eager code orders them.
  manual_seed(14);
  models::MLP model({3, 2}), reference({3, 2});
  kiln::testing::copy_parameters(model, reference);
  optim::SGD opt(model.parameters(), {.lr = 0.1});
  optim::SGD ref_opt(reference.parameters(), {.lr = 0.1});
  auto step_of = [](models::MLP& m, optim::SGD& o) {
    return [&m, &o](const Args& a) -> Args {
      const Tensor loss = mse_loss(m(a[0]), a[1]);
      (void)loss.item<double>();
      loss.backward();
      o.step();
      o.param_groups()[0].set_lr(o.param_groups()[0].lr() * 0.5);  // a schedule's step
      return {loss};
    };
  };
  CompiledFunction step = compile(step_of(model, opt));
  auto eager = step_of(reference, ref_opt);
  for (int i = 0; i < 3; ++i) {
    INFO("step " << i);
    const Tensor x = randn({4, 3}), y = randn({4, 2});
    opt.zero_grad();
    ref_opt.zero_grad();
    Tensor got;
    CHECK_NOTHROW(got = step({x, y})[0]);
    KILN_CHECK_CLOSE(got, eager({x, y})[0], 1e-5, 1e-6);
    check_modules_close(model, reference, 1e-5, 1e-6);
  }
}

TEST_CASE("split edge: a compiled function called inside a split run", "[split]") {
  CompiledFunction inner = compile([](const Args& a) -> Args { return {exp(a[0]) * 2 - a[0]}; });
  auto fn = [&inner](const Args& a) -> Args {
    (void)sum(a[0] * 2).item<double>();
    const Tensor t = a[0] * 3;  // pending when the inner function gets it
    const Tensor r = inner({t})[0];
    return {r + 1};
  };
  auto eager = [](const Args& a) -> Args { return {exp(a[0] * 3) * 2 - a[0] * 3 + 1}; };
  CompiledFunction f = compile(fn);
  for (int i = 0; i < 3; ++i) {
    INFO("call " << i);
    const Tensor x = randn({4}, f64);
    const Tensor got = f({x})[0];
    CHECK_FALSE(pending(got));
    KILN_CHECK_CLOSE(got, eager({x})[0], 1e-12, 1e-12);
  }
}

// inner_kind 0: an inner compiled function, a whole graph with a library op (matmul),
// traced before the outer split calls; 1: the same, first called (traced) inside a split
// call; 2: an inner function with a break of its own (a split run inside a split run).
static void check_nested(int inner_kind) {
  INFO("inner kind " << inner_kind);
  auto inner_fn = [inner_kind](const Args& a) -> Args {
    Tensor r = matmul(a[0], a[1]) + 1;
    if (inner_kind == 2) r = r * sum(r).item<double>();
    return {r};
  };
  CompiledFunction inner = compile(inner_fn);
  bool use_inner = inner_kind != 1;
  auto outer_of = [](const TracedFunction& g, const bool& use) {
    return [g, &use](const Args& a) -> Args {
      (void)sum(a[0] * 2).item<double>();
      const Tensor t = a[0] * 3;  // pending when the inner function gets it
      const Tensor r = use ? g({t, a[1]})[0] : t;
      return {tanh(r) + 1};
    };
  };
  const bool always = true;
  CompiledFunction f = compile(outer_of(inner, use_inner));
  auto eager = outer_of(inner_fn, always);
  for (int i = 0; i < 3; ++i) {
    INFO("call " << i);
    const Tensor x = randn({2, 3}, f64), w = randn({3, 2}, f64) * 0.1;
    if (i == 1) use_inner = true;
    Tensor got;
    REQUIRE_NOTHROW(got = f({x, w})[0]);
    if (i == 0 && inner_kind == 1) continue;
    CHECK_FALSE(pending(got));
    KILN_CHECK_CLOSE(got, eager({x, w})[0], 1e-12, 1e-12);  // f64, one matmul and tanh apart
  }
  CHECK(f.split_calls() == 2);
}

TEST_CASE("split edge: nested compiled functions inside a split run", "[split]") {
  check_nested(GENERATE(0, 2));
}

TEST_CASE("split edge: a compiled function first traced inside a split run", "[split]") {
  // trace() turns deferral off while it runs fn: its calls compute as it records them.
  check_nested(1);
}
