// The facts about an op are fields of its registry entry (core/registry.h), not lists of op
// names kept by the layers that read them: this file checks the entries, and that no such
// list comes back in the sources.
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "testing.h"

#include "core/registry.h"

using namespace kiln;

namespace {

std::string read_source(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The text with its // comments blanked (a comment may name ops in prose).
std::string without_comments(const std::string& text) {
  std::string out;
  bool in_string = false, in_comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_comment) {
      if (c == '\n') {
        in_comment = false;
        out += c;
      }
      continue;
    }
    if (!in_string && c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      in_comment = true;
      continue;
    }
    if (c == '"' && (i == 0 || text[i - 1] != '\\')) in_string = !in_string;
    out += c;
  }
  return out;
}

struct NameList {
  std::string file;
  int line = 0;
  std::vector<std::string> names;
};

// Runs of string literals naming three or more distinct ops, separated only by what a list
// or a chain of comparisons puts between them (commas, ||, ==, an identifier such as
// `op` or `node.op`): {"sum", "mean", "amax"}, op == "sum" || op == "mean" || ... A
// call between two names (g.add_op1("mul", {g.add_op1("add", ...) is no list.
std::vector<NameList> name_lists(const std::string& file, const std::string& text,
                                 const std::set<std::string>& ops) {
  static const std::regex literal("\"([a-z0-9_]+)\"");
  static const std::regex separator(R"([\s,|&=!.\w>-]*)");
  std::vector<NameList> found;
  NameList run;
  std::set<std::string> distinct;
  size_t run_end = 0;
  auto close = [&] {
    if (distinct.size() >= 3) found.push_back(run);
    run = {};
    distinct.clear();
  };
  for (auto it = std::sregex_iterator(text.begin(), text.end(), literal); it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1];
    const auto start = static_cast<size_t>(it->position());
    if (!ops.contains(name)) {
      close();
      continue;
    }
    const std::string gap = text.substr(run_end, start - run_end);
    if (!run.names.empty() && !std::regex_match(gap, separator)) close();
    if (run.names.empty()) {
      run.file = file;
      run.line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(start), '\n'));
    }
    run.names.push_back(name);
    distinct.insert(name);
    run_end = start + static_cast<size_t>(it->length());
  }
  close();
  return found;
}

std::set<std::string> op_names() {
  std::set<std::string> names;
  for (const OpDef* op : all_ops()) names.insert(op->name);
  return names;
}

}  // namespace

TEST_CASE("no list of op names outside the registry and the ops' own files") {
  // Allowed: core/ops/ (the ops' definitions), kernels/ (each kernel registers itself under
  // its op's name), autograd/formulas/ (each formula likewise) and compiler/passes/ (a
  // rewrite rule names the ops it matches).
  const std::filesystem::path root = KILN_SOURCE_DIR;
  const std::vector<std::string> allowed = {"core/ops/", "kernels/", "autograd/formulas/", "compiler/passes/"};
  const std::set<std::string> ops = op_names();
  std::vector<NameList> lists;
  int scanned = 0;
  for (const char* layer : {"core", "kernels", "autograd", "compiler", "models", "optim", "data", "tools"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / layer)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".h")) continue;
      const std::string rel = std::filesystem::relative(entry.path(), root).generic_string();
      if (std::any_of(allowed.begin(), allowed.end(), [&](const std::string& a) { return rel.starts_with(a); }))
        continue;
      ++scanned;
      for (NameList& l : name_lists(rel, without_comments(read_source(entry.path())), ops)) lists.push_back(l);
    }
  }
  CHECK(scanned > 50);
  for (const NameList& l : lists) {
    std::string names;
    for (const std::string& n : l.names) names += " " + n;
    FAIL_CHECK(l.file << ":" << l.line << " lists ops by name:" << names
                      << " (make it a field of the ops' registry entries, core/registry.h)");
  }
}

