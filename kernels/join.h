#pragma once
// cat, stack and pad as copies into views of the output (copy_ and fill_ calls), so one
// kernel serves every device: kernels/cpu/join.cpp defines them and registers them for the
// CPU, kernels/cuda/join.cpp for CUDA (where copy_ and fill_ are generated kernels, so the
// values are the CPU's exactly).
#include <span>

#include "core/registry.h"

namespace kiln::join {

void cat(std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& a);
void stack(std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& a);
// Constant padding: negative pads crop the input, positive ones shift where it lands.
void pad(std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& a);

}  // namespace kiln::join
