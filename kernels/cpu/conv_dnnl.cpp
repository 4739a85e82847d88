// conv2d and its gradients through oneDNN (kernels/cpu/conv_dnnl.h). Each call describes
// kiln's tensors to oneDNN as they are (dims and strides), asks for a convolution whose
// layouts oneDNN chooses ("any"; NHWC for NHWC activations where oneDNN has such a
// kernel), reorders the operands into those layouts where they differ, runs it, and
// reorders the result into the output tensor (converting its dtype when they differ).
// Primitives are made once per geometry, dtypes, kind and activation layout, and kept.
#include "kernels/cpu/conv_dnnl.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

#ifdef KILN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/ops/factory.h"
#include "kernels/cpu/dnnl_runtime.h"
#endif

namespace kiln::cpu {
namespace {

ConvBackend initial_backend() {
#ifdef KILN_HAVE_DNNL
  const char* v = std::getenv("KILN_CONV_BACKEND");
  if (v && std::strcmp(v, "own") == 0) return ConvBackend::own;
  if (v && std::strcmp(v, "dnnl") == 0) return ConvBackend::dnnl;
  if (v && *v && std::strcmp(v, "auto") != 0)
    std::fprintf(stderr, "kiln: KILN_CONV_BACKEND=%s: expected auto, dnnl or own; using auto\n", v);
  return ConvBackend::automatic;
#else
  return ConvBackend::own;
#endif
}

std::atomic<ConvBackend> g_backend{initial_backend()};

thread_local std::string t_last_impl;
thread_local int64_t t_calls = 0;

}  // namespace

bool conv_dnnl_available() {
#ifdef KILN_HAVE_DNNL
  return true;
#else
  return false;
#endif
}

void set_conv_backend(ConvBackend backend) {
  KILN_CHECK(backend == ConvBackend::own || conv_dnnl_available(),
             "set_conv_backend: this build of kiln has no oneDNN (install libdnnl-dev and reconfigure); "
             "only ConvBackend::own is available");
  g_backend.store(backend);
}

ConvBackend conv_backend() { return g_backend.load(); }

const char* dnnl_last_implementation() { return t_last_impl.c_str(); }

int64_t dnnl_calls() { return t_calls; }

#ifndef KILN_HAVE_DNNL

bool dnnl_conv2d(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Conv2dGeometry&) {
  return false;
}
bool dnnl_conv2d_backward_input(const Tensor&, const Tensor&, const Tensor&, const Conv2dGeometry&) {
  return false;
}
bool dnnl_conv2d_backward_weight(const Tensor&, const Tensor&, const Tensor&, const Conv2dGeometry&) {
  return false;
}

#else

dnnl::engine& dnnl_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& dnnl_stream() {
  thread_local dnnl::stream stream(dnnl_engine());
  return stream;
}

void dnnl_run(const dnnl::primitive& primitive, const dnnl::memory::desc& scratchpad,
              std::unordered_map<int, dnnl::memory> args) {
  Tensor scratch;
  if (scratchpad.get_size() > 0) {
    scratch = make_tensor({static_cast<int64_t>(scratchpad.get_size())}, DType::u8);
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(scratchpad, dnnl_engine(), scratch.data_ptr()));
  }
  primitive.execute(dnnl_stream(), args);
  dnnl_stream().wait();
}

