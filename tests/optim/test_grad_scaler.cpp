// optim::GradScaler against hand-computed sequences (torch.amp.GradScaler's semantics), the
// loss scaler's ops (core/ops/amp_ops.h), skipped optimizer steps, checkpoints of the
// scaler, and accumulation with scaling.
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "core/ops/amp_ops.h"
#include "core/registry.h"
#include "models/small_models.h"
#include "optim/accumulation.h"
#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "testing.h"

using namespace kiln;
using Catch::Matchers::Contains;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The gradient of step s: finite values, or with an infinity or a NaN in it.
enum class Grad { ok, inf, nan };
Tensor step_coefficients(int s, Grad kind) {
  Tensor c = sin(arange(4, {.dtype = DType::f32}) * (0.7 + 0.3 * s) + 0.5);
  if (kind == Grad::inf) c.select(0, 1).fill_(kInf);
  if (kind == Grad::nan) c.select(0, 2).fill_(kNaN);
  return c;
}

// Runs one scaled step: loss = sum(p * c), so p's gradient is c times the scale.
void scaled_step(optim::GradScaler& scaler, optim::Optimizer& opt, const Tensor& p, const Tensor& c) {
  opt.zero_grad();
  const Tensor loss = sum(p * c);
  scaler.scale(loss).backward();
  scaler.step(opt);
  scaler.update();
}

void check_identical(const Tensor& actual, const Tensor& expected) {
  REQUIRE(actual.dtype() == expected.dtype());
  KILN_CHECK_EQUAL(actual, expected);
}

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(const std::vector<Tensor>&)>;

// The scripted sequence: after each step, the scale and growth tracker as PyTorch's
// _amp_update_scale_ gives them (growth every 2 clean steps), parameters and state equal bit
// for bit to an unscaled optimizer that ran only the clean steps (the scales are powers of
// two, so unscaling is exact), and, on a skipped step, exactly as they were.
void check_scripted_sequence(const MakeOptimizer& make) {
  const Grad script[] = {Grad::ok, Grad::ok, Grad::inf, Grad::ok, Grad::nan, Grad::ok, Grad::ok, Grad::ok};
  const double scales[] = {8, 16, 8, 8, 4, 4, 8, 8};
  const int64_t trackers[] = {1, 0, 0, 1, 0, 1, 0, 1};
  const Tensor start = arange(4, {.dtype = DType::f32}) * 0.25 - 0.3;
  Tensor p = start.clone().requires_grad_(), q = start.clone().requires_grad_();
  std::unique_ptr<optim::Optimizer> scaled = make({p}), reference = make({q});
  optim::GradScaler scaler({.init_scale = 8, .growth_interval = 2});
  CHECK(scaler.get_scale() == 8);
  for (int s = 0; s < 8; ++s) {
    INFO("step " << s);
    const Tensor before = p.detach().clone();
    const auto state_before = scaled->state_dict();
    scaled_step(scaler, *scaled, p, step_coefficients(s, script[s]));
    CHECK(scaler.get_scale() == scales[s]);
    CHECK(scaler.growth_tracker() == trackers[s]);
    if (script[s] == Grad::ok) {
      reference->zero_grad();
      q.set_grad(step_coefficients(s, Grad::ok));
      reference->step();
    }
    if (script[s] != Grad::ok && s > 0) {
      check_identical(p.detach(), before);
      const auto state_after = scaled->state_dict();
      REQUIRE(state_after.size() == state_before.size());
      for (const auto& [key, t] : state_before) {
        INFO(key);
        check_identical(state_after.at(key), t);
      }
    }
    check_identical(p.detach(), q.detach());
    for (const auto& [key, t] : reference->state(q)) {
      INFO(key);
      check_identical(scaled->state(p).at(key), t);
    }
  }
}

}  // namespace

TEST_CASE("amp_unscale_ multiplies by the inverse scale and flags infinities and NaNs", "[optim][amp]") {
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    INFO(name(dt));
    const Tensor a = (arange(6, {.dtype = DType::f32}) - 2.5).to(dt) * 64, b = full({3, 2}, 96.0, {.dtype = dt});
    const Tensor inv = full({}, 1.0 / 32, {.dtype = DType::f32});
    Tensor found = zeros({}, {.dtype = DType::f32});
    std::vector<Tensor> grads = {a.clone(), b.clone().t()};  // the second one not contiguous
    const AmpUnscaled pure = amp_unscale(grads, found, inv);
    amp_unscale_(grads, found, inv);
    check_identical(grads[0], a * 0.03125);  // exact: a power of two
    check_identical(grads[1], b.t() * 0.03125);
    check_identical(pure.grads[0], grads[0]);
    check_identical(pure.grads[1], grads[1]);
    CHECK(found.item<float>() == 0.0f);
    CHECK(pure.found_inf.item<float>() == 0.0f);

    for (double bad : {kInf, -kInf, kNaN}) {
      Tensor g = a.clone();
      g.select(0, 4).fill_(bad);
      amp_unscale_(std::vector<Tensor>{b.clone(), g}, found, inv);
      CHECK(found.item<float>() == 1.0f);
      amp_unscale_(std::vector<Tensor>{b.clone()}, found, inv);
      CHECK(found.item<float>() == 1.0f);  // a flag already set stays set
      found.zero_();
    }
  }
  // 16-bit gradients are scaled in f32 and rounded once: 3 * (1/3 in f32) in bf16.
  const Tensor g = full({2}, 3.0, {.dtype = DType::bf16});
  const float third = 1.0f / 3.0f;
  amp_unscale_(std::vector<Tensor>{g}, zeros({}, {.dtype = DType::f32}), full({}, third, {.dtype = DType::f32}));
  CHECK(g.to(DType::f32).select(0, 0).item<float>() == static_cast<float>(BFloat16(3.0f * third)));
}

