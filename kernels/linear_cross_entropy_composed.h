#pragma once
// linear_cross_entropy and its backward op (core/ops/linear_cross_entropy.h) composed of
// eager ops, on any device: CUDA's kernels (kernels/cuda/linear_cross_entropy.cpp). The CPU
// has kernels of its own (kernels/cpu/linear_cross_entropy.cpp); the tests check the two
// against each other on the CPU.
#include <cstdint>
#include <span>
#include <vector>

#include "core/registry.h"
#include "core/tensor.h"

namespace kiln {

// The rows whose target counts, in order, from a contiguous CPU i64 target; a target outside
// [0, classes) that is not ignore_index is an error naming `op` and the input.
std::vector<int64_t> counted_rows(const Tensor& target, int64_t classes, int64_t ignore_index, const char* op,
                                  const Tensor& input);

// The op's inputs and outputs, as the registry passes them.
void linear_cross_entropy_composed(std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& attrs);
void linear_cross_entropy_backward_composed(std::span<const Tensor> in, std::span<const Tensor> out,
                                            const Attrs& attrs);

}  // namespace kiln
