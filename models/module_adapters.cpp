#include "models/module_adapters.h"

#include "models/module.h"

namespace kiln::compiler {

TraceOptions module_names(const nn::Module& module) {
  TraceOptions options;
  for (const auto& [name, p] : module.named_parameters()) options.names[p.impl()] = name;
  for (const auto& [name, b] : module.named_buffers()) options.names[b.impl()] = name;
  return options;
}

}  // namespace kiln::compiler

namespace kiln::optim {

std::vector<ParamGroupSpec> param_groups_no_decay(const nn::Module& module, double weight_decay) {
  return param_groups_no_decay(module.parameters(), weight_decay);
}

}  // namespace kiln::optim
