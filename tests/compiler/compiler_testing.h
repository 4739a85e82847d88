#pragma once
// Helpers shared by the compiler's tests.
#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "compiler/compile.h"
#include "compiler/ir/graph.h"
#include "compiler/passes/passes.h"
#include "compiler/trace.h"
#include "core/grad_mode.h"
#include "core/generator.h"
#include "core/ops/factory.h"
#include "core/ops/loss.h"
#include "core/ops/optim_ops.h"
#include "models/module.h"
#include "models/resnet.h"
#include "optim/sgd.h"
#include "testing.h"

namespace kiln::testing {

// Points the kernel cache at a fresh directory for one test (and turns the disk cache on)
// and removes the directory afterwards.
struct TempCache {
  std::filesystem::path dir;
  TempCache() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-test-cache-XXXXXX").string();
    dir = mkdtemp(tmpl.data());
    setenv("KILN_CACHE_DIR", dir.c_str(), 1);
    unsetenv("KILN_CACHE");
  }
  ~TempCache() {
    unsetenv("KILN_CACHE_DIR");
    unsetenv("KILN_CACHE");
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  TempCache(const TempCache&) = delete;
  TempCache& operator=(const TempCache&) = delete;
};

// Building graphs by hand: a wrapped-number constant, a one-output op, and the group of
// every op node that is not a view (what lower_pointwise takes).
inline compiler::Value number(compiler::Graph& g, double v) {
  return g.add_constant(Scalar(v), compiler::TensorType{.dtype = DType::f64, .shape = {}, .wrapped_number = true});
}

inline compiler::Value op(compiler::Graph& g, std::string_view name, std::vector<compiler::Value> in,
                          Attrs attrs = {}) {
  return g.add_op1(name, std::move(in), std::move(attrs));
}

// What ended each piece of a compiled function's last split run ("item", "return", ...).
inline std::vector<std::string> split_piece_ends(const compiler::CompiledFunction& f) {
  std::vector<std::string> ends;
  for (const compiler::SplitPiece& p : f.last_split()) ends.push_back(p.end);
  return ends;
}

// How many op nodes of `op` the graph has.
inline int64_t count_ops(const compiler::Graph& g, std::string_view op) {
  int64_t n = 0;
  for (const compiler::Node& node : g.nodes()) n += node.kind == compiler::NodeKind::op && node.op == op;
  return n;
}

// Makes `to`'s parameters equal to `from`'s (two models of one architecture).
inline void copy_parameters(const nn::Module& from, nn::Module& to) {
  NoGradGuard no_grad;
  const auto source = from.named_parameters(), target = to.named_parameters();
  for (size_t i = 0; i < source.size(); ++i) {
    Tensor t = target[i].second;
    t.copy_(source[i].second);
  }
}

// The graph compile runs for one training step of `model` (forward, cross entropy against
// class indices y, backward) on batch x: traced, then the default compile passes (batch norm
// split as `split` says: the CUDA target's schedule with `always`).
inline compiler::Graph training_step_graph(nn::Module& model, const Tensor& x, const Tensor& y,
                                           compiler::BatchNormSplit split = compiler::BatchNormSplit::cuda) {
  auto step = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    Tensor loss = cross_entropy(model(a[0]), a[1]);
    loss.backward();
    return {loss};
  };
  const compiler::Trace t = compiler::trace(step, {x, y}, compiler::module_names(model));
  return compiler::run_pipeline(t.graph, compiler::default_compile_passes(compiler::LayoutPolicy::automatic, split));
}

// The compiled ResNet-50 training step the CUDA checks use, as `kiln-ir resnet50 --train
// --batch 2 --image-size 32` shows it (10 classes, seed 0): the CUDA target's schedule, batch
// norm split into its statistics ops and fused pointwise kernels.
inline compiler::Graph resnet50_step_graph() {
  manual_seed(0);
  models::ResNet model = models::resnet50({.num_classes = 10, .zero_init_residual = true});
  model.train(true);
  const Tensor x = randn({2, 3, 32, 32});
  const Tensor y = randint(0, 10, {2});
  return training_step_graph(model, x, y, compiler::BatchNormSplit::always);
}

