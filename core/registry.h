#pragma once
// The op registry. Each op is declared once with its name, its shape and dtype rule
// (`infer`, used by eager calls and by the tracer alike) and its kernels per device.
// Every eager op call goes through call_op, and the one tracing hook sees each call with
// its inputs, attributes and outputs.
#include <array>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/scoped_hook.h"
#include "core/tensor.h"

namespace kiln {

// Attribute values: everything an op is parameterised by that is not a tensor.
using AttrValue =
    std::variant<bool, int64_t, double, Scalar, std::vector<int64_t>, DType, Device, std::string>;
struct Attr {
  std::string name;
  AttrValue value;
};

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<Attr> items) : items_(items) {}
  void set(std::string name, AttrValue value);
  bool has(std::string_view name) const { return find(name) != nullptr; }
  const AttrValue& get(std::string_view name) const;  // error when missing
  // The attribute as a T; an error when it is missing or of another type.
  template <class T> const T& as(std::string_view name) const {
    const T* v = std::get_if<T>(&get(name));
    if (!v) wrong_type(name);
    return *v;
  }
  bool b(std::string_view name) const { return as<bool>(name); }
  int64_t i(std::string_view name) const { return as<int64_t>(name); }
  double f(std::string_view name) const { return as<double>(name); }
  Scalar scalar(std::string_view name) const { return as<Scalar>(name); }
  const std::vector<int64_t>& ints(std::string_view name) const {
    return as<std::vector<int64_t>>(name);
  }
  DType dtype(std::string_view name) const { return as<DType>(name); }
  Device device(std::string_view name) const { return as<Device>(name); }
  const std::string& str(std::string_view name) const { return as<std::string>(name); }
  std::optional<Scalar> optional_scalar(std::string_view name) const;
  const std::vector<Attr>& items() const { return items_; }
  std::string to_string() const;  // "{dim=[1], keepdim=true}"

 private:
  const AttrValue* find(std::string_view name) const;
  [[noreturn]] void wrong_type(std::string_view name) const;
  std::vector<Attr> items_;
};

// What the shape rule sees of a tensor. `defined` is false for an absent optional input.
struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
  bool wrapped_number = false;
  bool defined = true;
  // How an op's output is laid out (its kernel writes into any strides; a shape rule says
  // channels_last only where the kernel keeps that layout fast). Of an input: its
  // suggest_memory_format().
  MemoryFormat memory_format = MemoryFormat::contiguous;
  static TensorMeta of(const Tensor& t);
  std::string str() const;  // "f32[2,3] cpu", "f32[2,3,4,4] cpu channels_last"
};

struct OpDef;
struct BackwardFormula;  // defined by autograd/

// One op call as the tracing hook sees it.
struct OpCall {
  const OpDef& op;
  std::span<const Tensor> inputs;
  const Attrs& attrs;
  std::span<const Tensor> outputs;
  bool inplace = false;  // outputs[0] was given by the caller (`add_`, `copy_`)
  // For in-place calls that autograd records: the inputs that alias the target as they
  // were before the op overwrote them (others undefined), so backward can read them.
  std::span<const Tensor> inputs_before = {};
};

// Shape and dtype rule: validates inputs (throwing kiln::Error naming the op) and says
// what each output is. Outputs go on the device of the inputs unless the rule says so.
using InferFn = std::vector<TensorMeta> (*)(std::span<const TensorMeta> in, const Attrs& attrs);
// A kernel writes the outputs, which the dispatcher allocated from the rule's answer (or
// the caller gave, for in-place forms: then they may be strided or alias an input). Most
// are plain functions; one made from an op's facts (register_kernel_maker) holds the op.
using KernelFn = std::function<void(std::span<const Tensor> in, std::span<const Tensor> out,
                                    const Attrs& attrs)>;
// A view op returns a tensor sharing its input's storage.
using ViewFn = Tensor (*)(const Tensor& in, const Attrs& attrs);

enum class OpKind : uint8_t { compute, view };

// How an elementwise op computes each element of its output. The code generator
// (compiler/codegen/lower.cpp), the CPU kernels and the generated CUDA kernels read it;
// where the element is a function, it is the one of kernels/scalar.h named as the op.
enum class Elementwise : uint8_t {
  none,      // not elementwise
  same,      // scalar::<op>(operands) in their promoted dtype: neg, add, maximum
  floating,  // the same in the promoted dtype made floating (f32 for integers): exp, div
  compare,   // bool scalar::<op>(operands) compared in their promoted dtype: eq, lt
  logical,   // bool scalar::<op>(operands read as bool): logical_and
  convert,   // the operand converted to the output's dtype: cast, clone
  select,    // where(cond, a, b): a or b in their promoted dtype
  clamp,     // the operand bounded by the `min` and `max` attributes
  fill,      // the `value` attribute everywhere (the operand gives only the shape)
  opaque,    // elementwise, but only its own kernels compute it: to_device, dropout
};

// What a reduction op computes; the code generator lowers sum, mean, amax and amin.
enum class Reduction : uint8_t { none, sum, mean, amax, amin, other };

