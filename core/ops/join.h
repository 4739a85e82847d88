#pragma once
// Joining and splitting tensors: cat, stack, split, chunk and constant padding. cat and
// stack copy into a new tensor; split and chunk return views of their input.
#include <vector>

#include "core/tensor.h"

namespace kiln {

// Concatenates along `dim`; dtypes promote as in torch.cat. 1-d empty tensors are skipped
// (PyTorch's legacy rule); the others must agree in every size but `dim`.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Stacks equally shaped tensors along a new dim `dim` (in [-ndim-1, ndim]).
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Views of consecutive pieces of `split_size` along `dim` (the last may be smaller).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
// Views of consecutive pieces with the given sizes, which must add up to x.size(dim).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& split_sizes,
                          int64_t dim = 0);
// `chunks` views of ceil(size / chunks) along `dim` (fewer when they run out, as torch.chunk).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
// Constant padding. `pads` holds (before, after) pairs from the last dim backwards:
// {left, right, top, bottom, ...}; negative pads crop.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, Scalar value = 0);

}  // namespace kiln
