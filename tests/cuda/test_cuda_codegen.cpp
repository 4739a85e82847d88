// The CUDA renderer (compiler/codegen/cuda.h) checked without a GPU: generated kernels
// compile with NVRTC to sm_90 machine code, with no spills, from hand-built groups and from
// every kernel of a compiled ResNet-50 training step.
#include <chrono>
#include <map>

#include "compiler/codegen/cuda.h"
#include "compiler/codegen/lower.h"
#include "compiler/compiler_testing.h"
#include "compiler/fusion.h"
#include "compiler/passes/passes.h"
#include "compiler/trace.h"
#include "kernels/cuda/nvrtc.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using namespace kiln::compiler::codegen;
using Catch::Matchers::Contains;
using kiln::testing::TempCache;

namespace {

TensorType type(Shape shape, DType dtype = DType::f32) { return TensorType{.dtype = dtype, .shape = std::move(shape)}; }

using kiln::testing::compute_nodes;
using kiln::testing::number;
using kiln::testing::op;

// Renders and compiles the kernels in one batch; checks each is spill-free machine code.
void check_compiles(const std::vector<Kernel>& kernels, int jobs = 2) {
  std::vector<std::pair<std::string, std::string>> sources;
  for (const Kernel& k : kernels) sources.push_back({render_cuda(k), cuda_symbol(k)});
  std::vector<cuda::CudaBinary> binaries;
  try {
    binaries = cuda::compile_cuda_batch(sources, {}, jobs);
  } catch (const Error& e) {
    FAIL(e.what());
  }
  REQUIRE(binaries.size() == kernels.size());
  for (size_t i = 0; i < kernels.size(); ++i) {
    INFO(print(kernels[i]) << "\n" << sources[i].first << "\n" << binaries[i].log);
    CHECK(binaries[i].cubin.compare(0, 4, "\x7f" "ELF") == 0);
    CHECK(binaries[i].registers > 0);
    CHECK(binaries[i].spill_store_bytes == 0);
    CHECK(binaries[i].spill_load_bytes == 0);
  }
}

}  // namespace

TEST_CASE("cuda codegen: hand-built pointwise and reduction kernels compile for sm_90", "[nvrtc][cuda_codegen]") {
  TempCache cache;
  std::vector<Kernel> kernels;
  // f32 with a transposed input and a broadcast row; a bool output.
  Graph p;
  const Value x = p.add_input("x", type({5, 7}));
  const Value y = p.add_input("y", type({1, 5}));
  const Value xt = op(p, "permute", {x}, {{"dims", std::vector<int64_t>{1, 0}}});
  const Value r = op(p, "relu", {op(p, "add", {op(p, "mul", {xt, number(p, 2.0)}), y})});
  p.set_outputs({r, op(p, "gt", {r, number(p, 0.5)})});
  kernels.push_back(lower_pointwise(p, compute_nodes(p)));
  // f16 and bf16: computed in f32, rounded after every op; a nan and an infinity constant.
  for (DType d : {DType::f16, DType::bf16}) {
    Graph h;
    const Value a = h.add_input("a", type({4, 6}, d));
    const Value m = op(h, "mul", {op(h, "sigmoid", {a}), number(h, 1.7)});
    const Value c = op(h, "clamp", {m}, {{"min", Scalar(-std::numeric_limits<double>::infinity())}, {"max", Scalar(1.0)}});
    h.set_outputs({op(h, "where", {op(h, "ne", {a, a}), a, c})});
    kernels.push_back(lower_pointwise(h, compute_nodes(h)));
  }
  // bool and integer logic, i64 constants.
  Graph b;
  const Value bx = b.add_input("bx", type({3, 4}, DType::boolean));
  const Value bi = b.add_input("bi", type({4}, DType::i64));
  b.set_outputs({op(b, "logical_and", {bx, op(b, "gt", {bi, number(b, 1.0)})}), op(b, "where", {bx, op(b, "mul", {bi, bi}), number(b, -3.0)})});
  kernels.push_back(lower_pointwise(b, compute_nodes(b)));
  // Reductions: sum of a product over the last dim (f64 accumulator), mean over two dims
  // with keepdim, amax of f16, amax of bool, sum of i32 (i64 accumulator), sum of all.
  Graph s;
  const Value sa = s.add_input("a", type({5, 4}));
  s.set_outputs({op(s, "sum", {op(s, "mul", {sa, sa})}, {{"dims", std::vector<int64_t>{-1}}})});
  kernels.push_back(lower_reduction(s, compute_nodes(s)));
  Graph m;
  const Value mb = m.add_input("b", type({3, 4, 5}));
  m.set_outputs({op(m, "mean", {op(m, "relu", {mb})}, {{"dims", std::vector<int64_t>{0, 2}}, {"keepdim", true}})});
  kernels.push_back(lower_reduction(m, compute_nodes(m)));
  for (DType d : {DType::f16, DType::boolean, DType::i32}) {
    Graph g;
    const Value a = g.add_input("a", type({3, 8}, d));
    g.set_outputs({op(g, d == DType::i32 ? "sum" : "amax", {a}, {{"dims", std::vector<int64_t>{1}}})});
    kernels.push_back(lower_reduction(g, compute_nodes(g)));
  }
  Graph all;
  const Value aa = all.add_input("a", type({6, 3}, DType::bf16));
  all.set_outputs({op(all, "sum", {aa})});
  kernels.push_back(lower_reduction(all, compute_nodes(all)));

  const std::string pointwise = render_cuda(kernels[0]);
  INFO(pointwise);
  CHECK_THAT(pointwise, Contains("struct KilnArgs { long long v["));
  CHECK_THAT(pointwise, Contains("extern \"C\" __global__ void __launch_bounds__(256) " + cuda_symbol(kernels[0]) +
                                 "(float* const out0, bool* const out1, const float* const in0"));
  CHECK_THAT(pointwise, Contains("const KilnArgs args)"));
  const std::string half = render_cuda(kernels[1]);
  CHECK_THAT(half, Contains("float(kiln::Half(kiln::scalar::"));  // the f16 rounding point
  CHECK_THAT(render_cuda(kernels[5]), Contains("kiln_shfl_down(acc"));
  check_compiles(kernels);
}

