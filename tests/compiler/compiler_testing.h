#pragma once
// Helpers shared by the compiler's tests.
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "compiler/compile.h"
#include "compiler/ir/graph.h"
#include "core/grad_mode.h"
#include "core/ops/optim_ops.h"
#include "models/module.h"

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

}  // namespace kiln::testing