namespace {

using dnnl::memory;
using dt = memory::data_type;

std::optional<dt> data_type(DType t) {
  if (t == DType::f32) return dt::f32;
  if (t == DType::bf16) return dt::bf16;
  return std::nullopt;
}

// Whether oneDNN may read or write t through its strides: dense, in NCHW or NHWC order
// (an expanded or overlapping view is copied first by the caller).
bool dense(const Tensor& t) {
  return t.is_contiguous() || (t.dim() == 4 && t.is_contiguous(MemoryFormat::channels_last));
}

memory::dims dims_of(const Shape& s) { return memory::dims(s.begin(), s.end()); }

// An activation [N, C, H, W] as it is stored.
memory::desc activation_desc(const Tensor& t) {
  const memory::dims strides(t.strides().begin(), t.strides().end());
  return memory::desc(dims_of(t.shape()), *data_type(t.dtype()), strides);
}

// The weight [O, I/G, kh, kw] as stored; with groups as oneDNN's [G, O/G, I/G, kh, kw].
memory::desc weight_desc(const Tensor& w, int64_t groups) {
  if (groups == 1) return activation_desc(w);
  const int64_t o = w.size(0) / groups;
  const memory::dims dims = {groups, o, w.size(1), w.size(2), w.size(3)};
  const memory::dims strides = {w.stride(0) * o, w.stride(0), w.stride(1), w.stride(2), w.stride(3)};
  return memory::desc(dims, *data_type(w.dtype()), strides);
}

// The descriptor of the same logical tensor in the layout oneDNN chooses (in dtype `type`
// where given).
memory::desc any_of(const memory::desc& d, dt type = dt::undef) {
  return memory::desc(d.dims(), type == dt::undef ? d.data_type() : type, memory::format_tag::any);
}

// The convolution's parameters in oneDNN's terms (dilation counts the gaps: kiln's - 1).
struct Geometry {
  memory::dims strides, dilates, padding;
  explicit Geometry(const Conv2dGeometry& g)
      : strides{g.stride_h, g.stride_w},
        dilates{g.dilation_h - 1, g.dilation_w - 1},
        padding{g.pad_h, g.pad_w} {}
};

enum class Kind : uint8_t { forward, backward_input, backward_weight };

// One primitive of a kind for one geometry and set of dtypes; usable is false where
// oneDNN offers only its reference implementation, which is slower than kiln's kernels.
struct Entry {
  bool usable = false;
  std::string impl;
  dnnl::primitive primitive;
  memory::desc src, weights, dst, bias;  // the layouts the primitive works in
  memory::desc scratchpad;               // the scratch memory one execution needs
};

// How a primitive takes the activations: in oneDNN's blocked layouts, reordered at each
// call, or as they are, NHWC (its brgemm and JIT kernels read NHWC directly on AVX-512;
// elsewhere an NHWC primitive may be only the reference one, and blocked is tried next).
enum class Activations : uint8_t { blocked, nhwc };

using Key = std::tuple<Kind, Activations, std::vector<int64_t>, dt, dt, dt, dt>;

Key key_of(Kind kind, Activations a, const Conv2dGeometry& g, dt src, dt weights, dt dst, dt bias) {
  std::vector<int64_t> v = {g.batch,    g.in_channels, g.in_h,       g.in_w,       g.out_channels,
                            g.kernel_h, g.kernel_w,    g.stride_h,   g.stride_w,   g.pad_h,
                            g.pad_w,    g.dilation_h,  g.dilation_w, g.groups};
  return {kind, a, std::move(v), src, weights, dst, bias};
}

// An activation's descriptor for a primitive: NHWC, or the layout oneDNN chooses.
memory::desc activation_for(const memory::desc& d, Activations a, dt type = dt::undef) {
  if (a == Activations::blocked) return any_of(d, type);
  return memory::desc(d.dims(), type == dt::undef ? d.data_type() : type, memory::format_tag::nhwc);
}

// Primitives take their scratch memory from each call (a kiln tensor), not from a buffer
// of their own: two threads may run the same convolution at once.
dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// The forward primitive descriptor, also the hint the backward ones need: for them src
// and weights take the operands' dtype `operands` (a gradient written in f32 from bf16
// operands has no forward of its own).
dnnl::convolution_forward::primitive_desc forward_pd(const Conv2dGeometry& g, Activations a,
                                                     const memory::desc& src, const memory::desc& weights,
                                                     const memory::desc& dst, const memory::desc* bias,
                                                     dt operands) {
  const Geometry p(g);
  const memory::desc s = activation_for(src, a, operands), w = any_of(weights, operands),
                     d = activation_for(dst, a);
  const auto desc = bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                           dnnl::algorithm::convolution_direct, s, w, *bias, d,
                                                           p.strides, p.dilates, p.padding, p.padding)
                         : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                           dnnl::algorithm::convolution_direct, s, w, d,
                                                           p.strides, p.dilates, p.padding, p.padding);
  return dnnl::convolution_forward::primitive_desc(desc, user_scratchpad(), dnnl_engine());
}

