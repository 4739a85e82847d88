// Indexing ops: their shape and dtype rules and public functions. Index values are data,
// so their range is checked by the kernels; the rules check shapes and dtypes.
#include "core/ops/indexing.h"

#include <algorithm>

#include "core/registry.h"

namespace kiln {
namespace {

void check_inputs(std::span<const TensorMeta> in, size_t n, const char* op) {
  KILN_CHECK(in.size() == n, "{}: expects {} tensors, got {}", op, n, in.size());
  for (const TensorMeta& m : in)
    KILN_CHECK(m.defined, "{}: an input is undefined ({})", op, metas_str(in));
}

int64_t ndim_of(const TensorMeta& m) { return static_cast<int64_t>(m.shape.size()); }
// Size of dim d, where a 0-d tensor counts as one element along dim 0.
int64_t size_at(const TensorMeta& m, int64_t d) { return m.shape.empty() ? 1 : m.shape[d]; }

void check_index_dtype(const TensorMeta& index, bool allow_i32, const char* op,
                       std::span<const TensorMeta> in) {
  const bool ok = index.dtype == DType::i64 || (allow_i32 && index.dtype == DType::i32);
  KILN_CHECK(ok, "{}: the index must be {}, got {} ({})", op, allow_i32 ? "i64 or i32" : "i64",
             index.dtype, metas_str(in));
}

// ---- gather / scatter_add ----
std::vector<TensorMeta> infer_gather(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 2, "gather");
  const TensorMeta &x = in[0], &index = in[1];
  check_index_dtype(index, false, "gather", in);
  const int64_t nd = std::max<int64_t>(ndim_of(x), 1);
  const int64_t dim = wrap_dim(a.i("dim"), ndim_of(x), "gather");
  KILN_CHECK(std::max<int64_t>(ndim_of(index), 1) == nd,
             "gather: the index must have as many dims as the input ({})", metas_str(in));
  for (int64_t d = 0; d < nd; ++d)
    KILN_CHECK(d == dim || size_at(index, d) <= size_at(x, d),
               "gather: the index's size {} at dim {} exceeds the input's size {} ({})",
               size_at(index, d), d, size_at(x, d), metas_str(in));
  return {TensorMeta{index.shape, x.dtype, common_device(in, "gather")}};
}
const OpDef& kGather = define_op({.name = "gather", .infer = infer_gather});

std::vector<TensorMeta> infer_scatter_add(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 3, "scatter_add");
  const TensorMeta &x = in[0], &index = in[1], &src = in[2];
  check_index_dtype(index, false, "scatter_add", in);
  KILN_CHECK(src.dtype == x.dtype, "scatter_add: src has dtype {} but the input has {} ({})",
             src.dtype, x.dtype, metas_str(in));
  const int64_t nd = std::max<int64_t>(ndim_of(x), 1);
  const int64_t dim = wrap_dim(a.i("dim"), ndim_of(x), "scatter_add");
  KILN_CHECK(std::max<int64_t>(ndim_of(index), 1) == nd && std::max<int64_t>(ndim_of(src), 1) == nd,
             "scatter_add: the input, index and src must have the same number of dims ({})",
             metas_str(in));
  for (int64_t d = 0; d < nd; ++d) {
    KILN_CHECK(size_at(index, d) <= size_at(src, d),
               "scatter_add: the index's size {} at dim {} exceeds src's size {} ({})",
               size_at(index, d), d, size_at(src, d), metas_str(in));
    KILN_CHECK(d == dim || size_at(index, d) <= size_at(x, d),
               "scatter_add: the index's size {} at dim {} exceeds the input's size {} ({})",
               size_at(index, d), d, size_at(x, d), metas_str(in));
  }
  return {TensorMeta{x.shape, x.dtype, common_device(in, "scatter_add")}};
}
// The input is read only at the element written (src is added to it there).
int scatter_add_accumulator(std::span<const TensorMeta>) { return 0; }
const OpDef& kScatterAdd =
    define_op({.name = "scatter_add", .infer = infer_scatter_add, .accumulator = scatter_add_accumulator,
               .cast_policy = CastPolicy::promote});

// ---- index_select / embedding ----
std::vector<TensorMeta> infer_index_select(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 2, "index_select");
  const TensorMeta &x = in[0], &index = in[1];
  check_index_dtype(index, true, "index_select", in);
  KILN_CHECK(index.shape.size() <= 1, "index_select: the index must be 1-d or 0-d ({})",
             metas_str(in));
  const int64_t dim = wrap_dim(a.i("dim"), ndim_of(x), "index_select");
  Shape out = x.shape;
  if (out.empty())
    KILN_CHECK(numel_of(index.shape) == 1, "index_select: a 0-d input needs exactly one index ({})",
               metas_str(in));
  else
    out[dim] = numel_of(index.shape);
  return {TensorMeta{out, x.dtype, common_device(in, "index_select")}};
}
const OpDef& kIndexSelect = define_op({.name = "index_select", .infer = infer_index_select});