// What autocast does to an op's floating inputs (the mixed-precision issue reads it),
// after PyTorch's autocast op lists:
enum class CastPolicy : uint8_t {
  none,     // runs in the dtypes it is given
  lower,    // to the autocast dtype (f16 or bf16): matmul, conv2d
  f32,      // to f32: softmax, the losses, exp, log, sum
  promote,  // to the widest floating dtype among them: add, cat, where
};

// What one call of a library op does on a GPU beyond reading each input and writing each
// output once, for the GPU cost model (compiler/cost.h). kernels/gpu_work.cpp gives each op
// that needs one its function, from what the CUDA kernels (kernels/cuda/) do.
struct GpuWork {
  double flops = -1;           // -1: one per element of the first output
  bool tensor_cores = false;   // its products run on tensor cores, in the dtype `math`
  DType math = DType::f32;
  int64_t extra_read = 0;      // bytes the implementation reads and writes besides
  int64_t extra_written = 0;
  int64_t launches = 1;        // kernels it launches
  std::string note;            // why the extras ("nchw: transposes in and out", ...)
};
// tf32: f32 products may run on TF32 tensor cores.
using GpuWorkFn = GpuWork (*)(std::span<const TensorMeta> in, std::span<const TensorMeta> out, const Attrs& attrs,
                              bool tf32);

struct OpDef {
  std::string name;
  InferFn infer = nullptr;
  OpKind kind = OpKind::compute;
  ViewFn view = nullptr;
  // Inputs the op writes in place (batch norm's running statistics, say).
  std::vector<int> mutated_inputs;
  // For ops whose written inputs depend on the call (a multi-tensor optimizer update of
  // `count` parameters): says them from the call's attributes, in place of mutated_inputs.
  std::vector<int> (*mutated_inputs_of)(const Attrs& attrs) = nullptr;
  // Reads the random generator (its seed and offset are attributes of the call).
  bool random = false;
  // Elementwise ops (all but `none`) read each input only at the output element it lines up
  // with (after broadcasting), so an in-place call may write over an input that is the same
  // view as its target (x.add_(x)). Other ops read inputs elsewhere too: call_op_out
  // refuses an input that is the same view as the target, except the accumulator below.
  Elementwise elementwise = Elementwise::none;
  // The attributes the element function takes after its operands, as numbers (gelu's
  // tanh form as a bool, softplus's beta and threshold).
  std::vector<Scalar> (*scalar_args)(const Attrs& attrs) = nullptr;
  Reduction reduction = Reduction::none;
  // For ops that add their result to an input: which input that is, in a call with inputs
  // `in` (-1: none in this call). It is read only at the element the op writes, so the op
  // may write its result over it (call_op_out, the compiler's in-place plan): addmm's bias
  // when it has the product's shape, conv2d_backward_weight's gradient to add to.
  int (*accumulator)(std::span<const TensorMeta> in) = nullptr;
  int accumulator_input(std::span<const TensorMeta> in) const { return accumulator ? accumulator(in) : -1; }
  // For an op that writes its mutated inputs and returns nothing of its own (an optimizer's
  // update, `sgd_update_`): its pure twin, which takes the same inputs and attributes and
  // returns the new values of the given mutated inputs, in input order (`sgd_update`). The
  // tracer records the pure twin (the graph has no mutation); a compiled program runs the
  // in-place op where the write-backs allow.
  std::string pure_twin;
  // Set by the registry on the pure twin: the op whose pure_twin it is.
  const OpDef* in_place_twin = nullptr;
  CastPolicy cast_policy = CastPolicy::none;
  std::array<KernelFn, kNumDeviceTypes> kernels{};
  const BackwardFormula* backward = nullptr;  // set by autograd/
  bool backward_reads_inputs = false;         // the formula needs the inputs' values
  GpuWorkFn gpu_work = nullptr;               // set by kernels/gpu_work.cpp

  // The inputs a call with `attrs` writes in place.
  std::vector<int> mutated(const Attrs& attrs) const {
    return mutated_inputs_of ? mutated_inputs_of(attrs) : mutated_inputs;
  }
  bool mutates_inputs() const { return mutated_inputs_of || !mutated_inputs.empty(); }
  bool is_elementwise() const { return elementwise != Elementwise::none; }
};

// Declares an op (once, from a static initializer in core/ops/). Returns a reference that
// stays valid for the life of the program.
const OpDef& define_op(OpDef def);
// Registers `op`'s kernel for a device type (from kernels/<device>/).
void register_kernel(std::string_view op, DeviceType device, KernelFn kernel);
// Gives a kernel on `device` to every op that `make` makes one for from its facts (the
// generated CUDA kernels of the elementwise ops and reductions, compiler/codegen/cuda_eager.cpp): to
// the ops defined so far and to each op defined later. A kernel registered by name wins.
using KernelMaker = KernelFn (*)(const OpDef& op);
void register_kernel_maker(DeviceType device, KernelMaker make);
// The op named `name`; an error when there is none.
const OpDef& find_op(std::string_view name);
// Every defined op, sorted by name.
std::vector<const OpDef*> all_ops();
// Lets kernels/ say what an op's library call costs on a GPU (GpuWork above).
void set_gpu_work(std::string_view op, GpuWorkFn work);
// Lets autograd/ attach a backward formula to an op.
void set_backward(std::string_view op, const BackwardFormula* formula, bool reads_inputs);

