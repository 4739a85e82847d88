// The CUDA renderer's kernels run on the CPU through the emulator (cuda_emulator.h) and
// give the C++ renderer's results: bit for bit for pointwise kernels (same scalar
// functions, any launch), to rounding for reductions (the block combines partial sums in
// another order). Without a GPU this is what checks the CUDA kernels' indexing, the vector
// path and its run-time conditions, and the launches max-autotune may choose.
#include <map>

#include "compiler/codegen/cpp.h"
#include "compiler/codegen/lower.h"
#include "compiler/codegen/cpp_run.h"
#include "compiler/compiler_testing.h"
#include "compiler/fusion.h"
#include "compiler/passes/passes.h"
#include "compiler/trace.h"
#include "cuda/cuda_emulator.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using namespace kiln::compiler::codegen;
using Catch::Matchers::Contains;
using kiln::testing::compute_nodes;
using kiln::testing::emulate_cuda;
using kiln::testing::EmulatedKernel;
using kiln::testing::number;
using kiln::testing::op;
using kiln::testing::run_emulated;
using kiln::testing::TempCache;

namespace {

TensorType type(Shape shape, DType dtype = DType::f32) { return TensorType{.dtype = dtype, .shape = std::move(shape)}; }

// Random contents for a tensor of `t`'s type (its layout too).
Tensor random_of(const TensorType& t) {
  const Tensor r = randn(t.shape);
  Tensor v;
  if (t.dtype == DType::boolean) v = gt(r, 0.0);
  else if (is_floating(t.dtype)) v = r.to(t.dtype);
  else v = mul(r, 20.0).to(t.dtype);
  Tensor out = make_tensor(t.shape, t.dtype, Device::cpu(), t.memory_format());
  out.copy_(v);
  return out;
}

// The tensors of the kernel's input buffers (graph values given by `value_of`) and fresh
// outputs of the group values' types, for both renderers.
struct Bound {
  std::vector<Tensor> inputs, cpp_out, cuda_out;
};
Bound bind(const Graph& g, const Kernel& k) {
  Bound b;
  for (int32_t i : k.input_buffers()) {
    const Buffer& buf = k.buffers[static_cast<size_t>(i)];
    b.inputs.push_back(random_of(g.nodes()[static_cast<size_t>(buf.node)].outputs.at(static_cast<size_t>(buf.output_index))));
  }
  for (int32_t o : k.output_buffers()) {
    const Buffer& buf = k.buffers[static_cast<size_t>(o)];
    const TensorType& t = g.nodes()[static_cast<size_t>(buf.node)].outputs.at(static_cast<size_t>(buf.output_index));
    b.cpp_out.push_back(make_tensor(t.shape, t.dtype, Device::cpu(), t.memory_format()));
    b.cuda_out.push_back(make_tensor(t.shape, t.dtype, Device::cpu(), t.memory_format()));
  }
  return b;
}

// The kernel of every compute node of g, as one group.
Kernel lower(const Graph& g, bool reduction = false) {
  return reduction ? lower_reduction(g, compute_nodes(g)) : lower_pointwise(g, compute_nodes(g));
}

// Runs both renderings of `k` on the same inputs and compares (exact for pointwise).
// Returns the vector groups the CUDA kernel ran.
int64_t check_same(const Kernel& k, const CompiledKernel& cpp, const EmulatedKernel& cuda,
                   const Bound& b, const LaunchTuning& tuning = {}) {
  INFO("kernel IR:\n" << print(k));
  run_kernel(cpp, k, b.inputs, b.cpp_out);
  const int64_t groups = run_emulated(cuda, b.inputs, b.cuda_out, tuning);
  for (size_t i = 0; i < b.cpp_out.size(); ++i) {
    if (k.num_reduced == 0) KILN_CHECK_EQUAL(b.cuda_out[i], b.cpp_out[i]);
    else KILN_CHECK_CLOSE(b.cuda_out[i], b.cpp_out[i], 1e-5, 1e-6);
  }
  return groups;
}

}  // namespace

