// Pooling ops: their shape and dtype rules and their public functions.
#include "core/ops/pool.h"

#include "core/registry.h"

namespace kiln {
namespace {

// One or two ints as {h, w}; `fallback` when the attribute is absent or empty.
void read_pair(const Attrs& a, const char* attr, const char* op, int64_t fallback[2],
               int64_t out[2]) {
  if (!a.has(attr) || a.ints(attr).empty()) {
    out[0] = fallback[0];
    out[1] = fallback[1];
    return;
  }
  const std::vector<int64_t>& v = a.ints(attr);
  KILN_CHECK(v.size() <= 2, "{}: {} must be 1 or 2 ints, got {} ({})", op, attr, v.size(),
             a.to_string());
  out[0] = v[0];
  out[1] = v.size() == 2 ? v[1] : v[0];
}

void check_defined(std::span<const TensorMeta> in, size_t n, const char* op) {
  KILN_CHECK(in.size() == n, "{}: expects {} tensors, got {}", op, n, in.size());
  for (const TensorMeta& m : in) KILN_CHECK(m.defined, "{}: an input is undefined", op);
}

// A pooling input: floating, CHW or NCHW with nonzero C, H and W.
void check_pool_input(const TensorMeta& x, std::span<const TensorMeta> in, const char* op) {
  KILN_CHECK(is_floating(x.dtype), "{}: expects a floating input, got {}", op, metas_str(in));
  KILN_CHECK(x.shape.size() == 3 || x.shape.size() == 4,
             "{}: expects a 3-d (C,H,W) or 4-d (N,C,H,W) input, got {}", op, metas_str(in));
  for (size_t d = x.shape.size() - 3; d < x.shape.size(); ++d)
    KILN_CHECK(x.shape[d] > 0, "{}: expects nonzero sizes in the non-batch dims, got {}", op,
               metas_str(in));
}

// The input shape a backward op is given as its `input_size` attribute, checked against
// its gradient's leading dims.
Shape input_size_attr(const Attrs& a, const TensorMeta& grad, std::span<const TensorMeta> in,
                      const char* op) {
  const Shape& size = a.ints("input_size");
  KILN_CHECK(size.size() == grad.shape.size() && (size.size() == 3 || size.size() == 4),
             "{}: input_size {} must be the forward input's shape, of the rank of grad_out ({})",
             op, shape_str(size), metas_str(in));
  for (size_t d = 0; d + 2 < size.size(); ++d)
    KILN_CHECK(size[d] == grad.shape[d], "{}: input_size {} and grad_out disagree in dim {} ({})",
               op, shape_str(size), d, metas_str(in));
  for (size_t d = size.size() - 2; d < size.size(); ++d)
    KILN_CHECK(size[d] > 0, "{}: input_size {} has an empty spatial dim", op, shape_str(size));
  return size;
}

// A pooled output laid out as `format` (the input's: pooling keeps a channels_last layout).
TensorMeta laid_out(Shape shape, DType dtype, Device device, MemoryFormat format) {
  TensorMeta m{std::move(shape), dtype, device};
  m.memory_format = format;
  return m;
}

// The layout of a backward op's grad_input, which has no input tensor to follow:
// channels_last when grad_out is, or when the optional `channels_last` attribute asks for it
// (autograd sets it from the forward input, since a [N, C, 1, 1] grad_out counts as
// contiguous whatever the input was).
MemoryFormat grad_input_format(const TensorMeta& grad, const Shape& size, const Attrs& a,
                               std::span<const TensorMeta> in, const char* op) {
  const bool asked = a.has("channels_last") && a.b("channels_last");
  KILN_CHECK(!asked || size.size() == 4, "{}: channels_last needs a 4-d input_size, got {} ({})",
             op, shape_str(size), metas_str(in));
  return asked ? MemoryFormat::channels_last : grad.memory_format;
}

Shape pooled_shape(const Shape& x, const Pool2dParams& p, std::span<const TensorMeta> in,
                   const char* op) {
  const size_t h = x.size() - 2;
  Shape out = x;
  for (int d = 0; d < 2; ++d) {
    out[h + d] =
        pooled_size(x[h + d], p.kernel[d], p.padding[d], p.stride[d], p.dilation[d], p.ceil_mode);
  }
  KILN_CHECK(out[h] >= 1 && out[h + 1] >= 1,
             "{}: output size {}x{} is too small for input {} (kernel {}x{}, padding {}x{}, "
             "dilation {}x{})",
             op, out[h], out[h + 1], metas_str(in), p.kernel[0], p.kernel[1], p.padding[0],
             p.padding[1], p.dilation[0], p.dilation[1]);
  return out;
}

std::vector<TensorMeta> infer_max_pool2d(std::span<const TensorMeta> in, const Attrs& a) {
  constexpr const char* op = "max_pool2d";
  check_defined(in, 1, op);
  check_pool_input(in[0], in, op);
  const Shape out = pooled_shape(in[0].shape, pool2d_params(a, op), in, op);
  const MemoryFormat format = in[0].memory_format;
  return {laid_out(out, in[0].dtype, in[0].device, format),
          laid_out(out, DType::i64, in[0].device, format)};
}
const OpDef& kMaxPool2d = define_op({.name = "max_pool2d", .infer = infer_max_pool2d});

// (grad_out, indices) -> grad_input
std::vector<TensorMeta> infer_max_pool2d_backward(std::span<const TensorMeta> in, const Attrs& a) {
  constexpr const char* op = "max_pool2d_backward";
  check_defined(in, 2, op);
  KILN_CHECK(is_floating(in[0].dtype) && in[1].dtype == DType::i64,
             "{}: expects a floating grad_out and i64 indices, got {}", op, metas_str(in));
  KILN_CHECK(in[0].shape == in[1].shape, "{}: grad_out and indices differ in shape ({})", op,
             metas_str(in));
  const Shape size = input_size_attr(a, in[0], in, op);
  return {laid_out(size, in[0].dtype, common_device(in, op),
                   grad_input_format(in[0], size, a, in, op))};
}
const OpDef& kMaxPool2dBackward =
    define_op({.name = "max_pool2d_backward", .infer = infer_max_pool2d_backward});

std::vector<TensorMeta> infer_avg_pool2d(std::span<const TensorMeta> in, const Attrs& a) {
  constexpr const char* op = "avg_pool2d";
  check_defined(in, 1, op);
  check_pool_input(in[0], in, op);
  const Shape out = pooled_shape(in[0].shape, pool2d_params(a, op), in, op);
  return {laid_out(out, in[0].dtype, in[0].device, in[0].memory_format)};
}
const OpDef& kAvgPool2d = define_op({.name = "avg_pool2d", .infer = infer_avg_pool2d});

// (grad_out) -> grad_input; grad_out must have the shape the forward op gave.
std::vector<TensorMeta> infer_avg_pool2d_backward(std::span<const TensorMeta> in, const Attrs& a) {
  constexpr const char* op = "avg_pool2d_backward";
  check_defined(in, 1, op);
  KILN_CHECK(is_floating(in[0].dtype), "{}: expects a floating grad_out, got {}", op,
             metas_str(in));
  const Shape size = input_size_attr(a, in[0], in, op);
  const Shape expected = pooled_shape(size, pool2d_params(a, op), in, op);
  KILN_CHECK(expected == in[0].shape,
             "{}: grad_out {} does not match the pooled shape {} of input_size {}", op,
             metas_str(in), shape_str(expected), shape_str(size));
  return {laid_out(size, in[0].dtype, in[0].device, grad_input_format(in[0], size, a, in, op))};
}
const OpDef& kAvgPool2dBackward =
    define_op({.name = "avg_pool2d_backward", .infer = infer_avg_pool2d_backward});

std::vector<TensorMeta> infer_adaptive_avg_pool2d(std::span<const TensorMeta> in, const Attrs& a) {
  constexpr const char* op = "adaptive_avg_pool2d";
  check_defined(in, 1, op);
  check_pool_input(in[0], in, op);
  int64_t none[2] = {-1, -1}, size[2];
  read_pair(a, "output_size", op, none, size);
  KILN_CHECK(size[0] >= 0 && size[1] >= 0, "{}: output_size must be 1 or 2 sizes >= 0, got {}", op,
             a.to_string());
  Shape out = in[0].shape;
  out[out.size() - 2] = size[0];
  out[out.size() - 1] = size[1];
  return {laid_out(out, in[0].dtype, in[0].device, in[0].memory_format)};
}
const OpDef& kAdaptiveAvgPool2d =
    define_op({.name = "adaptive_avg_pool2d", .infer = infer_adaptive_avg_pool2d});

std::vector<TensorMeta> infer_adaptive_avg_pool2d_backward(std::span<const TensorMeta> in,
                                                           const Attrs& a) {
  constexpr const char* op = "adaptive_avg_pool2d_backward";
  check_defined(in, 1, op);
  KILN_CHECK(is_floating(in[0].dtype), "{}: expects a floating grad_out, got {}", op,
             metas_str(in));
  const Shape size = input_size_attr(a, in[0], in, op);
  return {laid_out(size, in[0].dtype, in[0].device, grad_input_format(in[0], size, a, in, op))};
}
const OpDef& kAdaptiveAvgPool2dBackward = define_op(
    {.name = "adaptive_avg_pool2d_backward", .infer = infer_adaptive_avg_pool2d_backward});

Attrs pool_attrs(std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                 std::vector<int64_t> padding, bool ceil_mode) {
  return {{"kernel_size", std::move(kernel_size)},
          {"stride", std::move(stride)},
          {"padding", std::move(padding)},
          {"ceil_mode", ceil_mode}};
}

Attrs avg_attrs(std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                std::vector<int64_t> padding, bool ceil_mode, bool count_include_pad,
                std::optional<int64_t> divisor_override) {
  Attrs a = pool_attrs(std::move(kernel_size), std::move(stride), std::move(padding), ceil_mode);
  a.set("count_include_pad", count_include_pad);
  if (divisor_override) a.set("divisor_override", *divisor_override);
  return a;
}

}  // namespace

Pool2dParams pool2d_params(const Attrs& a, const char* op) {
  Pool2dParams p;
  int64_t unset[2] = {0, 0}, zeros[2] = {0, 0}, ones[2] = {1, 1};
  KILN_CHECK(a.has("kernel_size") && !a.ints("kernel_size").empty(),
             "{}: kernel_size is required ({})", op, a.to_string());
  read_pair(a, "kernel_size", op, unset, p.kernel);
  read_pair(a, "stride", op, p.kernel, p.stride);
  read_pair(a, "padding", op, zeros, p.padding);
  read_pair(a, "dilation", op, ones, p.dilation);
  p.ceil_mode = a.has("ceil_mode") && a.b("ceil_mode");
  p.count_include_pad = !a.has("count_include_pad") || a.b("count_include_pad");
  p.divisor = a.has("divisor_override") ? a.i("divisor_override") : 0;
  KILN_CHECK(!a.has("divisor_override") || p.divisor != 0, "{}: divisor_override must be nonzero",
             op);
  for (int d = 0; d < 2; ++d) {
    KILN_CHECK(p.kernel[d] > 0 && p.stride[d] > 0 && p.dilation[d] > 0,
               "{}: kernel_size, stride and dilation must be positive ({})", op, a.to_string());
    // As PyTorch: a window that could lie wholly in the padding has no input to reduce.
    KILN_CHECK(p.padding[d] >= 0 && p.padding[d] <= p.kernel[d] / 2,
               "{}: padding must be between 0 and half the kernel size ({})", op, a.to_string());
  }
  return p;
}

int64_t pooled_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation,
                    bool ceil_mode) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  // Floor division (span may be negative when the kernel exceeds the padded input).
  const int64_t q = span >= 0 ? span / stride : -((-span + stride - 1) / stride);
  int64_t out = q + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

