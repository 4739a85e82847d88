// The first codegen path: fusion groups -> kernel IR -> C++ -> host compiler -> dlopen,
// checked against the reference interpreter. Each compile costs ~0.5 s, so the tests share
// few distinct kernel structures.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "compiler/codegen/cpp.h"
#include "compiler/codegen/cpp_jit.h"
#include "compiler/codegen/lower.h"
#include "compiler/codegen/cpp_run.h"
#include "compiler/trace.h"
#include "compiler_testing.h"
#include "core/disk_cache.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using namespace kiln::compiler::codegen;
using Catch::Matchers::Contains;

namespace {

using kiln::testing::TempCache;

TensorType f32(Shape shape, DType dtype = DType::f32) { return TensorType{.dtype = dtype, .shape = std::move(shape)}; }

using kiln::testing::compute_nodes;
using kiln::testing::number;
using kiln::testing::op;

// Runs the kernel with the graph inputs bound to its input buffers; fresh outputs, or the
// given ones.
std::vector<Tensor> run(const Graph& g, const Kernel& k, const CompiledKernel& c, const std::vector<Tensor>& args,
                        std::vector<Tensor> outputs = {}) {
  std::vector<Tensor> inputs;
  for (int32_t b : k.input_buffers()) {
    const Buffer& buffer = k.buffers[static_cast<size_t>(b)];
    for (size_t i = 0; i < g.inputs().size(); ++i)
      if (g.inputs()[i].node == buffer.node) inputs.push_back(args[i]);
  }
  REQUIRE(inputs.size() == k.input_buffers().size());
  if (outputs.empty())
    for (int32_t b : k.output_buffers()) {
      const TensorType& t = g.nodes()[static_cast<size_t>(k.buffers[static_cast<size_t>(b)].node)].outputs[0];
      outputs.push_back(make_tensor(t.shape, t.dtype));
    }
  run_kernel(c, k, inputs, outputs);
  return outputs;
}

// relu(permute(x) * 2 + y) with x [n, m] read transposed and y [1, n] broadcast.
Graph mul_add_relu(int64_t m, int64_t n) {
  Graph g;
  const Value x = g.add_input("x", f32({n, m}));
  const Value y = g.add_input("y", f32({1, n}));
  const Value xt = op(g, "permute", {x}, {{"dims", std::vector<int64_t>{1, 0}}});
  const Value r = op(g, "relu", {op(g, "add", {op(g, "mul", {xt, number(g, 2.0)}), y})});
  g.set_outputs({r});
  return g;
}

}  // namespace

TEST_CASE("codegen: mul add relu over a transposed input and a broadcast row compiles once per structure",
          "[codegen]") {
  TempCache cache;
  const Graph g = mul_add_relu(3, 5);
  const Kernel k = lower_pointwise(g, compute_nodes(g));
  const std::string ir = print(k), source = render_cpp(k);
  INFO("kernel IR:\n" << ir << "\nC++:\n" << source);
  if (std::getenv("KILN_CODEGEN_SHOW")) std::cout << ir << "\n" << source << "\n";
  CHECK(k.name == "mul_add_relu");
  CHECK(k.rank == 2);
  CHECK(k.buffers.size() == 3);
  CHECK_THAT(ir, Contains("in1: f32 bcast[0]") && Contains("via permute{dims=[1,0]}"));
  CHECK_THAT(source, Contains("kiln::scalar::relu(") && Contains("#pragma omp parallel for"));

  const int64_t before = compiler_invocations();
  const CompiledKernel c = compile_cpp(source, cpp_symbol(k));
  CHECK(compiler_invocations() == before + 1);
  CHECK(std::filesystem::exists(c.path));

  const std::vector<Tensor> args = {randn({5, 3}), randn({1, 5})};
  KILN_CHECK_CLOSE(run(g, k, c, args)[0], interpret(g, args)[0], 1e-6, 1e-6);

  // The same structure at other sizes: the same source and function, no compiler run.
  const Graph big = mul_add_relu(64, 300);
  const Kernel kb = lower_pointwise(big, compute_nodes(big));
  CHECK(render_cpp(kb) == source);
  const CompiledKernel cb = compile_cpp(render_cpp(kb), cpp_symbol(kb));
  CHECK(cb.function == c.function);
  const std::vector<Tensor> big_args = {randn({300, 64}), randn({1, 300})};
  KILN_CHECK_CLOSE(run(big, kb, cb, big_args)[0], interpret(big, big_args)[0], 1e-6, 1e-6);
  // A strided output takes the general (non unit-stride) loop.
  Tensor out_t = make_tensor({300, 64}, DType::f32);
  const Tensor strided_out = out_t.t();
  run(big, kb, cb, big_args, {strided_out});
  KILN_CHECK_CLOSE(strided_out, interpret(big, big_args)[0], 1e-6, 1e-6);
  CHECK(compiler_invocations() == before + 1);

  // A new process would find the shared object on disk: no compiler run either.
  clear_kernel_memory_cache();
  const CompiledKernel from_disk = compile_cpp(source, cpp_symbol(k));
  CHECK(compiler_invocations() == before + 1);
  CHECK(from_disk.path == c.path);
  KILN_CHECK_CLOSE(run(g, k, from_disk, args)[0], interpret(g, args)[0], 1e-6, 1e-6);
}