TEST_CASE("cuda emulated: pointwise kernels equal the C++ kernels on every layout, vectorized where aligned",
          "[cuda_emulated]") {
  TempCache cache;
  // relu(permute(x) * 2 + y): x [n, m] read transposed (stride n innermost: no vectors),
  // y [1, n]... and z = x + w, both contiguous (vectors where the rows allow).
  Graph g;
  const int64_t rows = 6, cols = 16;
  const Value x = g.add_input("x", type({rows, cols}));
  const Value w = g.add_input("w", type({1, cols}));
  const Value r = op(g, "relu", {op(g, "add", {op(g, "mul", {x, number(g, 2.0)}), w})});
  g.set_outputs({r});
  const Kernel k = lower(g);
  const std::string source = render_cuda(k);
  CHECK_THAT(source, Contains("kiln_vec<float>") && Contains("kiln_aligned(in0)") && Contains("<= 0xffffffffLL"));
  const CompiledKernel cpp = compile_cpp(render_cpp(k), cpp_symbol(k));
  const EmulatedKernel cuda = emulate_cuda(k);

  SECTION("contiguous and aligned: the vector path, under every launch max-autotune may take") {
    const Bound b = bind(g, k);
    CHECK(check_same(k, cpp, cuda, b) == rows * cols / 4);
    for (const LaunchTuning t : {LaunchTuning{64, 2}, LaunchTuning{128, 8}, LaunchTuning{256, 1}}) {
      Bound again = bind(g, k);
      again.inputs = b.inputs;
      CHECK(check_same(k, cpp, cuda, again, t) == rows * cols / 4);
    }
  }
  SECTION("each of the vector path's conditions alone sends a call down the one-element path") {
    Bound b = bind(g, k);
    // Rows of stride 18 from an aligned start: the stride alone.
    b.inputs[0] = randn({rows, 18}).slice(1, 0, cols);
    CHECK(check_same(k, cpp, cuda, b) == 0);
    // Rows of stride 20 from an aligned start: every condition holds.
    b.inputs[0] = randn({rows, 20}).slice(1, 0, cols);
    CHECK(check_same(k, cpp, cuda, b) == rows * cols / 4);
    // The start 1 or 2 elements past alignment (the address alone: the tensor's own
    // offset is in its pointer), and 4 past, which is aligned again.
    for (int64_t start : {1, 2, 4}) {
      b.inputs[0] = randn({rows * cols + 4}).slice(0, start, start + rows * cols).view({rows, cols});
      CHECK(check_same(k, cpp, cuda, b) == (start == 4 ? rows * cols / 4 : 0));
    }
  }
  SECTION("an offset inside the kernel's own view: a slice the kernel reads") {
    // The slice is a view step of the kernel (its offset an argument), not of the tensor.
    for (int64_t start : {2, 4}) {
      Graph sg;
      const Value in = sg.add_input("a", type({rows, cols + 4}));
      const Value part = op(sg, "slice", {in}, {{"dim", int64_t{1}}, {"start", start}, {"end", start + cols}, {"step", int64_t{1}}});
      sg.set_outputs({op(sg, "relu", {part})});
      const Kernel ks = lower(sg);
      const CompiledKernel cs = compile_cpp(render_cpp(ks), cpp_symbol(ks));
      const EmulatedKernel es = emulate_cuda(ks);
      INFO("slice start " << start);
      CHECK(check_same(ks, cs, es, bind(sg, ks)) == (start == 4 ? rows * cols / 4 : 0));
    }
  }
  SECTION("a transposed input runs one element per thread") {
    Bound b = bind(g, k);
    b.inputs[0] = randn({cols, rows}).t();
    CHECK(check_same(k, cpp, cuda, b) == 0);
  }
  SECTION("an innermost size that is not a multiple of 4 runs one element per thread") {
    Graph odd;
    const Value a = odd.add_input("a", type({3, 7}));
    odd.set_outputs({op(odd, "relu", {op(odd, "add", {op(odd, "mul", {a, number(odd, 2.0)}), odd.add_input("c", type({1, 7}))})})});
    const Kernel ko = lower(odd);
    REQUIRE(render_cuda(ko) == render_cuda(k));  // the same structure: one compiled kernel
    CHECK(check_same(ko, cpp, cuda, bind(odd, ko)) == 0);
  }
}

