// The graph passes (compiler/passes/passes.h): each hand-written NAME.in.ir in
// tests/compiler/passes/ goes through the pass its name starts with (then dead_code, which
// drops what the rewrites bypassed) and must print as NAME.out.ir does, stay valid, and
// compute what it computed before.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "compiler/passes/passes.h"
#include "compiler/trace.h"
#include "compiler_testing.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using kiln::testing::count_ops;
using Catch::Matchers::Contains;

namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream file(path);
  REQUIRE(file.good());
  std::stringstream s;
  s << file.rdbuf();
  return s.str();
}

struct PassCase {
  std::string name;  // file stem without ".in"
  std::filesystem::path in, out;
};

std::vector<PassCase> pass_cases() {
  std::vector<PassCase> cases;
  const std::string suffix = ".in.ir";
  for (const auto& entry : std::filesystem::directory_iterator(KILN_TEST_PASSES_DIR)) {
    const std::string file = entry.path().filename().string();
    if (file.size() <= suffix.size() || file.compare(file.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string name = file.substr(0, file.size() - suffix.size());
    cases.push_back({name, entry.path(), entry.path().parent_path() / (name + ".out.ir")});
  }
  std::sort(cases.begin(), cases.end(), [](const PassCase& a, const PassCase& b) { return a.name < b.name; });
  return cases;
}

// The pass a test file names with its prefix.
NamedPass pass_for(const std::string& case_name) {
  for (const NamedPass& pass : {NamedPass{"dead_code", dead_code}, NamedPass{"fold_constants", fold_constants},
                                NamedPass{"simplify", simplify}, NamedPass{"channels_last", channels_last},
                                NamedPass{"gemm_epilogues", gemm_epilogues}})
    if (case_name.rfind(pass.name + "_", 0) == 0) return pass;
  FAIL("test graph " << case_name << " names no pass");
  return {};
}

// A random tensor of an input's type.
Tensor random_of(const TensorType& type, Generator& gen) {
  if (is_floating(type.dtype)) return randn(type.shape, {.dtype = type.dtype}, &gen);
  if (type.dtype == DType::boolean) return randint(0, 2, type.shape, {}, &gen).to(DType::boolean);
  return randint(0, 10, type.shape, {}, &gen).to(type.dtype);
}

// Runs both graphs on the same random inputs: the outputs and the inputs written back agree.
void check_same_values(const Graph& before, const Graph& after, double rtol, double atol) {
  REQUIRE(before.inputs().size() == after.inputs().size());
  Generator gen(7);
  std::vector<Tensor> inputs;
  for (Value v : before.inputs()) inputs.push_back(random_of(before.type(v), gen));
  std::vector<Tensor> inputs_before, inputs_after;
  for (const Tensor& t : inputs) {
    inputs_before.push_back(t.clone());
    inputs_after.push_back(t.clone());
  }
  const std::vector<Tensor> expected = interpret(before, inputs_before);
  const std::vector<Tensor> actual = interpret(after, inputs_after);
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    CHECK(actual[i].dtype() == expected[i].dtype());
    KILN_CHECK_CLOSE(actual[i], expected[i], rtol, atol);
  }
  for (size_t i = 0; i < inputs.size(); ++i) KILN_CHECK_CLOSE(inputs_after[i], inputs_before[i], rtol, atol);
}

bool logged(const RewriteLog& log, const std::string& rule) {
  return std::any_of(log.begin(), log.end(), [&](const std::string& line) { return line.rfind(rule + ":", 0) == 0; });
}

}  // namespace

TEST_CASE("passes: every test graph rewrites to its expected graph and keeps its values", "[passes]") {
  const std::vector<PassCase> cases = pass_cases();
  REQUIRE(cases.size() >= 10);
  RewriteLog all_rewrites;
  for (const PassCase& c : cases) {
    INFO("test graph " << c.name);
    const Graph original = parse(read_text(c.in));
    verify(original);
    const NamedPass pass = pass_for(c.name);
    RewriteLog log;
    const Graph rewritten = pass.run(original, &log);
    verify(rewritten);
    const Graph result = dead_code(rewritten);
    INFO("rewrites:\n" << [&] {
      std::string s;
      for (const std::string& line : log) s += line + "\n";
      return s;
    }());
    verify(result);
    const Graph expected = parse(read_text(c.out));
    CHECK(print(result, false) == print(expected, false));
    CHECK(result.structural_hash() == expected.structural_hash());
    CHECK(log.empty() == (print(original, false) == print(result, false)));  // a rewrite is logged
    all_rewrites.insert(all_rewrites.end(), log.begin(), log.end());
    // NHWC convolutions sum in another order than NCHW ones (sums of ~30 terms of size ~3:
    // absolute 1e-4 covers their rounding).
    if (pass.name == "channels_last")
      check_same_values(original, result, 1e-5, 1e-4);
    else if (pass.name == "gemm_epilogues")  // x joins the GEMM's sums: rounding only
      check_same_values(original, result, 1e-6, 1e-6);
    else
      check_same_values(original, result, pass.name == "fold_constants" ? 1e-6 : 0.0, 0.0);
  }
  // Between them, the files exercise every rule.
  for (const std::vector<Rule>* table : {&simplify_rules(), &fold_rules(), &layout_rules()})
    for (const Rule& rule : *table) {
      INFO("rule " << rule.name);
      CHECK(logged(all_rewrites, rule.name));
    }
  CHECK(logged(all_rewrites, "dead_code"));
  CHECK(logged(all_rewrites, "accumulate_into_product"));
}