TEST_CASE("cuda codegen: launch shapes", "[nvrtc][cuda_codegen]") {
  Graph p;
  const Value x = p.add_input("x", type({3, 1000}));
  p.set_outputs({op(p, "neg", {x})});
  const Kernel pk = lower_pointwise(p, compute_nodes(p));
  const std::vector<int64_t> pa = {3, 1000};
  const CudaLaunch pl = cuda_launch_shape(pk, pa);
  CHECK(pl.block == 256);
  // 1000 is a multiple of 4: a thread per 4 elements (the vector path), else one per element.
  CHECK(cuda_pointwise_threads(pk, pa) == 750);
  CHECK(pl.grid == (750 + 255) / 256);
  const std::vector<int64_t> odd = {3, 1001};
  CHECK(cuda_pointwise_threads(pk, odd) == 3003);
  CHECK(cuda_launch_shape(pk, odd).grid == (3003 + 255) / 256);
  const std::vector<int64_t> huge = {1 << 20, 1 << 20};
  CHECK(cuda_launch_shape(pk, huge).grid == 65536);
  const std::vector<int64_t> empty = {0, 1000};
  CHECK(cuda_launch_shape(pk, empty).grid == 0);

  Graph s;
  const Value a = s.add_input("a", type({7, 40}));
  s.set_outputs({op(s, "sum", {a}, {{"dims", std::vector<int64_t>{1}}})});
  const Kernel sk = lower_reduction(s, compute_nodes(s));
  const std::vector<int64_t> small = {7, 40}, big = {7, 100000}, tiny = {7, 3};
  CHECK(cuda_launch_shape(sk, small).grid == 7);
  CHECK(cuda_launch_shape(sk, small).block == 64);
  CHECK(cuda_launch_shape(sk, big).block == 256);
  CHECK(cuda_launch_shape(sk, tiny).block == 32);
  const std::vector<int64_t> too_few = {7};
  CHECK_THROWS_WITH(cuda_launch_shape(sk, too_few), Contains("cuda_launch_shape"));
}

// The check: every kernel of the compiled ResNet-50 training step (batch 2, 32x32,
// as `kiln-ir resnet50 --train --batch 2 --image-size 32 --stage kernels`) renders and
// compiles to sm_90 machine code with zero spill bytes.
TEST_CASE("cuda codegen: every kernel of a ResNet-50 training step compiles for sm_90 without spills",
          "[nvrtc][cuda_codegen]") {
  TempCache cache;
  cuda::clear_cuda_memory_cache();
  const Graph g = kiln::testing::resnet50_step_graph();
  std::vector<Kernel> kernels;
  std::map<std::string, int> kinds;
  for (const ScheduleStep& group : fuse(g)) {
    if (!group.is_kernel()) continue;
    kernels.push_back(group.kernel);
    ++kinds[group.kernel.num_reduced > 0 ? "reduction" : "pointwise"];
  }
  REQUIRE(kernels.size() > 100);
  CHECK(kinds["reduction"] > 0);
  const auto start = std::chrono::steady_clock::now();
  const int64_t before = cuda::nvrtc_invocations();
  check_compiles(kernels, 2);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  WARN(kernels.size() << " kernels (" << kinds["pointwise"] << " pointwise, " << kinds["reduction"]
                      << " reductions), " << cuda::nvrtc_invocations() - before << " NVRTC programs, " << seconds
                      << " s on 2 threads");
}