Tensor max_pool2d(const Tensor& x, std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, std::vector<int64_t> dilation, bool ceil_mode) {
  return max_pool2d_with_indices(x, std::move(kernel_size), std::move(stride), std::move(padding),
                                 std::move(dilation), ceil_mode)
      .values;
}

MaxPool2dResult max_pool2d_with_indices(const Tensor& x, std::vector<int64_t> kernel_size,
                                        std::vector<int64_t> stride, std::vector<int64_t> padding,
                                        std::vector<int64_t> dilation, bool ceil_mode) {
  Attrs a = pool_attrs(std::move(kernel_size), std::move(stride), std::move(padding), ceil_mode);
  a.set("dilation", std::move(dilation));
  std::vector<Tensor> out = call_op(kMaxPool2d, {x}, a);
  return {out[0], out[1]};
}

// The attribute asking a pooling gradient for a channels_last layout, set only when asked,
// so that contiguous graphs stay as they were.
static Attrs with_format(Attrs a, MemoryFormat format) {
  if (format == MemoryFormat::channels_last) a.set("channels_last", true);
  return a;
}

Tensor max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, Shape input_size,
                           MemoryFormat format) {
  return call_op1(kMaxPool2dBackward, {grad_out, indices},
                  with_format({{"input_size", std::move(input_size)}}, format));
}

