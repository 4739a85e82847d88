#include "core/registry.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include <fmt/ranges.h>

#include "core/autocast.h"
#include "core/cuda.h"
#include "core/grad_mode.h"

namespace kiln {

// ---- Attrs ----

void Attrs::set(std::string name, AttrValue value) {
  for (auto& a : items_) {
    if (a.name == name) {
      a.value = std::move(value);
      return;
    }
  }
  items_.push_back({std::move(name), std::move(value)});
}

const AttrValue* Attrs::find(std::string_view name) const {
  for (const auto& a : items_)
    if (a.name == name) return &a.value;
  return nullptr;
}

const AttrValue& Attrs::get(std::string_view name) const {
  const AttrValue* v = find(name);
  KILN_CHECK(v, "attribute '{}' is missing", name);
  return *v;
}

std::optional<Scalar> Attrs::optional_scalar(std::string_view name) const {
  if (!find(name)) return std::nullopt;
  return as<Scalar>(name);
}

void Attrs::wrong_type(std::string_view name) const {
  fail("attribute '{}' has the wrong type (attributes: {})", name, to_string());
}

static std::string attr_value_str(const AttrValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, Scalar>)
          return x.is_floating() ? fmt::format("{}", x.to_double())
                                 : x.kind() == DType::boolean ? (x.to_int() ? "true" : "false")
                                                              : fmt::format("{}", x.to_int());
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
          return fmt::format("[{}]", fmt::join(x, ","));
        else if constexpr (std::is_same_v<T, std::string>) return fmt::format("\"{}\"", x);
        else return fmt::format("{}", x);
      },
      v);
}

std::string Attrs::to_string() const {
  std::string s = "{";
  for (size_t i = 0; i < items_.size(); ++i) {
    if (i) s += ", ";
    s += items_[i].name + "=" + attr_value_str(items_[i].value);
  }
  return s + "}";
}

// ---- TensorMeta ----

TensorMeta TensorMeta::of(const Tensor& t) {
  if (!t.defined()) return TensorMeta{.shape = {}, .defined = false};
  return TensorMeta{t.shape(), t.dtype(), t.device(), t.is_wrapped_number(), true, t.suggest_memory_format()};
}

std::string TensorMeta::str() const {
  if (!defined) return "none";
  return fmt::format("{}{} {}{}", dtype, shape_str(shape), device,
                     memory_format == MemoryFormat::channels_last ? " channels_last" : "");
}

std::string metas_str(std::span<const TensorMeta> in) {
  std::string s;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i) s += ", ";
    s += in[i].str();
  }
  return s;
}

// ---- the registry ----

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<OpDef>, std::less<>> ops;
  std::vector<std::pair<DeviceType, KernelMaker>> makers;

  // Gives a defined op the kernels the makers make for it, where it has none.
  void make_kernels(OpDef& op, DeviceType device, KernelMaker make) {
    KernelFn& slot = op.kernels[static_cast<int>(device)];
    if (!slot && op.infer) slot = make(op);
  }

  OpDef& entry(std::string_view name) {
    auto it = ops.find(name);
    if (it == ops.end()) {
      auto def = std::make_unique<OpDef>();
      def->name = std::string(name);
      it = ops.emplace(std::string(name), std::move(def)).first;
    }
    return *it->second;
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

const OpDef& define_op(OpDef def) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  OpDef& e = r.entry(def.name);
  KILN_CHECK(!e.infer, "define_op: op '{}' is defined twice", def.name);
  KILN_CHECK(def.infer, "define_op: op '{}' has no shape rule", def.name);
  KILN_CHECK(def.kind != OpKind::view || def.view, "define_op: view op '{}' has no view function",
             def.name);
  KILN_CHECK(!def.in_place_twin, "define_op: op '{}': in_place_twin is set by the registry", def.name);
  KILN_CHECK(def.pure_twin.empty() || def.mutates_inputs(), "define_op: op '{}' has a pure twin but mutates nothing",
             def.name);
  def.kernels = e.kernels;  // kernels may have registered first
  def.backward = e.backward;
  def.backward_reads_inputs = e.backward_reads_inputs;
  def.in_place_twin = e.in_place_twin;  // the in-place twin may have been defined first
  e = std::move(def);
  if (!e.pure_twin.empty()) {
    OpDef& pure = r.entry(e.pure_twin);
    KILN_CHECK(!pure.in_place_twin, "define_op: op '{}' is the pure twin of two ops", e.pure_twin);
    pure.in_place_twin = &e;
  }
  for (const auto& [device, make] : r.makers) r.make_kernels(e, device, make);
  return e;
}

