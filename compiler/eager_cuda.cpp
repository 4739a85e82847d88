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
// value) make a kernel per distinct value. The optimizer updates' CUDA kernels are small
// graphs lowered the same way (below).
#if defined(KILN_HAVE_CUDA)

#include <bit>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "compiler/codegen/cuda_run.h"
#include "compiler/codegen/lower.h"
#include "compiler/ir/graph.h"
#include "core/cuda.h"
#include "core/ops/factory.h"
#include "core/ops/optim_ops.h"
#include "core/ops/elementwise.h"
#include "core/ops/reduce.h"
#include "core/registry.h"
#include "kernels/cuda/optim.h"

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
      type.layout = Layout::contiguous;
      inputs.push_back(g.add_input(fmt::format("x{}", i), type));
    }
    g.set_outputs(g.add_op(op.name, inputs, attrs));
    return g;
  });
  launch_graph_kernel(k, defined, out);
}

// ---- optimizer updates: one generated kernel per parameter ----
//
// The update is written as a graph of elementwise ops that lowers to one kernel computing
// the CPU kernel's arithmetic (kernels/cpu/optim_ops.cpp) in the same order and dtype: the
// factors that depend only on hyperparameters are computed in f64 on the host, as there,
// and travel as 0-d inputs (one small copy per call), so a schedule changing the lr never
// compiles a new kernel.

TensorType scalar_type(Device device) { return TensorType{DType::f64, {}, device}; }

std::string shape_pattern(const Tensor& t) {
  std::string p = fmt::format("{}:", t.dtype());
  for (int64_t s : t.shape()) p += s == 1 ? '1' : 'n';
  return p;
}

// The host factors as 0-d views of one device tensor. Every parameter of an optimizer
// step has the same factors, so the last few tensors are kept (they are never written, so
// sharing them between queued kernels is safe): one small copy per step, not per parameter.
// Kept per stream (the copy and the kernels reading it, and the block's reuse once it is
// dropped, are ordered on that stream) and per bit pattern (NaN has no order for a map's
// key, and -0 would find a kept 0).
std::vector<Tensor> device_scalars(const std::vector<double>& values, Device device) {
  static std::mutex mutex;
  static std::map<std::tuple<int, void*, std::vector<uint64_t>>, Tensor> recent;
  std::vector<uint64_t> bits;
  for (double v : values) bits.push_back(std::bit_cast<uint64_t>(v));
  const auto key = std::tuple{device.index, cuda::current_stream(device.index).handle, bits};
  Tensor all;
  {
    std::lock_guard lock(mutex);
    auto it = recent.find(key);
    if (it != recent.end()) {
      all = it->second;
    } else {
      if (recent.size() >= 16) recent.clear();
      all = from_vector<double>(values).to(device);
      recent.emplace(key, all);
    }
  }
  std::vector<Tensor> out;
  for (size_t i = 0; i < values.size(); ++i) out.push_back(all.select(0, static_cast<int64_t>(i)));
  return out;
}

// in: (param, grad, momentum_buffer?, lr, momentum, dampening, weight_decay).
void run_sgd(Span in, const Tensor& p_out, const Tensor& buf_out, const Attrs& attrs) {
  const Tensor& p = in[0];
  if (p.numel() == 0) return;
  const double lr = in[3].item<double>(), momentum = in[4].item<double>(), dampening = in[5].item<double>(),
               weight_decay = in[6].item<double>();
  const bool nesterov = attrs.b("nesterov"), maximize = attrs.b("maximize"), first = attrs.b("first");
  // Momentum 0 (a schedule's) leaves an existing buffer as it is, as PyTorch skips it; 0
  // in the parameters' dtype, as the CPU kernel tests it (a tiny f64 momentum rounds to an
  // f32 0).
  const bool zero_momentum = p.dtype() == DType::f64 ? momentum == 0 : static_cast<float>(momentum) == 0.0f;
  const bool resting = in[2].defined() && zero_momentum;
  const bool has_buf = in[2].defined() && !resting, decay = weight_decay != 0;
  if (resting && buf_out.defined() && buf_out.storage() != in[2].storage()) Tensor(buf_out).copy_(in[2]);
  const Device device = p.device();
  const std::string key = fmt::format("sgd|{}|{}{}{}{}{}", shape_pattern(p), has_buf, decay, nesterov, maximize, first);
  const GraphKernel& k = graph_kernel(key, false, device, "sgd_update", [&] {
    Graph g;
    TensorType type = TensorType::of(p);
    type.layout = Layout::contiguous;
    const Value P = g.add_input("param", type), G = g.add_input("grad", type);
    const Value B = has_buf ? g.add_input("momentum_buffer", type) : Value{};
    const Value LR = g.add_input("lr", scalar_type(device)), WD = g.add_input("weight_decay", scalar_type(device)),
                M = g.add_input("momentum", scalar_type(device)), DAMP = g.add_input("one_minus_dampening", scalar_type(device));
    Value d = maximize ? g.add_op1("neg", {G}) : G;
    if (decay) d = g.add_op1("add", {d, g.add_op1("mul", {WD, P})});
    std::vector<Value> outputs;
    if (has_buf) {
      const Value buf = first ? g.add_op1("clone", {d})
                              : g.add_op1("add", {g.add_op1("mul", {M, B}), g.add_op1("mul", {DAMP, d})});
      d = nesterov ? g.add_op1("add", {d, g.add_op1("mul", {M, buf})}) : buf;
      outputs.push_back(buf);
    }
    outputs.insert(outputs.begin(), g.add_op1("sub", {P, g.add_op1("mul", {LR, d})}));
    g.set_outputs(outputs);
    return g;
  });
  const std::vector<Tensor> s = device_scalars({lr, weight_decay, momentum, 1.0 - dampening}, device);
  std::vector<Tensor> inputs = {p, in[1]};
  if (has_buf) inputs.push_back(in[2]);
  inputs.insert(inputs.end(), s.begin(), s.end());
  std::vector<Tensor> outputs = {p_out};
  if (has_buf) outputs.push_back(buf_out);
  launch_graph_kernel(k, inputs, outputs);
}

