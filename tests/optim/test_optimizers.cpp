// SGD, AdamW, the Optimizer base and clip_grad_norm_: hand-computed updates, the fused
// step against a per-tensor reference written with tensor ops, groups, state_dict.
#include <cmath>
#include <limits>

#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/sgd.h"
#include "testing.h"

using namespace kiln;
using kiln::testing::tensor_of;
using kiln::testing::values;

namespace {

// A leaf that requires grad, holding `v`.
Tensor param_of(const std::vector<double>& v, DType dtype = DType::f64, Shape shape = {}) {
  Tensor p = tensor_of(v, std::move(shape), dtype);
  p.requires_grad_();
  return p;
}

void require_values(const Tensor& t, const std::vector<double>& expected, double tol) {
  const auto got = values(t);
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", expected " << expected[i]);
    REQUIRE(std::abs(got[i] - expected[i]) <= tol);
  }
}

// A deterministic gradient for parameter `k` at step `s`, varying in sign and size.
Tensor grad_for(const Tensor& p, int k, int s) {
  Tensor idx = arange(p.numel(), {.dtype = p.dtype()}).reshape(p.shape());
  return sin(add(mul(idx, 0.7 + 0.3 * k), 1.1 * (s + 1))).mul_(1.0 + 0.5 * s);
}

// torch's single-tensor SGD, written with tensor ops on copies of the parameters.
struct SGDReference {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, maximize;
  std::vector<Tensor> bufs;
  void step(std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
    bufs.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor g = maximize ? neg(grads[i]) : grads[i];
      if (weight_decay != 0) g = add(g, params[i], weight_decay);
      if (momentum != 0) {
        bufs[i] = bufs[i].defined() ? add(mul(bufs[i], momentum), g, 1.0 - dampening) : g.clone();
        g = nesterov ? add(g, bufs[i], momentum) : bufs[i];
      }
      params[i] = sub(params[i], g, lr);
    }
  }
};

// torch's single-tensor AdamW, written with tensor ops.
struct AdamWReference {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad;
  std::vector<Tensor> m, v, vmax;
  int t = 0;
  void step(std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
    ++t;
    m.resize(params.size());
    v.resize(params.size());
    vmax.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (!m[i].defined()) m[i] = v[i] = vmax[i] = zeros_like(params[i]);
      params[i] = mul(params[i], 1.0 - lr * weight_decay);
      m[i] = add(m[i], sub(grads[i], m[i]), 1.0 - beta1);
      v[i] = add(mul(v[i], beta2), mul(grads[i], grads[i]), 1.0 - beta2);
      Tensor second = v[i];
      if (amsgrad) second = vmax[i] = maximum(vmax[i], v[i]);
      Tensor denom = add(div(sqrt(second), std::sqrt(1.0 - std::pow(beta2, t))), eps);
      params[i] = sub(params[i], div(m[i], denom), lr / (1.0 - std::pow(beta1, t)));
    }
  }
};

std::vector<Tensor> make_params(DType dtype) {
  return {randn({3, 4}, {.dtype = dtype}).requires_grad_(), randn({5}, {.dtype = dtype}).requires_grad_(),
          randn({2, 1, 3}, {.dtype = dtype}).requires_grad_()};
}

// Runs 4 steps of `optimizer` (over `params`) and of `reference` from the same start and
// gradients, checking every parameter after each step to `tol`.
template <class Reference>
void compare_with_reference(optim::Optimizer& optimizer, Reference reference,
                            std::vector<Tensor> params, double tol) {
  std::vector<Tensor> ref_params;
  for (const auto& p : params) ref_params.push_back(p.detach().clone());
  for (int s = 0; s < 4; ++s) {
    std::vector<Tensor> grads;
    for (size_t k = 0; k < params.size(); ++k) {
      grads.push_back(grad_for(params[k], static_cast<int>(k), s));
      params[k].set_grad(grads.back().clone());
    }
    optimizer.step();
    reference.step(ref_params, grads);
    for (size_t k = 0; k < params.size(); ++k) {
      INFO("step " << s << " parameter " << k);
      require_values(params[k], values(ref_params[k]), tol);
    }
  }
}

}  // namespace

