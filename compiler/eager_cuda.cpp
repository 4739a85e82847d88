// Eager elementwise ops and reductions on CUDA, generated from the compiler's kernel IR.
//
// An eager call of `mul` on CUDA tensors is a one-node graph: it is lowered like a fused
// group (codegen/lower.h), rendered for CUDA (codegen/cuda.h), compiled by NVRTC for the
// device's architecture and loaded; sizes and strides are arguments, so one kernel serves
// every call with the same op, attributes, dtypes and broadcast pattern. So eager CUDA,
// compiled CUDA and the C++ target share one lowering and one scalar header
// (kernels/scalar.h): there is no second set of hand-written CUDA elementwise kernels to
// keep in step. These kernels live in compiler/ because they use its lowering; the
// registry, in core/, does not care which layer registers a kernel.
//
// A 0-d CPU operand (a wrapped number such as the 2 of `x * 2`) is copied to the device
// first; the attributes an op's lowering inlines (add's alpha, clamp's bounds, fill's
// value) make a kernel per distinct value.
#if defined(KILN_HAVE_CUDA)

#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "compiler/codegen/cuda.h"
#include "compiler/codegen/lower.h"
#include "compiler/codegen/run.h"
#include "compiler/ir/graph.h"
#include "core/registry.h"
#include "kernels/cuda/nvrtc.h"
#include "kernels/cuda/runtime.h"

namespace kiln::compiler {
namespace {

using codegen::Kernel;
using Span = std::span<const Tensor>;

struct EagerKernel {
  Kernel kernel;
  std::vector<int32_t> input_of_buffer;  // per input buffer, in order: the op's input index
  cuda::LoadedKernel loaded;
};

// What decides the generated kernel: the op and attributes, each operand's dtype, rank,
// size-1 dims and wrapped-number flag, the output's dtype and shape pattern, the device's
// architecture.
std::string kernel_key(const OpDef& op, Span in, Span out, const Attrs& attrs, const std::string& arch) {
  std::string key = fmt::format("{}{}|{}", op.name, compiler::attrs_text(attrs), arch);
  auto add = [&](const Tensor& t) {
    if (!t.defined()) {
      key += "|-";
      return;
    }
    key += fmt::format("|{}{}{}:", t.dtype(), t.is_wrapped_number() ? "w" : "", t.device().is_cpu() ? "c" : "");
    for (int64_t s : t.shape()) key += s == 1 ? '1' : 'n';
  };
  for (const Tensor& t : in) add(t);
  key += "|>";
  for (const Tensor& t : out) add(t);
  return key;
}

EagerKernel build(const OpDef& op, Span in, const Attrs& attrs, Device device, const std::string& arch,
                  bool reduction) {
  Graph g;
  std::vector<Value> inputs;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].defined()) {
      inputs.push_back(Value{});
      continue;
    }
    TensorType type = TensorType::of(in[i]);
    type.device = device;
    type.layout = Layout::contiguous;
    inputs.push_back(g.add_input(fmt::format("x{}", i), type));
  }
  const std::vector<Value> results = g.add_op(op.name, inputs, attrs);
  g.set_outputs(results);
  const int32_t node = results[0].node;
  EagerKernel e;
  e.kernel = reduction ? codegen::lower_reduction(g, {node}) : codegen::lower_pointwise(g, {node});
  for (int32_t b : e.kernel.input_buffers()) {
    const int32_t input_node = e.kernel.buffers[static_cast<size_t>(b)].node;
    int32_t index = -1;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined() && inputs[i].node == input_node) index = static_cast<int32_t>(i);
    KILN_CHECK(index >= 0, "{}: eager CUDA kernel {}: buffer {} reads no input of the op", op.name,
               e.kernel.name, e.kernel.buffers[static_cast<size_t>(b)].name);
    e.input_of_buffer.push_back(index);
  }
  const std::string source = codegen::render_cuda(e.kernel);
  const std::string symbol = codegen::cuda_symbol(e.kernel);
  const cuda::CudaBinary binary = cuda::compile_cuda(source, symbol, {.arch = arch});
  e.loaded = cuda::load_kernel(binary.cubin, symbol);
  return e;
}

const EagerKernel& kernel_for(const OpDef& op, Span in, Span out, const Attrs& attrs, bool reduction) {
  static std::mutex mutex;
  static std::unordered_map<std::string, EagerKernel> cache;
  const Device device = out[0].device();
  static std::vector<std::string> arch_of_device;
  std::lock_guard lock(mutex);
  if (arch_of_device.empty())
    for (int d = 0; d < cuda::device_count(); ++d) arch_of_device.push_back(cuda::device_properties(d).arch());
  const std::string& arch = arch_of_device.at(static_cast<size_t>(device.index));
  const std::string key = kernel_key(op, in, out, attrs, arch);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, build(op, in, attrs, device, arch, reduction)).first;
  return it->second;
}

void run(const OpDef& op, Span in, Span out, const Attrs& attrs, bool reduction) {
  if (out[0].numel() == 0) return;
  const Device device = out[0].device();
  const EagerKernel& e = kernel_for(op, in, out, attrs, reduction);
  std::vector<Tensor> bound;
  for (int32_t i : e.input_of_buffer) {
    const Tensor& t = in[static_cast<size_t>(i)];
    bound.push_back(t.device() == device ? t : t.to(device));
  }
  codegen::KernelCall call = codegen::kernel_call(e.kernel, bound, out);
  if (call.args.empty()) call.args.push_back(0);  // the argument struct is never empty
  std::vector<void*> params;
  for (void*& b : call.buffers) params.push_back(&b);
  params.push_back(call.args.data());
  const codegen::CudaLaunch shape = codegen::cuda_launch_shape(e.kernel, call.args);
  if (shape.grid == 0) return;
  cuda::launch(e.loaded, {shape.grid, shape.block, shape.shared_bytes}, params.data(), device.index);
}

// One kernel function per op (the registry's kernels are plain function pointers).
constexpr const char* kPointwise[] = {
    "neg", "abs", "sign", "relu", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal", "sin",
    "cos", "tanh", "sigmoid", "silu", "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne",
    "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "where", "clamp", "cast", "clone",
    "gelu", "softplus", "fill"};
constexpr const char* kReductions[] = {"sum", "mean", "amax", "amin"};

template <size_t I>
void pointwise(Span in, Span out, const Attrs& attrs) {
  static const OpDef& op = find_op(kPointwise[I]);
  run(op, in, out, attrs, false);
}
template <size_t I>
void reduce(Span in, Span out, const Attrs& attrs) {
  static const OpDef& op = find_op(kReductions[I]);
  run(op, in, out, attrs, true);
}

template <size_t... I, size_t... R>
void register_all(std::index_sequence<I...>, std::index_sequence<R...>) {
  (register_kernel(kPointwise[I], DeviceType::cuda, pointwise<I>), ...);
  (register_kernel(kReductions[R], DeviceType::cuda, reduce<R>), ...);
}

struct Registrar {
  Registrar() {
    register_all(std::make_index_sequence<std::size(kPointwise)>(),
                 std::make_index_sequence<std::size(kReductions)>());
  }
} registrar;

}  // namespace
}  // namespace kiln::compiler

#endif
