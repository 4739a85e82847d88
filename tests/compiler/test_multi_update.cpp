// The multi-tensor optimizer updates (sgd_update_multi_, adamw_update_multi_ and their pure
// twins, core/ops/optim_ops.h): bit for bit one single update per parameter, their shape
// rules, the mutated inputs that follow `count`, and a traced optimizer step that is one
// update node per group which the Program runs in place.
#include <memory>
#include <string>

#include "compiler/compile.h"
#include "compiler/passes/passes.h"
#include "compiler/program.h"
#include "compiler/trace.h"
#include "core/ops/optim_ops.h"
#include "core/registry.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "compiler_testing.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using kiln::testing::count_ops;
using kiln::testing::TempCache;
using Catch::Matchers::Contains;

namespace {

Tensor f64_scalar(double v) { return scalar_tensor(v, DType::f64); }

// Sizes across the CPU kernel's work list: a parameter of two chunks (65536 elements
// each), small ones, an empty one; together past the size that goes parallel.
const std::vector<Shape> kShapes = {{70001}, {5, 7}, {1}, {0, 3}, {3, 4, 2}};

std::vector<Tensor> randn_like_all(DType dtype, double scale = 1.0) {
  std::vector<Tensor> out;
  for (const Shape& s : kShapes) out.push_back(randn(s, {.dtype = dtype}) * scale);
  return out;
}
std::vector<Tensor> rand_like_all(DType dtype) {
  std::vector<Tensor> out;
  for (const Shape& s : kShapes) out.push_back(rand(s, {.dtype = dtype}));
  return out;
}
std::vector<Tensor> clones(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.defined() ? t.clone() : Tensor());
  return out;
}

// Bit for bit: same dtype, same values (KILN_CHECK_EQUAL compares exactly).
void check_identical(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.defined() == expected.defined());
  if (!actual.defined()) return;
  CHECK(actual.dtype() == expected.dtype());
  KILN_CHECK_EQUAL(actual, expected);
}

void check_sgd_multi(DType dtype, double momentum, double dampening, double wd, SGDFlags flags) {
  const std::vector<Tensor> params = randn_like_all(dtype);
  std::vector<Tensor> grads = randn_like_all(dtype);
  grads[1] = kiln::testing::transposed_copy(grads[1]);  // a strided grad: read through a copy
  const std::vector<Tensor> buffers = momentum != 0 ? randn_like_all(dtype) : std::vector<Tensor>{};
  const SGDHyper hyper{f64_scalar(0.05), f64_scalar(momentum), f64_scalar(dampening), f64_scalar(wd)};

  // The reference: one single update per parameter.
  const std::vector<Tensor> single_p = clones(params), single_buf = clones(buffers);
  for (size_t k = 0; k < params.size(); ++k)
    sgd_update_(single_p[k], grads[k], buffers.empty() ? Tensor() : single_buf[k], hyper, flags);

  const std::vector<SGDUpdate> pure = sgd_update_multi(params, grads, buffers, hyper, flags);
  const std::vector<Tensor> multi_p = clones(params), multi_buf = clones(buffers);
  sgd_update_multi_(multi_p, grads, multi_buf, hyper, flags);
  REQUIRE(pure.size() == params.size());
  for (size_t k = 0; k < params.size(); ++k) {
    INFO("parameter " << k);
    check_identical(multi_p[k], single_p[k]);
    check_identical(pure[k].param, single_p[k]);
    REQUIRE(pure[k].momentum_buffer.defined() == !buffers.empty());
    if (!buffers.empty()) {
      check_identical(multi_buf[k], single_buf[k]);
      check_identical(pure[k].momentum_buffer, single_buf[k]);
    }
  }
  KILN_CHECK_EQUAL(params[0], clones(params)[0]);  // the pure form left its arguments alone
}

