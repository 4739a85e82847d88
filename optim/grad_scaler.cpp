#include "optim/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops/amp_ops.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"

namespace kiln::optim {

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  KILN_CHECK(options.init_scale > 0 && std::isfinite(options.init_scale),
             "GradScaler: init_scale must be positive and finite, got {}", options.init_scale);
  KILN_CHECK(options.growth_factor > 1.0, "GradScaler: growth_factor must be above 1, got {}",
             options.growth_factor);
  KILN_CHECK(options.backoff_factor > 0 && options.backoff_factor < 1.0,
             "GradScaler: backoff_factor must be between 0 and 1, got {}", options.backoff_factor);
  KILN_CHECK(options.growth_interval >= 1 && options.growth_interval <= INT32_MAX,
             "GradScaler: growth_interval must be between 1 and 2^31 - 1, got {}", options.growth_interval);
  if (!options.enabled) return;
  scale_ = full({}, options.init_scale, {.dtype = DType::f32, .device = options.device});
  growth_tracker_ = zeros({}, {.dtype = DType::i32, .device = options.device});
}

// The scale lives where the losses are: moved there when it was made elsewhere.
void GradScaler::place(const Device& device) {
  if (scale_.device() == device) return;
  scale_ = scale_.to(device);
  growth_tracker_ = growth_tracker_.to(device);
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!options_.enabled) return loss;
  KILN_CHECK(loss.defined() && is_floating(loss.dtype()), "GradScaler.scale: the loss must be a floating tensor, got {}",
             loss.defined() ? loss.meta_str() : std::string("an undefined tensor"));
  place(loss.device());
  const Tensor& s = scale_;
  // In f32 whatever the loss's dtype: 65536 is not an f16 number (the largest is 65504).
  if (loss.dtype() == DType::f32) return loss * s;
  return (loss.to(DType::f32) * s).to(loss.dtype());
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!options_.enabled) return;
  PerOptimizer& state = per_optimizer_[&opt];
  KILN_CHECK(state.stage != Stage::unscaled,
             "GradScaler.unscale_: already called on this optimizer since the last update()");
  KILN_CHECK(state.stage != Stage::stepped, "GradScaler.unscale_: called after step() (call it before step())");
  // The gradients by dtype, all on one device.
  std::map<DType, std::vector<Tensor>> by_dtype;
  Device device = scale_.device();
  bool first = true;
  for (const ParamGroup& group : opt.param_groups())
    for (const Tensor& p : group.params) {
      const Tensor g = p.grad();
      if (!g.defined()) continue;
      KILN_CHECK(g.dtype() != DType::f16,
                 "GradScaler.unscale_: parameter {} has f16 gradients; keep parameters in f32 (autocast casts "
                 "them for the ops that run in f16)",
                 p.meta_str());
      if (first) device = g.device();
      KILN_CHECK(g.device() == device,
                 "GradScaler.unscale_: gradients on {} and {}; one optimizer's parameters must be on one device",
                 device.str(), g.device().str());
      first = false;
      by_dtype[g.dtype()].push_back(g);
    }
  NoGradGuard no_grad;
  // 1 / scale in f64, rounded to f32, as PyTorch computes it.
  const Tensor inv_scale = reciprocal(scale_.to(DType::f64)).to(DType::f32).to(device);
  if (!state.found_inf.defined() || state.found_inf.device() != device)
    state.found_inf = zeros({}, {.dtype = DType::f32, .device = device});
  else
    state.found_inf.zero_();
  for (const auto& [dtype, grads] : by_dtype) amp_unscale_(grads, state.found_inf, inv_scale);
  state.checked = !by_dtype.empty();  // nothing was checked: step() says so
  state.stage = Stage::unscaled;
}

void GradScaler::step(Optimizer& opt) {
  if (!options_.enabled) return opt.step();
  PerOptimizer& state = per_optimizer_[&opt];
  KILN_CHECK(state.stage != Stage::stepped,
             "GradScaler.step: already called on this optimizer since the last update()");
  if (state.stage == Stage::ready) unscale_(opt);
  KILN_CHECK(state.checked,
             "GradScaler.step: no inf checks were recorded for this optimizer (no parameter has a gradient)");
  opt.step(state.found_inf);
  state.stage = Stage::stepped;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  Tensor found;  // any optimizer's overflow backs the scale off
  for (const auto& [opt, state] : per_optimizer_) {
    if (state.stage == Stage::ready || !state.checked) continue;
    const Tensor f = state.found_inf.to(scale_.device());
    found = found.defined() ? found + f : f;
  }
  KILN_CHECK(found.defined(), "GradScaler.update: no inf checks were recorded before update() (call step() first)");
  amp_update_scale_(scale_, growth_tracker_, found,
                    {options_.growth_factor, options_.backoff_factor, options_.growth_interval});
  ready_all();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  KILN_CHECK(new_scale > 0 && std::isfinite(new_scale), "GradScaler.update: new_scale must be positive and finite, got {}",
             new_scale);
  NoGradGuard no_grad;
  scale_.fill_(new_scale);
  ready_all();
}

void GradScaler::ready_all() {
  for (auto& [opt, state] : per_optimizer_) {
    state.stage = Stage::ready;
    state.checked = false;
  }
}

double GradScaler::get_scale() const {
  if (!options_.enabled) return 1.0;
  return scale_.to(Device::cpu()).item<double>();
}

int64_t GradScaler::growth_tracker() const {
  return growth_tracker_.defined() ? growth_tracker_.to(Device::cpu()).item<int64_t>() : 0;
}

std::map<std::string, Tensor> GradScaler::state_dict() const {
  if (!options_.enabled) return {};
  return {{"scale", full({}, get_scale(), {.dtype = DType::f32})},
          {"growth_factor", full({}, options_.growth_factor, {.dtype = DType::f64})},
          {"backoff_factor", full({}, options_.backoff_factor, {.dtype = DType::f64})},
          {"growth_interval", full({}, options_.growth_interval, {.dtype = DType::i64})},
          {"_growth_tracker", full({}, growth_tracker(), {.dtype = DType::i32})}};
}

void GradScaler::load_state_dict(const std::map<std::string, Tensor>& dict) {
  if (!options_.enabled) return;
  KILN_CHECK(!dict.empty(),
             "GradScaler.load_state_dict: the dict is empty (perhaps saved from a disabled GradScaler)");
  const char* keys[] = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"};
  for (const char* key : keys) {
    auto it = dict.find(key);
    KILN_CHECK(it != dict.end() && it->second.numel() == 1, "GradScaler.load_state_dict: missing or non-scalar '{}'",
               key);
  }
  for (const auto& [key, value] : dict)
    KILN_CHECK(std::find(std::begin(keys), std::end(keys), key) != std::end(keys),
               "GradScaler.load_state_dict: unexpected key '{}'", key);
  auto value = [&](const char* key) { return dict.at(key).to(Device::cpu()).to(DType::f64).item<double>(); };
  GradScalerOptions o = options_;
  o.init_scale = value("scale");
  o.growth_factor = value("growth_factor");
  o.backoff_factor = value("backoff_factor");
  o.growth_interval = static_cast<int64_t>(value("growth_interval"));
  GradScaler checked(o);  // the same checks as the constructor's
  options_ = o;
  NoGradGuard no_grad;
  // Into the same tensors (a compiled step holds them), bit for bit: the f32 scale is copied,
  // not rounded through f64 and back.
  scale_.copy_(dict.at("scale").to(DType::f32).reshape({}));
  growth_tracker_.copy_(dict.at("_growth_tracker").to(DType::i32).reshape({}));
  ready_all();
}

}  // namespace kiln::optim