TEST_CASE("passes: an unchanged graph rebuilds to the same text", "[passes]") {
  for (const char* file : {"dead_code_keeps.out.ir", "simplify_views.out.ir"}) {
    const Graph g = parse(read_text(std::filesystem::path(KILN_TEST_PASSES_DIR) / file));
    RewriteLog log;
    CHECK(print(rewrite(g, simplify_rules(), &log)) == print(g));
    CHECK(print(dead_code(g)) == print(g));
    CHECK(log.empty());
  }
}

TEST_CASE("passes: rewrites are logged with the rule and the values", "[passes]") {
  const Graph g = parse(
      "%0 = input \"x\" : f32[2,3]\n"
      "%1 = neg(%0) : f32[2,3]\n"
      "%2 = neg(%1) : f32[2,3]\n"
      "%3 = clone(%2) : f32[2,3]\n"
      "return %3\n");
  RewriteLog log;
  const Graph s = dead_code(simplify(g, &log));
  CHECK(print(s, false) == "%0 = input \"x\" : f32[2,3]\nreturn %0\n");
  REQUIRE(log.size() == 2);
  CHECK(log[0] == "neg_neg: neg(%1) -> %0 [was %2]");
  CHECK(log[1] == "clone_identity: clone(%0) -> %0 [was %3]");
}

TEST_CASE("passes: a replacement of another type is not applied", "[passes]") {
  const Graph g = parse("%0 = input \"x\" : f32[2]\n%1 = relu(%0) : f32[2]\nreturn %1\n");
  const std::vector<Rule> rules = {
      {"wrong_type", {"relu"}, [](Rewriter& rw, const Candidate&) -> Replacement {
         return Values{rw.add_constant(Scalar(1.0), TensorType{})};
       }},
      {"relu_to_abs", {"relu"}, [](Rewriter& rw, const Candidate& c) -> Replacement {
         return Values{rw.add_op1("abs", {c.inputs[0]})};
       }}};
  RewriteLog log;
  // The first rule's answer is declined, the second's taken; its dropped constant is dead code.
  const Graph out = dead_code(rewrite(g, rules, &log));
  CHECK(print(out, false) == "%0 = input \"x\" : f32[2]\n%1 = abs(%0) : f32[2]\nreturn %1\n");
  REQUIRE(log.size() == 1);
  CHECK(log[0] == "relu_to_abs: relu(%0) -> %2 [was %1]");
}

TEST_CASE("passes: rules that never stop rewriting are an error", "[passes]") {
  const Graph g = parse("%0 = input \"x\" : f32[2]\n%1 = relu(%0) : f32[2]\nreturn %1\n");
  const std::vector<Rule> rules = {{"relu_again", {"relu"}, [](Rewriter& rw, const Candidate& c) -> Replacement {
                                      return Values{rw.add_op1("relu", {c.inputs[0]})};
                                    }}};
  CHECK_THROWS_WITH(rewrite(g, rules), Contains("keep rewriting"));
}

TEST_CASE("passes: the traced MLP training step simplifies to fewer nodes with the same values", "[passes]") {
  manual_seed(4);
  models::MLP mlp({4, 8, 3});
  const Tensor w1 = mlp.named_parameters().at(0).second;
  const Tensor x = randn({2, 4}), y = randn({2, 3});
  TraceOptions options;
  for (const auto& [name, p] : mlp.named_parameters()) options.names[p.impl()] = name;
  auto step = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    Tensor loss = mse_loss(mlp(a[0]), a[1]);
    loss.backward();
    return {loss, w1.grad()};
  };
  mlp.zero_grad();
  const Trace t = trace(step, {x, y}, options);
  const Graph& traced = t.graph;
  REQUIRE(count_ops(traced, "full") == 1);

  std::vector<PassRecord> records;
  const Graph simplified = run_pipeline(traced, default_simplify_passes(), &records);
  verify(simplified);
  CHECK(simplified.nodes().size() < traced.nodes().size());
  CHECK(count_ops(simplified, "full") == 0);
  CHECK(count_ops(simplified, "view") < count_ops(traced, "view"));
  CHECK(count_ops(simplified, "permute") < count_ops(traced, "permute"));
  CHECK(simplified.inputs().size() == traced.inputs().size());
  for (size_t i = 0; i < traced.inputs().size(); ++i)
    CHECK(simplified.node(simplified.inputs()[i]).name == traced.node(traced.inputs()[i]).name);

  mlp.zero_grad();
  const std::vector<Tensor> before = interpret(traced, t.inputs_for({x, y}));
  const std::vector<Tensor> after = interpret(simplified, t.inputs_for({x, y}));
  // fn's two results, then one grad effect per parameter (the tracer's extra outputs).
  REQUIRE(after.size() == 2 + mlp.parameters().size());
  REQUIRE(after.size() == before.size());
  for (size_t i = 0; i < after.size(); ++i) KILN_CHECK_CLOSE(after[i], before[i], 1e-6, 0.0);
  KILN_CHECK_CLOSE(after[1], t.results[1], 1e-6, 1e-7);

  REQUIRE(records.size() == 3);
  CHECK(records[0].nodes_before == static_cast<int64_t>(traced.nodes().size()));
  CHECK(records[2].nodes_after == static_cast<int64_t>(simplified.nodes().size()));
  CHECK(records[2].graph_after == print(simplified));
  CHECK(records[2].nodes_after <= records[2].nodes_before);  // dead_code drops what the others left unused
  CHECK(logged(records[0].rewrites, "fold_constant"));
  CHECK(logged(records[1].rewrites, "permute_permute"));
  const std::string table = timing_table(records);
  INFO(table);
  for (const char* pass : {"fold_constants", "simplify", "dead_code", "total"}) CHECK_THAT(table, Contains(pass));
  CHECK_THAT(table, Contains(std::to_string(traced.nodes().size()) + " -> "));
}