void check_padding_idx(const Attrs& a, int64_t num_weights, const char* op,
                       std::span<const TensorMeta> in) {
  if (!a.has("padding_idx")) return;
  const int64_t p = a.i("padding_idx");
  KILN_CHECK(p >= 0 && p < num_weights, "{}: padding_idx {} is out of range for {} weights ({})",
             op, p, num_weights, metas_str(in));
}

std::vector<TensorMeta> infer_embedding(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 2, "embedding");
  const TensorMeta &weight = in[0], &indices = in[1];
  KILN_CHECK(weight.shape.size() == 2, "embedding: the weight must be 2-d ({})", metas_str(in));
  check_index_dtype(indices, true, "embedding", in);
  check_padding_idx(a, weight.shape[0], "embedding", in);
  Shape out = indices.shape;
  out.push_back(weight.shape[1]);
  return {TensorMeta{out, weight.dtype, common_device(in, "embedding")}};
}
const OpDef& kEmbedding = define_op({.name = "embedding", .infer = infer_embedding});

std::vector<TensorMeta> infer_embedding_backward(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 2, "embedding_backward");
  const TensorMeta &grad = in[0], &indices = in[1];
  check_index_dtype(indices, true, "embedding_backward", in);
  KILN_CHECK(is_floating(grad.dtype), "embedding_backward: grad must be floating ({})",
             metas_str(in));
  const bool shapes_fit =
      grad.shape.size() == indices.shape.size() + 1 &&
      std::equal(indices.shape.begin(), indices.shape.end(), grad.shape.begin());
  KILN_CHECK(shapes_fit, "embedding_backward: grad must have shape indices.shape + [dim] ({})",
             metas_str(in));
  const int64_t num_weights = a.i("num_weights");
  KILN_CHECK(num_weights >= 0, "embedding_backward: num_weights {} is negative ({})", num_weights,
             metas_str(in));
  check_padding_idx(a, num_weights, "embedding_backward", in);
  return {TensorMeta{
      {num_weights, grad.shape.back()}, grad.dtype, common_device(in, "embedding_backward")}};
}
const OpDef& kEmbeddingBackward =
    define_op({.name = "embedding_backward", .infer = infer_embedding_backward});

// ---- one_hot ----
std::vector<TensorMeta> infer_one_hot(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 1, "one_hot");
  check_index_dtype(in[0], false, "one_hot", in);
  const int64_t classes = a.i("num_classes");
  KILN_CHECK(classes >= 0, "one_hot: num_classes {} is negative ({})", classes, metas_str(in));
  Shape out = in[0].shape;
  out.push_back(classes);
  return {TensorMeta{out, DType::i64, in[0].device}};
}
const OpDef& kOneHot = define_op({.name = "one_hot", .infer = infer_one_hot});

// ---- flip / tril / triu ----
std::vector<TensorMeta> infer_flip(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 1, "flip");
  const int64_t nd = ndim_of(in[0]);
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(nd, 1)), false);
  for (int64_t d : a.ints("dims")) {
    const int64_t w = wrap_dim(d, nd, "flip");
    KILN_CHECK(!seen[w], "flip: dim {} appears twice in dims {} ({})", w, shape_str(a.ints("dims")),
               metas_str(in));
    seen[w] = true;
  }
  return {TensorMeta{in[0].shape, in[0].dtype, in[0].device}};
}
const OpDef& kFlip = define_op({.name = "flip", .infer = infer_flip});

template <const char* op>
std::vector<TensorMeta> infer_triangle(std::span<const TensorMeta> in, const Attrs&) {
  check_inputs(in, 1, op);
  KILN_CHECK(in[0].shape.size() >= 2, "{}: the input must have at least 2 dims ({})", op,
             metas_str(in));
  return {TensorMeta{in[0].shape, in[0].dtype, in[0].device}};
}
constexpr char kTrilName[] = "tril";
constexpr char kTriuName[] = "triu";
const OpDef& kTril = define_op({.name = "tril", .infer = infer_triangle<kTrilName>});
const OpDef& kTriu = define_op({.name = "triu", .infer = infer_triangle<kTriuName>});

// ---- cumsum ----
std::vector<TensorMeta> infer_cumsum(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 1, "cumsum");
  wrap_dim(a.i("dim"), ndim_of(in[0]), "cumsum");
  const DType t = a.has("dtype")                   ? a.dtype("dtype")
                  : is_integral(in[0].dtype, true) ? DType::i64
                                                   : in[0].dtype;
  return {TensorMeta{in[0].shape, t, in[0].device}};
}
const OpDef& kCumsum = define_op({.name = "cumsum", .infer = infer_cumsum, .cast_policy = CastPolicy::f32});