// Runs an op eagerly: infer, allocate, kernel, hook.
std::vector<Tensor> call_op(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs = {});
Tensor call_op1(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs = {});
// Runs an op writing its (single) output into `out`, which must have the rule's shape and
// a dtype the result can be cast to. `out` may alias an input elementwise.
void call_op_out(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs,
                 const Tensor& out);

// The tracing hook: sees every top-level op call on this thread (ops that a kernel runs
// internally are not reported). Install with OpHookGuard; guards nest.
using OpHook = std::function<void(const OpCall&)>;
class OpHookGuard : ScopedHook<OpHook> {
 public:
  explicit OpHookGuard(OpHook hook);
};
// Whether an OpHook is installed on this thread: something (the tracer, a split run) is
// recording the ops this thread calls. Code with side effects the recording cannot hold
// (kiln::dist's gradient hooks) holds them back then.
bool op_hook_installed();

// Host reads: Tensor::item() reports the tensor it reads to this hook (one per thread,
// installed like OpHook) when called outside a kernel, so that a tracer can tell a value
// read on the host (which eager code may branch on, or turn into a number) from the ops it
// records: the graph would bake the value in. `guarded` is false inside an
// UnguardedHostReads scope (a read that only validates). Install with HostReadHookGuard;
// guards nest.
using HostReadHook = std::function<void(const Tensor&, const char* reader, bool guarded)>;
class HostReadHookGuard : ScopedHook<HostReadHook> {
 public:
  explicit HostReadHookGuard(HostReadHook hook);
};
// Called by the host reads (item(), clip_grad_norm_'s loop over the gradients; `reader`
// names it in messages); does nothing without a hook or inside a kernel.
void report_host_read(const Tensor& t, const char* reader);
// Host reads in this scope only validate (an optimizer checking lr >= 0): whatever value
// passes, the ops that follow are the same, so a tracer need not guard them (the hook sees
// them with guarded = false).
class UnguardedHostReads {
 public:
  UnguardedHostReads();
  ~UnguardedHostReads();
  UnguardedHostReads(const UnguardedHostReads&) = delete;
  UnguardedHostReads& operator=(const UnguardedHostReads&) = delete;
};

// Deferred calls (the compiler's split runs, compiler/trace.h): while a DeferHook is
// installed and answers true for an op, a top-level call of it (not one a kernel makes)
// runs no kernel. Its outputs are tensors over pending storages (core/storage.h) with the
// shapes, dtypes and layouts of the shape rule; an in-place target keeps its memory and old
// content; versions move as if the kernel had run; autograd and the tracing hook see the
// call as usual. Whoever deferred the call computes its values later, or runs it now with
// run_deferred. View ops are never deferred (they compute nothing). Install with
// DeferHookGuard; guards nest.
using DeferHook = std::function<bool(const OpDef& op)>;
class DeferHookGuard : ScopedHook<DeferHook> {
 public:
  explicit DeferHookGuard(DeferHook hook);
};
// Runs a deferred call's kernel now, as the call would have (its inputs must have memory):
// pending outputs get memory first.
void run_deferred(const OpCall& call);

// Reading a pending storage (Tensor::data_ptr) asks this hook, one per thread, to compute
// it; without a hook, or when the storage is still pending after it, the read is a
// kiln::Error. Install with PendingHookGuard; guards nest.
using PendingHook = std::function<void(StorageImpl& storage)>;
class PendingHookGuard : ScopedHook<PendingHook> {
 public:
  explicit PendingHookGuard(PendingHook hook);
};
// What Tensor::data_ptr() calls on a pending storage.
void compute_pending(StorageImpl& storage);

// The autograd recorder: called after every top-level op whose inputs require grad while
// grad mode is on; it attaches the backward graph. Installed once by autograd/.
using AutogradRecorder = void (*)(const OpCall& call);
void set_autograd_recorder(AutogradRecorder recorder);

// Shape helpers shared by shape rules.
// Broadcasts shapes as NumPy does; errors name `op` and show every shape.
Shape broadcast_shapes(std::span<const Shape> shapes, const char* op);
// torch.result_type over inputs (wrapped numbers and 0-d tensors rank lowest).
DType result_type(std::span<const TensorMeta> in);
// Checks that defined inputs (other than wrapped numbers) share a device; returns it.
Device common_device(std::span<const TensorMeta> in, const char* op);
// The layout of an elementwise result of shape `out`: channels_last when it is 4-d and an
// input of that whole shape is channels_last (PyTorch's layout propagation, simplified).
MemoryFormat elementwise_memory_format(std::span<const TensorMeta> in, const Shape& out);
// "f32[2,3] cpu, i64[2] cpu" for error messages.
std::string metas_str(std::span<const TensorMeta> in);

}  // namespace kiln
