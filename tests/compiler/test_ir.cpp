// The graph IR's text form: print, parse, verify, hash-consing and the structural hash.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "compiler/ir/graph.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;

namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::stringstream s;
  s << file.rdbuf();
  return s.str();
}

// The hand-written files are canonical text, apart from their comment lines at the top.
std::string without_comment_lines(const std::string& text) {
  std::string out, line;
  std::istringstream in(text);
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') out += line + "\n";
  return out;
}

std::vector<std::filesystem::path> ir_files() {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(KILN_TEST_IR_DIR))
    if (entry.path().extension() == ".ir") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

// parse(print(g)) prints as g does, with and without sources, and hashes the same.
void check_round_trip(const Graph& graph) {
  const std::string text = print(graph);
  const Graph again = parse(text);
  CHECK(print(again) == text);
  CHECK(print(again, false) == print(graph, false));
  CHECK(again.structural_hash() == graph.structural_hash());
  CHECK(again.num_values() == graph.num_values());
  CHECK_NOTHROW(verify(again));
}

// The message of the kiln::Error that parse(text) throws ("" when it throws none).
std::string parse_error(const std::string& text) {
  try {
    parse(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const compiler::Node& node_of(const Graph& g, int64_t value_number) {
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (size_t o = 0; o < g.nodes()[i].outputs.size(); ++o)
      if (g.value_number(Value{static_cast<int32_t>(i), static_cast<int32_t>(o)}) == value_number) return g.nodes()[i];
  FAIL("no value %" << value_number);
  return g.nodes()[0];
}

// A 2-layer MLP forward with an MSE loss and a weight-decay update of w1 as a write-back.
Graph mlp_graph() {
  Graph g;
  const Value x = g.add_input("x", TensorType{.shape = {32, 784}});
  const Value target = g.add_input("target", TensorType{.shape = {32, 10}});
  const Value w1 = g.add_input("fc1.weight", TensorType{.shape = {128, 784}}, InputRole::param);
  const Value b1 = g.add_input("fc1.bias", TensorType{.shape = {128}}, InputRole::param);
  const Value w2 = g.add_input("fc2.weight", TensorType{.shape = {10, 128}}, InputRole::param);
  const Value b2 = g.add_input("fc2.bias", TensorType{.shape = {10}}, InputRole::param);
  const Value lr = g.add_input("lr", TensorType{.dtype = DType::f64, .shape = {}}, InputRole::scalar);
  auto linear = [&](Value in, Value w, Value b) {
    const Value wt = g.add_op1("permute", {w}, {{"dims", std::vector<int64_t>{1, 0}}}, "linear");
    return g.add_op1("add", {g.add_op1("matmul", {in, wt}, {}, "linear"), b}, {}, "linear");
  };
  const Value h = g.add_op1("relu", {linear(x, w1, b1)}, {}, "relu");
  const Value y = linear(h, w2, b2);
  const Value loss = g.add_op1("mse_loss", {y, target}, {{"reduction", std::string("mean")}}, "mse_loss");
  const Value decay = g.add_op1("mul", {w1, lr}, {}, "mul");
  const Value half = g.add_constant(Scalar(0.5), TensorType{.dtype = DType::f64, .shape = {}, .wrapped_number = true});
  const Value scaled = g.add_op1("mul", {decay, half}, {}, "mul");
  const Value w1_new = g.add_op1("sub", {w1, scaled}, {{"alpha", Scalar(0.5)}}, "sub_");
  g.set_outputs({loss, y});
  g.add_write_back(w1, w1_new);
  return g;
}

}  // namespace

TEST_CASE("ir: every hand-written graph parses verifies and prints back as written", "[ir]") {
  const std::vector<std::filesystem::path> files = ir_files();
  REQUIRE(files.size() >= 3);
  for (const auto& path : files) {
    INFO(path.filename().string());
    const std::string text = read_text(path);
    const Graph g = parse(text);
    CHECK_NOTHROW(verify(g));
    CHECK(print(g) == without_comment_lines(text));
    check_round_trip(g);
  }
}

TEST_CASE("ir: a 2-layer MLP built through the Graph API round-trips", "[ir]") {
  const Graph g = mlp_graph();
  CHECK_NOTHROW(verify(g));
  const std::string text = print(g);
  INFO(text);
  CHECK(text.starts_with("%0 = input \"x\" : f32[32,784]\n%1 = input \"target\" : f32[32,10]\n"
                         "%2 = param \"fc1.weight\" : f32[128,784]\n"));
  CHECK(text.find("%6 = scalar \"lr\" : f64[]\n") != std::string::npos);
  CHECK(text.find("%7 = permute(%2) {dims=[1,0]} : f32[784,128]  # linear\n") != std::string::npos);
  CHECK(text.find("%8 = matmul(%0, %7) : f32[32,128]  # linear\n") != std::string::npos);
  CHECK(text.find("%14 = mse_loss(%13, %1) {reduction=\"mean\"} : f32[]  # mse_loss\n") != std::string::npos);
  CHECK(text.find("%16 = constant {value=$0.5} : f64[] number\n") != std::string::npos);
  CHECK(text.find("%17 = mul(%15, %16) : f32[128,784]  # mul\n"
                         "%18 = sub(%2, %17) {alpha=$0.5} : f32[128,784]  # sub_\n") != std::string::npos);
  CHECK(text.ends_with("return %14, %13\nwrite %2 <- %18\n"));
  CHECK(print(g, false).find('#') == std::string::npos);
  INFO(text);
  check_round_trip(g);
}

TEST_CASE("ir: parse reads every attribute kind exactly", "[ir]") {
  const Graph g = parse(read_text(std::filesystem::path(KILN_TEST_IR_DIR) / "attributes.ir"));
  CHECK(node_of(g, 0).name == "x#1 \"quoted\" \\ name");
  CHECK(node_of(g, 1).outputs[0].device == Device::cuda(0));
  CHECK(node_of(g, 2).outputs[0].layout == MemoryFormat::channels_last);
  CHECK(node_of(g, 2).outputs[0].dtype == DType::f16);
  CHECK(node_of(g, 3).role == InputRole::scalar);

  const Scalar two = node_of(g, 4).attrs.scalar("alpha");
  CHECK((two.kind() == DType::i64 && two.to_int() == 2));
  const Scalar minus_half = node_of(g, 5).attrs.scalar("alpha");
  CHECK((minus_half.is_floating() && minus_half.to_double() == -0.5));
  CHECK(node_of(g, 6).attrs.scalar("min").kind() == DType::i64);
  CHECK(node_of(g, 6).attrs.scalar("max").is_floating());
  CHECK(node_of(g, 7).attrs.scalar("value").kind() == DType::boolean);
  CHECK(node_of(g, 8).attrs.f("threshold") == INFINITY);
  CHECK(node_of(g, 9).attrs.f("beta") == -INFINITY);
  CHECK(std::isnan(node_of(g, 9).attrs.f("threshold")));
  CHECK(node_of(g, 10).attrs.f("beta") == 2.5e-07);
  CHECK(node_of(g, 10).attrs.f("threshold") == 1e30);
  CHECK(node_of(g, 11).attrs.ints("dims") == std::vector<int64_t>{-1});
  CHECK(node_of(g, 11).attrs.b("keepdim"));
  CHECK(node_of(g, 12).attrs.ints("dims").empty());
  CHECK(node_of(g, 12).attrs.dtype("dtype") == DType::f64);
  CHECK(node_of(g, 13).attrs.i("dim") == -1);
  CHECK(node_of(g, 15).attrs.device("device") == Device::cuda(1));
  CHECK(node_of(g, 15).outputs[0].str() == "bf16[2,3] cuda:1");
  CHECK(node_of(g, 16).attrs.device("device") == Device::cpu());
  CHECK(node_of(g, 17).attrs.str("approximate") == "tanh");
  CHECK(node_of(g, 19).inputs.empty());
  CHECK(node_of(g, 19).attrs.scalar("value").to_int() == -3);
  CHECK(node_of(g, 20).attrs.dtype("dtype") == DType::boolean);
  CHECK(node_of(g, 4).source == "add");
  CHECK(node_of(g, 8).source.empty());
}

TEST_CASE("ir: numbers strings and sources survive a round trip exactly", "[ir]") {
  Graph g;
  const Value x = g.add_input("line\nbreak \"and\" \\ tab\t", TensorType{.shape = {3}});
  const std::vector<double> doubles = {0.1, 1.0 / 3.0, -0.0, 1e-300, 5e-324, 1.7976931348623157e308, -2.5e-07,
                                       123456789.0, NAN, INFINITY, -INFINITY};
  const std::vector<Scalar> scalars = {Scalar(int64_t{INT64_MIN}), Scalar(int64_t{INT64_MAX}), Scalar(-0.0),
                                       Scalar(NAN), Scalar(-INFINITY), Scalar(0.1), Scalar(false)};
  std::vector<Value> outputs;
  for (double d : doubles) outputs.push_back(g.add_op1("softplus", {x}, {{"beta", d}}, "  spaced\tsource\n "));
  for (const Scalar& s : scalars) outputs.push_back(g.add_op1("fill", {x}, {{"value", s}}));
  outputs.push_back(g.add_op1("gelu", {x}, {{"approximate", std::string("two\nlines # not a comment")}}));
  outputs.push_back(g.add_op1("relu", {x}, {{"ints", std::vector<int64_t>{INT64_MIN, -1, 0, INT64_MAX}}}));
  g.set_outputs(outputs);
  check_round_trip(g);

  const Graph again = parse(print(g));
  CHECK(again.nodes()[0].name == g.nodes()[0].name);
  for (size_t i = 0; i < doubles.size(); ++i) {
    const double d = again.nodes()[1 + i].attrs.f("beta");
    CHECK((std::isnan(d) ? std::isnan(doubles[i]) : d == doubles[i] && std::signbit(d) == std::signbit(doubles[i])));
  }
  for (size_t i = 0; i < scalars.size(); ++i) {
    const Scalar s = again.nodes()[1 + doubles.size() + i].attrs.scalar("value");
    CHECK(s.kind() == scalars[i].kind());
    CHECK(attr_text(s) == attr_text(scalars[i]));
  }
  CHECK(again.nodes()[1].source == "spaced source");
  CHECK(again.nodes().back().attrs.ints("ints") == std::vector<int64_t>{INT64_MIN, -1, 0, INT64_MAX});
  CHECK(again.nodes()[again.nodes().size() - 2].attrs.str("approximate") == "two\nlines # not a comment");
}

TEST_CASE("ir: parse accepts sparse numbers comments and blank lines", "[ir]") {
  const Graph g = parse(
      "# a comment line\n"
      "\n"
      "%10 = input \"x\" : f32[4]   # comments after inputs are ignored\n"
      "   %3 = relu(%10) : f32[4]#no space\n"
      "%7 = constant {value=$1.5} : f64[] number\n"
      "%8 = mul(%3, %7) : f32[4]\n"
      "return %8, %10\n");
  CHECK(print(g) ==
        "%0 = input \"x\" : f32[4]\n"
        "%1 = relu(%0) : f32[4]  # no space\n"
        "%2 = constant {value=$1.5} : f64[] number\n"
        "%3 = mul(%1, %2) : f32[4]\n"
        "return %3, %0\n");
  CHECK(parse("").nodes().empty());
  CHECK(print(parse("")) == "return\n");
}

TEST_CASE("ir: identical nodes are hash-consed and random ones are not", "[ir]") {
  Graph g;
  const Value x = g.add_input("x", TensorType{.shape = {4, 4}});
  const Value a = g.add_op1("relu", {x});
  CHECK(g.add_op1("relu", {x}, {}, "another source") == a);
  const Value s1 = g.add_op1("sum", {x}, {{"dims", std::vector<int64_t>{1}}, {"keepdim", false}});
  const Value s2 = g.add_op1("sum", {x}, {{"dims", std::vector<int64_t>{1}}, {"keepdim", true}});
  CHECK(s1 != s2);
  const TensorType number{.dtype = DType::f64, .shape = {}, .wrapped_number = true};
  CHECK(g.add_constant(Scalar(2), number) == g.add_constant(Scalar(2), number));
  CHECK(g.add_constant(Scalar(2), number) != g.add_constant(Scalar(2.0), number));
  REQUIRE(find_op("dropout").random);
  const Attrs drop{{"p", 0.5}, {"train", true}, {"seed", int64_t{7}}, {"offset", int64_t{0}}};
  const std::vector<Value> d1 = g.add_op("dropout", {x}, drop);
  const std::vector<Value> d2 = g.add_op("dropout", {x}, drop);
  REQUIRE(d1.size() == 2);
  CHECK(d1[0].node != d2[0].node);

  // In text, a duplicate line names the existing value; random ops stay distinct.
  const Graph parsed = parse(
      "%0 = input \"x\" : f32[4,4]\n"
      "%1 = relu(%0) : f32[4,4]\n"
      "%2 = relu(%0) : f32[4,4]\n"
      "%3, %4 = dropout(%0) {p=0.5, train=true, seed=7, offset=0} : f32[4,4], bool[4,4]\n"
      "%5, %6 = dropout(%0) {p=0.5, train=true, seed=7, offset=0} : f32[4,4], bool[4,4]\n"
      "return %1, %2, %3, %5\n");
  CHECK(parsed.nodes().size() == 4);
  CHECK(print(parsed).ends_with("return %1, %1, %2, %4\n"));
}

TEST_CASE("ir: the structural hash sees attributes and types but not sources", "[ir]") {
  auto build = [](DType dtype, bool keepdim, std::string source) {
    Graph g;
    const Value x = g.add_input("x", TensorType{.dtype = dtype, .shape = {2, 3}});
    const Value s = g.add_op1("sum", {x}, {{"dims", std::vector<int64_t>{1}}, {"keepdim", keepdim}}, source);
    g.set_outputs({s});
    return g;
  };
  const uint64_t base = build(DType::f32, false, "sum").structural_hash();
  CHECK(build(DType::f32, false, "something else").structural_hash() == base);
  CHECK(build(DType::f32, true, "sum").structural_hash() != base);
  CHECK(build(DType::f64, false, "sum").structural_hash() != base);
  Graph with_output = build(DType::f32, false, "sum");
  with_output.set_outputs({});
  CHECK(with_output.structural_hash() != base);
}

TEST_CASE("ir: write-backs must target an input with the same type", "[ir]") {
  Graph g;
  const Value w = g.add_input("w", TensorType{.shape = {3}}, InputRole::param);
  const Value w64 = g.add_op1("cast", {w}, {{"dtype", DType::f64}});
  const Value r = g.add_op1("relu", {w});
  CHECK_THROWS_WITH(g.add_write_back(w, w64), Catch::Contains("write-back of f64[3] into input \"w\""));
  CHECK_THROWS_WITH(g.add_write_back(r, w), Catch::Contains("must target a graph input"));
  g.add_write_back(w, r);
  g.add_write_back(w, g.add_op1("neg", {w}));  // a later write-back replaces the first
  REQUIRE(g.write_backs().size() == 1);
  CHECK(print(g).ends_with("return\nwrite %0 <- %3\n"));
  CHECK_THROWS_WITH(parse("%0 = param \"w\" : f32[3]\n%1 = cast(%0) {dtype=f64} : f64[3]\nwrite %0 <- %1\n"),
                    Catch::StartsWith("graph line 3: ") && Catch::Contains("write-back of f64[3]"));
  CHECK_THROWS_WITH(parse("%0 = param \"w\" : f32[3]\n%1 = relu(%0) : f32[3]\nwrite %1 <- %0\n"),
                    Catch::StartsWith("graph line 3: ") && Catch::Contains("graph input"));
}

TEST_CASE("ir: verify names the first broken node", "[ir]") {
  // The Graph API only builds valid graphs; a pass could still break one. The graphs here
  // are not const objects, so writing through nodes() after a const_cast is well defined.
  auto nodes_of = [](Graph& g) -> std::vector<compiler::Node>& { return const_cast<std::vector<compiler::Node>&>(g.nodes()); };
  {
    Graph g = mlp_graph();
    CHECK_NOTHROW(verify(g));
    nodes_of(g)[8].outputs[0].shape = {32, 127};
    CHECK_THROWS_WITH(verify(g), Catch::Contains("verify: node 8 (%8 = matmul)") &&
                                     Catch::Contains("output 0 is f32[32,127], its shape rule says f32[32,128]"));
  }
  {
    Graph g = mlp_graph();
    nodes_of(g)[8].inputs[1] = Value{12, 0};  // a use before its definition
    CHECK_THROWS_WITH(verify(g), Catch::Contains("node 8") && Catch::Contains("not defined before"));
  }
  {
    Graph g = mlp_graph();
    nodes_of(g)[9].inputs[1] = Value{0, 0};  // add(matmul [32,128], x [32,784])
    CHECK_THROWS_WITH(verify(g), Catch::Contains("node 9 (%9 = add)") && Catch::Contains("shape rule rejects"));
  }
  {
    Graph g = mlp_graph();
    auto& write_backs = const_cast<std::vector<std::pair<Value, Value>>&>(g.write_backs());
    write_backs[0].second = Value{14, 0};  // the loss, f32[], into fc1.weight
    CHECK_THROWS_WITH(verify(g), Catch::Contains("verify: the write-back to input \"fc1.weight\" (f32[128,784]) writes %14 of type f32[]"));
  }
  {
    Graph g = mlp_graph();
    nodes_of(g)[16].attrs = Attrs{{"value", 0.5}};  // a constant whose value is not a Scalar
    CHECK_THROWS_WITH(verify(g), Catch::Contains("node 16 (%16 = constant)"));
  }
}

TEST_CASE("ir: parse errors name the line and what is wrong", "[ir]") {
  const std::string head = "%0 = input \"x\" : f32[2,3]\n";
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {head + "%1 = frobnicate(%0) : f32[2,3]\n", "graph line 2: find_op: there is no op named 'frobnicate'"},
      {head + "%1 = relu(%5) : f32[2,3]\n", "graph line 2: %5 is used before it is defined"},
      {head + "%1 = relu(%0) : f32[3,2]\n", "graph line 2: relu output 0 is printed as f32[3,2] but its shape rule says f32[2,3]"},
      {head + "%1 = relu(%0) : f64[2,3]\n", "graph line 2: relu output 0 is printed as f64[2,3]"},
      {head + "%1 relu(%0) : f32[2,3]\n", "graph line 2: expected '=' after the defined values"},
      {head + "%1 = relu(%0 : f32[2,3]\n", "graph line 2: expected ')' to close the op's inputs"},
      {head + "%1 = sum(%0) {dims=[1,x]} : f32[2]\n", "graph line 2: bad integer 'x'"},
      {head + "%1 = sum(%0) {keepdim=maybe} : f32[2]\n", "graph line 2: unknown attribute value 'maybe'"},
      {head + "%1 = sum(%0) {dims=[1] : f32[2]\n", "graph line 2: expected '}' to close the attributes"},
      {head + "%1 = relu(%0) : q32[2,3]\n", "graph line 2: unknown dtype 'q32'"},
      {head + "%1 = relu(%0) : f32[2,3] sparse\n", "graph line 2: unknown type qualifier 'sparse'"},
      {head + "%0 = relu(%0) : f32[2,3]\n", "graph line 2: %0 is defined twice"},
      {head + "%1, %2 = relu(%0) : f32[2,3]\n", "graph line 2: relu defines 1 values, the line names 2"},
      {head + "%1 = matmul(%0, %0) : f32[2,3]\n", "graph line 2: matmul"},
      {head + "%1 = input \"x : f32[2]\n", "graph line 2: unterminated string"},
      {head + "%1 = input \"x\" : f32[2]\n", "graph line 2: graph: two inputs named \"x\""},
      {head + "%1 = constant {value=2} : f64[]\n", "graph line 2: a constant takes one attribute"},
      {head + "%1 = constant {value=$2} : f64[2]\n", "graph line 2: graph: a constant must be a 0-d tensor"},
      {head + "%1 = sum(%0) {dims=[99999999999999999999]} : f32[2]\n", "graph line 2: bad integer"},
      {head + "%1 = to_device(%0) {device=cuda} : f32[2,3]\n", "graph line 2: expected ':' after cuda"},
      {head + "\nreturn %0 extra\n", "graph line 3: unexpected text 'extra'"},
      {head + "return %0\nreturn %0\n", "graph line 3: a second return"},
      {head + "write %0 - %0\n", "graph line 2: expected '<' in '<-'"},
      {head + "%1 = relu(%0) : f32[2,3\n", "graph line 2: expected ']' to close a list of integers"},
      {head + "%1 = relu(%0) : f32[2,3] 5  # source\n", "graph line 2: unexpected text '5  # source'"},
      {head + "%1 = relu(%0) {alpha=$maybe} : f32[2,3]\n", "graph line 2: bad number 'maybe'"},
      {head + "%1 = relu(%0) {dims=[1], dims=[2]} : f32[2,3]\n", "graph line 2: attribute dims given twice"},
      {head + "return %0\n%1 = relu(none) : f32[2,3]\n", "graph line 3: relu: an input is undefined"},
      {head + "%1 = relu(%0) : f32[2,3], f32[2,3]\n", "graph line 2: relu has 1 outputs, the line gives 2 types"},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    CHECK_THAT(parse_error(c.text), Catch::StartsWith(c.message));
  }
}