TEST_CASE("amp ops reject bad input with the op's name", "[optim][amp]") {
  const Tensor g = ones({3}), f = zeros({}, {.dtype = DType::f32});
  CHECK_THROWS_WITH(amp_unscale_(std::vector<Tensor>{g}, zeros({}, {.dtype = DType::f64}), f),
                    Contains("amp_unscale_") && Contains("found_inf"));
  CHECK_THROWS_WITH(amp_unscale_(std::vector<Tensor>{g}, f, ones({1})), Contains("inv_scale"));
  CHECK_THROWS_WITH(amp_unscale_(std::vector<Tensor>{ones({3}, {.dtype = DType::i64})}, f, f),
                    Contains("gradient 0") && Contains("floating"));
  CHECK_THROWS_WITH(amp_update_scale_(f, zeros({}, {.dtype = DType::f32}), f, {}),
                    Contains("amp_update_scale_") && Contains("growth_tracker"));
}

TEST_CASE("amp_update_scale_ backs off, counts clean steps and grows", "[optim][amp]") {
  Tensor scale = full({}, 1024.0, {.dtype = DType::f32}), tracker = zeros({}, {.dtype = DType::i32});
  const Tensor clean = zeros({}, {.dtype = DType::f32}), overflow = ones({}, {.dtype = DType::f32});
  const AmpScaleUpdate u{.growth_factor = 2.0, .backoff_factor = 0.25, .growth_interval = 3};
  const AmpScaleState pure = amp_update_scale(scale, tracker, overflow, u);
  CHECK(pure.scale.item<float>() == 256.0f);
  CHECK(scale.item<float>() == 1024.0f);  // the pure form leaves its inputs
  for (int i = 1; i <= 2; ++i) {
    amp_update_scale_(scale, tracker, clean, u);
    CHECK(scale.item<float>() == 1024.0f);
    CHECK(tracker.item<int32_t>() == i);
  }
  amp_update_scale_(scale, tracker, clean, u);
  CHECK(scale.item<float>() == 2048.0f);
  CHECK(tracker.item<int32_t>() == 0);
  amp_update_scale_(scale, tracker, overflow, u);
  CHECK(scale.item<float>() == 512.0f);
  // A growth that would overflow f32 keeps the scale.
  Tensor big = full({}, 3e38, {.dtype = DType::f32});
  Tensor t = full({}, 2, {.dtype = DType::i32});
  amp_update_scale_(big, t, clean, u);
  CHECK(big.item<float>() == 3e38f);
  CHECK(t.item<int32_t>() == 0);
}

TEST_CASE("GradScaler with SGD: the scripted sequence of overflows", "[optim][amp]") {
  check_scripted_sequence([](const std::vector<Tensor>& ps) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::SGD>(ps, optim::SGDOptions{.lr = 0.5, .momentum = 0.9, .weight_decay = 0.01});
  });
}

TEST_CASE("GradScaler with AdamW: skipped steps leave moments and step counts", "[optim][amp]") {
  check_scripted_sequence([](const std::vector<Tensor>& ps) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{.lr = 0.1, .weight_decay = 0.01, .amsgrad = true});
  });
}

TEST_CASE("GradScaler enforces the order of unscale_, step and update", "[optim][amp]") {
  Tensor p = ones({3}).requires_grad_();
  optim::SGD sgd({p}, {.lr = 0.1});
  optim::GradScaler scaler;
  CHECK(scaler.get_scale() == 65536.0);
  scaler.scale(sum(p)).backward();
  KILN_CHECK_EQUAL(p.grad(), full({3}, 65536.0));
  scaler.unscale_(sgd);
  KILN_CHECK_EQUAL(p.grad(), ones({3}));
  CHECK_THROWS_WITH(scaler.unscale_(sgd), Contains("already called"));
  scaler.step(sgd);
  CHECK_THROWS_WITH(scaler.step(sgd), Contains("GradScaler.step") && Contains("already called"));
  CHECK_THROWS_WITH(scaler.unscale_(sgd), Contains("after step()"));
  scaler.update();
  CHECK_THROWS_WITH(scaler.update(), Contains("no inf checks"));
  sgd.zero_grad();
  CHECK_THROWS_WITH(scaler.step(sgd), Contains("no inf checks") && Contains("gradient"));
  CHECK_THROWS_WITH(optim::GradScaler({.growth_factor = 0.5}), Contains("growth_factor"));
  Tensor h = ones({2}, {.dtype = DType::f16}).requires_grad_();
  optim::SGD half({h}, {.lr = 0.1});
  h.set_grad(ones({2}, {.dtype = DType::f16}));
  CHECK_THROWS_WITH(scaler.unscale_(half), Contains("f16 gradients"));
}

