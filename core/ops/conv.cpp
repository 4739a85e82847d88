// 2-d convolution and its gradients: their shape and dtype rules and public functions.
#include "core/ops/conv.h"

namespace kiln {
namespace {

std::array<int64_t, 2> pair_attr(const Attrs& attrs, const char* name, int64_t fallback,
                                 const char* op, const std::string& shapes) {
  if (!attrs.has(name)) return {fallback, fallback};
  const std::vector<int64_t>& v = attrs.ints(name);
  KILN_CHECK(v.size() == 2, "{}: {}: {} must have 2 values, got {}", op, shapes, name, v.size());
  return {v[0], v[1]};
}

void check_floating(const char* op, std::span<const TensorMeta> in) {
  for (const TensorMeta& m : in) {
    if (!m.defined) continue;
    KILN_CHECK(is_floating(m.dtype), "{}: dtype {} is not supported, floating types only ({})", op,
               m.dtype, metas_str(in));
    KILN_CHECK(m.dtype == in[0].dtype, "{}: dtypes differ ({})", op, metas_str(in));
  }
  common_device(in, op);
}

std::vector<int64_t> vec(const std::array<int64_t, 2>& a) { return {a[0], a[1]}; }

Attrs conv_attrs(const Conv2dOptions& o) {
  return {{"stride", vec(o.stride)},
          {"padding", vec(o.padding)},
          {"dilation", vec(o.dilation)},
          {"groups", o.groups}};
}

std::vector<TensorMeta> infer_conv2d(std::span<const TensorMeta> in, const Attrs& attrs) {
  KILN_CHECK(in.size() == 2 || in.size() == 3,
             "conv2d: expects input, weight and bias, got {} tensors", in.size());
  KILN_CHECK(in[0].defined && in[1].defined, "conv2d: input and weight must be defined ({})",
             metas_str(in));
  check_floating("conv2d", in);
  const Conv2dGeometry g = conv2d_geometry(in[0].shape, in[1].shape, attrs, "conv2d");
  if (in.size() == 3 && in[2].defined)
    KILN_CHECK(in[2].shape == Shape{g.out_channels},
               "conv2d: input {} and weight {}: bias {} must be [{}]", shape_str(in[0].shape),
               shape_str(in[1].shape), shape_str(in[2].shape), g.out_channels);
  // The output keeps the input's layout: a channels_last network stays channels_last.
  TensorMeta out{g.output_shape(), in[0].dtype, in[0].device};
  out.memory_format = in[0].memory_format;
  return {out};
}
const OpDef& kConv2d = define_op({.name = "conv2d", .infer = infer_conv2d, .cast_policy = CastPolicy::lower});

// Both gradients check grad_out against the forward's output shape.
void check_grad_out(const char* op, const TensorMeta& grad_out, const Conv2dGeometry& g) {
  KILN_CHECK(grad_out.shape == g.output_shape(),
             "{}: grad_out {} does not match the output shape {} of input {} and weight {}", op,
             shape_str(grad_out.shape), shape_str(g.output_shape()), shape_str(g.input_shape()),
             shape_str(g.weight_shape()));
}

std::vector<TensorMeta> infer_backward_input(std::span<const TensorMeta> in, const Attrs& attrs) {
  const char* op = "conv2d_backward_input";
  KILN_CHECK(in.size() == 2 && in[0].defined && in[1].defined,
             "{}: expects grad_out and weight ({})", op, metas_str(in));
  check_floating(op, in);
  const Conv2dGeometry g = conv2d_geometry(attrs.ints("input_size"), in[1].shape, attrs, op);
  check_grad_out(op, in[0], g);
  // The input's gradient is laid out as grad_out, the activation this op reads.
  TensorMeta out{g.input_shape(), in[0].dtype, in[0].device};
  out.memory_format = in[0].memory_format;
  return {out};
}
const OpDef& kBackwardInput =
    define_op({.name = "conv2d_backward_input", .infer = infer_backward_input, .cast_policy = CastPolicy::lower});

std::vector<TensorMeta> infer_backward_weight(std::span<const TensorMeta> in, const Attrs& attrs) {
  const char* op = "conv2d_backward_weight";
  KILN_CHECK((in.size() == 2 || in.size() == 3) && in[0].defined && in[1].defined,
             "{}: expects grad_out, input and an optional gradient to add to ({})", op, metas_str(in));
  check_floating(op, in);  // dtypes equal, devices common: the added gradient's too
  const Conv2dGeometry g = conv2d_geometry(in[1].shape, attrs.ints("weight_size"), attrs, op);
  check_grad_out(op, in[0], g);
  KILN_CHECK(in.size() < 3 || !in[2].defined || in[2].shape == g.weight_shape(),
             "{}: the gradient to add to is {}, the weight's gradient {} ({})", op, shape_str(in[2].shape),
             shape_str(g.weight_shape()), metas_str(in));
  // Weights (and so their gradients) stay contiguous whatever the activations' layout.
  return {TensorMeta{g.weight_shape(), in[0].dtype, in[0].device}};
}
int backward_weight_accumulator(std::span<const TensorMeta> in) { return in.size() == 3 && in[2].defined ? 2 : -1; }
const OpDef& kBackwardWeight = define_op(
    {.name = "conv2d_backward_weight", .infer = infer_backward_weight, .accumulator = backward_weight_accumulator,
     .cast_policy = CastPolicy::lower});

}  // namespace

Conv2dGeometry conv2d_geometry(const Shape& input, const Shape& weight, const Attrs& attrs,
                               const char* op) {
  const std::string shapes =
      fmt::format("input {} and weight {}", shape_str(input), shape_str(weight));
  KILN_CHECK(input.size() == 4, "{}: {}: the input must be 4-d (N, C, H, W)", op, shapes);
  KILN_CHECK(weight.size() == 4, "{}: {}: the weight must be 4-d (O, C / groups, kh, kw)", op,
             shapes);
  const auto stride = pair_attr(attrs, "stride", 1, op, shapes);
  const auto padding = pair_attr(attrs, "padding", 0, op, shapes);
  const auto dilation = pair_attr(attrs, "dilation", 1, op, shapes);
  const int64_t groups = attrs.has("groups") ? attrs.i("groups") : 1;
  KILN_CHECK(stride[0] >= 1 && stride[1] >= 1 && dilation[0] >= 1 && dilation[1] >= 1 &&
                 padding[0] >= 0 && padding[1] >= 0,
             "{}: {}: stride [{},{}] and dilation [{},{}] must be positive, padding [{},{}] not "
             "negative",
             op, shapes, stride[0], stride[1], dilation[0], dilation[1], padding[0], padding[1]);
  KILN_CHECK(groups >= 1, "{}: {}: groups must be positive, got {}", op, shapes, groups);
  for (int64_t s : input) KILN_CHECK(s >= 0, "{}: {}: negative size", op, shapes);
  for (int64_t s : weight) KILN_CHECK(s >= 0, "{}: {}: negative size", op, shapes);
  KILN_CHECK(input[1] % groups == 0, "{}: {}: groups {} does not divide the {} input channels", op,
             shapes, groups, input[1]);
  KILN_CHECK(weight[0] % groups == 0, "{}: {}: groups {} does not divide the {} output channels",
             op, shapes, groups, weight[0]);
  KILN_CHECK(weight[1] * groups == input[1],
             "{}: {}: channel mismatch: the weight expects {} input channels ({} per group x {} "
             "groups), the input has {}",
             op, shapes, weight[1] * groups, weight[1], groups, input[1]);
  KILN_CHECK(weight[2] >= 1 && weight[3] >= 1, "{}: {}: empty kernel", op, shapes);
  Conv2dGeometry g{};
  g.batch = input[0];
  g.in_channels = input[1];
  g.in_h = input[2];
  g.in_w = input[3];
  g.out_channels = weight[0];
  g.kernel_h = weight[2];
  g.kernel_w = weight[3];
  g.stride_h = stride[0];
  g.stride_w = stride[1];
  g.pad_h = padding[0];
  g.pad_w = padding[1];
  g.dilation_h = dilation[0];
  g.dilation_w = dilation[1];
  g.groups = groups;
  const int64_t extent_h = dilation[0] * (g.kernel_h - 1) + 1;
  const int64_t extent_w = dilation[1] * (g.kernel_w - 1) + 1;
  const int64_t padded_h = g.in_h + 2 * g.pad_h, padded_w = g.in_w + 2 * g.pad_w;
  KILN_CHECK(extent_h <= padded_h && extent_w <= padded_w,
             "{}: {}: the kernel ({}x{} with dilation) is larger than the padded input ({}x{})", op,
             shapes, extent_h, extent_w, padded_h, padded_w);
  g.out_h = (padded_h - extent_h) / g.stride_h + 1;
  g.out_w = (padded_w - extent_w) / g.stride_w + 1;
  return g;
}

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options) {
  return call_op1(kConv2d, {input, weight, bias}, conv_attrs(options));
}

Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dOptions& options) {
  Attrs attrs = conv_attrs(options);
  attrs.set("input_size", input_shape);
  return call_op1(kBackwardInput, {grad_out, weight}, attrs);
}

Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& input,
                              const Shape& weight_shape, const Conv2dOptions& options,
                              const Tensor& accumulate) {
  Attrs attrs = conv_attrs(options);
  attrs.set("weight_size", weight_shape);
  if (accumulate.defined()) return call_op1(kBackwardWeight, {grad_out, input, accumulate}, attrs);
  return call_op1(kBackwardWeight, {grad_out, input}, attrs);
}

}  // namespace kiln
