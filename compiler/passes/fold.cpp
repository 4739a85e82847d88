// fold_constants (compiler/passes/passes.h).
#include "compiler/passes/passes.h"
#include "core/error.h"
#include "core/grad_mode.h"

namespace kiln::compiler {

namespace {

// The node's value computed now, by the kernel the program would have run.
Replacement fold_constant(Rewriter& rw, const Candidate& c) {
  if (c.def.random || c.op() == "empty" || c.def.mutates_inputs()) return std::nullopt;
  if (c.outputs.size() != 1 || !c.outputs[0].shape.empty() || !c.outputs[0].device.is_cpu())
    return std::nullopt;
  std::vector<Tensor> args;
  for (Value v : c.inputs) {
    if (!v.defined()) {
      args.emplace_back();
      continue;
    }
    if (!rw.is_constant(v) || !rw.type(v).device.is_cpu()) return std::nullopt;
    const TensorType& t = rw.type(v);
    Tensor arg = scalar_tensor(rw.producer(v).attrs.scalar("value"), t.dtype);
    arg.impl()->wrapped_number = t.wrapped_number;  // type promotion treats numbers weakly
    args.push_back(std::move(arg));
  }
  NoGradGuard no_grad;
  Scalar value;
  try {
    value = call_op(c.def, std::move(args), c.attrs).at(0).item();
  } catch (const Error&) {
    return std::nullopt;  // left for run time, which reports it where it happens
  }
  return Values{rw.add_constant(value, c.outputs[0])};
}

}  // namespace

const std::vector<Rule>& fold_rules() {
  static const std::vector<Rule> rules = {{"fold_constant", {}, fold_constant}};
  return rules;
}

Graph fold_constants(const Graph& graph, RewriteLog* log) {
  return rewrite(graph, fold_rules(), log);
}

}  // namespace kiln::compiler