TEST_CASE("cuda emulated: channels_last, broadcast, mixed dtypes and 16-bit floats", "[cuda_emulated]") {
  TempCache cache;
  SECTION("an NHWC batch-norm apply: x * scale[C] + shift[C] then relu, C innermost") {
    Graph g;
    TensorType xt = type({2, 8, 3, 5});
    xt.layout = MemoryFormat::channels_last;
    const Value x = g.add_input("x", xt);
    const Value s = g.add_input("s", type({1, 8, 1, 1}));
    const Value t = g.add_input("t", type({1, 8, 1, 1}));
    g.set_outputs({op(g, "relu", {op(g, "add", {op(g, "mul", {x, s}), t})})});
    const Kernel k = lower(g);
    const CompiledKernel cpp = compile_cpp(render_cpp(k), cpp_symbol(k));
    const EmulatedKernel cuda = emulate_cuda(k);
    const Bound b = bind(g, k);
    REQUIRE(b.cpp_out[0].suggest_memory_format() == MemoryFormat::channels_last);
    CHECK(check_same(k, cpp, cuda, b) == 2 * 8 * 3 * 5 / 4);
  }
  SECTION("f64 operands: vectors of 32 bytes need 16-byte aligned addresses") {
    Graph g;
    const Value y = g.add_input("y", type({4, 12}, DType::f64));
    g.set_outputs({op(g, "neg", {y})});
    const Kernel k = lower(g);
    const CompiledKernel cpp = compile_cpp(render_cpp(k), cpp_symbol(k));
    const EmulatedKernel cuda = emulate_cuda(k);
    Bound b = bind(g, k);
    CHECK(check_same(k, cpp, cuda, b) == 4 * 12 / 4);
    // The tensor's own offset is in its pointer: 1 element (8 bytes) past alignment is
    // misaligned, 2 (16 bytes) aligned.
    for (int64_t start : {1, 2}) {
      b.inputs[0] = randn({4 * 12 + 2}, {.dtype = DType::f64}).slice(0, start, start + 4 * 12).view({4, 12});
      CHECK(check_same(k, cpp, cuda, b) == (start == 2 ? 4 * 12 / 4 : 0));
    }
  }
  SECTION("relu's backward: where(gt(y, 0), g, 0) with a bool mask between, f64") {
    Graph g;
    const Value y = g.add_input("y", type({4, 12}, DType::f64));
    const Value gr = g.add_input("g", type({4, 12}, DType::f64));
    const Value mask = op(g, "gt", {y, number(g, 0.0)});
    g.set_outputs({op(g, "where", {mask, gr, number(g, 0.0)}), mask});
    const Kernel k = lower(g);
    const CompiledKernel cpp = compile_cpp(render_cpp(k), cpp_symbol(k));
    const EmulatedKernel cuda = emulate_cuda(k);
    CHECK(check_same(k, cpp, cuda, bind(g, k)) == 4 * 12 / 4);
  }
  SECTION("bf16 and f16 inputs added into f32, and an i64 output") {
    Graph g;
    const Value a = g.add_input("a", type({5, 8}, DType::bf16));
    const Value c = g.add_input("c", type({5, 8}, DType::f16));
    const Value sum = op(g, "add", {op(g, "cast", {a}, {{"dtype", DType::f32}}), op(g, "cast", {c}, {{"dtype", DType::f32}})});
    g.set_outputs({sum, op(g, "cast", {op(g, "mul", {sum, number(g, 10.0)})}, {{"dtype", DType::i64}})});
    const Kernel k = lower(g);
    const CompiledKernel cpp = compile_cpp(render_cpp(k), cpp_symbol(k));
    const EmulatedKernel cuda = emulate_cuda(k);
    CHECK(check_same(k, cpp, cuda, bind(g, k)) == 5 * 8 / 4);
  }
}

