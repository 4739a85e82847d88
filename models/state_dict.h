#pragma once
// StateDict: named tensors, the currency of checkpoints and of a module's parameters and
// buffers ("encoder.0.weight" -> tensor).
#include <map>
#include <string>

#include "core/tensor.h"

namespace kiln {

// Ordered by name, so that iteration (and anything written from it) is deterministic.
using StateDict = std::map<std::string, Tensor>;

}  // namespace kiln
