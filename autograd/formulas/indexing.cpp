// Backward formulas of the indexing, joining and dropout ops. Index inputs get no
// gradient; gathers are undone by scatter_add into zeros and scatters by gather.
#include "core/ops/indexing.h"

#include "autograd/formula.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/join.h"

namespace kiln {
namespace {

Tensor cast_to(const Tensor& g, DType dtype) { return g.dtype() == dtype ? g : g.to(dtype); }

Tensor zeros_for(const Shape& shape, const Tensor& like) {
  return zeros(shape, {.dtype = like.dtype(), .device = like.device()});
}

// g scattered along dim d of a zero tensor of `shape` at `index` (which has g's shape).
Tensor scatter_into_zeros(const Shape& shape, int64_t d, const Tensor& index, const Tensor& g) {
  if (shape.empty()) return g.reshape({});
  return scatter_add(zeros_for(shape, g), d, index, g);
}

int64_t dim_attr(const BackwardContext& c, int64_t ndim) {
  return wrap_dim(c.attrs.i("dim"), ndim, c.op.name.c_str());
}

// The pieces of the gradient along the cat dim; 1-d empty inputs (which cat skips) get an
// empty gradient.
std::vector<Tensor> cat_backward(const BackwardContext& c) {
  const Tensor& g = c.grad();
  const int64_t d = dim_attr(c, g.dim());
  std::vector<Tensor> out(c.input_metas.size());
  int64_t offset = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const TensorMeta& m = c.input_metas[i];
    if (m.shape.size() == 1 && m.shape[0] == 0 && g.dim() != 1) continue;
    const int64_t size = m.shape[d];
    if (c.needs(i)) out[i] = cast_to(g.narrow(d, offset, size), m.dtype);
    offset += size;
  }
  return out;
}

std::vector<Tensor> stack_backward(const BackwardContext& c) {
  const Tensor& g = c.grad();
  const int64_t d = dim_attr(c, g.dim());
  std::vector<Tensor> out(c.input_metas.size());
  for (size_t i = 0; i < out.size(); ++i)
    if (c.needs(i)) out[i] = cast_to(g.select(d, static_cast<int64_t>(i)), c.input_metas[i].dtype);
  return out;
}

// Undoing the padding: negated pads crop what was added and zero-fill what was cropped.
std::vector<Tensor> pad_backward(const BackwardContext& c) {
  std::vector<int64_t> pads = c.attrs.ints("pads");
  for (int64_t& p : pads) p = -p;
  return {pad(c.grad(), pads)};
}

std::vector<Tensor> gather_backward(const BackwardContext& c) {
  const Shape& shape = c.input_metas[0].shape;
  const int64_t d = dim_attr(c, static_cast<int64_t>(shape.size()));
  return {scatter_into_zeros(shape, d, c.input(1), c.grad()), Tensor()};
}

// x gets the gradient unchanged; src gets what its elements were added to, and zero where
// the index does not reach (src may be larger than the index).
std::vector<Tensor> scatter_add_backward(const BackwardContext& c) {
  const Tensor& g = c.grad();
  std::vector<Tensor> out(3);
  if (c.needs(0)) out[0] = g;
  if (c.needs(2)) {
    const Shape& src_shape = c.input_metas[2].shape;
    const int64_t d = dim_attr(c, g.dim());
    Tensor gs = gather(g, d, c.input(1));
    if (gs.shape() != src_shape) {
      if (gs.numel() == numel_of(src_shape)) {
        gs = gs.reshape(src_shape);
      } else {
        std::vector<int64_t> pads;
        for (int64_t k = gs.dim() - 1; k >= 0; --k) {
          pads.push_back(0);
          pads.push_back(src_shape[k] - gs.size(k));
        }
        gs = pad(gs, pads);
      }
    }
    out[2] = gs;
  }
  return out;
}

std::vector<Tensor> index_select_backward(const BackwardContext& c) {
  const Shape& shape = c.input_metas[0].shape;
  const Tensor& g = c.grad();
  if (shape.empty()) return {g.reshape({}), Tensor()};
  const int64_t d = dim_attr(c, static_cast<int64_t>(shape.size()));
  Shape index_shape(shape.size(), 1);
  index_shape[d] = g.size(d);
  const Tensor index = cast_to(c.input(1), DType::i64).reshape(index_shape).expand(g.shape());
  return {scatter_add(zeros_for(shape, g), d, index, g), Tensor()};
}

std::optional<int64_t> padding_idx(const BackwardContext& c) {
  if (!c.attrs.has("padding_idx")) return std::nullopt;
  return c.attrs.i("padding_idx");
}

std::vector<Tensor> embedding_grad(const BackwardContext& c) {
  return {embedding_backward(c.grad(), c.input(1), c.input_metas[0].shape[0], padding_idx(c)),
          Tensor()};
}

// embedding_backward is linear in grad: its adjoint looks the rows up again, with the
// padding row's contributions zero.
std::vector<Tensor> embedding_backward_grad(const BackwardContext& c) {
  const Tensor& indices = c.input(1);
  Tensor g = embedding(c.grad(), indices);
  if (auto p = padding_idx(c)) g = where((indices == *p).unsqueeze(-1), 0, g);
  return {g, Tensor()};
}

std::vector<Tensor> flip_backward(const BackwardContext& c) {
  return {flip(c.grad(), c.attrs.ints("dims"))};
}
std::vector<Tensor> tril_backward(const BackwardContext& c) {
  return {tril(c.grad(), c.attrs.i("diagonal"))};
}
std::vector<Tensor> triu_backward(const BackwardContext& c) {
  return {triu(c.grad(), c.attrs.i("diagonal"))};
}

// The adjoint of a running sum is a running sum from the end.
std::vector<Tensor> cumsum_backward(const BackwardContext& c) {
  const TensorMeta& m = c.input_metas[0];
  const Tensor& g = c.grad();
  if (m.shape.empty()) return {cast_to(g, m.dtype)};
  const int64_t d = dim_attr(c, g.dim());
  return {cast_to(flip(cumsum(flip(g, {d}), d), {d}), m.dtype)};
}

// topk and sort: the values' gradient goes back to where each value came from.
std::vector<Tensor> sorted_values_backward(const BackwardContext& c) {
  const Shape& shape = c.input_metas[0].shape;
  const int64_t d = dim_attr(c, static_cast<int64_t>(shape.size()));
  return {scatter_into_zeros(shape, d, c.output(1), c.grad())};
}

std::vector<Tensor> dropout_grad(const BackwardContext& c) {
  const Tensor& mask = c.output(1);
  const bool train = !c.attrs.has("train") || c.attrs.b("train");
  if (!train) return {mul(c.grad(), mask)};
  return {dropout_backward(c.grad(), mask, c.attrs.f("p"))};
}

struct Registrar {
  Registrar() {
    register_backward("cat", {.fn = cat_backward, .saves_inputs = false});
    register_backward("stack", {.fn = stack_backward, .saves_inputs = false});
    register_backward("pad", {.fn = pad_backward, .saves_inputs = false});
    register_backward("gather", {.fn = gather_backward, .unsaved_inputs = {0}});
    register_backward("scatter_add", {.fn = scatter_add_backward, .unsaved_inputs = {0, 2}});
    register_backward("index_select", {.fn = index_select_backward, .unsaved_inputs = {0}});
    register_backward("embedding", {.fn = embedding_grad, .unsaved_inputs = {0}});
    register_backward("embedding_backward", {.fn = embedding_backward_grad});
    register_backward("flip", {.fn = flip_backward, .saves_inputs = false});
    register_backward("tril", {.fn = tril_backward, .saves_inputs = false});
    register_backward("triu", {.fn = triu_backward, .saves_inputs = false});
    register_backward("cumsum", {.fn = cumsum_backward, .saves_inputs = false});
    register_backward("topk",
                      {.fn = sorted_values_backward, .saves_inputs = false, .saves_outputs = true});
    register_backward("sort",
                      {.fn = sorted_values_backward, .saves_inputs = false, .saves_outputs = true});
    register_backward("dropout",
                      {.fn = dropout_grad, .saves_inputs = false, .saves_outputs = true});
  }
} registrar;

}  // namespace
}  // namespace kiln
