// Normalization ops: their shape and dtype rules and their public functions.
#include "core/ops/norm.h"

#include "core/grad_mode.h"
#include "core/ops/factory.h"
#include "core/registry.h"

namespace kiln {
namespace {

// The dtype statistics are kept in: f64 for f64 inputs, f32 otherwise.
DType stats_dtype(DType input) { return input == DType::f64 ? DType::f64 : DType::f32; }

bool attr_bool(const Attrs& a, const char* attr, const char* op) {
  KILN_CHECK(a.has(attr), "{}: attribute '{}' is required ({})", op, attr, a.to_string());
  return a.b(attr);
}

// An optional per-channel (or per-feature) tensor: absent, or floating and shaped `shape`.
void check_param(const TensorMeta& m, const Shape& shape, const char* what,
                 std::span<const TensorMeta> in, const char* op) {
  if (!m.defined) return;
  KILN_CHECK(is_floating(m.dtype), "{}: {} must be floating, got {}", op, what, metas_str(in));
  KILN_CHECK(m.shape == shape, "{}: {} must have shape {}, got {} (inputs: {})", op, what,
             shape_str(shape), shape_str(m.shape), metas_str(in));
}

void check_count(std::span<const TensorMeta> in, size_t n, const char* op) {
  KILN_CHECK(in.size() == n, "{}: expects {} tensors (absent optional ones undefined), got {}", op,
             n, in.size());
}

// (input, weight?, bias?, running_mean, running_var) -> (out, save_mean, save_invstd)
std::vector<TensorMeta> infer_batch_norm(std::span<const TensorMeta> in, const Attrs& a) {
  constexpr const char* op = "batch_norm";
  check_count(in, 5, op);
  const TensorMeta& x = in[0];
  KILN_CHECK(x.defined && is_floating(x.dtype), "{}: expects a floating input, got {}", op,
             metas_str(in));
  KILN_CHECK(x.shape.size() >= 2, "{}: expects an input of shape [N,C,...] (2-d or more), got {}",
             op, metas_str(in));
  const bool training = attr_bool(a, "training", op);
  const int64_t channels = x.shape[1];
  const Shape per_channel{channels};
  check_param(in[1], per_channel, "weight", in, op);
  check_param(in[2], per_channel, "bias", in, op);
  const bool has_mean = in[3].defined;
  const bool has_var = in[4].defined;
  KILN_CHECK(has_mean == has_var, "{}: give both running_mean and running_var or neither ({})", op,
             metas_str(in));
  KILN_CHECK(training || has_mean,
             "{}: running_mean and running_var are required in eval mode (training=false) ({})", op,
             metas_str(in));
  if (has_mean) {
    check_param(in[3], per_channel, "running_mean", in, op);
    check_param(in[4], per_channel, "running_var", in, op);
  }
  if (training) {
    const int64_t per_channel_count = channels ? numel_of(x.shape) / channels : 0;
    KILN_CHECK(per_channel_count > 1,
               "{}: expected more than 1 value per channel when training, got input {}", op,
               metas_str(in));
  }
  const Device device = common_device(in, op);
  const DType s = stats_dtype(x.dtype);
  // The normalized output keeps a channels_last input's layout; the statistics are [C].
  TensorMeta out{x.shape, x.dtype, device};
  out.memory_format = x.memory_format;
  return {out, TensorMeta{per_channel, s, device}, TensorMeta{per_channel, s, device}};
}
const OpDef& kBatchNorm =
    define_op({.name = "batch_norm", .infer = infer_batch_norm, .mutated_inputs = {3, 4}});

// (input, running_mean, running_var) {momentum} -> (new_running_mean, new_running_var): the
// update batch_norm in training writes into its running statistics, as a pure op (what the
// tracer records instead of the in-place write).
std::vector<TensorMeta> infer_batch_norm_stats_update(std::span<const TensorMeta> in,
                                                      const Attrs& a) {
  constexpr const char* op = "batch_norm_stats_update";
  check_count(in, 3, op);
  const TensorMeta& x = in[0];
  KILN_CHECK(x.defined && is_floating(x.dtype), "{}: expects a floating input, got {}", op,
             metas_str(in));
  KILN_CHECK(x.shape.size() >= 2, "{}: expects an input of shape [N,C,...] (2-d or more), got {}",
             op, metas_str(in));
  KILN_CHECK(in[1].defined && in[2].defined, "{}: running_mean and running_var are required ({})",
             op, metas_str(in));
  KILN_CHECK(a.has("momentum"), "{}: attribute 'momentum' is required ({})", op, a.to_string());
  (void)a.f("momentum");  // a double: an error naming the attribute otherwise
  const int64_t channels = x.shape[1];
  const Shape per_channel{channels};
  check_param(in[1], per_channel, "running_mean", in, op);
  check_param(in[2], per_channel, "running_var", in, op);
  const int64_t per_channel_count = channels ? numel_of(x.shape) / channels : 0;
  KILN_CHECK(per_channel_count > 1, "{}: expected more than 1 value per channel, got input {}", op,
             metas_str(in));
  const Device device = common_device(in, op);
  return {TensorMeta{per_channel, in[1].dtype, device}, TensorMeta{per_channel, in[2].dtype, device}};
}
const OpDef& kBatchNormStatsUpdate =
    define_op({.name = "batch_norm_stats_update", .infer = infer_batch_norm_stats_update});

// (input, weight?, bias?, running_mean, running_var) {training=true, momentum, eps} ->
// (out, save_mean, save_invstd, new_running_mean, new_running_var): batch_norm in training
// and batch_norm_stats_update over the same input as one pure op, whose kernels compute the
// batch statistics once (the tracer records it for a training batch norm; the values are
// bit for bit the two ops').
std::vector<TensorMeta> infer_batch_norm_update(std::span<const TensorMeta> in, const Attrs& a) {
  constexpr const char* op = "batch_norm_update";
  check_count(in, 5, op);
  KILN_CHECK(in[3].defined && in[4].defined, "{}: running_mean and running_var are required ({})", op,
             metas_str(in));
  KILN_CHECK(attr_bool(a, "training", op), "{}: only for training (training=true), got {}", op, a.to_string());
  KILN_CHECK(a.has("momentum"), "{}: attribute 'momentum' is required ({})", op, a.to_string());
  (void)a.f("momentum");  // a double: an error naming the attribute otherwise
  std::vector<TensorMeta> out = infer_batch_norm(in, a);
  const Device device = out[0].device;
  out.push_back(TensorMeta{in[3].shape, in[3].dtype, device});
  out.push_back(TensorMeta{in[4].shape, in[4].dtype, device});
  return out;
}
const OpDef& kBatchNormUpdate = define_op({.name = "batch_norm_update", .infer = infer_batch_norm_update});

// (grad_out, input, weight?, save_mean, save_invstd) -> (grad_input, grad_weight, grad_bias)
std::vector<TensorMeta> infer_batch_norm_backward(std::span<const TensorMeta> in, const Attrs& a) {
  constexpr const char* op = "batch_norm_backward";
  check_count(in, 5, op);
  const TensorMeta &g = in[0], &x = in[1];
  KILN_CHECK(g.defined && x.defined && in[3].defined && in[4].defined,
             "{}: grad_out, input, save_mean and save_invstd are required ({})", op, metas_str(in));
  KILN_CHECK(is_floating(g.dtype) && is_floating(x.dtype),
             "{}: expects floating grad_out and input, got {}", op, metas_str(in));
  KILN_CHECK(x.shape.size() >= 2, "{}: expects an input of shape [N,C,...] (2-d or more), got {}",
             op, metas_str(in));
  KILN_CHECK(g.shape == x.shape, "{}: grad_out and input differ in shape ({})", op, metas_str(in));
  attr_bool(a, "training", op);
  const Shape per_channel{x.shape[1]};
  check_param(in[2], per_channel, "weight", in, op);
  check_param(in[3], per_channel, "save_mean", in, op);
  check_param(in[4], per_channel, "save_invstd", in, op);
  const Device device = common_device(in, op);
  const DType param = in[2].defined ? in[2].dtype : x.dtype;
  // grad_input takes the input's layout, or grad_out's when the input is contiguous.
  TensorMeta grad_input{x.shape, x.dtype, device};
  grad_input.memory_format =
      x.memory_format == MemoryFormat::channels_last ? x.memory_format : g.memory_format;
  return {grad_input, TensorMeta{per_channel, param, device},
          TensorMeta{per_channel, param, device}};
}
const OpDef& kBatchNormBackward =
    define_op({.name = "batch_norm_backward", .infer = infer_batch_norm_backward});

// The shape of layer_norm's statistics: the leading dims, then a 1 per normalized dim.
Shape layer_norm_stats_shape(const TensorMeta& x, const Attrs& a, std::span<const TensorMeta> in,
                             const char* op) {
  KILN_CHECK(a.has("normalized_shape"), "{}: attribute 'normalized_shape' is required", op);
  const Shape& ns = a.ints("normalized_shape");
  KILN_CHECK(!ns.empty(), "{}: normalized_shape must not be empty ({})", op, metas_str(in));
  KILN_CHECK(numel_of(ns) > 0, "{}: normalized_shape {} has no elements to normalize over ({})", op,
             shape_str(ns), metas_str(in));
  const size_t axis = x.shape.size() - std::min(ns.size(), x.shape.size());
  KILN_CHECK(x.shape.size() >= ns.size() && Shape(x.shape.begin() + axis, x.shape.end()) == ns,
             "{}: normalized_shape {} does not match the trailing dims of the input {}", op,
             shape_str(ns), metas_str(in));
  Shape stats(x.shape.begin(), x.shape.begin() + axis);
  stats.resize(x.shape.size(), 1);
  return stats;
}

// (input, weight?, bias?) -> (out, mean, rstd)
std::vector<TensorMeta> infer_layer_norm(std::span<const TensorMeta> in, const Attrs& a) {
  constexpr const char* op = "layer_norm";
  check_count(in, 3, op);
  const TensorMeta& x = in[0];
  KILN_CHECK(x.defined && is_floating(x.dtype), "{}: expects a floating input, got {}", op,
             metas_str(in));
  const Shape stats = layer_norm_stats_shape(x, a, in, op);
  check_param(in[1], a.ints("normalized_shape"), "weight", in, op);
  check_param(in[2], a.ints("normalized_shape"), "bias", in, op);
  const Device device = common_device(in, op);
  const DType s = stats_dtype(x.dtype);
  return {TensorMeta{x.shape, x.dtype, device}, TensorMeta{stats, s, device},
          TensorMeta{stats, s, device}};
}
const OpDef& kLayerNorm = define_op({.name = "layer_norm", .infer = infer_layer_norm, .cast_policy = CastPolicy::f32});

// (grad_out, input, mean, rstd, weight?) -> (grad_input, grad_weight, grad_bias)
std::vector<TensorMeta> infer_layer_norm_backward(std::span<const TensorMeta> in, const Attrs& a) {
  constexpr const char* op = "layer_norm_backward";
  check_count(in, 5, op);
  const TensorMeta &g = in[0], &x = in[1];
  KILN_CHECK(g.defined && x.defined && in[2].defined && in[3].defined,
             "{}: grad_out, input, mean and rstd are required ({})", op, metas_str(in));
  KILN_CHECK(is_floating(g.dtype) && is_floating(x.dtype),
             "{}: expects floating grad_out and input, got {}", op, metas_str(in));
  KILN_CHECK(g.shape == x.shape, "{}: grad_out and input differ in shape ({})", op, metas_str(in));
  const Shape stats = layer_norm_stats_shape(x, a, in, op);
  const Shape& ns = a.ints("normalized_shape");
  for (int i : {2, 3}) {
    KILN_CHECK(is_floating(in[i].dtype) && numel_of(in[i].shape) == numel_of(stats),
               "{}: mean and rstd must be floating with shape {} ({})", op, shape_str(stats),
               metas_str(in));
  }
  check_param(in[4], ns, "weight", in, op);
  const Device device = common_device(in, op);
  const DType param = in[4].defined ? in[4].dtype : x.dtype;
  return {TensorMeta{x.shape, x.dtype, device}, TensorMeta{ns, param, device},
          TensorMeta{ns, param, device}};
}
const OpDef& kLayerNormBackward =
    define_op({.name = "layer_norm_backward", .infer = infer_layer_norm_backward});

}  // namespace

BatchNormResult batch_norm_with_stats(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                      const Tensor& running_mean, const Tensor& running_var,
                                      bool training, double momentum, double eps) {
  std::vector<Tensor> out = call_op(kBatchNorm,
                                    {input, weight, bias, running_mean, running_var},
                                    {{"training", training}, {"momentum", momentum}, {"eps", eps}});
  return {out[0], out[1], out[2]};
}

Tensor batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps) {
  return batch_norm_with_stats(input, weight, bias, running_mean, running_var, training, momentum,
                               eps)
      .output;
}