TEST_CASE("cuda emulated: reductions combine through shuffles and shared memory as the C++ kernels sum",
          "[cuda_emulated]") {
  TempCache cache;
  SECTION("row sums, one block per row, the reduced extent past one warp and not a power of two") {
    Graph g;
    const Value a = g.add_input("a", type({5, 300}));
    g.set_outputs({op(g, "sum", {op(g, "mul", {a, a})}, {{"dims", std::vector<int64_t>{1}}})});
    const Kernel k = lower(g, true);
    REQUIRE(k.num_reduced == 1);
    const CompiledKernel cpp = compile_cpp(render_cpp(k), cpp_symbol(k));
    const EmulatedKernel cuda = emulate_cuda(k);
    check_same(k, cpp, cuda, bind(g, k));
  }
  SECTION("an NHWC batch norm's channel sums over N, H and W, and the maxima (exact)") {
    Graph g;
    TensorType xt = type({2, 8, 3, 5});
    xt.layout = MemoryFormat::channels_last;
    const Value x = g.add_input("x", xt);
    g.set_outputs({op(g, "amax", {x}, {{"dims", std::vector<int64_t>{0, 2, 3}}})});
    const Kernel k = lower(g, true);
    const CompiledKernel cpp = compile_cpp(render_cpp(k), cpp_symbol(k));
    const EmulatedKernel cuda = emulate_cuda(k);
    const Bound b = bind(g, k);
    check_same(k, cpp, cuda, b);
    KILN_CHECK_EQUAL(b.cuda_out[0], b.cpp_out[0]);
  }
}

// Every pointwise kernel of the compiled ResNet-50 training step of the NVRTC check
// (batch 2, 32x32), emulated against its C++ kernel on random inputs.
TEST_CASE("cuda emulated: every pointwise kernel of a ResNet-50 training step equals its C++ kernel",
          "[cuda_emulated]") {
  TempCache cache;
  const Graph g = kiln::testing::resnet50_step_graph();
  // One kernel per distinct source; the first group of each is run.
  std::map<std::string, const Kernel*> first;
  std::vector<ScheduleStep> groups = fuse(g);
  for (const ScheduleStep& group : groups)
    if (group.kind == ScheduleStep::pointwise) first.emplace(render_cuda(group.kernel), &group.kernel);
  REQUIRE(first.size() >= 3);
  std::vector<std::pair<std::string, std::string>> cpp_sources;
  for (const auto& [source, k] : first) cpp_sources.push_back({render_cpp(*k), cpp_symbol(*k)});
  const std::vector<CompiledKernel> cpp = compile_cpp_batch(cpp_sources, 2);
  int64_t vectorized = 0;
  size_t i = 0;
  for (const auto& [source, k] : first) {
    const EmulatedKernel cuda = emulate_cuda(*k);
    vectorized += check_same(*k, cpp[i++], cuda, bind(g, *k)) > 0;
  }
  WARN(first.size() << " distinct pointwise kernels emulated, " << vectorized << " took the vector path");
  CHECK(vectorized > 0);
}

// Every kernel of a compiled MLP training step (batch 3): the bias gradients are
// reductions over the batch of transposed reads, one block per output.
TEST_CASE("cuda emulated: every kernel of an MLP training step equals its C++ kernel", "[cuda_emulated]") {
  TempCache cache;
  manual_seed(1);
  auto model = std::make_shared<models::MLP>(std::vector<int64_t>{48, 40, 24, 10});
  const Tensor x = randn({3, 48});
  const Tensor y = randint(0, 10, {3});
  const Graph g = kiln::testing::training_step_graph(*model, x, y);
  const std::vector<ScheduleStep> groups = fuse(g);
  std::vector<const Kernel*> kernels;
  for (const ScheduleStep& group : groups)
    if (group.is_kernel()) kernels.push_back(&group.kernel);
  int64_t reductions = 0;
  for (const Kernel* k : kernels) reductions += k->num_reduced > 0;
  REQUIRE(reductions >= 3);
  std::vector<std::pair<std::string, std::string>> sources;
  for (const Kernel* k : kernels) sources.push_back({render_cpp(*k), cpp_symbol(*k)});
  const std::vector<CompiledKernel> cpp = compile_cpp_batch(sources, 2);
  for (size_t i = 0; i < kernels.size(); ++i) check_same(*kernels[i], cpp[i], emulate_cuda(*kernels[i]), bind(g, *kernels[i]));
}