void check_adamw_multi(DType dtype, bool amsgrad, double wd, bool maximize) {
  const std::vector<Tensor> params = randn_like_all(dtype), grads = randn_like_all(dtype);
  std::vector<AdamWState> states;
  const double steps[] = {1, 2, 5, 3, 7};  // each parameter counts its own steps
  const std::vector<Tensor> m = randn_like_all(dtype, 0.1), v = rand_like_all(dtype), vmax = rand_like_all(dtype);
  for (size_t k = 0; k < params.size(); ++k)
    states.push_back({m[k], v[k], amsgrad ? vmax[k] : Tensor(), f64_scalar(steps[k])});
  const AdamWHyper hyper{f64_scalar(0.01), f64_scalar(0.8), f64_scalar(0.95), f64_scalar(1e-6), f64_scalar(wd)};
  const AdamWFlags flags{amsgrad, maximize};
  auto copy = [](const std::vector<AdamWState>& s) {
    std::vector<AdamWState> out;
    for (const AdamWState& x : s)
      out.push_back({x.exp_avg.clone(), x.exp_avg_sq.clone(),
                     x.max_exp_avg_sq.defined() ? x.max_exp_avg_sq.clone() : Tensor(), x.step});
    return out;
  };

  const std::vector<Tensor> single_p = clones(params);
  const std::vector<AdamWState> single_s = copy(states);
  for (size_t k = 0; k < params.size(); ++k) adamw_update_(single_p[k], grads[k], single_s[k], hyper, flags);

  const std::vector<AdamWUpdate> pure = adamw_update_multi(params, grads, states, hyper, flags);
  const std::vector<Tensor> multi_p = clones(params);
  const std::vector<AdamWState> multi_s = copy(states);
  adamw_update_multi_(multi_p, grads, multi_s, hyper, flags);
  REQUIRE(pure.size() == params.size());
  for (size_t k = 0; k < params.size(); ++k) {
    INFO("parameter " << k);
    check_identical(multi_p[k], single_p[k]);
    check_identical(multi_s[k].exp_avg, single_s[k].exp_avg);
    check_identical(multi_s[k].exp_avg_sq, single_s[k].exp_avg_sq);
    check_identical(multi_s[k].max_exp_avg_sq, single_s[k].max_exp_avg_sq);
    check_identical(pure[k].param, single_p[k]);
    check_identical(pure[k].exp_avg, single_s[k].exp_avg);
    check_identical(pure[k].exp_avg_sq, single_s[k].exp_avg_sq);
    check_identical(pure[k].max_exp_avg_sq, single_s[k].max_exp_avg_sq);
  }
}

}  // namespace

TEST_CASE("sgd_update_multi equals one sgd_update per parameter bit for bit", "[multiupdate]") {
  manual_seed(31);
  for (const kiln::testing::SgdVariant& v : kiln::testing::sgd_variants()) {
    INFO(kiln::testing::sgd_variant_text(v));
    for (DType dtype : {DType::f32, DType::f64}) {
      INFO(fmt::format("{}", dtype));
      check_sgd_multi(dtype, v.momentum, v.dampening, v.weight_decay, v.flags);
    }
  }
}

TEST_CASE("adamw_update_multi equals one adamw_update per parameter bit for bit", "[multiupdate]") {
  manual_seed(32);
  for (bool amsgrad : {false, true})
    for (double wd : {0.0, 0.1})
      for (bool maximize : {false, true})
        for (DType dtype : {DType::f32, DType::f64}) {
          INFO("amsgrad " << amsgrad << " weight_decay " << wd << " maximize " << maximize << " " << fmt::format("{}", dtype));
          check_adamw_multi(dtype, amsgrad, wd, maximize);
        }
}