void register_kernel_maker(DeviceType device, KernelMaker make) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.makers.emplace_back(device, make);
  for (auto& [name, def] : r.ops) r.make_kernels(*def, device, make);
}

void register_kernel(std::string_view op, DeviceType device, KernelFn kernel) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.entry(op).kernels[static_cast<int>(device)] = kernel;
}

void set_gpu_work(std::string_view op, GpuWorkFn work) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.entry(op).gpu_work = work;
}

void set_backward(std::string_view op, const BackwardFormula* formula, bool reads_inputs) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.entry(op).backward = formula;
  r.entry(op).backward_reads_inputs = reads_inputs;
}

const OpDef& find_op(std::string_view name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.ops.find(name);
  KILN_CHECK(it != r.ops.end() && it->second->infer, "find_op: there is no op named '{}'", name);
  return *it->second;
}

std::vector<const OpDef*> all_ops() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<const OpDef*> out;
  for (auto& [name, def] : r.ops)
    if (def->infer) out.push_back(def.get());
  return out;
}

// ---- the hook ----

namespace {
thread_local OpHook t_hook;
thread_local int t_depth = 0;  // > 0 while a kernel runs: nested calls are not reported

struct DepthScope {
  DepthScope() { ++t_depth; }
  ~DepthScope() { --t_depth; }
};
}  // namespace

namespace {
AutogradRecorder g_recorder = nullptr;

bool any_requires_grad(std::span<const Tensor> inputs) {
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

// After the kernel, before the tracing hook: the tracer sees outputs with their graph.
void after_op(const OpCall& call) {
  if (t_depth != 0) return;
  const bool grad_target = call.inplace && call.outputs[0].requires_grad();
  if (g_recorder && GradMode::is_enabled() && (grad_target || any_requires_grad(call.inputs)))
    g_recorder(call);
  if (t_hook) t_hook(call);
}
}  // namespace

void set_autograd_recorder(AutogradRecorder recorder) { g_recorder = recorder; }

namespace {
thread_local HostReadHook t_host_read_hook;
thread_local int t_unguarded_reads = 0;
}  // namespace

UnguardedHostReads::UnguardedHostReads() { ++t_unguarded_reads; }
UnguardedHostReads::~UnguardedHostReads() { --t_unguarded_reads; }

HostReadHookGuard::HostReadHookGuard(HostReadHook hook) : ScopedHook(t_host_read_hook, std::move(hook)) {}

void report_host_read(const Tensor& t, const char* reader) {
  if (t_depth == 0 && t_host_read_hook) t_host_read_hook(t, reader, t_unguarded_reads == 0);
}

namespace {
thread_local DeferHook t_defer_hook;
thread_local PendingHook t_pending_hook;

// Whether this call runs no kernel (DeferHookGuard): only top-level calls are deferred.
bool defers(const OpDef& op) { return t_depth == 0 && t_defer_hook && t_defer_hook(op); }

// A tensor as the shape rule describes it, over a pending storage.
Tensor pending_tensor(const TensorMeta& m) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = pending_storage(static_cast<size_t>(numel_of(m.shape)) * itemsize(m.dtype), m.device);
  impl->strides = strides_for(m.shape, m.memory_format);
  impl->shape = m.shape;
  impl->dtype = m.dtype;
  impl->device = m.device;
  return Tensor(std::move(impl));
}
}  // namespace

DeferHookGuard::DeferHookGuard(DeferHook hook) : ScopedHook(t_defer_hook, std::move(hook)) {}

PendingHookGuard::PendingHookGuard(PendingHook hook) : ScopedHook(t_pending_hook, std::move(hook)) {}

void compute_pending(StorageImpl& storage) {
  if (t_pending_hook) t_pending_hook(storage);
  KILN_CHECK(!is_pending(storage),
             "a tensor's value was read ({} bytes on {}) but the op that makes it was deferred and nothing "
             "computed it: a value made inside a compiled function's split run, read after the run failed",
             storage.nbytes, storage.device);
}

OpHookGuard::OpHookGuard(OpHook hook) : ScopedHook(t_hook, std::move(hook)) {}
bool op_hook_installed() { return static_cast<bool>(t_hook); }