inline std::vector<int32_t> compute_nodes(const compiler::Graph& g) {
  std::vector<int32_t> nodes;
  for (size_t n = 0; n < g.nodes().size(); ++n)
    if (g.nodes()[n].kind == compiler::NodeKind::op && g.nodes()[n].def->kind == OpKind::compute)
      nodes.push_back(static_cast<int32_t>(n));
  return nodes;
}

// The SGD hyperparameter and flag combinations the update tests cover: plain, weight
// decay with maximize, a first momentum step, dampening, nesterov, all at once.
struct SgdVariant {
  double momentum, dampening, weight_decay;
  SGDFlags flags;
};
inline std::vector<SgdVariant> sgd_variants() {
  return {{0, 0, 0, {}},          {0, 0, 0.1, {false, true, false}},   {0.9, 0, 0, {false, false, true}},
          {0.9, 0.2, 0.01, {}},   {0.8, 0, 0.05, {true, false, false}}, {0.9, 0.1, 0.01, {false, true, false}}};
}
inline std::string sgd_variant_text(const SgdVariant& v) {
  return "momentum " + std::to_string(v.momentum) + " dampening " + std::to_string(v.dampening) +
         " weight_decay " + std::to_string(v.weight_decay) + " nesterov " + std::to_string(v.flags.nesterov) +
         " maximize " + std::to_string(v.flags.maximize) + " first " + std::to_string(v.flags.first);
}

// Runs `outputs_of(model, args)` (the loss first, then anything else the step returns) +
// backward + SGD as a compiled step on one model and eagerly on another built the same way,
// three times, and checks with `same(got, want)` every output and every parameter after each
// step. `options` are kiln::compile's (fullgraph and the parameter names are set here).
// Returns the compiled function for further checks.
template <class Model>
compiler::CompiledFunction compare_steps(
    const std::function<Model()>& make,
    const std::function<std::vector<Tensor>(Model&, const std::vector<Tensor>&)>& outputs_of,
    const std::vector<Tensor>& args, compiler::CompileOptions options,
    const std::function<bool(const Tensor& got, const Tensor& want)>& same) {
  auto model = std::make_shared<Model>(make());
  auto reference = std::make_shared<Model>(make());
  optim::SGD sgd(model->parameters(), {.lr = 0.1}),
      reference_sgd(reference->parameters(), {.lr = 0.1});
  auto step_of = [&](std::shared_ptr<Model> m, optim::SGD& opt) -> compiler::TracedFunction {
    return [m, &opt, outputs_of](const std::vector<Tensor>& a) -> std::vector<Tensor> {
      std::vector<Tensor> out = outputs_of(*m, a);
      out.at(0).backward();
      opt.step();
      for (Tensor& t : out) t = t.detach();
      return out;
    };
  };
  options.fullgraph = true;
  options.trace = compiler::module_names(*model);
  compiler::CompiledFunction compiled = compiler::compile(step_of(model, sgd), options);
  const compiler::TracedFunction eager = step_of(reference, reference_sgd);
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    manual_seed(40 + static_cast<uint64_t>(call));
    const std::vector<Tensor> got = compiled(args);
    model->zero_grad();
    manual_seed(40 + static_cast<uint64_t>(call));
    const std::vector<Tensor> want = eager(args);
    reference->zero_grad();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("output " << i << ": " << got[i].str() << " eager " << want[i].str());
      CHECK(same(got[i], want[i]));
    }
    const auto ref_params = reference->named_parameters();
    size_t i = 0;
    for (const auto& [name, p] : model->named_parameters()) {
      INFO(name);
      CHECK(same(p.detach(), ref_params.at(i++).second.detach()));
    }
  }
  CHECK(compiled.recompiles() == 0);
  CHECK(compiled.graph_breaks() == 0);
  return compiled;
}

// compare_steps of `loss_of(model, args)`, bit for bit.
template <class Model>
compiler::CompiledFunction check_step(const std::function<Model()>& make,
                            const std::function<Tensor(Model&, const std::vector<Tensor>&)>& loss_of,
                            const std::vector<Tensor>& args, compiler::CompileOptions options = {}) {
  const std::function<std::vector<Tensor>(Model&, const std::vector<Tensor>&)> outputs_of =
      [loss_of](Model& m, const std::vector<Tensor>& a) { return std::vector<Tensor>{loss_of(m, a)}; };
  return compare_steps<Model>(make, outputs_of, args, std::move(options), same_bits);
}

}  // namespace kiln::testing