// ---- topk / sort ----
std::vector<TensorMeta> infer_topk(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 1, "topk");
  const TensorMeta& x = in[0];
  const int64_t dim = wrap_dim(a.i("dim"), ndim_of(x), "topk");
  const int64_t k = a.i("k");
  KILN_CHECK(k >= 0 && k <= size_at(x, dim),
             "topk: k {} is out of range for dim {} of size {} ({})", k, dim, size_at(x, dim),
             metas_str(in));
  Shape out = x.shape;
  if (!out.empty()) out[dim] = k;
  return {TensorMeta{out, x.dtype, x.device}, TensorMeta{out, DType::i64, x.device}};
}
const OpDef& kTopk = define_op({.name = "topk", .infer = infer_topk});

std::vector<TensorMeta> infer_sort(std::span<const TensorMeta> in, const Attrs& a) {
  check_inputs(in, 1, "sort");
  const TensorMeta& x = in[0];
  wrap_dim(a.i("dim"), ndim_of(x), "sort");
  return {TensorMeta{x.shape, x.dtype, x.device}, TensorMeta{x.shape, DType::i64, x.device}};
}
const OpDef& kSort = define_op({.name = "sort", .infer = infer_sort});

// padding_idx normalised to [0, num_weights) as an attribute, or no attribute.
Attrs padding_attrs(std::optional<int64_t> padding_idx, int64_t num_weights, const char* op) {
  Attrs a;
  if (!padding_idx) return a;
  int64_t p = *padding_idx;
  KILN_CHECK(p >= -num_weights && p < num_weights,
             "{}: padding_idx {} is out of range for {} weights", op, p, num_weights);
  if (p < 0) p += num_weights;
  a.set("padding_idx", p);
  return a;
}

}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  return call_op1(kGather, {x, index}, {{"dim", dim}});
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  return call_op1(kScatterAdd, {x, index, src}, {{"dim", dim}});
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  return call_op1(kIndexSelect, {x, index}, {{"dim", dim}});
}

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx) {
  KILN_CHECK(weight.defined() && weight.dim() == 2, "embedding: the weight must be 2-d, got {}",
             weight.meta_str());
  return call_op1(kEmbedding, {weight, indices},
                  padding_attrs(padding_idx, weight.size(0), "embedding"));
}

Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_weights,
                          std::optional<int64_t> padding_idx) {
  Attrs a = padding_attrs(padding_idx, num_weights, "embedding_backward");
  a.set("num_weights", num_weights);
  return call_op1(kEmbeddingBackward, {grad, indices}, a);
}

Tensor one_hot(const Tensor& indices, int64_t num_classes) {
  KILN_CHECK(indices.defined(), "one_hot: the indices are undefined");
  KILN_CHECK(num_classes >= -1, "one_hot: num_classes must be -1 or non-negative, got {}",
             num_classes);
  if (num_classes == -1) {
    // The output's shape depends on the data: read the largest index here.
    KILN_CHECK(indices.numel() > 0,
               "one_hot: cannot infer the number of classes from an empty tensor ({})",
               indices.meta_str());
    KILN_CHECK(indices.dtype() == DType::i64, "one_hot: the index must be i64, got {}",
               indices.meta_str());
    const Tensor host = indices.to(Device::cpu()).contiguous();
    const int64_t* p = host.data_ptr<int64_t>();
    num_classes = *std::max_element(p, p + host.numel()) + 1;
  }
  return call_op1(kOneHot, {indices}, {{"num_classes", num_classes}});
}

Tensor flip(const Tensor& x, const std::vector<int64_t>& dims) {
  return call_op1(kFlip, {x}, {{"dims", dims}});
}

Tensor tril(const Tensor& x, int64_t diagonal) {
  return call_op1(kTril, {x}, {{"diagonal", diagonal}});
}
Tensor triu(const Tensor& x, int64_t diagonal) {
  return call_op1(kTriu, {x}, {{"diagonal", diagonal}});
}

Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  Attrs a{{"dim", dim}};
  if (dtype) a.set("dtype", *dtype);
  return call_op1(kCumsum, {x}, a);
}

std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  auto out =
      call_op(kTopk, {x}, {{"k", k}, {"dim", dim}, {"largest", largest}, {"sorted", sorted}});
  return {out[0], out[1]};
}

std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t dim, bool descending, bool stable) {
  auto out = call_op(kSort, {x}, {{"dim", dim}, {"descending", descending}, {"stable", stable}});
  return {out[0], out[1]};
}

}  // namespace kiln