TEST_CASE("multi updates refuse mismatched inputs naming the op and the parameter", "[multiupdate]") {
  const DType f64 = DType::f64;
  const std::vector<Tensor> params = {zeros({3}, {.dtype = f64}), zeros({2, 2}, {.dtype = f64})};
  const std::vector<Tensor> grads = {zeros({3}, {.dtype = f64}), zeros({2, 2}, {.dtype = f64})};
  const SGDHyper hyper{f64_scalar(0.1), f64_scalar(0.9), f64_scalar(0), f64_scalar(0)};
  // Parameter 1's grad has another shape.
  const std::vector<Tensor> bad_grads = {grads[0], zeros({4}, {.dtype = f64})};
  REQUIRE_THROWS_WITH(sgd_update_multi_(params, bad_grads, {}, hyper, {}),
                      Contains("sgd_update_multi_ (parameter 1)") && Contains("grad"));
  REQUIRE_THROWS_WITH(sgd_update_multi(params, bad_grads, {}, hyper, {}),
                      Contains("sgd_update_multi (parameter 1)"));
  // Mixed dtypes: one call takes one kind of parameter (the optimizers split such groups).
  const std::vector<Tensor> mixed = {params[0], zeros({2, 2})}, mixed_grads = {grads[0], zeros({2, 2})};
  REQUIRE_THROWS_WITH(sgd_update_multi_(mixed, mixed_grads, {}, hyper, {}),
                      Contains("parameter 1") && Contains("dtype"));
  // Momentum buffers for some parameters only.
  const std::vector<Tensor> some_buffers = {zeros({3}, {.dtype = f64}), Tensor()};
  REQUIRE_THROWS_WITH(sgd_update_multi_(params, grads, some_buffers, hyper, {}),
                      Contains("parameter 1") && Contains("every parameter or none"));
  // Spans of other lengths.
  REQUIRE_THROWS_WITH(sgd_update_multi_(params, std::vector<Tensor>{grads[0]}, {}, hyper, {}), Contains("sgd_update_multi_") && Contains("grads"));
  // An in-place update into a strided parameter.
  const std::vector<Tensor> strided = {params[0], zeros({2, 2}, {.dtype = f64}).t()};
  REQUIRE_THROWS_WITH(sgd_update_multi_(strided, grads, {}, hyper, {}), Contains("param 1") && Contains("contiguous"));
  // A raw call whose count does not match its tensors.
  std::vector<Tensor> raw = {params[0], params[1], grads[0], grads[1], Tensor(), Tensor(),
                             hyper.lr, hyper.momentum, hyper.dampening, hyper.weight_decay};
  REQUIRE_THROWS_WITH(call_op(find_op("sgd_update_multi_"), raw,
                              {{"count", int64_t{3}}, {"nesterov", false}, {"maximize", false}, {"first", false}}),
                      Contains("sgd_update_multi_") && Contains("count 3"));
  REQUIRE_THROWS_WITH(call_op(find_op("sgd_update_multi_"), raw, {{"nesterov", false}, {"maximize", false}, {"first", false}}),
                      Contains("sgd_update_multi_") && Contains("count"));

  const AdamWHyper adam{f64_scalar(0.1), f64_scalar(0.9), f64_scalar(0.99), f64_scalar(1e-8), f64_scalar(0)};
  const std::vector<AdamWState> states = {{zeros({3}, {.dtype = f64}), zeros({3}, {.dtype = f64}), Tensor(), f64_scalar(1)},
                                          {zeros({2, 2}, {.dtype = f64}), zeros({3}, {.dtype = f64}), Tensor(), f64_scalar(1)}};
  REQUIRE_THROWS_WITH(adamw_update_multi_(params, grads, states, adam, {}),
                      Contains("adamw_update_multi_ (parameter 1)") && Contains("exp_avg_sq"));
  const std::vector<AdamWState> fine = {states[0], {states[1].exp_avg, zeros({2, 2}, {.dtype = f64}), Tensor(), f64_scalar(1)}};
  REQUIRE_THROWS_WITH(adamw_update_multi_(params, grads, fine, adam, {.amsgrad = true}),
                      Contains("adamw_update_multi_ (parameter 0)") && Contains("max_exp_avg_sq"));
  REQUIRE_NOTHROW(adamw_update_multi_(params, grads, fine, adam, {}));
}

TEST_CASE("the multi ops write the inputs their count says and bump only their versions", "[multiupdate]") {
  const OpDef& sgd = find_op("sgd_update_multi_");
  CHECK(sgd.mutates_inputs());
  CHECK(sgd.mutated({{"count", int64_t{2}}}) == std::vector<int>{0, 1, 4, 5});
  CHECK(find_op("adamw_update_multi_").mutated({{"count", int64_t{2}}}) ==
        std::vector<int>{0, 1, 4, 5, 6, 7, 8, 9});
  CHECK_FALSE(find_op("sgd_update_multi").mutates_inputs());  // the pure twin writes nothing
  CHECK(find_op("sgd_update_").mutated({}) == std::vector<int>{0, 2});

  const std::vector<Tensor> params = {zeros({3}), zeros({2})}, grads = {ones({3}), ones({2})};
  const std::vector<Tensor> buffers = {zeros({3}), zeros({2})};
  auto version = [](const Tensor& t) { return t.storage()->version.load(); };
  const auto p1 = version(params[1]), b0 = version(buffers[0]), g0 = version(grads[0]);
  sgd_update_multi_(params, grads, buffers, {f64_scalar(0.1), f64_scalar(0.9), f64_scalar(0), f64_scalar(0)}, {});
  CHECK(version(params[1]) > p1);
  CHECK(version(buffers[0]) > b0);
  CHECK(version(grads[0]) == g0);
}

