// Backward formulas of the view ops. Each gradient is built from ordinary differentiable
// ops (reshape, permute, pad, sum, scatter_add, gather), never by writing into a buffer, so
// that create_graph backward passes and traced backward graphs see plain ops.
#include <algorithm>
#include <numeric>

#include "autograd/formula.h"
#include "core/ops/factory.h"
#include "core/ops/indexing.h"
#include "core/ops/join.h"

namespace kiln {
namespace {

// t padded with `before` and `after` zeros along dim d (negative amounts crop).
Tensor pad_dim(const Tensor& t, int64_t d, int64_t before, int64_t after) {
  std::vector<int64_t> pads(static_cast<size_t>(2 * (t.dim() - d)), 0);
  pads[pads.size() - 2] = before;
  pads[pads.size() - 1] = after;
  return pad(t, pads);
}

std::vector<Tensor> reshape_backward(const BackwardContext& c) {
  return {c.grad().reshape(c.input_metas[0].shape)};
}

std::vector<Tensor> permute_backward(const BackwardContext& c) {
  const std::vector<int64_t>& dims = c.attrs.ints("dims");
  const int64_t n = static_cast<int64_t>(dims.size());
  std::vector<int64_t> inverse(dims.size());
  for (int64_t i = 0; i < n; ++i) inverse[wrap_dim(dims[i], n, "permute_backward")] = i;
  return {c.grad().permute(inverse)};
}

std::vector<Tensor> expand_backward(const BackwardContext& c) {
  return {sum_to(c.grad(), c.input_metas[0].shape)};
}

// The slice's gradient placed at positions start, start + step, ... of a zero tensor of the
// input's shape: interleave step - 1 zeros after each element, then pad to the input size.
std::vector<Tensor> slice_backward(const BackwardContext& c) {
  const Shape& shape = c.input_metas[0].shape;
  const int64_t d =
      wrap_dim(c.attrs.i("dim"), static_cast<int64_t>(shape.size()), "slice_backward");
  const int64_t size = shape[d];
  int64_t start = c.attrs.i("start");
  const int64_t step = c.attrs.i("step");
  if (start < 0) start += size;
  start = std::clamp<int64_t>(start, 0, size);
  Tensor g = c.grad();
  const int64_t length = g.size(d);
  if (step > 1) {
    Shape merged = g.shape();
    merged[d] = length * step;
    g = pad_dim(g.unsqueeze(d + 1), d + 1, 0, step - 1).reshape(merged);
  }
  return {pad_dim(g, d, start, size - start - length * step)};
}

std::vector<Tensor> select_backward(const BackwardContext& c) {
  const Shape& shape = c.input_metas[0].shape;
  const int64_t d =
      wrap_dim(c.attrs.i("dim"), static_cast<int64_t>(shape.size()), "select_backward");
  int64_t index = c.attrs.i("index");
  if (index < 0) index += shape[d];
  return {pad_dim(c.grad().unsqueeze(d), d, index, shape[d] - index - 1)};
}

// Whether no two elements of (shape, strides) share an address: sorted by stride, each
// dim must step over everything the smaller dims span.
bool non_overlapping(const Shape& shape, const Shape& strides) {
  std::vector<size_t> order;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return true;
    if (shape[i] > 1) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return strides[a] < strides[b]; });
  int64_t span = 1;  // one past the largest offset the smaller dims reach
  for (size_t i : order) {
    if (strides[i] < span) return false;
    span = strides[i] * (shape[i] - 1) + span;
  }
  return true;
}

// The gradient flows through storage: scatter it to the storage positions the output
// reads, then gather the positions the input occupies. The input must not overlap itself
// (an expanded input would receive the same gradient several times).
std::vector<Tensor> as_strided_backward(const BackwardContext& c) {
  const Tensor& x = c.input(0);
  KILN_CHECK(non_overlapping(x.shape(), x.strides()),
             "as_strided: backward is not supported for an input whose elements overlap ({} "
             "with strides {})",
             x.meta_str(), shape_str(x.strides()));
  const Tensor& g = c.grad();
  const int64_t capacity = static_cast<int64_t>(x.storage()->nbytes / x.itemsize());
  const Tensor positions = arange(capacity, {.dtype = DType::i64, .device = x.device()});
  const Tensor out_pos =
      positions.as_strided(c.attrs.ints("shape"), c.attrs.ints("strides"), c.attrs.i("offset"));
  const Tensor in_pos = positions.as_strided(x.shape(), x.strides(), x.offset());
  const Tensor storage_grad =
      scatter_add(zeros({capacity}, {.dtype = g.dtype(), .device = g.device()}), 0,
                  out_pos.reshape({-1}), g.reshape({-1}));
  return {gather(storage_grad, 0, in_pos.reshape({-1})).reshape(x.shape())};
}

struct Registrar {
  Registrar() {
    register_backward("view", {.fn = reshape_backward, .saves_inputs = false});
    register_backward("squeeze", {.fn = reshape_backward, .saves_inputs = false});
    register_backward("unsqueeze", {.fn = reshape_backward, .saves_inputs = false});
    register_backward("permute", {.fn = permute_backward, .saves_inputs = false});
    register_backward("expand", {.fn = expand_backward, .saves_inputs = false});
    register_backward("slice", {.fn = slice_backward, .saves_inputs = false});
    register_backward("select", {.fn = select_backward, .saves_inputs = false});
    register_backward("as_strided", {.fn = as_strided_backward});
  }
} registrar;

}  // namespace
}  // namespace kiln