TEST_CASE("a disabled GradScaler is the plain loop", "[optim][amp]") {
  Tensor p = ones({3}).requires_grad_();
  optim::SGD sgd({p}, {.lr = 0.5});
  optim::GradScaler scaler({.enabled = false});
  const Tensor loss = sum(p * 2);
  CHECK(scaler.scale(loss).same(loss));
  loss.backward();
  scaler.unscale_(sgd);
  scaler.step(sgd);
  scaler.update();
  KILN_CHECK_EQUAL(p.detach(), zeros({3}));
  CHECK(scaler.get_scale() == 1.0);
  CHECK(scaler.state_dict().empty());
}

TEST_CASE("a resumed GradScaler continues bit for bit", "[optim][amp]") {
  const Grad script[] = {Grad::ok, Grad::inf, Grad::ok, Grad::ok, Grad::ok, Grad::nan, Grad::ok, Grad::ok};
  const Tensor start = arange(4, {.dtype = DType::f32}) * 0.5;
  const optim::GradScalerOptions options{.init_scale = 1024, .growth_interval = 2};
  Tensor p = start.clone().requires_grad_();
  optim::AdamW opt({p}, {.lr = 0.05});
  optim::GradScaler scaler(options);
  for (int s = 0; s < 4; ++s) scaled_step(scaler, opt, p, step_coefficients(s, script[s]));
  // A checkpoint: parameters, optimizer and scaler state.
  const Tensor saved_p = p.detach().clone();
  const auto saved_opt = opt.state_dict();
  const auto saved_scaler = scaler.state_dict();
  CHECK(saved_scaler.at("scale").item<float>() == static_cast<float>(scaler.get_scale()));
  CHECK(saved_scaler.at("_growth_tracker").dtype() == DType::i32);
  for (int s = 4; s < 8; ++s) scaled_step(scaler, opt, p, step_coefficients(s, script[s]));

  Tensor r = saved_p.clone().requires_grad_();
  optim::AdamW resumed_opt({r}, {.lr = 0.05});
  resumed_opt.load_state_dict(saved_opt);
  optim::GradScaler resumed(options);
  resumed.load_state_dict(saved_scaler);
  for (int s = 4; s < 8; ++s) scaled_step(resumed, resumed_opt, r, step_coefficients(s, script[s]));
  check_identical(r.detach(), p.detach());
  CHECK(resumed.get_scale() == scaler.get_scale());
  CHECK(resumed.growth_tracker() == scaler.growth_tracker());

  CHECK_THROWS_WITH(resumed.load_state_dict({}), Contains("empty"));
  auto missing = saved_scaler;
  missing.erase("_growth_tracker");
  CHECK_THROWS_WITH(resumed.load_state_dict(missing), Contains("_growth_tracker"));
}

TEST_CASE("accumulation with the scaler equals the unscaled accumulated step and unscales once", "[optim][amp]") {
  manual_seed(3);
  models::MLP scaled_model(std::vector<int64_t>{5, 7, 3}), plain_model(std::vector<int64_t>{5, 7, 3});
  plain_model.load_state_dict(scaled_model.state_dict());
  optim::SGD scaled_opt(scaled_model.parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD plain_opt(plain_model.parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::GradScaler scaler({.init_scale = 4096});
  optim::Accumulation acc({.batch = 10, .micro_batch = 4});  // micro-batches of 4, 4, 2
  for (int s = 0; s < 3; ++s) {
    const Tensor x = randn({10, 5}), y = randn({10, 3});
    int unscales = 0;
    {
      OpHookGuard count([&](const OpCall& call) { unscales += call.op.name == "amp_unscale_"; });
      scaled_opt.zero_grad();
      for (const optim::MicroBatch& mb : acc.split(x, y)) {
        scaler.scale(mb.scale(mse_loss(scaled_model(mb.x), mb.y))).backward();
        mb.finish();
      }
      scaler.step(scaled_opt);
      scaler.update();
    }
    CHECK(unscales == 1);
    plain_opt.zero_grad();
    for (const optim::MicroBatch& mb : acc.split(x, y)) mb.scale(mse_loss(plain_model(mb.x), mb.y)).backward();
    plain_opt.step();
    // Scaling by a power of two and back is exact, unless a product underflows or overflows.
    const auto a = scaled_model.named_parameters(), b = plain_model.named_parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      check_identical(a[i].second.detach(), b[i].second.detach());
    }
  }
}