namespace {

using Args = std::vector<Tensor>;

// Two groups of parameters (four and two tensors) with gradients, and their optimizer.
struct Setup {
  std::vector<Tensor> first, second;
  std::unique_ptr<optim::Optimizer> optimizer;

  Setup(bool adamw, DType dtype) {
    manual_seed(41);
    for (const Shape& s : std::vector<Shape>{{6, 5}, {5}, {4, 6}, {4}}) first.push_back(randn(s, {.dtype = dtype}).requires_grad_());
    for (const Shape& s : std::vector<Shape>{{3, 3}, {3}}) second.push_back(randn(s, {.dtype = dtype}).requires_grad_());
    const std::vector<optim::ParamGroupSpec> groups = {{first, {}}, {second, {{"lr", 0.02}}}};
    if (adamw) optimizer = std::make_unique<optim::AdamW>(groups, optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
    else optimizer = std::make_unique<optim::SGD>(groups, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
    set_grads(0);
    optimizer->step();  // the first step makes the state eagerly
  }
  std::vector<Tensor> params() const {
    std::vector<Tensor> all = first;
    all.insert(all.end(), second.begin(), second.end());
    return all;
  }
  // Into the same gradient tensors after the first call: the traced graph reads those.
  void set_grads(int s) {
    int k = 0;
    for (Tensor& p : params()) {
      const Tensor g = sin(arange(p.numel(), {.dtype = p.dtype()}).reshape(p.shape()) * (0.3 + 0.1 * k++) + s);
      if (p.grad().defined()) p.grad().copy_(g);
      else p.set_grad(g.detach());
    }
  }
  Args step(const Args&) {
    optimizer->step();
    return {};
  }
};

// Every parameter and state tensor of a against b's, bit for bit.
void check_same_state(Setup& a, Setup& b) {
  const std::vector<Tensor> pa = a.params(), pb = b.params();
  for (size_t k = 0; k < pa.size(); ++k) {
    INFO("parameter " << k);
    check_identical(pa[k], pb[k]);
    for (const auto& [key, t] : a.optimizer->state(pa[k])) {
      INFO(key);
      check_identical(t, b.optimizer->state(pb[k]).at(key));
    }
  }
}

// The optimizer step traced: one update node per group, which the Program runs through the
// in-place twin, into the parameters' own memory, equal to the eager step bit for bit.
void check_traced_step(bool adamw, const std::string& update) {
  TempCache cache;
  Setup traced(adamw, DType::f64), eager(adamw, DType::f64);
  traced.set_grads(1);
  eager.set_grads(1);
  auto fn = [&](const Args& a) { return traced.step(a); };
  const Trace t = trace(fn, {});  // runs the step once, as eager does next
  eager.optimizer->step();
  check_same_state(traced, eager);

  INFO(print(t.graph));
  CHECK(count_ops(t.graph, update + "_multi") == 2);
  CHECK(count_ops(t.graph, update) == 0);
  const Graph g = run_pipeline(t.graph, default_simplify_passes(), nullptr, false);
  const Program program(g);
  const std::string text = program.describe();
  INFO(text);
  CHECK(text.find("(in place: " + update + "_multi_)") != std::string::npos);

  const std::vector<Tensor> params = traced.params();
  std::vector<void*> data;
  for (const Tensor& p : params) data.push_back(p.data_ptr());
  for (int s = 2; s <= 3; ++s) {
    INFO("step " << s);
    traced.set_grads(s);
    eager.set_grads(s);
    program.run(t.inputs_for({}));
    eager.optimizer->step();
    check_same_state(traced, eager);
  }
  for (size_t k = 0; k < params.size(); ++k) CHECK(params[k].data_ptr() == data[k]);
}

}  // namespace

TEST_CASE("a traced SGD step is one sgd_update_multi per group run in place", "[multiupdate]") {
  check_traced_step(false, "sgd_update");
}

TEST_CASE("a traced AdamW step is one adamw_update_multi per group run in place", "[multiupdate]") {
  check_traced_step(true, "adamw_update");
}