TEST_CASE("the scan finds a list of op names") {
  const std::set<std::string> ops = op_names();
  const std::string set = "const std::set<std::string> kReductions = {\"sum\", \"mean\", \"amax\", \"amin\"};";
  const std::string chain = "return op == \"sum\" || op == \"mean\" || node.op == \"amax\";";
  const std::string graph = "g.add_op1(\"add\", {g.add_op1(\"mul\", {M, B}), g.add_op1(\"mul\", {D, d})});";
  const std::string attrs = "{\"min\", \"max\"}";  // two names: attribute names that are also ops
  REQUIRE(name_lists("set", set, ops).size() == 1);
  CHECK(name_lists("set", set, ops)[0].names.size() == 4);
  CHECK(name_lists("chain", chain, ops).size() == 1);
  CHECK(name_lists("graph", graph, ops).empty());
  CHECK(name_lists("attrs", attrs, ops).empty());
  CHECK(without_comments("a // \"sum\", \"mean\", \"amax\"\nb") == "a \nb");
}

TEST_CASE("elementwise ops carry their category, and the generated kernels follow it") {
  std::set<std::string> functions;  // the functions kernels/scalar.h defines
  const std::string scalar_h = read_source(std::filesystem::path(KILN_SOURCE_DIR) / "kernels/scalar.h");
  static const std::regex defined(R"(KILN_HD [\w ]+ (\w+)\()");
  for (auto it = std::sregex_iterator(scalar_h.begin(), scalar_h.end(), defined); it != std::sregex_iterator(); ++it)
    functions.insert((*it)[1]);
  int elementwise = 0, reductions = 0;
  const bool cuda_built = find_op("to_device").kernels[static_cast<int>(DeviceType::cuda)] != nullptr;
  for (const OpDef* op : all_ops()) {
    INFO("op " << op->name);
    if (op->is_elementwise()) {
      ++elementwise;
      CHECK(op->kind == OpKind::compute);
      CHECK(op->reduction == Reduction::none);
      CHECK(op->kernels[static_cast<int>(DeviceType::cpu)] != nullptr);
    }
    // An op computed by a function of its own name: that function is in kernels/scalar.h.
    switch (op->elementwise) {
      case Elementwise::same:
      case Elementwise::floating:
      case Elementwise::compare:
      case Elementwise::logical: CHECK(functions.contains(op->name)); break;
      default: CHECK(op->scalar_args == nullptr);
    }
    if (op->reduction != Reduction::none) {
      ++reductions;
      CHECK(op->elementwise == Elementwise::none);
    }
    // In a build with CUDA, every op the code generator computes has its generated kernel.
    const bool generated = (op->elementwise != Elementwise::none && op->elementwise != Elementwise::opaque) ||
                           op->reduction == Reduction::sum || op->reduction == Reduction::mean ||
                           op->reduction == Reduction::amax || op->reduction == Reduction::amin;
    if (generated && cuda_built) CHECK(op->kernels[static_cast<int>(DeviceType::cuda)] != nullptr);
  }
  CHECK(elementwise >= 40);
  CHECK(reductions >= 15);
  CHECK(find_op("add").elementwise == Elementwise::same);
  CHECK(find_op("div").elementwise == Elementwise::floating);
  CHECK(find_op("where").elementwise == Elementwise::select);
  CHECK(find_op("dropout").elementwise == Elementwise::opaque);
  CHECK(find_op("mean").reduction == Reduction::mean);
}

TEST_CASE("cast policies follow PyTorch's autocast lists") {
  for (const char* op : {"matmul", "mm", "bmm", "addmm", "conv2d", "conv2d_backward_input", "conv2d_backward_weight"})
    CHECK(find_op(op).cast_policy == CastPolicy::lower);
  for (const char* op : {"softmax", "log_softmax", "cross_entropy_loss", "nll_loss", "mse_loss", "layer_norm", "exp",
                         "log", "pow", "sum", "mean", "var", "norm"})
    CHECK(find_op(op).cast_policy == CastPolicy::f32);
  for (const char* op : {"add", "mul", "cat", "where"}) CHECK(find_op(op).cast_policy == CastPolicy::promote);
  CHECK(find_op("relu").cast_policy == CastPolicy::none);
  // Only floating ops have a policy that changes dtypes; views never.
  for (const OpDef* op : all_ops())
    if (op->kind == OpKind::view) CHECK(op->cast_policy == CastPolicy::none);
}