TEST_CASE("codegen: f64 comparison where cast and an i64 broadcast input in one kernel", "[codegen]") {
  TempCache cache;
  Graph g;
  const Value x = g.add_input("x", f32({4, 7}, DType::f64));
  const Value y = g.add_input("y", f32({4, 7}, DType::f64));
  const Value z = g.add_input("z", f32({7}, DType::i64));
  const Value mask = op(g, "gt", {x, y});
  const Value shifted = op(g, "add", {x, z});  // f64 + i64 -> f64
  const Value w = op(g, "where", {mask, op(g, "mul", {shifted, y}), op(g, "tanh", {op(g, "exp", {y})})});
  const Value w32 = op(g, "cast", {op(g, "sub", {w, number(g, 0.25)})}, {{"dtype", DType::f32}});
  g.set_outputs({mask, w, w32});
  const Kernel k = lower_pointwise(g, compute_nodes(g));
  INFO(print(k) << "\n" << render_cpp(k));
  REQUIRE(k.num_outputs() == 3);
  CHECK(k.buffers[0].dtype == DType::boolean);
  CHECK(k.buffers[2].dtype == DType::f32);
  const CompiledKernel c = compile_cpp(render_cpp(k), cpp_symbol(k));
  const std::vector<Tensor> args = {randn({4, 7}, {.dtype = DType::f64}), randn({4, 7}, {.dtype = DType::f64}),
                                    randint(-3, 3, {7}, {.dtype = DType::i64})};
  const std::vector<Tensor> got = run(g, k, c, args), want = interpret(g, args);
  KILN_CHECK_EQUAL(got[0], want[0]);
  KILN_CHECK_CLOSE(got[1], want[1], 1e-12, 1e-12);
  KILN_CHECK_CLOSE(got[2], want[2], 1e-6, 1e-6);
}

TEST_CASE("codegen: unary chains and reductions compile together in one batch", "[codegen]") {
  TempCache cache;
  // f32: sigmoid(tanh(exp(x * -0.5))) + sqrt(abs(x)), clamped.
  Graph u;
  const Value x = u.add_input("x", f32({6, 9}));
  const Value chain = op(u, "sigmoid", {op(u, "tanh", {op(u, "exp", {op(u, "mul", {x, number(u, -0.5)})})})});
  const Value sum = op(u, "add", {chain, op(u, "sqrt", {op(u, "abs", {x})})});
  u.set_outputs({op(u, "clamp", {sum}, {{"min", Scalar(0.0)}, {"max", Scalar(1.5)}})});
  const Kernel ku = lower_pointwise(u, compute_nodes(u));

  // sum over the last dim of x * x (x read transposed), and mean / amax over dim 0.
  Graph s;
  const Value a = s.add_input("a", f32({5, 4}));
  const Value at = op(s, "permute", {a}, {{"dims", std::vector<int64_t>{1, 0}}});
  s.set_outputs({op(s, "sum", {op(s, "mul", {at, at})}, {{"dims", std::vector<int64_t>{-1}}})});
  const Kernel ks = lower_reduction(s, compute_nodes(s));
  Graph m;
  const Value b = m.add_input("b", f32({3, 4, 5}));
  m.set_outputs({op(m, "mean", {op(m, "relu", {b})}, {{"dims", std::vector<int64_t>{0, 2}}, {"keepdim", true}})});
  const Kernel km = lower_reduction(m, compute_nodes(m));
  Graph x_max;
  const Value e = x_max.add_input("e", f32({3, 8}, DType::i64));
  x_max.set_outputs({op(x_max, "amax", {e}, {{"dims", std::vector<int64_t>{1}}})});
  const Kernel kx = lower_reduction(x_max, compute_nodes(x_max));
  // f16 rounds after every op, as the eager kernels do: the results match exactly.
  Graph h;
  const Value xh = h.add_input("xh", f32({4, 6}, DType::f16));
  h.set_outputs({op(h, "add", {op(h, "relu", {op(h, "mul", {xh, number(h, 1.7)})}), xh})});
  const Kernel kh = lower_pointwise(h, compute_nodes(h));
  INFO(print(ks) << "\n" << render_cpp(ks) << "\n" << print(km));
  if (std::getenv("KILN_CODEGEN_SHOW")) std::cout << print(ks) << "\n" << render_cpp(ks) << "\n" << print(km) << "\n";
  CHECK(ks.num_reduced == 1);
  CHECK(km.num_reduced == 2);

  const int64_t before = compiler_invocations();
  const std::vector<CompiledKernel> c = compile_cpp_batch(
      {{render_cpp(ku), cpp_symbol(ku)}, {render_cpp(ks), cpp_symbol(ks)}, {render_cpp(km), cpp_symbol(km)},
       {render_cpp(kx), cpp_symbol(kx)}, {render_cpp(kh), cpp_symbol(kh)}});
  CHECK(compiler_invocations() == before + 5);

  const std::vector<Tensor> xu = {randn({6, 9})};
  KILN_CHECK_CLOSE(run(u, ku, c[0], xu)[0], interpret(u, xu)[0], 1e-6, 1e-6);
  const std::vector<Tensor> xs = {randn({5, 4})};
  KILN_CHECK_CLOSE(run(s, ks, c[1], xs)[0], interpret(s, xs)[0], 1e-6, 1e-6);
  const std::vector<Tensor> xm = {randn({3, 4, 5})};
  KILN_CHECK_CLOSE(run(m, km, c[2], xm)[0], interpret(m, xm)[0], 1e-6, 1e-6);
  const std::vector<Tensor> xx = {randint(-100, 100, {3, 8}, {.dtype = DType::i64})};
  KILN_CHECK_EQUAL(run(x_max, kx, c[3], xx)[0], interpret(x_max, xx)[0]);
  const std::vector<Tensor> xh16 = {randn({4, 6}).to(DType::f16)};
  KILN_CHECK_EQUAL(run(h, kh, c[4], xh16)[0], interpret(h, xh16)[0]);
}