void sgd_update_inplace(Span in, Span, const Attrs& attrs) { run_sgd(in, in[0], in[2], attrs); }
void sgd_update(Span in, Span out, const Attrs& attrs) {
  run_sgd(in, out[0], out.size() > 1 ? out[1] : Tensor(), attrs);
}

// in: (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq?, step, lr, beta1, beta2, eps,
// weight_decay); out: the new param, exp_avg, exp_avg_sq and max_exp_avg_sq.
void run_adamw(Span in, std::span<const Tensor> out, const Attrs& attrs) {
  const Tensor& p = in[0];
  if (p.numel() == 0) return;
  const double step = in[5].item<double>(), lr = in[6].item<double>(), beta1 = in[7].item<double>(),
               beta2 = in[8].item<double>(), eps = in[9].item<double>(), weight_decay = in[10].item<double>();
  const bool maximize = attrs.b("maximize"), amsgrad = in[4].defined();
  const Device device = p.device();
  const std::string key = fmt::format("adamw|{}|{}{}", shape_pattern(p), maximize, amsgrad);
  const GraphKernel& k = graph_kernel(key, false, device, "adamw_update", [&] {
    Graph g;
    TensorType type = TensorType::of(p);
    type.layout = Layout::contiguous;
    const Value P = g.add_input("param", type), G = g.add_input("grad", type), M = g.add_input("exp_avg", type),
                V = g.add_input("exp_avg_sq", type);
    const Value VMAX = amsgrad ? g.add_input("max_exp_avg_sq", type) : Value{};
    std::vector<Value> f;
    for (const char* name : {"decay", "one_minus_beta1", "beta2", "one_minus_beta2", "step_size", "correction2_sqrt", "eps"})
      f.push_back(g.add_input(name, scalar_type(device)));
    const Value grad = maximize ? g.add_op1("neg", {G}) : G;
    const Value param = g.add_op1("mul", {P, f[0]});
    const Value m = g.add_op1("add", {M, g.add_op1("mul", {f[1], g.add_op1("sub", {grad, M})})});
    const Value v = g.add_op1("add", {g.add_op1("mul", {V, f[2]}), g.add_op1("mul", {g.add_op1("mul", {f[3], grad}), grad})});
    const Value second = amsgrad ? g.add_op1("maximum", {VMAX, v}) : v;
    const Value denom = g.add_op1("add", {g.add_op1("div", {g.add_op1("sqrt", {second}), f[5]}), f[6]});
    const Value new_p = g.add_op1("sub", {param, g.add_op1("mul", {f[4], g.add_op1("div", {m, denom})})});
    std::vector<Value> outputs = {new_p, m, v};
    if (amsgrad) outputs.push_back(second);
    g.set_outputs(outputs);
    return g;
  });
  const std::vector<Tensor> s = device_scalars(
      {1.0 - lr * weight_decay, 1.0 - beta1, beta2, 1.0 - beta2, lr / (1.0 - std::pow(beta1, step)),
       std::sqrt(1.0 - std::pow(beta2, step)), eps},
      device);
  std::vector<Tensor> inputs = {p, in[1], in[2], in[3]};
  if (amsgrad) inputs.push_back(in[4]);
  inputs.insert(inputs.end(), s.begin(), s.end());
  std::vector<Tensor> outputs(out.begin(), out.begin() + (amsgrad ? 4 : 3));
  launch_graph_kernel(k, inputs, outputs);
}

