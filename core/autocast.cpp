#include "core/autocast.h"

#include <array>
#include <unordered_map>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/registry.h"

namespace kiln {
namespace {

thread_local std::array<std::optional<DType>, kNumDeviceTypes> t_dtype;
thread_local int t_scopes = 0;  // open autocast scopes (enabled or not) on this thread

// The parameters cast in this thread's outermost scope: per source and target dtype, the
// source (kept alive, so its address is not reused), its storage's version then, the cast.
struct CastParam {
  Tensor source;
  uint64_t version = 0;
  Tensor cast;
};
thread_local std::unordered_map<const TensorImpl*, std::array<std::optional<CastParam>, kNumDTypes>> t_params;

const OpDef& cast_op() {
  static const OpDef& op = find_op("cast");
  return op;
}

bool eligible(const Tensor& t, DeviceType device) {
  return t.defined() && !t.is_wrapped_number() && t.device().type == device && is_floating(t.dtype()) &&
         t.dtype() != DType::f64;
}

Tensor cast_to(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  // Only casts autograd records are kept: one made under no_grad has no graph back to the
  // parameter, and a later use with grad must not reuse it.
  if (!(t.requires_grad() && t.is_leaf() && GradMode::is_enabled()))
    return call_op1(cast_op(), {t}, {{"dtype", dtype}});
  std::optional<CastParam>& slot = t_params[t.impl()][static_cast<size_t>(dtype)];
  const uint64_t version = t.storage()->version;
  if (!slot || slot->version != version) slot = CastParam{t, version, call_op1(cast_op(), {t}, {{"dtype", dtype}})};
  return slot->cast;
}

// The widest floating dtype among the eligible inputs: f32 over f16 and bf16, and f32 for a
// mix of f16 and bf16 (neither holds the other).
DType widest(const std::vector<Tensor>& inputs, DeviceType device) {
  std::optional<DType> out;
  for (const Tensor& t : inputs) {
    if (!eligible(t, device)) continue;
    if (!out) out = t.dtype();
    else if (*out != t.dtype()) out = DType::f32;
  }
  return out.value_or(DType::f32);
}

}  // namespace

autocast::autocast(AutocastOptions options) : device_(options.device_type) {
  const auto d = static_cast<size_t>(device_);
  const DType dtype = options.dtype.value_or(device_ == DeviceType::cpu ? DType::bf16 : DType::f16);
  KILN_CHECK(dtype == DType::bf16 || dtype == DType::f16,
             "autocast: the dtype must be bf16 or f16, got {} (device type {})", dtype,
             device_ == DeviceType::cpu ? "cpu" : "cuda");
  previous_ = t_dtype[d];
  t_dtype[d] = options.enabled ? std::optional<DType>(dtype) : std::nullopt;
  ++t_scopes;
}

autocast::~autocast() {
  t_dtype[static_cast<size_t>(device_)] = previous_;
  if (--t_scopes == 0) t_params.clear();
}

std::optional<DType> autocast_dtype(DeviceType device) { return t_dtype[static_cast<size_t>(device)]; }

std::vector<Tensor> autocast_inputs(const OpDef& op, std::vector<Tensor> inputs) {
  if (t_scopes == 0 || op.cast_policy == CastPolicy::none) return inputs;
  // The device type of the call: its first tensor's (wrapped numbers aside).
  std::optional<DeviceType> device;
  for (const Tensor& t : inputs)
    if (t.defined() && !t.is_wrapped_number()) {
      device = t.device().type;
      break;
    }
  if (!device) return inputs;
  const std::optional<DType> lower = t_dtype[static_cast<size_t>(*device)];
  if (!lower) return inputs;
  DType target = DType::f32;
  if (op.cast_policy == CastPolicy::lower) target = *lower;
  if (op.cast_policy == CastPolicy::promote) target = widest(inputs, *device);
  for (Tensor& t : inputs)
    if (eligible(t, *device)) t = cast_to(t, target);
  return inputs;
}

}  // namespace kiln