Tensor avg_pool2d(const Tensor& x, std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, bool ceil_mode, bool count_include_pad,
                  std::optional<int64_t> divisor_override) {
  return call_op1(kAvgPool2d, {x},
                  avg_attrs(std::move(kernel_size), std::move(stride), std::move(padding),
                            ceil_mode, count_include_pad, divisor_override));
}

Tensor avg_pool2d_backward(const Tensor& grad_out, Shape input_size,
                           std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                           std::vector<int64_t> padding, bool ceil_mode, bool count_include_pad,
                           std::optional<int64_t> divisor_override, MemoryFormat format) {
  Attrs a = avg_attrs(std::move(kernel_size), std::move(stride), std::move(padding), ceil_mode,
                      count_include_pad, divisor_override);
  a.set("input_size", std::move(input_size));
  return call_op1(kAvgPool2dBackward, {grad_out}, with_format(std::move(a), format));
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::vector<int64_t> output_size) {
  KILN_CHECK(output_size.size() == 1 || output_size.size() == 2,
             "adaptive_avg_pool2d: output_size must be 1 or 2 ints, got {}", output_size.size());
  return call_op1(kAdaptiveAvgPool2d, {x}, {{"output_size", std::move(output_size)}});
}

Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, Shape input_size,
                                    MemoryFormat format) {
  return call_op1(kAdaptiveAvgPool2dBackward, {grad_out},
                  with_format({{"input_size", std::move(input_size)}}, format));
}

}  // namespace kiln