TEST_CASE("codegen: corrupt cache entries rebuild and KILN_CACHE=off and compiler errors", "[codegen]") {
  TempCache cache;
  const std::string source =
      "#include <cstdint>\nextern \"C\" void k_seven(void* const* b, const int64_t*) { "
      "*static_cast<int64_t*>(b[0]) = 7; }\n";
  const std::string path = kernel_cache_path(source);
  std::ofstream(path) << "not a shared object";
  const int64_t before = compiler_invocations();
  const CompiledKernel c = compile_cpp(source, "k_seven");
  CHECK(compiler_invocations() == before + 1);
  int64_t value = 0;
  void* buffers[] = {&value};
  c.function(buffers, nullptr);
  CHECK(value == 7);

  setenv("KILN_CACHE", "off", 1);
  clear_kernel_memory_cache();
  CHECK(kernel_cache_path(source).empty());
  const CompiledKernel again = compile_cpp(source, "k_seven");
  CHECK(compiler_invocations() == before + 2);
  CHECK(again.path.empty());
  value = 0;
  again.function(buffers, nullptr);
  CHECK(value == 7);
  unsetenv("KILN_CACHE");

  const std::string broken = "extern \"C\" void k_broken() { this is not C++; }\n";
  try {
    compile_cpp(broken, "k_broken");
    FAIL("compile_cpp accepted a broken source");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Contains("k_broken") && Contains("error") && Contains("source kept at") && Contains(".cpp"));
    // Kept in $TMPDIR for inspection; not needed here.
    const size_t at = what.find("source kept at ") + std::strlen("source kept at ");
    const std::filesystem::path kept = what.substr(at, what.find('\n', at) - at);
    CHECK(disk_cache::read_file(kept) == broken);
    std::filesystem::remove(kept);
  }
}

TEST_CASE("codegen: lowering refuses unsupported ops and mismatched outputs", "[codegen]") {
  Graph g;
  const Value a = g.add_input("a", f32({2, 3}));
  const Value b = g.add_input("b", f32({3, 4}));
  const Value mm = op(g, "matmul", {a, b});
  g.set_outputs({op(g, "relu", {mm})});
  CHECK_THROWS_WITH(lower_pointwise(g, compute_nodes(g)), Contains("matmul"));
  CHECK_THROWS_WITH(lower_reduction(g, {mm.node}), Contains("sum") && Contains("matmul"));

  Graph h;
  const Value x = h.add_input("x", f32({2, 3}));
  const Value row = h.add_input("row", f32({3}));
  const Value r = op(h, "exp", {row});
  h.set_outputs({op(h, "add", {x, r}), r});
  CHECK_THROWS_WITH(lower_pointwise(h, compute_nodes(h)), Contains("different shapes"));
}