// ---- dispatch ----

static std::vector<TensorMeta> metas_of(const std::vector<Tensor>& inputs) {
  std::vector<TensorMeta> metas;
  metas.reserve(inputs.size());
  for (const Tensor& t : inputs) metas.push_back(TensorMeta::of(t));
  return metas;
}

static const KernelFn& kernel_for(const OpDef& op, Device device, std::span<const TensorMeta> metas) {
  if (device.is_cuda() && has_device_allocator(device.type) &&
      (!cuda::is_available() || device.index >= cuda::device_count()))
    fail("{}: device {} is not available: {} (inputs: {})", op.name, device,
         cuda::is_available() ? fmt::format("this machine has {} CUDA devices", cuda::device_count())
                              : cuda::unavailable_reason(),
         metas_str(metas));
  const KernelFn& k = op.kernels[static_cast<int>(device.type)];
  if (!k) {
    if (!has_device_allocator(device.type))
      fail("{}: device {} is not available: this build of kiln has no backend for it (inputs: {})",
           op.name, device, metas_str(metas));
    fail("{}: no kernel for device {} (inputs: {})", op.name, device, metas_str(metas));
  }
  return k;
}

static std::vector<Tensor> run_op(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs);
static void run_op_out(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs,
                       const Tensor& out);

// Runs f, making sure an error from inside an op names the op first.
template <class F>
static decltype(auto) naming_errors(const OpDef& op, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    const std::string_view what = e.what();
    if (what.starts_with(op.name) && what.substr(op.name.size()).starts_with(":")) throw;
    throw Error(op.name + ": " + std::string(what));
  }
}

std::vector<Tensor> call_op(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs) {
  // Autocast casts the inputs of top-level calls (core/autocast.h), as calls of `cast`.
  if (op.cast_policy != CastPolicy::none && t_depth == 0) inputs = autocast_inputs(op, std::move(inputs));
  return naming_errors(op, [&] { return run_op(op, std::move(inputs), attrs); });
}

static std::vector<Tensor> run_op(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs) {
  std::vector<TensorMeta> metas = metas_of(inputs);
  std::vector<Tensor> outputs;
  if (op.kind == OpKind::view) {
    op.infer(metas, attrs);  // validates
    outputs.push_back(op.view(inputs.at(0), attrs));
    const Tensor& in = inputs.at(0);
    outputs[0].impl()->view_base = in.impl()->view_base ? in.impl()->view_base : in.impl_ptr();
  } else {
    std::vector<TensorMeta> out_metas = op.infer(metas, attrs);
    // An op without outputs (an in-place update) runs where its tensors are.
    Device device = out_metas.empty() ? common_device(metas, op.name.c_str()) : out_metas[0].device;
    const KernelFn& kernel = kernel_for(op, device, metas);
    const bool deferred = defers(op);
    outputs.reserve(out_metas.size());
    for (const TensorMeta& m : out_metas)
      outputs.push_back(deferred ? pending_tensor(m) : make_tensor(m.shape, m.dtype, m.device, m.memory_format));
    if (!deferred) {
      DepthScope scope;
      kernel(inputs, outputs, attrs);
    }
  }
  for (int i : op.mutated(attrs))
    if (inputs.at(i).defined()) bump_version(inputs.at(i));
  after_op(OpCall{op, inputs, attrs, outputs, false});
  return outputs;
}

void run_deferred(const OpCall& call) {
  const OpDef& op = call.op;
  naming_errors(op, [&] {
    std::vector<TensorMeta> metas;
    for (const Tensor& t : call.inputs) metas.push_back(TensorMeta::of(t));
    const Device device = !call.outputs.empty() ? call.outputs[0].device() : common_device(metas, op.name.c_str());
    const KernelFn& kernel = kernel_for(op, device, metas);
    for (const Tensor& out : call.outputs) {
      if (!out.defined() || !is_pending(*out.storage())) continue;
      const Storage memory = allocate_storage(out.storage()->nbytes, out.device());
      take_memory(*out.storage(), *memory);
    }
    DepthScope scope;
    kernel(call.inputs, call.outputs, call.attrs);
  });
}

Tensor call_op1(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs) {
  return call_op(op, std::move(inputs), attrs).at(0);
}

static bool can_cast(DType from, DType to) {
  // torch.can_cast for in-place results: no float -> integer, no non-bool -> bool.
  if (is_floating(from) && !is_floating(to)) return false;
  if (from != DType::boolean && to == DType::boolean) return false;
  return true;
}

