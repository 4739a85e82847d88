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
// value) make a kernel per distinct value. (The optimizer updates' CUDA kernels are
// kernels/cuda/optim.cpp's, on the arithmetic of kernels/scalar.h.)
#if defined(KILN_HAVE_CUDA)

#include <functional>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "compiler/codegen/cuda_run.h"
#include "compiler/codegen/lower.h"
#include "compiler/ir/graph.h"
#include "core/cuda.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/registry.h"

namespace kiln::compiler {
namespace {

using codegen::Buffer;
using codegen::Kernel;
using Span = std::span<const Tensor>;

// A kernel generated from a small graph of elementwise ops (or one reduction), with the
// graph input each of its input buffers reads.
struct GraphKernel {
  Kernel kernel;
  std::vector<int32_t> input_of_buffer;  // per input buffer, in order: an index into g.inputs()
  // Per output buffer, in order: an index into g.outputs() (the kernel stores its outputs in
  // node order, which need not be the graph's output order).
  std::vector<int32_t> output_of_buffer;
  codegen::CudaFunction function;
};

GraphKernel compile_graph(const Graph& g, bool reduction, Device device, const char* what) {
  std::vector<int32_t> nodes;
  for (size_t n = 0; n < g.nodes().size(); ++n)
    if (g.nodes()[n].kind == NodeKind::op) nodes.push_back(static_cast<int32_t>(n));
  GraphKernel e;
  e.kernel = reduction ? codegen::lower_reduction(g, nodes) : codegen::lower_pointwise(g, nodes);
  for (int32_t b : e.kernel.input_buffers()) {
    const int32_t input_node = e.kernel.buffers[static_cast<size_t>(b)].node;
    int32_t index = -1;
    for (size_t i = 0; i < g.inputs().size(); ++i)
      if (g.inputs()[i].node == input_node) index = static_cast<int32_t>(i);
    KILN_CHECK(index >= 0, "{}: CUDA kernel {}: buffer {} reads no graph input", what, e.kernel.name,
               e.kernel.buffers[static_cast<size_t>(b)].name);
    e.input_of_buffer.push_back(index);
  }
  for (int32_t b : e.kernel.output_buffers()) {
    const Buffer& buffer = e.kernel.buffers[static_cast<size_t>(b)];
    int32_t index = -1;
    for (size_t i = 0; i < g.outputs().size(); ++i)
      if (g.outputs()[i].node == buffer.node && g.outputs()[i].output == buffer.output_index)
        index = static_cast<int32_t>(i);
    KILN_CHECK(index >= 0, "{}: CUDA kernel {}: buffer {} stores no graph output", what, e.kernel.name, buffer.name);
    e.output_of_buffer.push_back(index);
  }
  e.function = codegen::load_cuda_kernels({&e.kernel}, device, 1).at(0);
  return e;
}

// The kernel cached under `key` (which must say everything `build` depends on), built and
// compiled on first use.
const GraphKernel& graph_kernel(const std::string& key, bool reduction, Device device, const char* what,
                                const std::function<Graph()>& build) {
  static std::mutex mutex;
  static std::unordered_map<std::string, GraphKernel> cache;
  const std::string full_key = key + "|" + codegen::cuda_arch(device);
  std::lock_guard lock(mutex);
  auto it = cache.find(full_key);
  if (it == cache.end()) it = cache.emplace(full_key, compile_graph(build(), reduction, device, what)).first;
  return it->second;
}

// Launches `k` on the device of outputs[0]: graph_inputs in g.inputs() order (0-d CPU
// tensors are copied to the device first), outputs in the graph's output order.
void launch_graph_kernel(const GraphKernel& k, Span graph_inputs, Span outputs) {
  std::vector<Tensor> bound, stored;
  for (int32_t i : k.input_of_buffer) bound.push_back(graph_inputs[static_cast<size_t>(i)]);
  for (int32_t i : k.output_of_buffer) stored.push_back(outputs[static_cast<size_t>(i)]);
  codegen::run_cuda_kernel(k.function, k.kernel, bound, stored);
}

// What decides an eager op's kernel: the op and attributes, each operand's dtype, rank,
// size-1 dims and wrapped-number flag, the outputs' dtypes and size-1 dims.
std::string eager_key(const OpDef& op, Span in, Span out, const Attrs& attrs) {
  std::string key = fmt::format("{}{}", op.name, compiler::attrs_text(attrs));
  auto add = [&](const Tensor& t) {
    if (!t.defined()) {
      key += "|-";
      return;
    }
    key += fmt::format("|{}{}:", t.dtype(), t.is_wrapped_number() ? "w" : "");
    for (int64_t s : t.shape()) key += s == 1 ? '1' : 'n';
  };
  for (const Tensor& t : in) add(t);
  key += "|>";
  for (const Tensor& t : out) add(t);
  return key;
}

// A reduction to few outputs over many elements would give each output one block (the
// kernel's mapping): a full sum of 256 M floats ran at 2.7 GB/s. It runs in two passes
// instead: the reduced elements, flattened after the kept ones, are split into up to 2048
// parts, each a block of the first pass; the second reduces the parts. Sums and means
// accumulate in f64 (i64 for integers) through both passes, as the one-pass kernel does.
bool run_split_reduction(const OpDef& op, Span in, Span out, const Attrs& attrs) {
  const Tensor& x = in[0];
  const int64_t kept = out[0].numel();
  if (x.numel() == 0 || kept == 0 || kept > 256) return false;
  const int64_t reduced = x.numel() / kept;
  if (reduced < (int64_t{1} << 16)) return false;
  int64_t parts = 0;
  for (int64_t p = 2048; p >= 64 && parts == 0; --p)
    if (reduced % p == 0) parts = p;
  if (parts == 0) return false;
  std::vector<bool> is_reduced(static_cast<size_t>(x.dim()), !attrs.has("dims") || attrs.ints("dims").empty());
  if (attrs.has("dims"))
    for (int64_t d : attrs.ints("dims")) is_reduced[static_cast<size_t>(wrap_dim(d, x.dim(), op.name.c_str()))] = true;
  std::vector<int64_t> order;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!is_reduced[static_cast<size_t>(d)]) order.push_back(d);
  for (int64_t d = 0; d < x.dim(); ++d)
    if (is_reduced[static_cast<size_t>(d)]) order.push_back(d);
  const Tensor flat = x.permute(order).reshape({kept, parts, reduced / parts});
  Tensor result;
  if (op.reduction == Reduction::amax) {
    result = amax(amax(flat, {2}), {1});
  } else if (op.reduction == Reduction::amin) {
    result = amin(amin(flat, {2}), {1});
  } else {
    const DType from = attrs.has("dtype") ? attrs.dtype("dtype") : x.dtype();
    const DType acc = is_floating(from) ? DType::f64 : DType::i64;
    result = sum(sum(flat, {2}, false, acc), {1});
    if (op.reduction == Reduction::mean) result = div(result, Scalar(static_cast<double>(reduced)));
  }
  Tensor(out[0]).copy_(result.reshape(out[0].shape()));
  return true;
}

// An elementwise op whose operands are contiguous tensors of the output's shape (or 0-d
// scalars) computes the same as over 1-d views of them, and a 1-d kernel needs no
// unravelling of its index (a 4-d one divides four times per element): the common case of
// activations, measured at a third of the copy bandwidth on an H200 before this.
bool flat_operands(Span in, Span out, std::vector<Tensor>& flat_in, std::vector<Tensor>& flat_out) {
  const Tensor& first = out[0];
  const Shape& shape = first.shape();
  if (shape.size() <= 1) return false;
  // One dense layout for all (contiguous, or channels_last with the same strides): element
  // i of each operand's memory is the same logical element.
  const bool contiguous = first.is_contiguous();
  if (!contiguous && !first.is_contiguous(MemoryFormat::channels_last)) return false;
  auto same_layout = [&](const Tensor& t) {
    return t.shape() == shape && (contiguous ? t.is_contiguous() : t.strides() == first.strides());
  };
  for (const Tensor& t : out)
    if (!same_layout(t)) return false;
  for (const Tensor& t : in)
    if (t.defined() && t.dim() != 0 && !same_layout(t)) return false;
  auto line = [&](const Tensor& t) { return t.as_strided({t.numel()}, {1}, t.offset()); };
  for (const Tensor& t : in) flat_in.push_back(t.defined() && t.dim() != 0 ? line(t) : t);
  for (const Tensor& t : out) flat_out.push_back(line(t));
  return true;
}

void run(const OpDef& op, Span in_given, Span out_given, const Attrs& attrs, bool reduction) {
  if (out_given[0].numel() == 0) return;
  if (reduction && run_split_reduction(op, in_given, out_given, attrs)) return;
  std::vector<Tensor> flat_in, flat_out;
  const bool flat = !reduction && flat_operands(in_given, out_given, flat_in, flat_out);
  const Span in = flat ? Span(flat_in) : in_given, out = flat ? Span(flat_out) : out_given;
  const Device device = out[0].device();
  std::vector<Tensor> defined;
  for (const Tensor& t : in)
    if (t.defined()) defined.push_back(t);
  const GraphKernel& k = graph_kernel(eager_key(op, in, out, attrs), reduction, device, op.name.c_str(), [&] {
    Graph g;
    std::vector<Value> inputs;
    for (size_t i = 0; i < in.size(); ++i) {
      if (!in[i].defined()) {
        inputs.push_back(Value{});
        continue;
      }
      TensorType type = TensorType::of(in[i]);
      type.device = device;
      type.layout = MemoryFormat::contiguous;
      inputs.push_back(g.add_input(fmt::format("x{}", i), type));
    }
    g.set_outputs(g.add_op(op.name, inputs, attrs));
    return g;
  });
  launch_graph_kernel(k, defined, out);
}

// The generated kernel of each op the code generator computes (codegen::lowers_pointwise
// and lowers_reduction read the op's registry entry).
KernelFn generated_kernel(const OpDef& op) {
  const bool reduction = codegen::lowers_reduction(op);
  if (!reduction && !codegen::lowers_pointwise(op)) return {};
  return [&op, reduction](Span in, Span out, const Attrs& attrs) { run(op, in, out, attrs, reduction); };
}

struct Registrar {
  Registrar() { register_kernel_maker(DeviceType::cuda, generated_kernel); }
} registrar;

}  // namespace
}  // namespace kiln::compiler

#endif