TEST_CASE("codegen: a call merges the dims that every buffer walks as one", "[codegen]") {
  TempCache cache;
  // x [4,8,3,3] contiguous plus y [4,8,1,1]: y broadcasts over the 3x3, so dims 2-3 merge
  // (for x, and broadcast for y) and dims 0-1 merge (contiguous for both), not all four.
  Graph g;
  const Value x = g.add_input("x", f32({4, 8, 3, 3})), y = g.add_input("y", f32({4, 8, 1, 1}));
  g.set_outputs({op(g, "add", {x, y})});
  const Kernel k = lower_pointwise(g, compute_nodes(g));
  const std::vector<Tensor> args = {randn({4, 8, 3, 3}), randn({4, 8, 1, 1})};
  const Tensor out = make_tensor({4, 8, 3, 3}, DType::f32);
  const KernelCall call = kernel_call(k, args, {&out, 1});
  CHECK(std::vector<int64_t>(call.args.begin(), call.args.begin() + 4) == std::vector<int64_t>{1, 32, 1, 9});
  const CompiledKernel c = compile_cpp(render_cpp(k), cpp_symbol(k));
  KILN_CHECK_EQUAL(run(g, k, c, args)[0], interpret(g, args)[0]);
  // A transposed x walks other strides: nothing of dims 2-3 merges with 0-1 then.
  const std::vector<Tensor> transposed = {randn({4, 8, 3, 3}).transpose(2, 3), args[1]};
  KILN_CHECK_EQUAL(run(g, k, c, transposed)[0], interpret(g, transposed)[0]);

  // A long run is split back in two at a dim boundary, the inner part up to 65,536.
  Graph r;
  const Value z = r.add_input("z", f32({2, 300, 300}));
  r.set_outputs({op(r, "relu", {z})});
  const Kernel kr = lower_pointwise(r, compute_nodes(r));
  const std::vector<Tensor> zs = {randn({2, 300, 300})};
  const Tensor zo = make_tensor({2, 300, 300}, DType::f32);
  const KernelCall rc = kernel_call(kr, zs, {&zo, 1});
  CHECK(std::vector<int64_t>(rc.args.begin(), rc.args.begin() + 3) == std::vector<int64_t>{1, 600, 300});
  const CompiledKernel crelu = compile_cpp(render_cpp(kr), cpp_symbol(kr));
  KILN_CHECK_EQUAL(run(r, kr, crelu, zs)[0], interpret(r, zs)[0]);

  // Reductions merge kept dims and reduced dims separately.
  Graph s;
  const Value w = s.add_input("w", f32({4, 8, 3, 3}));
  s.set_outputs({op(s, "sum", {w}, {{"dims", std::vector<int64_t>{2, 3}}, {"keepdim", false}})});
  const Kernel ks = lower_reduction(s, compute_nodes(s));
  const std::vector<Tensor> ws = {randn({4, 8, 3, 3})};
  const Tensor so = make_tensor({4, 8}, DType::f32);
  const KernelCall sc = kernel_call(ks, ws, {&so, 1});
  CHECK(std::vector<int64_t>(sc.args.begin(), sc.args.begin() + 4) == std::vector<int64_t>{1, 32, 1, 9});
  const CompiledKernel csum = compile_cpp(render_cpp(ks), cpp_symbol(ks));
  KILN_CHECK_CLOSE(run(s, ks, csum, ws)[0], interpret(s, ws)[0], 1e-6, 1e-6);
}

TEST_CASE("codegen: column reductions read rows of outputs and sum in the row nest's order", "[codegen]") {
  // mean(x * 3, dim 0) over x [33, 150]: contiguous, the kept dim is unit-stride and the
  // reduced one is not, so the kernel takes its column nest (blocks of 64 outputs: two whole
  // and a partial one); the same x stored transposed takes the row nest. Each output sums
  // its 33 elements in the same order either way: equal bit for bit.
  TempCache cache;
  Graph g;
  const Value x = g.add_input("x", f32({33, 150}));
  g.set_outputs({op(g, "mean", {op(g, "mul", {x, number(g, 3.0)})}, {{"dims", std::vector<int64_t>{0}}})});
  const Kernel k = lower_reduction(g, compute_nodes(g));
  const std::string source = render_cpp(k);
  INFO(source);
  CHECK_THAT(source, Contains("_col[64]"));
  const CompiledKernel c = compile_cpp_batch({{source, cpp_symbol(k)}}).at(0);
  const Tensor rows = randn({33, 150});
  const Tensor columns = rows.t().contiguous().t();  // the same values, stored transposed
  REQUIRE(columns.strides()[0] == 1);
  const Tensor by_column = run(g, k, c, {rows})[0];
  const Tensor by_row = run(g, k, c, {columns})[0];
  KILN_CHECK_EQUAL(by_column, by_row);
  KILN_CHECK_CLOSE(by_column, mean(rows * 3, {0}), 1e-6, 1e-6);
}