// The element range [first, last] a tensor's view can touch in its storage.
static std::pair<int64_t, int64_t> element_range(const Tensor& t) {
  int64_t last = t.offset();
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.shape()[d] - 1) * t.strides()[d];
  return {t.offset(), last};
}

// Whether the view covers a block of memory with no gaps and no element twice, in some
// order of its dims (a contiguous tensor, or a transpose or permutation of one).
static bool dense_without_overlap(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims longer than 1
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.shape()[d] != 1) dims.push_back({t.strides()[d], t.shape()[d]});
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (auto [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

// In-place writes must not race with their own reads: the target may not have elements
// that share memory (an expanded tensor), and an input over the same memory must be the
// target itself, element for element. Like PyTorch, overlaps are judged between dense
// views (where element ranges tell the truth); other layouts are left alone.
static void check_inplace_overlap(const OpDef& op, const std::vector<Tensor>& inputs,
                                  const Tensor& out) {
  for (int64_t d = 0; d < out.dim(); ++d)
    KILN_CHECK(out.strides()[d] != 0 || out.shape()[d] <= 1,
               "{}: the in-place target {} has elements that share memory (strides {}); clone() "
               "it first",
               op.name, out.meta_str(), shape_str(out.strides()));
  if (out.numel() == 0 || !dense_without_overlap(out)) return;
  const auto [lo, hi] = element_range(out);
  const int accumulator = op.is_elementwise() ? -1 : op.accumulator_input(metas_of(inputs));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& in = inputs[i];
    if (!in.defined() || in.storage() != out.storage() || in.numel() == 0) continue;
    if (same_view(in, out)) {
      // The target itself: read only at the element written by an elementwise op or as the
      // accumulator; any other op (a GEMM's operand) would read elements it already wrote.
      KILN_CHECK(op.is_elementwise() || static_cast<int>(i) == accumulator,
                 "{}: input {} ({}) is the in-place target itself, which {} reads beyond the element it "
                 "writes; clone() the input first",
                 op.name, i, in.meta_str(), op.name);
      continue;
    }
    if (!dense_without_overlap(in)) continue;
    const auto [ilo, ihi] = element_range(in);
    KILN_CHECK(ihi < lo || ilo > hi,
               "{}: the input {} (strides {}) overlaps the in-place target {} (strides {}) in "
               "memory without being the same view; clone() the input first",
               op.name, in.meta_str(), shape_str(in.strides()), out.meta_str(),
               shape_str(out.strides()));
  }
}

void call_op_out(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs,
                 const Tensor& out) {
  naming_errors(op, [&] { run_op_out(op, std::move(inputs), attrs, out); });
}

static void run_op_out(const OpDef& op, std::vector<Tensor> inputs, const Attrs& attrs,
                       const Tensor& out) {
  KILN_CHECK(out.defined(), "the in-place target is undefined");
  KILN_CHECK(op.kind == OpKind::compute, "{}: a view op has no in-place form", op.name);
  std::vector<TensorMeta> metas = metas_of(inputs);
  std::vector<TensorMeta> out_metas = op.infer(metas, attrs);
  KILN_CHECK(out_metas.size() == 1, "{}: in-place form needs an op with one output", op.name);
  const TensorMeta& m = out_metas[0];
  KILN_CHECK(m.shape == out.shape(),
             "{}: result shape {} does not match the in-place target {} (inputs: {})", op.name,
             shape_str(m.shape), out.meta_str(), metas_str(metas));
  KILN_CHECK(can_cast(m.dtype, out.dtype()),
             "{}: result dtype {} can't be cast to the in-place target's dtype {} (inputs: {})",
             op.name, m.dtype, out.dtype(), metas_str(metas));
  KILN_CHECK(m.device == out.device(), "{}: result on {} but the in-place target is on {}",
             op.name, m.device, out.device());
  check_inplace_overlap(op, inputs, out);
  if (t_depth == 0 && GradMode::is_enabled()) {
    KILN_CHECK(!(out.requires_grad() && out.is_leaf()),
               "a leaf tensor that requires grad ({}) is used in an in-place operation; do it "
               "under NoGradGuard or on a clone",
               out.meta_str());
    // Writing through a view would have to rewrite the base's graph too (PyTorch's
    // CopySlices), which kiln does not do yet: refuse rather than give wrong gradients.
    const auto& base = out.impl()->view_base;
    KILN_CHECK(!base || !(base->requires_grad || any_requires_grad(inputs)),
               "an in-place operation on a view ({}) of a tensor that requires grad, or with "
               "inputs that require grad, is not supported yet; clone() the view or build the "
               "result out of place",
               out.meta_str());
  }
  const KernelFn& kernel = kernel_for(op, m.device, metas);
  std::vector<Tensor> outputs{out};
  std::vector<Tensor> before;
  // Autograd will need the values the op is about to overwrite: copied by top-level clone
  // calls (without autograd), which a tracer records and a deferring caller defers.
  if (t_depth == 0 && g_recorder && op.backward_reads_inputs && GradMode::is_enabled() &&
      any_requires_grad(inputs)) {
    NoGradGuard no_grad;
    before.resize(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined() && inputs[i].storage() == out.storage()) before[i] = inputs[i].clone();
  }
  if (!defers(op)) {
    DepthScope scope;
    kernel(inputs, outputs, attrs);
  }
  bump_version(out);
  after_op(OpCall{op, inputs, attrs, outputs, true, before});
}

// ---- shape and dtype helpers ----

Shape broadcast_shapes(std::span<const Shape> shapes, const char* op) {
  size_t nd = 0;
  for (const Shape& s : shapes) nd = std::max(nd, s.size());
  Shape out(nd, 1);
  for (const Shape& s : shapes) {
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[nd - s.size() + i];
      int64_t v = s[i];
      if (v == o || v == 1) continue;
      if (o == 1) {
        o = v;
        continue;
      }
      std::string all;
      for (size_t j = 0; j < shapes.size(); ++j) all += (j ? ", " : "") + shape_str(shapes[j]);
      fail("{}: shapes {} cannot be broadcast together (size {} against {} at dim {})", op, all,
           v, o, static_cast<int64_t>(nd - s.size() + i));
    }
  }
  return out;
}

