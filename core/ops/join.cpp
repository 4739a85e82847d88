// Joining and splitting ops: the rules and public functions of cat, stack and pad; split
// and chunk are views built with narrow and need no op of their own.
#include "core/ops/join.h"

#include <algorithm>

#include "core/registry.h"

namespace kiln {
namespace {

void check_defined(std::span<const TensorMeta> in, const char* op) {
  KILN_CHECK(!in.empty(), "{}: expects a non-empty list of tensors", op);
  for (const TensorMeta& m : in)
    KILN_CHECK(m.defined, "{}: an input is undefined ({})", op, metas_str(in));
}

// PyTorch's legacy rule: a 1-d tensor of size 0 takes no part in cat's shape check.
bool skipped_by_cat(const TensorMeta& m) { return m.shape.size() == 1 && m.shape[0] == 0; }

std::vector<TensorMeta> infer_cat(std::span<const TensorMeta> in, const Attrs& a) {
  check_defined(in, "cat");
  for (size_t i = 0; i < in.size(); ++i)
    KILN_CHECK(!in[i].shape.empty(), "cat: tensor {} is 0-d and cannot be concatenated ({})", i,
               metas_str(in));
  const Device device = common_device(in, "cat");
  const DType dtype = result_type(in);
  const TensorMeta* ref = nullptr;
  for (const TensorMeta& m : in)
    if (!skipped_by_cat(m)) {
      ref = &m;
      break;
    }
  if (!ref) {
    wrap_dim(a.i("dim"), 1, "cat");
    return {TensorMeta{{0}, dtype, device}};
  }
  const int64_t nd = static_cast<int64_t>(ref->shape.size());
  const int64_t dim = wrap_dim(a.i("dim"), nd, "cat");
  Shape out = ref->shape;
  out[dim] = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const TensorMeta& m = in[i];
    if (skipped_by_cat(m)) continue;
    KILN_CHECK(static_cast<int64_t>(m.shape.size()) == nd,
               "cat: tensors must have the same number of dims, but tensor {} has {} and tensor "
               "{} has {} ({})",
               ref - in.data(), nd, i, m.shape.size(), metas_str(in));
    for (int64_t d = 0; d < nd; ++d)
      KILN_CHECK(d == dim || m.shape[d] == out[d],
                 "cat: sizes must match except in dim {}, but tensor {} has size {} at dim {} "
                 "where {} was expected ({})",
                 dim, i, m.shape[d], d, out[d], metas_str(in));
    out[dim] += m.shape[dim];
  }
  return {TensorMeta{out, dtype, device}};
}
const OpDef& kCat = define_op({.name = "cat", .infer = infer_cat, .cast_policy = CastPolicy::promote});

std::vector<TensorMeta> infer_stack(std::span<const TensorMeta> in, const Attrs& a) {
  check_defined(in, "stack");
  const Shape& shape = in[0].shape;
  for (size_t i = 1; i < in.size(); ++i)
    KILN_CHECK(in[i].shape == shape,
               "stack: expects tensors of one shape, but tensor 0 has {} and tensor {} has {} ({})",
               shape_str(shape), i, shape_str(in[i].shape), metas_str(in));
  const int64_t nd = static_cast<int64_t>(shape.size());
  // The new dim may go anywhere in [0, nd], so wrap against nd + 1 dims.
  const int64_t dim = wrap_dim(a.i("dim"), nd + 1, "stack");
  Shape out = shape;
  out.insert(out.begin() + dim, static_cast<int64_t>(in.size()));
  return {TensorMeta{out, result_type(in), common_device(in, "stack")}};
}
const OpDef& kStack = define_op({.name = "stack", .infer = infer_stack, .cast_policy = CastPolicy::promote});

std::vector<TensorMeta> infer_pad(std::span<const TensorMeta> in, const Attrs& a) {
  KILN_CHECK(in.size() == 1 && in[0].defined, "pad: expects one tensor");
  const TensorMeta& x = in[0];
  const std::vector<int64_t>& pads = a.ints("pads");
  const int64_t nd = static_cast<int64_t>(x.shape.size());
  KILN_CHECK(pads.size() % 2 == 0, "pad: pads {} must have an even length ({})", shape_str(pads),
             metas_str(in));
  KILN_CHECK(static_cast<int64_t>(pads.size()) <= 2 * nd,
             "pad: pads {} cover {} dims but the input has {} ({})", shape_str(pads),
             pads.size() / 2, nd, metas_str(in));
  Shape out = x.shape;
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    const int64_t d = nd - 1 - static_cast<int64_t>(i);
    out[d] = x.shape[d] + pads[2 * i] + pads[2 * i + 1];
    KILN_CHECK(out[d] >= 0,
               "pad: size {} of dim {} padded by {} and {} gives a negative size {} ({})",
               x.shape[d], d, pads[2 * i], pads[2 * i + 1], out[d], metas_str(in));
  }
  return {TensorMeta{out, x.dtype, x.device}};
}
const OpDef& kPad = define_op({.name = "pad", .infer = infer_pad});

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  return call_op1(kCat, tensors, {{"dim", dim}});
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  return call_op1(kStack, tensors, {{"dim", dim}});
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  KILN_CHECK(x.dim() > 0, "split: expects a tensor of at least 1 dim, got {}", x.meta_str());
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  const int64_t size = x.size(d);
  KILN_CHECK(split_size > 0 || (split_size == 0 && size == 0),
             "split: split_size must be positive, got {} for dim {} of {}", split_size, d,
             x.meta_str());
  // An empty dim still gives one (empty) piece, as in PyTorch.
  const int64_t pieces =
      split_size == 0 ? 1 : std::max<int64_t>((size + split_size - 1) / split_size, 1);
  std::vector<Tensor> out;
  out.reserve(static_cast<size_t>(pieces));
  for (int64_t i = 0; i < pieces; ++i) {
    const int64_t start = i * split_size;
    out.push_back(x.narrow(d, start, std::min(split_size, size - start)));
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& split_sizes, int64_t dim) {
  KILN_CHECK(x.dim() > 0, "split: expects a tensor of at least 1 dim, got {}", x.meta_str());
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : split_sizes) {
    KILN_CHECK(s >= 0, "split: sizes {} hold a negative size ({})", shape_str(split_sizes),
               x.meta_str());
    total += s;
  }
  KILN_CHECK(total == x.size(d), "split: sizes {} add up to {} but dim {} of {} has size {}",
             shape_str(split_sizes), total, d, x.meta_str(), x.size(d));
  std::vector<Tensor> out;
  out.reserve(split_sizes.size());
  int64_t start = 0;
  for (int64_t s : split_sizes) {
    out.push_back(x.narrow(d, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  KILN_CHECK(x.dim() > 0, "chunk: expects a tensor of at least 1 dim, got {}", x.meta_str());
  KILN_CHECK(chunks > 0, "chunk: chunks must be positive, got {} ({})", chunks, x.meta_str());
  const int64_t d = wrap_dim(dim, x.dim(), "chunk");
  const int64_t size = x.size(d);
  // An empty dim gives `chunks` empty pieces (split alone would give one).
  if (size == 0) return split(x, std::vector<int64_t>(static_cast<size_t>(chunks), 0), d);
  return split(x, (size + chunks - 1) / chunks, d);
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, Scalar value) {
  return call_op1(kPad, {x}, {{"pads", pads}, {"value", value}});
}

}  // namespace kiln