bool is_reference(const std::string& impl) { return impl.rfind("ref", 0) == 0; }

Entry make_entry(Kind kind, Activations a, const Conv2dGeometry& g, const memory::desc& src,
                 const memory::desc& weights, const memory::desc& dst, const memory::desc* bias) {
  Entry e;
  try {
    const Geometry p(g);
    const dt operands = kind == Kind::backward_weight ? src.data_type() : weights.data_type();
    const auto fwd = forward_pd(g, a, src, weights, dst, bias, operands);
    if (kind == Kind::forward) {
      e.impl = fwd.impl_info_str();
      e.scratchpad = fwd.scratchpad_desc();
      e.primitive = dnnl::convolution_forward(fwd);
      e.src = fwd.src_desc();
      e.weights = fwd.weights_desc();
      e.dst = fwd.dst_desc();
      if (bias) e.bias = fwd.bias_desc();
    } else if (kind == Kind::backward_input) {
      const dnnl::convolution_backward_data::desc desc(dnnl::algorithm::convolution_direct,
                                                       activation_for(src, a), any_of(weights),
                                                       activation_for(dst, a), p.strides, p.dilates,
                                                       p.padding, p.padding);
      const dnnl::convolution_backward_data::primitive_desc pd(desc, user_scratchpad(), dnnl_engine(), fwd);
      e.impl = pd.impl_info_str();
      e.scratchpad = pd.scratchpad_desc();
      e.primitive = dnnl::convolution_backward_data(pd);
      e.src = pd.diff_src_desc();
      e.weights = pd.weights_desc();
      e.dst = pd.diff_dst_desc();
    } else {
      const dnnl::convolution_backward_weights::desc desc(dnnl::algorithm::convolution_direct,
                                                          activation_for(src, a), any_of(weights),
                                                          activation_for(dst, a), p.strides, p.dilates,
                                                          p.padding, p.padding);
      const dnnl::convolution_backward_weights::primitive_desc pd(desc, user_scratchpad(), dnnl_engine(), fwd);
      e.impl = pd.impl_info_str();
      e.scratchpad = pd.scratchpad_desc();
      e.primitive = dnnl::convolution_backward_weights(pd);
      e.src = pd.src_desc();
      e.weights = pd.diff_weights_desc();
      e.dst = pd.diff_dst_desc();
    }
    e.usable = !is_reference(e.impl);
  } catch (const dnnl::error&) {
    e.usable = false;  // no implementation for these dtypes or sizes: kiln's kernels run
  }
  return e;
}

// The primitive for a call whose activations are NHWC (`nhwc`: both dense channels_last)
// or not: NHWC ones as they are where oneDNN has a kernel for that, else blocked.
const Entry& entry(Kind kind, bool nhwc, const Conv2dGeometry& g, const memory::desc& src,
                   const memory::desc& weights, const memory::desc& dst, const memory::desc* bias) {
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<Entry>> entries;
  std::lock_guard lock(mutex);
  auto made = [&](Activations a) -> const Entry& {
    const Key key = key_of(kind, a, g, src.data_type(), weights.data_type(), dst.data_type(),
                           bias ? bias->data_type() : dt::undef);
    std::unique_ptr<Entry>& e = entries[key];
    if (!e) e = std::make_unique<Entry>(make_entry(kind, a, g, src, weights, dst, bias));
    return *e;
  };
  if (nhwc) {
    const Entry& direct = made(Activations::nhwc);
    if (direct.usable) return direct;
  }
  return made(Activations::blocked);
}