static int category(DType t) {
  return t == DType::boolean ? 0 : is_floating(t) ? 2 : 1;
}

// PyTorch's combine_categories: a lower-priority group only matters when it is of a higher
// category (a float scalar makes an int tensor float, but never makes an f16 tensor f32).
static std::optional<DType> combine(std::optional<DType> higher, std::optional<DType> lower) {
  if (!higher) return lower;
  if (!lower) return higher;
  if (category(*higher) >= category(*lower)) return higher;
  return promote_types(*higher, *lower);
}

DType result_type(std::span<const TensorMeta> in) {
  std::optional<DType> dims, zero_dim, wrapped;
  auto update = [](std::optional<DType>& r, DType t) { r = r ? promote_types(*r, t) : t; };
  for (const TensorMeta& m : in) {
    if (!m.defined) continue;
    if (m.wrapped_number) {
      // A floating literal stands for the default float type, an integer for i64.
      update(wrapped, is_floating(m.dtype) ? kDefaultFloat : m.dtype);
    } else if (m.shape.empty()) {
      update(zero_dim, m.dtype);
    } else {
      update(dims, m.dtype);
    }
  }
  std::optional<DType> r = combine(dims, combine(zero_dim, wrapped));
  return r ? *r : kDefaultFloat;
}

MemoryFormat elementwise_memory_format(std::span<const TensorMeta> in, const Shape& out) {
  if (out.size() != 4) return MemoryFormat::contiguous;
  for (const TensorMeta& m : in)
    if (m.defined && m.shape == out && m.memory_format == MemoryFormat::channels_last)
      return MemoryFormat::channels_last;
  return MemoryFormat::contiguous;
}

Device common_device(std::span<const TensorMeta> in, const char* op) {
  std::optional<Device> device;
  for (const TensorMeta& m : in) {
    if (!m.defined || m.wrapped_number) continue;
    // A 0-d CPU tensor may join tensors on any device, as in PyTorch.
    if (m.shape.empty() && m.device.is_cpu()) continue;
    if (!device) device = m.device;
    KILN_CHECK(*device == m.device, "{}: expected all tensors on one device, got {} and {} ({})",
               op, *device, m.device, metas_str(in));
  }
  if (device) return *device;
  for (const TensorMeta& m : in)
    if (m.defined && !m.wrapped_number) return m.device;
  return Device::cpu();
}

}  // namespace kiln
