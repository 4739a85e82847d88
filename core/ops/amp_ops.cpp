// The loss scaler's ops (core/ops/amp_ops.h): shape rules and public functions.
#include "core/ops/amp_ops.h"

#include <cmath>

#include "core/grad_mode.h"
#include "core/registry.h"

namespace kiln {
namespace {

void check_flag(const TensorMeta& m, const char* what, DType dtype, const Device& device, const char* op) {
  KILN_CHECK(m.defined && m.shape.empty() && m.dtype == dtype && m.device == device,
             "{}: {} must be a 0-d {} tensor on {}, got {}", op, what, dtype, device.str(),
             m.defined ? m.str() : std::string("an undefined tensor"));
}

// (grad x N, found_inf, inv_scale) {count}
int64_t check_unscale(std::span<const TensorMeta> in, const Attrs& a, const char* op) {
  KILN_CHECK(a.has("count") && a.i("count") >= 1, "{}: attribute 'count' >= 1 is required ({})", op, a.to_string());
  const int64_t n = a.i("count");
  KILN_CHECK(static_cast<int64_t>(in.size()) == n + 2,
             "{}: expects {} gradients, found_inf and inv_scale ({} tensors), got {}", op, n, n + 2, in.size());
  const Device device = in[0].device;
  for (int64_t k = 0; k < n; ++k) {
    const TensorMeta& g = in[static_cast<size_t>(k)];
    KILN_CHECK(g.defined && is_floating(g.dtype) && g.device == device,
               "{}: gradient {} must be a floating tensor on {} (the first gradient's device), got {}", op, k,
               device.str(), g.defined ? g.str() : std::string("an undefined tensor"));
  }
  check_flag(in[static_cast<size_t>(n)], "found_inf", DType::f32, device, op);
  check_flag(in[static_cast<size_t>(n + 1)], "inv_scale", DType::f32, device, op);
  return n;
}

std::vector<TensorMeta> infer_unscale_(std::span<const TensorMeta> in, const Attrs& a) {
  check_unscale(in, a, "amp_unscale_");
  return {};
}
std::vector<TensorMeta> infer_unscale(std::span<const TensorMeta> in, const Attrs& a) {
  const int64_t n = check_unscale(in, a, "amp_unscale");
  std::vector<TensorMeta> out;
  for (int64_t k = 0; k <= n; ++k) {
    const TensorMeta& m = in[static_cast<size_t>(k)];
    out.push_back(TensorMeta{m.shape, m.dtype, m.device});
  }
  return out;
}
// The gradients and found_inf: inputs 0..count.
std::vector<int> unscale_mutated(const Attrs& a) {
  std::vector<int> out;
  for (int64_t k = 0; k <= a.i("count"); ++k) out.push_back(static_cast<int>(k));
  return out;
}

// (scale, growth_tracker, found_inf) {growth_factor, backoff_factor, growth_interval}
void check_update(std::span<const TensorMeta> in, const Attrs& a, const char* op) {
  KILN_CHECK(in.size() == 3, "{}: expects scale, growth_tracker and found_inf, got {} tensors", op, in.size());
  for (const char* attr : {"growth_factor", "backoff_factor", "growth_interval"})
    KILN_CHECK(a.has(attr), "{}: attribute '{}' is required ({})", op, attr, a.to_string());
  KILN_CHECK(in[0].defined, "{}: scale is required", op);
  const Device device = in[0].device;
  check_flag(in[0], "scale", DType::f32, device, op);
  check_flag(in[1], "growth_tracker", DType::i32, device, op);
  check_flag(in[2], "found_inf", DType::f32, device, op);
  KILN_CHECK(a.i("growth_interval") >= 1, "{}: growth_interval must be at least 1, got {}", op,
             a.i("growth_interval"));
}
std::vector<TensorMeta> infer_update_(std::span<const TensorMeta> in, const Attrs& a) {
  check_update(in, a, "amp_update_scale_");
  return {};
}
std::vector<TensorMeta> infer_update(std::span<const TensorMeta> in, const Attrs& a) {
  check_update(in, a, "amp_update_scale");
  return {TensorMeta{{}, DType::f32, in[0].device}, TensorMeta{{}, DType::i32, in[0].device}};
}

const OpDef& kUnscaleInPlace = define_op({.name = "amp_unscale_",
                                          .infer = infer_unscale_,
                                          .mutated_inputs_of = unscale_mutated,
                                          .pure_twin = "amp_unscale"});
const OpDef& kUnscale = define_op({.name = "amp_unscale", .infer = infer_unscale});
const OpDef& kUpdateInPlace = define_op(
    {.name = "amp_update_scale_", .infer = infer_update_, .mutated_inputs = {0, 1}, .pure_twin = "amp_update_scale"});
const OpDef& kUpdate = define_op({.name = "amp_update_scale", .infer = infer_update});

std::vector<Tensor> unscale_inputs(std::span<const Tensor> grads, const Tensor& found_inf, const Tensor& inv_scale) {
  std::vector<Tensor> in(grads.begin(), grads.end());
  in.push_back(found_inf);
  in.push_back(inv_scale);
  return in;
}
Attrs update_attrs(const AmpScaleUpdate& u) {
  return {{"growth_factor", u.growth_factor}, {"backoff_factor", u.backoff_factor},
          {"growth_interval", u.growth_interval}};
}

}  // namespace

void amp_unscale_(std::span<const Tensor> grads, const Tensor& found_inf, const Tensor& inv_scale) {
  KILN_CHECK(!grads.empty(), "amp_unscale_: no gradients");
  NoGradGuard no_grad;
  call_op(kUnscaleInPlace, unscale_inputs(grads, found_inf, inv_scale), {{"count", static_cast<int64_t>(grads.size())}});
}

AmpUnscaled amp_unscale(std::span<const Tensor> grads, const Tensor& found_inf, const Tensor& inv_scale) {
  KILN_CHECK(!grads.empty(), "amp_unscale: no gradients");
  NoGradGuard no_grad;
  std::vector<Tensor> out =
      call_op(kUnscale, unscale_inputs(grads, found_inf, inv_scale), {{"count", static_cast<int64_t>(grads.size())}});
  Tensor flag = out.back();
  out.pop_back();
  return {std::move(out), flag};
}

void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       const AmpScaleUpdate& update) {
  NoGradGuard no_grad;
  call_op(kUpdateInPlace, {scale, growth_tracker, found_inf}, update_attrs(update));
}

AmpScaleState amp_update_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                               const AmpScaleUpdate& update) {
  NoGradGuard no_grad;
  const std::vector<Tensor> out = call_op(kUpdate, {scale, growth_tracker, found_inf}, update_attrs(update));
  return {out[0], out[1]};
}

}  // namespace kiln