bool channels_last_dense(const Tensor& t) { return t.dim() == 4 && t.is_contiguous(MemoryFormat::channels_last); }

// A tensor's memory as oneDNN reads it, in the layout `want`: the tensor itself when it is
// laid out so already, else a reorder of it into scratch (kept alive in `keep`).
memory input_in(const Tensor& t, const memory::desc& given, const memory::desc& want, std::vector<Tensor>& keep) {
  memory user(given, dnnl_engine(), t.data_ptr());
  if (given == want) return user;
  keep.push_back(make_tensor({static_cast<int64_t>(want.get_size())}, DType::u8));
  memory m(want, dnnl_engine(), keep.back().data_ptr());
  dnnl::reorder(user, m).execute(dnnl_stream(), user, m);
  return m;
}

// Scratch for a result in the layout oneDNN writes, or the output itself when it matches.
memory output_in(const Tensor& out, const memory::desc& given, const memory::desc& want, std::vector<Tensor>& keep) {
  if (given == want) return memory(given, dnnl_engine(), out.data_ptr());
  keep.push_back(make_tensor({static_cast<int64_t>(want.get_size())}, DType::u8));
  return memory(want, dnnl_engine(), keep.back().data_ptr());
}

// Writes a result from oneDNN's layout into the output tensor (a no-op when it was
// written there directly).
void output_out(const memory& result, const Tensor& out, const memory::desc& given) {
  if (result.get_data_handle() == out.data_ptr() && result.get_desc() == given) return;
  memory user(given, dnnl_engine(), out.data_ptr());
  dnnl::reorder(result, user).execute(dnnl_stream(), const_cast<memory&>(result), user);
}

// The operands oneDNN can take as they are: dense, of a dtype it has (f32, bf16), the
// operands of one dtype; an output that is not dense is written through a dense temporary.
bool takes(const Tensor& a, const Tensor& b, const Tensor& out) {
  return conv_backend() != ConvBackend::own && a.dtype() == b.dtype() && data_type(a.dtype()) &&
         data_type(out.dtype()) && a.numel() > 0 && b.numel() > 0 && out.numel() > 0;
}

Tensor dense_view(const Tensor& t) { return dense(t) ? t : t.contiguous(); }

// Runs body(o) with o a dense tensor of out's shape and dtype (out itself when it is one),
// copied into out after.
template <class Body>
bool into_dense(const Tensor& out, Body&& body) {
  if (dense(out)) return body(out);
  Tensor tmp = make_tensor(out.shape(), out.dtype(), out.device(), out.suggest_memory_format());
  if (!body(tmp)) return false;
  Tensor(out).copy_(tmp);
  return true;
}

const char* kind_name(Kind k) {
  return k == Kind::forward ? "conv2d" : k == Kind::backward_input ? "conv2d_backward_input" : "conv2d_backward_weight";
}

// Runs a primitive, turning oneDNN's failures into kiln errors naming the op.
void execute(Kind kind, const Entry& e, std::unordered_map<int, memory> args, const Conv2dGeometry& g) {
  try {
    dnnl_run(e.primitive, e.scratchpad, std::move(args));
  } catch (const dnnl::error& err) {
    fail("{}: oneDNN ({}) failed on input [{}, {}, {}, {}], weight [{}, {}, {}, {}]: {}", kind_name(kind), e.impl,
         g.batch, g.in_channels, g.in_h, g.in_w, g.out_channels, g.in_channels / g.groups, g.kernel_h,
         g.kernel_w, err.what());
  }
  t_last_impl = e.impl;
  ++t_calls;
}

}  // namespace