RunningStats batch_norm_stats_update(const Tensor& input, const Tensor& running_mean,
                                     const Tensor& running_var, double momentum) {
  // Running statistics are buffers that no gradient flows through (PyTorch updates them
  // under no_grad too): the new values must not record the input's graph.
  NoGradGuard no_grad;
  std::vector<Tensor> out = call_op(kBatchNormStatsUpdate, {input, running_mean, running_var},
                                    {{"momentum", momentum}});
  return {out[0], out[1]};
}

NormGrads batch_norm_backward(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                              const Tensor& save_mean, const Tensor& save_invstd, bool training,
                              double eps) {
  std::vector<Tensor> out =
      call_op(kBatchNormBackward, {grad_out, input, weight, save_mean, save_invstd},
              {{"training", training}, {"eps", eps}});
  return {out[0], out[1], out[2]};
}

LayerNormResult layer_norm_with_stats(const Tensor& input, std::vector<int64_t> normalized_shape,
                                      const Tensor& weight, const Tensor& bias, double eps) {
  std::vector<Tensor> out =
      call_op(kLayerNorm, {input, weight, bias},
              {{"normalized_shape", std::move(normalized_shape)}, {"eps", eps}});
  return {out[0], out[1], out[2]};
}

Tensor layer_norm(const Tensor& input, std::vector<int64_t> normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  return layer_norm_with_stats(input, std::move(normalized_shape), weight, bias, eps).output;
}

NormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& input,
                              std::vector<int64_t> normalized_shape, const Tensor& mean,
                              const Tensor& rstd, const Tensor& weight) {
  std::vector<Tensor> out = call_op(kLayerNormBackward, {grad_out, input, mean, rstd, weight},
                                    {{"normalized_shape", std::move(normalized_shape)}});
  return {out[0], out[1], out[2]};
}

}  // namespace kiln
