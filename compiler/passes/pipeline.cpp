// run_pipeline and its timing table (compiler/passes/passes.h).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "compiler/passes/passes.h"
#include "core/error.h"

namespace kiln::compiler {

Graph run_pipeline(const Graph& graph, const std::vector<NamedPass>& passes, std::vector<PassRecord>* records,
                   bool keep_graphs) {
  Graph current = graph;
  for (const NamedPass& pass : passes) {
    PassRecord record{.name = pass.name, .nodes_before = static_cast<int64_t>(current.nodes().size())};
    const auto start = std::chrono::steady_clock::now();
    Graph next = pass.run(current, records ? &record.rewrites : nullptr);
    record.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    // Verifying is cheap next to any pass, and a broken graph is best caught where it broke.
    try {
      verify(next);
    } catch (const Error& e) {
      fail("pass {} left an invalid graph: {}", pass.name, e.what());
    }
    record.nodes_after = static_cast<int64_t>(next.nodes().size());
    if (records) {
      if (keep_graphs) record.graph_after = print(next);
      records->push_back(std::move(record));
    }
    current = std::move(next);
  }
  return current;
}

std::vector<NamedPass> default_simplify_passes() {
  return {{"fold_constants", fold_constants}, {"simplify", simplify}, {"dead_code", dead_code}};
}

std::vector<NamedPass> default_compile_passes(LayoutPolicy layout, BatchNormSplit batch_norm,
                                              bool linear_cross_entropy, GemmActivations gemm_activation,
                                              bool linear_cross_entropy_cuda) {
  std::vector<NamedPass> passes{{"fold_constants", fold_constants}, {"simplify", simplify}};
  if (linear_cross_entropy)
    passes.push_back({"fuse_linear_cross_entropy", [linear_cross_entropy_cuda](const Graph& g, RewriteLog* log) {
                        return fuse_linear_cross_entropy(g, linear_cross_entropy_cuda, log);
                      }});
  for (NamedPass& pass : std::vector<NamedPass>{
           {"decompose", decompose},
          {"gemm_epilogues", gemm_epilogues},
          {"gemm_activations",
           [gemm_activation](const Graph& g, RewriteLog* log) { return gemm_activations(g, gemm_activation, log); }},
          {"layout", [layout](const Graph& g, RewriteLog* log) { return choose_layout(g, layout, log); }},
          {"split_batch_norm",
           [batch_norm](const Graph& g, RewriteLog* log) { return split_batch_norm(g, batch_norm, log); }},
          {"dead_code", dead_code}})
    passes.push_back(std::move(pass));
  return passes;
}

std::string timing_table(const std::vector<PassRecord>& records) {
  size_t name_width = 5;  // "total"
  for (const PassRecord& r : records) name_width = std::max(name_width, r.name.size());
  std::string out = fmt::format("{:<{}}  {:>9}  {:>15}  {:>8}\n", "pass", name_width, "ms", "nodes", "rewrites");
  double total_ms = 0;
  size_t total_rewrites = 0;
  for (const PassRecord& r : records) {
    out += fmt::format("{:<{}}  {:>9.3f}  {:>15}  {:>8}\n", r.name, name_width, r.ms,
                       fmt::format("{} -> {}", r.nodes_before, r.nodes_after), r.rewrites.size());
    total_ms += r.ms;
    total_rewrites += r.rewrites.size();
  }
  if (!records.empty())
    out += fmt::format("{:<{}}  {:>9.3f}  {:>15}  {:>8}\n", "total", name_width, total_ms,
                       fmt::format("{} -> {}", records.front().nodes_before, records.back().nodes_after),
                       total_rewrites);
  return out;
}

}  // namespace kiln::compiler
