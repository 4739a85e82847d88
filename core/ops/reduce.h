#pragma once
// Reductions, with PyTorch's semantics: a dim list names the dims to reduce (an empty list
// reduces every dim, negative dims count from the end, a dim listed twice is an error), and
// keepdim keeps each reduced dim with size 1. Integer and bool inputs of sum and prod give
// i64. Empty reductions give the op's identity (sum 0, prod 1, mean NaN); ops without one
// (max, min, amax, amin, argmax, argmin, the inf norms) reject them.
#include <optional>
#include <vector>

#include "core/tensor.h"

namespace kiln {

using DimList = std::vector<int64_t>;

// Sum over `dims`. A given `dtype` is the dtype the input is converted to and the result's.
Tensor sum(const Tensor& x, const DimList& dims = {}, bool keepdim = false,
           std::optional<DType> dtype = std::nullopt);
// Mean over `dims`: of a floating input, or of any input with a floating `dtype`.
Tensor mean(const Tensor& x, const DimList& dims = {}, bool keepdim = false,
            std::optional<DType> dtype = std::nullopt);
// Product over `dims`; dtype as for sum.
Tensor prod(const Tensor& x, const DimList& dims = {}, bool keepdim = false,
            std::optional<DType> dtype = std::nullopt);

// The largest (smallest) element along a dim, and its i64 position there: the first on
// ties, the first NaN when there is one.
struct ValuesIndices {
  Tensor values;
  Tensor indices;
};

// The largest element of a non-empty tensor, as a 0-d tensor (NaN when any element is NaN).
Tensor max(const Tensor& x);
// The smallest element of a non-empty tensor, as a 0-d tensor (NaN when any element is NaN).
Tensor min(const Tensor& x);
// Largest values along `dim` and where they are.
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
// Smallest values along `dim` and where they are.
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false);
// Largest values over `dims` (NaN-propagating), in x's dtype.
Tensor amax(const Tensor& x, const DimList& dims = {}, bool keepdim = false);
// Smallest values over `dims` (NaN-propagating), in x's dtype.
Tensor amin(const Tensor& x, const DimList& dims = {}, bool keepdim = false);
// i64 position of the largest value along `dim`, or in the flattened tensor without one.
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
// i64 position of the smallest value along `dim`, or in the flattened tensor without one.
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);

// Variance over `dims` of a floating tensor: sum((x - mean)^2) / max(0, n - correction).
Tensor var(const Tensor& x, const DimList& dims = {}, double correction = 1, bool keepdim = false);
// Standard deviation: sqrt(var(x, dims, correction, keepdim)).
Tensor std(const Tensor& x, const DimList& dims = {}, double correction = 1, bool keepdim = false);
// kiln::std under a name that works unqualified: with `using namespace kiln`, `std(x)` is
// ambiguous (it also names namespace std), so call `std_dev(x)` or `kiln::std(x)`.
Tensor std_dev(const Tensor& x, const DimList& dims = {}, double correction = 1,
               bool keepdim = false);
// log(sum(exp(x))) over `dims`, computed after subtracting the max; integer inputs give f32.
Tensor logsumexp(const Tensor& x, const DimList& dims = {}, bool keepdim = false);
// Whether every element over `dims` is nonzero; bool result for any input dtype.
Tensor all(const Tensor& x, const DimList& dims = {}, bool keepdim = false);
// Whether some element over `dims` is nonzero; bool result for any input dtype.
Tensor any(const Tensor& x, const DimList& dims = {}, bool keepdim = false);
// The vector p-norm over `dims` of a floating tensor: p = 2, 1, 0 (count of nonzeros),
// +-infinity (max or min of |x|) or any other p (sum(|x|^p)^(1/p)).
Tensor norm(const Tensor& x, double p = 2, const DimList& dims = {}, bool keepdim = false);

// Which dims of `shape` the dim list reduces (all of them for an empty list); errors name
// `op` and show the shape. A 0-d tensor accepts dims 0 and -1 and has nothing to reduce.
std::vector<bool> reduced_dims(const Shape& shape, const DimList& dims, const char* op);
// The result shape of reducing `reduced` dims of `shape`.
Shape reduced_shape(const Shape& shape, const std::vector<bool>& reduced, bool keepdim);

}  // namespace kiln