TEST_CASE("SGD with momentum and weight decay matches hand-computed updates", "[optim]") {
  // p = [1, -2], g = [0.5, 1] each step, lr 0.1, momentum 0.9, weight_decay 0.1:
  // step 1: d = g + 0.1 p = [0.6, 0.8] = buf, p = [0.94, -2.08]
  // step 2: d = [0.594, 0.792], buf = [1.134, 1.512], p = [0.8266, -2.2312]
  // step 3: d = [0.58266, 0.77688], buf = [1.60326, 2.13768], p = [0.666274, -2.444968]
  Tensor p = param_of({1.0, -2.0});
  optim::SGD sgd({p}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1});
  const std::vector<std::vector<double>> expected = {{0.94, -2.08}, {0.8266, -2.2312}, {0.666274, -2.444968}};
  for (const auto& e : expected) {
    p.set_grad(tensor_of({0.5, 1.0}, {}, DType::f64));
    sgd.step();
    require_values(p, e, 1e-12);
  }
  require_values(sgd.state(p).at("momentum_buffer"), {1.60326, 2.13768}, 1e-12);
}

TEST_CASE("SGD with momentum scheduled to 0 leaves its buffer and applies the plain step", "[optim]") {
  // As PyTorch: momentum 0 skips the buffer, whatever the dampening. Step 1 (momentum 0.9,
  // dampening 0.5) makes buf = g = [0.5, 1]; then momentum 0: p -= 0.1 g, buf unchanged.
  Tensor p = param_of({1.0, -2.0}), q = param_of({3.0});  // two parameters: the multi op too
  optim::SGD sgd({p, q}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
  p.set_grad(tensor_of({0.5, 1.0}, {}, DType::f64));
  q.set_grad(tensor_of({2.0}, {}, DType::f64));
  sgd.step();
  require_values(p, {0.95, -2.1}, 1e-12);
  sgd.param_groups()[0].set("momentum", 0.0);
  sgd.step();
  require_values(p, {0.9, -2.2}, 1e-12);
  require_values(q, {2.6}, 1e-12);
  require_values(sgd.state(p).at("momentum_buffer"), {0.5, 1.0}, 1e-12);
  require_values(sgd.state(q).at("momentum_buffer"), {2.0}, 1e-12);
}

TEST_CASE("SGD nesterov and maximize match hand-computed updates", "[optim]") {
  // g = 1, lr 0.1, momentum 0.5: step 1 buf = 1, d = 1.5, p = -0.15; step 2 buf = 1.5,
  // d = 1.75, p = -0.325. maximize flips the sign of every update.
  Tensor p = param_of({0.0}), q = param_of({0.0});
  optim::SGD sgd({p}, {.lr = 0.1, .momentum = 0.5, .nesterov = true});
  optim::SGD ascent({q}, {.lr = 0.1, .momentum = 0.5, .nesterov = true, .maximize = true});
  for (double expected : {-0.15, -0.325}) {
    p.set_grad(tensor_of({1.0}, {}, DType::f64));
    q.set_grad(tensor_of({1.0}, {}, DType::f64));
    sgd.step();
    ascent.step();
    require_values(p, {expected}, 1e-12);
    require_values(q, {-expected}, 1e-12);
  }
  REQUIRE_THROWS_AS(optim::SGD({p}, {.lr = 0.1, .nesterov = true}), Error);
}

TEST_CASE("AdamW matches hand-computed updates", "[optim]") {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8. Without decay, p = 1, g = 0.5 then -1:
  // step 1: m = 0.05, v = 2.5e-4, p = 1 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.900000002
  // step 2: m = -0.055, v = 1.24975e-3, p = 0.9366103542405654
  Tensor p = param_of({1.0});
  optim::AdamW adam({p}, {.lr = 0.1, .weight_decay = 0.0});
  p.set_grad(tensor_of({0.5}, {}, DType::f64));
  adam.step();
  require_values(p, {0.900000002}, 1e-12);
  p.set_grad(tensor_of({-1.0}, {}, DType::f64));
  adam.step();
  require_values(p, {0.9366103542405654}, 1e-12);
  require_values(adam.state(p).at("exp_avg"), {-0.055}, 1e-15);
  require_values(adam.state(p).at("exp_avg_sq"), {1.24975e-3}, 1e-15);
  REQUIRE(adam.state(p).at("step").item<double>() == 2.0);

  // With weight_decay 0.1 and g = 0.5 twice, p first shrinks by 1 - lr * wd = 0.99 and the
  // Adam step is 0.1 / (1 + 2e-8) each time: 0.89 + 2e-9, then 0.7811 + 3.98e-9.
  Tensor q = param_of({1.0});
  optim::AdamW decayed({q}, {.lr = 0.1, .weight_decay = 0.1});
  q.set_grad(tensor_of({0.5}, {}, DType::f64));
  decayed.step();
  require_values(q, {0.89 + 2e-9}, 1e-14);
  decayed.step();
  require_values(q, {0.7811 + 3.98e-9}, 1e-14);
}

TEST_CASE("The fused SGD step equals the per-tensor reference", "[optim]") {
  struct Variant { double momentum, dampening, weight_decay; bool nesterov, maximize; };
  for (Variant v : {Variant{0, 0, 0, false, false}, Variant{0.9, 0, 0, false, false},
                    Variant{0.9, 0.1, 0.01, false, true}, Variant{0.8, 0, 0.05, true, false}}) {
    for (DType dtype : {DType::f64, DType::f32}) {
      INFO("momentum " << v.momentum << " nesterov " << v.nesterov << " dtype " << name(dtype));
      auto params = make_params(dtype);
      optim::SGD sgd(params, {.lr = 0.05, .momentum = v.momentum, .dampening = v.dampening,
                              .weight_decay = v.weight_decay, .nesterov = v.nesterov, .maximize = v.maximize});
      compare_with_reference(sgd, SGDReference{0.05, v.momentum, v.dampening, v.weight_decay, v.nesterov, v.maximize, {}},
                             params, dtype == DType::f64 ? 1e-12 : 1e-6);
    }
  }
}

TEST_CASE("The fused AdamW step equals the per-tensor reference", "[optim]") {
  for (bool amsgrad : {false, true}) {
    for (double weight_decay : {0.0, 0.1}) {
      for (DType dtype : {DType::f64, DType::f32}) {
        INFO("amsgrad " << amsgrad << " weight_decay " << weight_decay << " dtype " << name(dtype));
        auto params = make_params(dtype);
        optim::AdamW adam(params, {.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6,
                                   .weight_decay = weight_decay, .amsgrad = amsgrad});
        compare_with_reference(adam, AdamWReference{0.01, 0.8, 0.95, 1e-6, weight_decay, amsgrad, {}, {}, {}},
                               params, dtype == DType::f64 ? 1e-12 : 1e-6);
      }
    }
  }
}

// Capturable only moves where the step counts live and where the factors are computed
// (kernels/cuda/optim.h); on the CPU both are the CPU, so every number must be the default's
// bit for bit: the same ops, in the same order, on the same values. The steps change lr
// (written into the tensors, as a schedule does) and skip on found_inf, so a count bumped
// when it should not be, or a factor read from a stale lr, shows.
TEST_CASE("Capturable AdamW equals the default bit for bit, through lr changes and skipped steps", "[optim][amp]") {
  for (const bool amsgrad : {false, true}) {
    for (const bool maximize : {false, true}) {
      INFO("amsgrad " << amsgrad << " maximize " << maximize);
      manual_seed(31);
      const std::vector<Tensor> params = make_params(DType::f32);
      std::vector<Tensor> copies;
      for (const Tensor& p : params) copies.push_back(p.detach().clone().requires_grad_());
      const optim::AdamWOptions options{.lr = 0.01, .weight_decay = 0.05, .amsgrad = amsgrad, .maximize = maximize};
      optim::AdamW plain(params, options);
      optim::AdamWOptions capturable_options = options;
      capturable_options.capturable = true;
      optim::AdamW capturable(copies, capturable_options);
      REQUIRE(capturable.capturable());
      for (int s = 0; s < 6; ++s) {
        for (size_t k = 0; k < params.size(); ++k) {
          const Tensor g = grad_for(params[k], static_cast<int>(k), s);
          params[k].set_grad(g.clone());
          copies[k].set_grad(g.clone());
        }
        plain.param_groups()[0].set_lr(0.01 * (s + 1));
        capturable.param_groups()[0].set_lr(0.01 * (s + 1));
        const Tensor found_inf = full({}, s == 1 || s == 4 ? 1.0f : 0.0f, {.dtype = DType::f32});
        plain.step(found_inf);
        capturable.step(found_inf);
        for (size_t k = 0; k < params.size(); ++k) {
          INFO("step " << s << " parameter " << k);
          REQUIRE(values(copies[k]) == values(params[k]));
          for (const char* name : {"exp_avg", "exp_avg_sq"})
            REQUIRE(values(capturable.state(copies[k]).at(name)) == values(plain.state(params[k]).at(name)));
        }
      }
      for (const Tensor& p : copies) {
        const Tensor& step = capturable.state(p).at("step");
        CHECK(step.dim() == 0);
        CHECK(step.dtype() == DType::f64);
        CHECK(step.device() == p.device());
        CHECK(step.item<double>() == 4.0);  // 6 steps, 2 skipped
      }
    }
  }
}

// A checkpoint from either kind loads into the other and continues as the saving one would:
// the step counts go where the loading optimizer keeps them.
TEST_CASE("AdamW state dicts load across capturable and default", "[optim]") {
  for (const bool from_capturable : {false, true}) {
    INFO("saved by a " << (from_capturable ? "capturable" : "default") << " AdamW");
    manual_seed(32);
    const std::vector<Tensor> params = make_params(DType::f64);
    optim::AdamW first(params, {.lr = 0.1, .amsgrad = true, .capturable = from_capturable});
    for (int s = 0; s < 2; ++s) {
      for (size_t k = 0; k < params.size(); ++k) params[k].set_grad(grad_for(params[k], static_cast<int>(k), s));
      first.step();
    }
    const auto dict = first.state_dict();
    CHECK_FALSE(dict.contains("param_groups.0.capturable"));  // the optimizer's choice, not the dict's
    std::vector<Tensor> copies;
    for (const auto& p : params) copies.push_back(p.detach().clone().requires_grad_());
    optim::AdamW second(copies, {.lr = 0.1, .amsgrad = true, .capturable = !from_capturable});
    second.load_state_dict(dict);
    for (const Tensor& p : copies) {
      CHECK(second.state(p).at("step").item<double>() == 2.0);
      CHECK(second.state(p).at("step").device() == (from_capturable ? Device::cpu() : p.device()));
    }
    for (int s = 2; s < 4; ++s) {
      for (size_t k = 0; k < params.size(); ++k) {
        params[k].set_grad(grad_for(params[k], static_cast<int>(k), s));
        copies[k].set_grad(grad_for(params[k], static_cast<int>(k), s));
      }
      first.step();
      second.step();
      for (size_t k = 0; k < params.size(); ++k) require_values(copies[k], values(params[k]), 0.0);
    }
  }
}

TEST_CASE("Parameters without a gradient are skipped", "[optim]") {
  Tensor a = param_of({1.0, 2.0}), b = param_of({3.0});
  optim::AdamW adam({a, b}, {.lr = 0.1});
  a.set_grad(tensor_of({1.0, 1.0}, {}, DType::f64));
  adam.step();
  require_values(b, {3.0}, 0.0);
  REQUIRE_FALSE(adam.has_state(b));
  REQUIRE(adam.has_state(a));
}

TEST_CASE("zero_grad sets gradients to none or to zeros", "[optim]") {
  Tensor p = param_of({1.0, 2.0});
  optim::SGD sgd({p}, {.lr = 0.1});
  Tensor g = tensor_of({3.0, 4.0}, {}, DType::f64);
  p.set_grad(g);
  sgd.zero_grad(false);
  REQUIRE(p.grad().defined());
  require_values(p.grad(), {0.0, 0.0}, 0.0);
  sgd.zero_grad();
  REQUIRE_FALSE(p.grad().defined());
}

TEST_CASE("Parameter groups keep their own learning rates", "[optim]") {
  Tensor a = param_of({1.0}), b = param_of({1.0});
  optim::SGD sgd(std::vector<optim::ParamGroupSpec>{{{a}, {}}, {{b}, {{"lr", 0.5}}}}, {.lr = 0.1});
  REQUIRE(sgd.param_groups().size() == 2);
  a.set_grad(tensor_of({1.0}, {}, DType::f64));
  b.set_grad(tensor_of({1.0}, {}, DType::f64));
  sgd.step();
  require_values(a, {0.9}, 1e-15);
  require_values(b, {0.5}, 1e-15);
  REQUIRE_THROWS_AS(sgd.add_param_group({{a}, {}}), Error);                 // already in a group
  REQUIRE_THROWS_AS(sgd.add_param_group({{param_of({0.0})}, {{"betas", 1}}}), Error);  // unknown name
}

TEST_CASE("Changing lr between steps takes effect with nothing else changed", "[optim]") {
  Tensor p = param_of({0.0});
  optim::SGD sgd({p}, {.lr = 0.1});
  const Tensor lr_tensor = sgd.param_groups()[0].hyper.at("lr");
  p.set_grad(tensor_of({1.0}, {}, DType::f64));
  sgd.step();
  require_values(p, {-0.1}, 1e-15);
  sgd.param_groups()[0].set_lr(0.25);
  REQUIRE(sgd.param_groups()[0].hyper.at("lr").same(lr_tensor));  // written in place
  REQUIRE(lr_tensor.item<double>() == 0.25);
  sgd.step();
  require_values(p, {-0.35}, 1e-15);
}

TEST_CASE("move_hyperparameters moves named hyperparameters once; set() writes into the moved tensors", "[optim]") {
  Tensor p = param_of({0.0});
  optim::SGD sgd({p}, {.lr = 0.1, .momentum = 0.5});
  REQUIRE_THROWS_WITH(sgd.move_hyperparameters({"lr", "betas"}, Device::cpu()),
                      Catch::Matchers::Contains("no hyperparameter 'betas'"));
  sgd.move_hyperparameters(optim::SGD::tensor_hyperparameters(), Device::cpu());
  const Tensor lr_tensor = sgd.param_groups()[0].hyper.at("lr");
  sgd.param_groups()[0].set_lr(0.25);
  REQUIRE(sgd.param_groups()[0].hyper.at("lr").same(lr_tensor));
  REQUIRE(sgd.param_groups()[0].lr() == 0.25);
  REQUIRE(sgd.param_groups()[0].get("momentum") == 0.5);
  REQUIRE_THROWS_WITH(sgd.param_groups()[0].set("betas", 1.0), Catch::Matchers::Contains("no hyperparameter 'betas'"));
}

TEST_CASE("param_groups_no_decay puts 1-d parameters in a group without decay", "[optim]") {
  nn::Sequential model(nn::Linear(3, 4), nn::LayerNorm({4}), nn::Linear(4, 2, {.bias = false}));
  auto groups = optim::param_groups_no_decay(model, 0.05);
  REQUIRE(groups.size() == 2);
  REQUIRE(groups[0].params.size() == 2);  // the two Linear weights
  REQUIRE(groups[1].params.size() == 3);  // Linear bias, LayerNorm weight and bias
  optim::AdamW adam(groups, {.lr = 0.01});
  REQUIRE(adam.param_groups()[0].weight_decay() == 0.05);
  REQUIRE(adam.param_groups()[1].weight_decay() == 0.0);
  REQUIRE(adam.param_groups()[1].params[0].same(model.parameters()[1]));
}

TEST_CASE("state_dict round trip continues identically", "[optim]") {
  for (int which = 0; which < 2; ++which) {
    auto make = [&](const std::vector<Tensor>& ps) -> std::unique_ptr<optim::Optimizer> {
      if (which == 0) return std::make_unique<optim::SGD>(ps, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{.lr = 0.1, .amsgrad = true});
    };
    auto params = make_params(DType::f64);
    auto first = make(params);
    for (int s = 0; s < 2; ++s) {
      for (size_t k = 0; k < params.size(); ++k) params[k].set_grad(grad_for(params[k], static_cast<int>(k), s));
      first->step();
    }
    first->param_groups()[0].set_lr(0.03);
    const auto dict = first->state_dict();
    REQUIRE(dict.at("param_groups.0.lr").item<double>() == 0.03);
    REQUIRE(dict.at("param_groups.0.lr").dim() == 0);
    std::vector<Tensor> copies;
    for (const auto& p : params) copies.push_back(p.detach().clone().requires_grad_());
    auto second = make(copies);
    second->load_state_dict(dict);
    for (int s = 2; s < 4; ++s) {
      for (size_t k = 0; k < params.size(); ++k) {
        params[k].set_grad(grad_for(params[k], static_cast<int>(k), s));
        copies[k].set_grad(grad_for(params[k], static_cast<int>(k), s));
      }
      first->step();
      second->step();
      for (size_t k = 0; k < params.size(); ++k) require_values(copies[k], values(params[k]), 0.0);
    }
  }
}

TEST_CASE("load_state_dict refuses mismatched groups and shapes", "[optim]") {
  Tensor a = param_of({1.0, 2.0}), b = param_of({1.0});
  optim::SGD one({a}, {.lr = 0.1, .momentum = 0.9});
  a.set_grad(tensor_of({1.0, 1.0}, {}, DType::f64));
  one.step();
  auto dict = one.state_dict();
  optim::SGD two_params({a, b}, {.lr = 0.1, .momentum = 0.9});
  REQUIRE_THROWS_AS(two_params.load_state_dict(dict), Error);  // parameter count
  optim::SGD two_groups(std::vector<optim::ParamGroupSpec>{{{a}, {}}, {{b}, {}}}, {.lr = 0.1});
  REQUIRE_THROWS_AS(two_groups.load_state_dict(dict), Error);  // group count
  optim::SGD other_shape({b}, {.lr = 0.1, .momentum = 0.9});
  REQUIRE_THROWS_AS(other_shape.load_state_dict(dict), Error);  // momentum_buffer shape
  dict["bogus"] = tensor_of({1.0}, {}, DType::f64);
  REQUIRE_THROWS_AS(one.load_state_dict(dict), Error);
}

TEST_CASE("clip_grad_norm_ returns the norm and scales gradients", "[optim]") {
  // Gradients [3, 4] and [12]: 2-norm 13, inf-norm 12, 1-norm 19.
  Tensor a = param_of({0.0, 0.0}), b = param_of({0.0}), c = param_of({0.0});
  auto reset = [&] {
    a.set_grad(tensor_of({3.0, 4.0}, {}, DType::f64));
    b.set_grad(tensor_of({12.0}, {}, DType::f64));
  };
  reset();
  REQUIRE(optim::clip_grad_norm_({a, b, c}, 100.0).item<double>() == Approx(13.0).epsilon(1e-15));
  require_values(a.grad(), {3.0, 4.0}, 0.0);  // under max_norm: unchanged
  REQUIRE(optim::clip_grad_norm_({a, b, c}, 6.5).item<double>() == Approx(13.0).epsilon(1e-15));
  const double coef = 6.5 / (13.0 + 1e-6);
  require_values(a.grad(), {3.0 * coef, 4.0 * coef}, 1e-14);
  require_values(b.grad(), {12.0 * coef}, 1e-14);
  reset();
  REQUIRE(optim::clip_grad_norm_({a, b}, 6.0, std::numeric_limits<double>::infinity()).item<double>() == 12.0);
  require_values(b.grad(), {12.0 * 6.0 / (12.0 + 1e-6)}, 1e-14);
  reset();
  REQUIRE(optim::clip_grad_norm_({a, b}, 100.0, 1.0).item<double>() == Approx(19.0).epsilon(1e-15));
  // f32 gradients under max_norm keep their bits (they are multiplied by exactly 1).
  Tensor d = param_of({0.0, 0.0, 0.0}, DType::f32);
  const Tensor g32 = tensor_of({0.1, -0.3, 1e-30}, {}, DType::f32);
  d.set_grad(g32.clone());
  optim::clip_grad_norm_({d}, 1.0);
  KILN_CHECK_EQUAL(d.grad(), g32);
  CHECK(optim::clip_grad_norm_({c}, 1.0).item<double>() == 0.0);  // no gradients
  CHECK_THROWS_WITH(optim::clip_grad_norm_({a}, -1.0), Catch::Matchers::Contains("max_norm"));
}
