#pragma once
// What the layers below models/ use of a module, declared here so that they need not
// include models/ (a layer includes only the layers below it): the compiler's names for
// its parameters and buffers, the optimizer's parameter groups. models/module.h includes
// this header, so every model header brings these.
#include <vector>

#include "compiler/trace.h"
#include "optim/optimizer.h"

namespace kiln::nn {
class Module;
}

namespace kiln::compiler {
// TraceOptions naming a module's parameters and buffers by their dotted names
// ("layer1.0.conv1.weight"), for graphs, dumps and messages.
TraceOptions module_names(const nn::Module& module);
}  // namespace kiln::compiler

namespace kiln::optim {
// param_groups_no_decay over the module's parameters.
std::vector<ParamGroupSpec> param_groups_no_decay(const nn::Module& module, double weight_decay);
}  // namespace kiln::optim

namespace kiln {
using compiler::module_names;
}  // namespace kiln
