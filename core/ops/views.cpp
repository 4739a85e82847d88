// View ops: each returns a tensor over its input's storage. They go through the registry
// like every op, so the tracer sees them (the compiler turns them into index arithmetic).
#include <algorithm>
#include <numeric>
#include <optional>

#include "core/registry.h"

namespace kiln {
namespace {

const TensorMeta& only_input(std::span<const TensorMeta> in, const char* op) {
  KILN_CHECK(in.size() == 1 && in[0].defined, "{}: expects one tensor", op);
  return in[0];
}

// Resolves one -1 in `shape` against numel; errors name `op`.
Shape infer_size(Shape shape, int64_t numel, const Shape& from, const char* op) {
  int64_t known = 1;
  std::optional<size_t> infer;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      KILN_CHECK(!infer, "{}: only one dimension can be -1 in {}", op, shape_str(shape));
      infer = i;
    } else {
      KILN_CHECK(shape[i] >= 0, "{}: invalid size {} in {}", op, shape[i], shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer) {
    KILN_CHECK(known != 0 && numel % known == 0, "{}: shape {} is invalid for input {} of {} elements",
               op, shape_str(shape), shape_str(from), numel);
    shape[*infer] = numel / known;
  }
  KILN_CHECK(numel_of(shape) == numel, "{}: shape {} is invalid for input {} of {} elements", op,
             shape_str(shape), shape_str(from), numel);
  return shape;
}

// Strides that let `new_shape` view memory laid out as (shape, strides), if any exist.
// Walks both shapes from the innermost dim, matching runs of dims that are contiguous
// with each other ("chunks") in the old layout.
std::optional<Shape> view_strides(const Shape& shape, const Shape& strides, const Shape& new_shape) {
  Shape out(new_shape.size());
  if (numel_of(shape) == 0 || shape.empty()) return contiguous_strides(new_shape);
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_stride = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    const bool chunk_ends = d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
      out[view_d] = view_numel * chunk_stride;
      view_numel *= new_shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (d > 0) {
      chunk_stride = strides[d - 1];
      tensor_numel = view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

// ---- view ----
std::vector<TensorMeta> infer_view(std::span<const TensorMeta> in, const Attrs& a) {
  TensorMeta m = only_input(in, "view");
  m.shape = infer_size(a.ints("shape"), numel_of(m.shape), m.shape, "view");
  m.wrapped_number = false;
  return {m};
}
Tensor do_view(const Tensor& x, const Attrs& a) {
  Shape shape = infer_size(a.ints("shape"), x.numel(), x.shape(), "view");
  auto strides = view_strides(x.shape(), x.strides(), shape);
  KILN_CHECK(strides,
             "view: shape {} cannot view {} with strides {} without a copy (the input is not "
             "contiguous enough); use reshape",
             shape_str(shape), x.meta_str(), shape_str(x.strides()));
  return make_view(x, shape, *strides, x.offset());
}
const OpDef& kView = define_op({.name = "view", .infer = infer_view, .kind = OpKind::view, .view = do_view});

// ---- as_strided ----
std::vector<TensorMeta> infer_as_strided(std::span<const TensorMeta> in, const Attrs& a) {
  TensorMeta m = only_input(in, "as_strided");
  const Shape& shape = a.ints("shape");
  const Shape& strides = a.ints("strides");
  KILN_CHECK(shape.size() == strides.size(), "as_strided: shape {} and strides {} differ in length",
             shape_str(shape), shape_str(strides));
  for (size_t i = 0; i < shape.size(); ++i)
    KILN_CHECK(shape[i] >= 0 && strides[i] >= 0, "as_strided: negative size or stride in {} / {}",
               shape_str(shape), shape_str(strides));
  m.shape = shape;
  m.wrapped_number = false;
  return {m};
}
Tensor do_as_strided(const Tensor& x, const Attrs& a) {
  const Shape& shape = a.ints("shape");
  const Shape& strides = a.ints("strides");
  const int64_t offset = a.i("offset");
  int64_t last = offset;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) { last = -1; break; }
    last += (shape[i] - 1) * strides[i];
  }
  const int64_t capacity = static_cast<int64_t>(x.storage()->nbytes / x.itemsize());
  KILN_CHECK(offset >= 0 && last < capacity,
             "as_strided: shape {} strides {} offset {} reaches element {} but the storage of {} "
             "holds {}",
             shape_str(shape), shape_str(strides), offset, last, x.meta_str(), capacity);
  return make_view(x, shape, strides, offset);
}
const OpDef& kAsStrided = define_op(
    {.name = "as_strided", .infer = infer_as_strided, .kind = OpKind::view, .view = do_as_strided});

// ---- permute ----
std::vector<int64_t> checked_perm(const Shape& shape, const std::vector<int64_t>& dims) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  KILN_CHECK(static_cast<int64_t>(dims.size()) == nd,
             "permute: {} dims given for a tensor of shape {}", dims.size(), shape_str(shape));
  std::vector<int64_t> perm(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    perm[i] = wrap_dim(dims[i], nd, "permute");
    KILN_CHECK(!seen[perm[i]], "permute: dim {} repeats in {} (shape {})", perm[i], shape_str(dims),
               shape_str(shape));
    seen[perm[i]] = true;
  }
  return perm;
}
std::vector<TensorMeta> infer_permute(std::span<const TensorMeta> in, const Attrs& a) {
  TensorMeta m = only_input(in, "permute");
  auto perm = checked_perm(m.shape, a.ints("dims"));
  Shape s(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) s[i] = m.shape[perm[i]];
  m.shape = s;
  m.wrapped_number = false;
  return {m};
}
Tensor do_permute(const Tensor& x, const Attrs& a) {
  auto perm = checked_perm(x.shape(), a.ints("dims"));
  Shape s(perm.size()), st(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    s[i] = x.shape()[perm[i]];
    st[i] = x.strides()[perm[i]];
  }
  return make_view(x, s, st, x.offset());
}
const OpDef& kPermute =
    define_op({.name = "permute", .infer = infer_permute, .kind = OpKind::view, .view = do_permute});

// ---- slice ----
struct SliceSpec {
  int64_t dim, start, length, step;
};
SliceSpec slice_spec(const Shape& shape, const Attrs& a) {
  KILN_CHECK(!shape.empty(), "slice: cannot slice a 0-d tensor");
  const int64_t dim = wrap_dim(a.i("dim"), static_cast<int64_t>(shape.size()), "slice");
  const int64_t size = shape[dim];
  int64_t start = a.i("start"), end = a.i("end");
  const int64_t step = a.i("step");
  KILN_CHECK(step > 0, "slice: step must be positive, got {} (shape {})", step, shape_str(shape));
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  return {dim, start, (end - start + step - 1) / step, step};
}
std::vector<TensorMeta> infer_slice(std::span<const TensorMeta> in, const Attrs& a) {
  TensorMeta m = only_input(in, "slice");
  SliceSpec s = slice_spec(m.shape, a);
  m.shape[s.dim] = s.length;
  m.wrapped_number = false;
  return {m};
}
Tensor do_slice(const Tensor& x, const Attrs& a) {
  SliceSpec s = slice_spec(x.shape(), a);
  Shape shape = x.shape(), strides = x.strides();
  shape[s.dim] = s.length;
  const int64_t offset = x.offset() + s.start * strides[s.dim];
  strides[s.dim] *= s.step;
  return make_view(x, shape, strides, offset);
}
const OpDef& kSlice =
    define_op({.name = "slice", .infer = infer_slice, .kind = OpKind::view, .view = do_slice});

// ---- select ----
std::pair<int64_t, int64_t> select_spec(const Shape& shape, const Attrs& a) {
  KILN_CHECK(!shape.empty(), "select: cannot select from a 0-d tensor");
  const int64_t dim = wrap_dim(a.i("dim"), static_cast<int64_t>(shape.size()), "select");
  int64_t index = a.i("index");
  KILN_CHECK(index >= -shape[dim] && index < shape[dim],
             "select: index {} is out of range for dim {} of size {} (shape {})", index, dim,
             shape[dim], shape_str(shape));
  if (index < 0) index += shape[dim];
  return {dim, index};
}
std::vector<TensorMeta> infer_select(std::span<const TensorMeta> in, const Attrs& a) {
  TensorMeta m = only_input(in, "select");
  auto [dim, index] = select_spec(m.shape, a);
  m.shape.erase(m.shape.begin() + dim);
  m.wrapped_number = false;
  return {m};
}
Tensor do_select(const Tensor& x, const Attrs& a) {
  auto [dim, index] = select_spec(x.shape(), a);
  Shape shape = x.shape(), strides = x.strides();
  const int64_t offset = x.offset() + index * strides[dim];
  shape.erase(shape.begin() + dim);
  strides.erase(strides.begin() + dim);
  return make_view(x, shape, strides, offset);
}
const OpDef& kSelect =
    define_op({.name = "select", .infer = infer_select, .kind = OpKind::view, .view = do_select});

// ---- expand ----
Shape expand_shape(const Shape& shape, const Shape& target) {
  KILN_CHECK(target.size() >= shape.size(),
             "expand: the target {} has fewer dims than the tensor's shape {}", shape_str(target),
             shape_str(shape));
  Shape out(target.size());
  const size_t lead = target.size() - shape.size();
  for (size_t i = 0; i < target.size(); ++i) {
    if (i < lead) {
      KILN_CHECK(target[i] >= 0, "expand: -1 is not allowed in a new leading dim ({} to {})",
                 shape_str(shape), shape_str(target));
      out[i] = target[i];
      continue;
    }
    const int64_t s = shape[i - lead];
    KILN_CHECK(target[i] >= -1, "expand: invalid size {} at dim {} ({} to {})", target[i], i,
               shape_str(shape), shape_str(target));
    const int64_t t = target[i] == -1 ? s : target[i];
    KILN_CHECK(s == t || s == 1,
               "expand: size {} at dim {} cannot expand to {} (shape {} to {})", s, i, t,
               shape_str(shape), shape_str(target));
    out[i] = t;
  }
  return out;
}
std::vector<TensorMeta> infer_expand(std::span<const TensorMeta> in, const Attrs& a) {
  TensorMeta m = only_input(in, "expand");
  m.shape = expand_shape(m.shape, a.ints("shape"));
  m.wrapped_number = false;
  return {m};
}
Tensor do_expand(const Tensor& x, const Attrs& a) {
  Shape shape = expand_shape(x.shape(), a.ints("shape"));
  Shape strides(shape.size(), 0);
  const size_t lead = shape.size() - x.shape().size();
  for (size_t i = lead; i < shape.size(); ++i)
    strides[i] = x.shape()[i - lead] == shape[i] ? x.strides()[i - lead] : 0;
  return make_view(x, shape, strides, x.offset());
}
const OpDef& kExpand =
    define_op({.name = "expand", .infer = infer_expand, .kind = OpKind::view, .view = do_expand});

// ---- squeeze / unsqueeze ----
std::vector<bool> squeeze_mask(const Shape& shape, const Attrs& a) {
  std::vector<bool> drop(shape.size(), false);
  if (!a.has("dims")) {
    for (size_t i = 0; i < shape.size(); ++i) drop[i] = shape[i] == 1;
  } else {
    for (int64_t d : a.ints("dims")) {
      const int64_t w = wrap_dim(d, static_cast<int64_t>(shape.size()), "squeeze");
      if (!shape.empty()) drop[w] = shape[w] == 1;
    }
  }
  return drop;
}
std::vector<TensorMeta> infer_squeeze(std::span<const TensorMeta> in, const Attrs& a) {
  TensorMeta m = only_input(in, "squeeze");
  auto drop = squeeze_mask(m.shape, a);
  Shape s;
  for (size_t i = 0; i < m.shape.size(); ++i)
    if (!drop[i]) s.push_back(m.shape[i]);
  m.shape = s;
  m.wrapped_number = false;
  return {m};
}
Tensor do_squeeze(const Tensor& x, const Attrs& a) {
  auto drop = squeeze_mask(x.shape(), a);
  Shape s, st;
  for (size_t i = 0; i < drop.size(); ++i) {
    if (drop[i]) continue;
    s.push_back(x.shape()[i]);
    st.push_back(x.strides()[i]);
  }
  return make_view(x, s, st, x.offset());
}
const OpDef& kSqueeze =
    define_op({.name = "squeeze", .infer = infer_squeeze, .kind = OpKind::view, .view = do_squeeze});

std::vector<TensorMeta> infer_unsqueeze(std::span<const TensorMeta> in, const Attrs& a) {
  TensorMeta m = only_input(in, "unsqueeze");
  const int64_t d = wrap_dim(a.i("dim"), static_cast<int64_t>(m.shape.size()) + 1, "unsqueeze");
  m.shape.insert(m.shape.begin() + d, 1);
  m.wrapped_number = false;
  return {m};
}
Tensor do_unsqueeze(const Tensor& x, const Attrs& a) {
  const int64_t d = wrap_dim(a.i("dim"), x.dim() + 1, "unsqueeze");
  Shape s = x.shape(), st = x.strides();
  const int64_t stride = d < x.dim() ? s[d] * st[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return make_view(x, s, st, x.offset());
}
const OpDef& kUnsqueeze = define_op(
    {.name = "unsqueeze", .infer = infer_unsqueeze, .kind = OpKind::view, .view = do_unsqueeze});

}  // namespace

// ---- Tensor's view methods ----

Tensor Tensor::view(Shape shape) const { return call_op1(kView, {*this}, {{"shape", shape}}); }

Tensor Tensor::reshape(Shape shape) const {
  Shape resolved = infer_size(shape, numel(), this->shape(), "reshape");
  if (view_strides(this->shape(), strides(), resolved)) return view(resolved);
  return contiguous().view(resolved);
}

Tensor Tensor::permute(std::vector<int64_t> dims) const {
  return call_op1(kPermute, {*this}, {{"dims", dims}});
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  const int64_t n = dim();
  std::vector<int64_t> perm(std::max<int64_t>(n, 0));
  std::iota(perm.begin(), perm.end(), 0);
  if (n == 0) {
    wrap_dim(d0, 0, "transpose");
    wrap_dim(d1, 0, "transpose");
    return permute({});
  }
  std::swap(perm[wrap_dim(d0, n, "transpose")], perm[wrap_dim(d1, n, "transpose")]);
  return permute(perm);
}

Tensor Tensor::t() const {
  KILN_CHECK(dim() <= 2, "t: expects a tensor of at most 2 dims, got {}", meta_str());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  return call_op1(kSlice, {*this},
                  {{"dim", dim}, {"start", start}, {"end", end}, {"step", step}});
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  const int64_t d = wrap_dim(dim, this->dim(), "narrow");
  const int64_t size = shape()[d];
  if (start < 0) start += size;
  KILN_CHECK(start >= 0 && length >= 0 && start + length <= size,
             "narrow: start {} and length {} exceed dim {} of size {} ({})", start, length, d, size,
             meta_str());
  return slice(d, start, start + length, 1);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  return call_op1(kSelect, {*this}, {{"dim", dim}, {"index", index}});
}

Tensor Tensor::expand(Shape shape) const { return call_op1(kExpand, {*this}, {{"shape", shape}}); }
Tensor Tensor::broadcast_to(Shape shape) const { return expand(std::move(shape)); }

Tensor Tensor::squeeze() const { return call_op1(kSqueeze, {*this}); }
Tensor Tensor::squeeze(int64_t dim) const {
  return call_op1(kSqueeze, {*this}, {{"dims", std::vector<int64_t>{dim}}});
}
Tensor Tensor::unsqueeze(int64_t dim) const {
  return call_op1(kUnsqueeze, {*this}, {{"dim", dim}});
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int64_t s = wrap_dim(start_dim, dim(), "flatten");
  const int64_t e = wrap_dim(end_dim, dim(), "flatten");
  KILN_CHECK(s <= e, "flatten: start_dim {} comes after end_dim {} ({})", s, e, meta_str());
  Shape shape(this->shape().begin(), this->shape().begin() + s);
  int64_t n = 1;
  for (int64_t i = s; i <= e; ++i) n *= this->shape()[i];
  shape.push_back(n);
  shape.insert(shape.end(), this->shape().begin() + e + 1, this->shape().end());
  return reshape(shape);
}

Tensor Tensor::unflatten(int64_t dim, Shape sizes) const {
  const int64_t d = wrap_dim(dim, this->dim(), "unflatten");
  Shape sz = infer_size(sizes, shape()[d], {shape()[d]}, "unflatten");
  Shape shape(this->shape().begin(), this->shape().begin() + d);
  shape.insert(shape.end(), sz.begin(), sz.end());
  shape.insert(shape.end(), this->shape().begin() + d + 1, this->shape().end());
  return view(shape);
}

Tensor Tensor::as_strided(Shape shape, Shape strides, int64_t offset) const {
  return call_op1(kAsStrided, {*this}, {{"shape", shape}, {"strides", strides}, {"offset", offset}});
}

}  // namespace kiln