bool dnnl_conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& bias_in, const Tensor& out,
                 const Conv2dGeometry& g) {
  if (!takes(x_in, w_in, out) || (bias_in.defined() && !data_type(bias_in.dtype()))) return false;
  const Tensor x = dense_view(x_in), w = dense_view(w_in);
  const Tensor bias = bias_in.defined() ? bias_in.contiguous() : Tensor();
  return into_dense(out, [&](const Tensor& o) {
    const memory::desc src = activation_desc(x), wd = weight_desc(w, g.groups), dst = activation_desc(o);
    const memory::desc bd = bias.defined() ? memory::desc({g.out_channels}, *data_type(bias.dtype()),
                                                          memory::format_tag::a)
                                           : memory::desc();
    // oneDNN's NHWC forward (brgemm) trails its blocked one on planes under 4x4.
    const bool nhwc = channels_last_dense(x) && channels_last_dense(o) && g.out_h * g.out_w >= 16;
    const Entry& e = entry(Kind::forward, nhwc, g, src, wd, dst, bias.defined() ? &bd : nullptr);
    if (!e.usable) return false;
    std::vector<Tensor> keep;
    std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, input_in(x, src, e.src, keep)},
                                            {DNNL_ARG_WEIGHTS, input_in(w, wd, e.weights, keep)}};
    if (bias.defined()) args.emplace(DNNL_ARG_BIAS, input_in(bias, bd, e.bias, keep));
    const memory result = output_in(o, dst, e.dst, keep);
    args.emplace(DNNL_ARG_DST, result);
    execute(Kind::forward, e, args, g);
    output_out(result, o, dst);
    return true;
  });
}

bool dnnl_conv2d_backward_input(const Tensor& grad_in, const Tensor& w_in, const Tensor& out,
                                const Conv2dGeometry& g) {
  if (!takes(grad_in, w_in, out)) return false;
  const Tensor grad = dense_view(grad_in), w = dense_view(w_in);
  return into_dense(out, [&](const Tensor& o) {
    const memory::desc src = activation_desc(o), wd = weight_desc(w, g.groups), dst = activation_desc(grad);
    const bool nhwc = channels_last_dense(grad) && channels_last_dense(o);
    const Entry& e = entry(Kind::backward_input, nhwc, g, src, wd, dst, nullptr);
    if (!e.usable) return false;
    std::vector<Tensor> keep;
    const memory result = output_in(o, src, e.src, keep);
    execute(Kind::backward_input, e,
            {{DNNL_ARG_DIFF_DST, input_in(grad, dst, e.dst, keep)},
             {DNNL_ARG_WEIGHTS, input_in(w, wd, e.weights, keep)},
             {DNNL_ARG_DIFF_SRC, result}},
            g);
    output_out(result, o, src);
    return true;
  });
}

bool dnnl_conv2d_backward_weight(const Tensor& grad_in, const Tensor& x_in, const Tensor& out,
                                 const Conv2dGeometry& g) {
  if (!takes(grad_in, x_in, out)) return false;
  const Tensor grad = dense_view(grad_in), x = dense_view(x_in);
  return into_dense(out, [&](const Tensor& o) {
    const memory::desc src = activation_desc(x), wd = weight_desc(o, g.groups), dst = activation_desc(grad);
    const bool nhwc = channels_last_dense(grad) && channels_last_dense(x);
    const Entry& e = entry(Kind::backward_weight, nhwc, g, src, wd, dst, nullptr);
    if (!e.usable) return false;
    std::vector<Tensor> keep;
    const memory result = output_in(o, wd, e.weights, keep);
    execute(Kind::backward_weight, e,
            {{DNNL_ARG_DIFF_DST, input_in(grad, dst, e.dst, keep)},
             {DNNL_ARG_SRC, input_in(x, src, e.src, keep)},
             {DNNL_ARG_DIFF_WEIGHTS, result}},
            g);
    output_out(result, o, wd);
    return true;
  });
}

#endif  // KILN_HAVE_DNNL

}  // namespace kiln::cpu
