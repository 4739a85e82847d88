#pragma once
// Indexing ops: gathering and scattering by index tensors, embeddings, one-hot, flips,
// triangles, cumulative sums, sorting and top-k. Index tensors are i64; index_select and
// embedding also take i32, as in PyTorch. Indices are never negative here (PyTorch's rule for
// these ops) and an index out of range is an error that names the op, the index and the size.
#include <optional>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (and likewise for other dims); out has
// index's shape. index has x's number of dims and is no larger than x outside `dim`.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// A copy of x with src added at the positions index names along `dim`:
// out[index[i][j]][j] += src[i][j] for dim 0. Repeated indices accumulate.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// The slices of x along `dim` picked by a 1-d (or 0-d) index, in index order.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// Rows of the [num_weights, dim] `weight` picked by `indices`: shape indices.shape + [dim].
// padding_idx (negative counts from the end) only affects the gradient.
Tensor embedding(const Tensor& weight, const Tensor& indices,
                 std::optional<int64_t> padding_idx = std::nullopt);
// The dense gradient of embedding: a [num_weights, dim] tensor where row r sums the rows of
// grad whose index is r; the padding_idx row stays zero.
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_weights,
                          std::optional<int64_t> padding_idx = std::nullopt);
// i64 one-hot encoding, shape indices.shape + [num_classes]; -1 infers max(indices) + 1.
Tensor one_hot(const Tensor& indices, int64_t num_classes = -1);
// x with the order of elements reversed along each of `dims`.
Tensor flip(const Tensor& x, const std::vector<int64_t>& dims);
// The lower (tril) or upper (triu) triangle of the last two dims, the rest zero: tril keeps
// column j of row i when j - i <= diagonal, triu when j - i >= diagonal.
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);
// Running sums along `dim`, in `dtype` when given; integer and bool inputs give i64.
Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);
// The k largest (or smallest) values along `dim` and their i64 positions, in order (NaN
// counts as the largest value; ties keep the lower position first). Results are always
// sorted; `sorted = false` is accepted for PyTorch's signature.
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                               bool sorted = true);
// Values sorted along `dim` and the i64 positions they came from. The sort is always stable
// (equal values keep their order); NaN sorts as the largest value.
std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false,
                               bool stable = false);

}  // namespace kiln