void adamw_update_inplace(Span in, Span, const Attrs& attrs) {
  const Tensor out[] = {in[0], in[2], in[3], in[4]};
  run_adamw(in, out, attrs);
}
void adamw_update(Span in, Span out, const Attrs& attrs) { run_adamw(in, out, attrs); }

// The multi-tensor SGD forms run a group's parameters in a few launches of one kernel
// (kernels/cuda/optim.h: up to 24 parameters each, the CPU kernel's numbers) where their
// tensors are dense f32 or f64 in one memory order; the others through the
// per-parameter kernel above (one launch per parameter, the single op's numbers). AdamW's
// multi forms likewise, up to 16 parameters a launch.
void sgd_update_multi_inplace(Span in, Span, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  const bool has_buf = in[static_cast<size_t>(2 * n)].defined();
  const Span params = in.subspan(0, static_cast<size_t>(n));
  const Span buffers = has_buf ? in.subspan(static_cast<size_t>(2 * n), static_cast<size_t>(n)) : Span{};
  for (int64_t k : cuda::sgd_update_multi_tensor(in, params, buffers, attrs)) {
    const std::vector<Tensor> single = sgd_single_inputs(in, n, k);
    run_sgd(single, single[0], single[2], attrs);
  }
}
// out: (new_param x N, new_momentum_buffer x N if given).
void sgd_update_multi(Span in, Span out, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  const Span params = out.subspan(0, static_cast<size_t>(n));
  const Span buffers = static_cast<int64_t>(out.size()) > n ? out.subspan(static_cast<size_t>(n)) : Span{};
  for (int64_t k : cuda::sgd_update_multi_tensor(in, params, buffers, attrs)) {
    const Tensor buf = static_cast<int64_t>(out.size()) > n ? out[static_cast<size_t>(n + k)] : Tensor();
    run_sgd(sgd_single_inputs(in, n, k), out[static_cast<size_t>(k)], buf, attrs);
  }
}
void adamw_update_multi_inplace(Span in, Span, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  const auto role = [&](int64_t r) { return in.subspan(static_cast<size_t>(r * n), static_cast<size_t>(n)); };
  const bool amsgrad = in[static_cast<size_t>(4 * n)].defined();
  for (int64_t k : cuda::adamw_update_multi_tensor(in, {role(0), role(2), role(3), amsgrad ? role(4) : Span{}}, attrs)) {
    const std::vector<Tensor> single = adamw_single_inputs(in, n, k);
    const Tensor out[] = {single[0], single[2], single[3], single[4]};
    run_adamw(single, out, attrs);
  }
}
// out: (new_param x N, new_exp_avg x N, new_exp_avg_sq x N, new_max_exp_avg_sq x N if given).
void adamw_update_multi(Span in, Span out, const Attrs& attrs) {
  const int64_t n = attrs.i("count");
  const auto role = [&](int64_t r) {
    return static_cast<int64_t>(out.size()) >= (r + 1) * n ? out.subspan(static_cast<size_t>(r * n), static_cast<size_t>(n))
                                                            : Span{};
  };
  for (int64_t k : cuda::adamw_update_multi_tensor(in, {role(0), role(1), role(2), role(3)}, attrs)) {
    std::vector<Tensor> outs;
    for (int64_t role = 0; role < 4; ++role) {
      const auto i = static_cast<size_t>(role * n + k);
      outs.push_back(i < out.size() ? out[i] : Tensor());
    }
    run_adamw(adamw_single_inputs(in, n, k), outs, attrs);
  }
}

// The generated kernel of each op the code generator computes (codegen::lowers_pointwise
// and lowers_reduction read the op's registry entry).
KernelFn generated_kernel(const OpDef& op) {
  const bool reduction = codegen::lowers_reduction(op);
  if (!reduction && !codegen::lowers_pointwise(op)) return {};
  return [&op, reduction](Span in, Span out, const Attrs& attrs) { run(op, in, out, attrs, reduction); };
}

void register_all() {
  register_kernel_maker(DeviceType::cuda, generated_kernel);
  register_kernel("sgd_update_", DeviceType::cuda, sgd_update_inplace);
  register_kernel("sgd_update", DeviceType::cuda, sgd_update);
  register_kernel("adamw_update_", DeviceType::cuda, adamw_update_inplace);
  register_kernel("adamw_update", DeviceType::cuda, adamw_update);
  register_kernel("sgd_update_multi_", DeviceType::cuda, sgd_update_multi_inplace);
  register_kernel("sgd_update_multi", DeviceType::cuda, sgd_update_multi);
  register_kernel("adamw_update_multi_", DeviceType::cuda, adamw_update_multi_inplace);
  register_kernel("adamw_update_multi", DeviceType::cuda, adamw_update_multi);
}

struct Registrar {
  Registrar() { register_all(); }
} registrar;

}  // namespace
}  // namespace kiln::compiler

#endif
