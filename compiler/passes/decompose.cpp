// decompose: ops the code generator cannot fuse, rewritten into reductions and elementwise
// ops it can (compiler/passes/passes.h). Each rule spells out what the eager CPU kernel
// computes (kernels/cpu/norm.cpp), in the same precision: statistics accumulate in f64,
// elementwise work happens in the compute type (f32 for 16-bit floats, f64 for f64) and the
// result is rounded to the input's dtype once, at the end.
//
// Where a statistic is read by several consumers, the rules convert inside the reduction
// (mean and sum with a `dtype` attribute) rather than through a shared cast node, so that
// fusion can keep each reduction's prologue private and nothing is stored twice.
#include "compiler/passes/passes.h"

namespace kiln::compiler {

namespace {

// The compute type of the eager norm kernels: f32 for every float but f64.
DType compute_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// `v` converted to `dtype`: v itself when it already has it.
Value cast_to(Rewriter& rw, Value v, DType dtype) {
  if (rw.type(v).dtype == dtype) return v;
  return rw.add_op1("cast", {v}, {{"dtype", dtype}}, "decompose");
}

// The shapes a layer_norm rule needs: the normalized (trailing) dims, the leading ones and
// the statistics' shape (leading dims, then a 1 per normalized dim).
struct NormDims {
  std::vector<int64_t> normalized, leading;
  Shape stats;
};
NormDims norm_dims(const Shape& x, const Shape& normalized_shape) {
  NormDims d;
  const auto axis = static_cast<int64_t>(x.size() - normalized_shape.size());
  for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
    (i < axis ? d.leading : d.normalized).push_back(i);
    d.stats.push_back(i < axis ? x[static_cast<size_t>(i)] : 1);
  }
  return d;
}

Attrs reduce_attrs(const std::vector<int64_t>& dims, bool keepdim, std::optional<DType> dtype = std::nullopt) {
  Attrs a{{"dims", dims}, {"keepdim", keepdim}};
  if (dtype) a.set("dtype", *dtype);
  return a;
}

// Decomposed ops become generated kernels, which the CPU and CUDA targets have; another
// device would keep its library's fused kernel.
bool has_generated_target(const Rewriter& rw, Value v) { return rw.type(v).device.is_cpu() || rw.type(v).device.is_cuda(); }

// layer_norm(x, w?, b?) -> (out, mean, rstd), as kernels/cpu/norm.cpp computes it per row:
//   m = mean(x) and var = mean((x - m)^2) in f64, rstd = 1 / sqrt(var + eps) in f64,
//   out = ((x - m) * rstd * w + b) in the compute type, with m and rstd rounded to it.
Replacement layer_norm(Rewriter& rw, const Candidate& c) {
  const Value x = c.inputs[0], w = c.inputs[1], b = c.inputs[2];
  if (!has_generated_target(rw, x)) return std::nullopt;
  const TensorType& xt = rw.type(x);
  const NormDims d = norm_dims(xt.shape, c.attrs.ints("normalized_shape"));
  if (d.normalized.empty()) return std::nullopt;
  const double eps = c.attrs.has("eps") ? c.attrs.f("eps") : 1e-5;
  const DType compute = compute_dtype(xt.dtype);
  const std::string& src = c.source;

  const Value mean64 = rw.add_op1("mean", {x}, reduce_attrs(d.normalized, true, DType::f64), src);
  const Value centered64 = rw.add_op1("sub", {x, mean64}, {}, src);
  const Value var64 = rw.add_op1("mean", {rw.add_op1("mul", {centered64, centered64}, {}, src)},
                                 reduce_attrs(d.normalized, true), src);
  const Value eps_value = rw.add_constant(Scalar(eps), TensorType{.dtype = DType::f64, .shape = {}, .device = xt.device,
                                                                  .wrapped_number = true});
  const Value rstd64 =
      rw.add_op1("reciprocal", {rw.add_op1("sqrt", {rw.add_op1("add", {var64, eps_value}, {}, src)}, {}, src)}, {}, src);
  // The saved statistics have the compute type (stats_dtype equals it), as do the factors.
  const Value mean = cast_to(rw, mean64, compute), rstd = cast_to(rw, rstd64, compute);

  Value y = rw.add_op1("mul", {rw.add_op1("sub", {cast_to(rw, x, compute), mean}, {}, src), rstd}, {}, src);
  if (w.defined()) y = rw.add_op1("mul", {y, cast_to(rw, w, compute)}, {}, src);
  if (b.defined()) y = rw.add_op1("add", {y, cast_to(rw, b, compute)}, {}, src);
  return Values{cast_to(rw, y, xt.dtype), mean, rstd};
}

// layer_norm_backward(g, x, mean, rstd, w?) -> (dx, dw, db), as kernels/cpu/norm.cpp:
//   xhat = (x - mean) * rstd and gw = g * w in the compute type;
//   dw = sum over rows of g * xhat, db = sum over rows of g, both in f64;
//   dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), the means in f64.
Replacement layer_norm_backward(Rewriter& rw, const Candidate& c) {
  const Value g_in = c.inputs[0], x = c.inputs[1], mean_in = c.inputs[2], rstd_in = c.inputs[3], w = c.inputs[4];
  if (!has_generated_target(rw, x)) return std::nullopt;
  const TensorType& xt = rw.type(x);
  const NormDims d = norm_dims(xt.shape, c.attrs.ints("normalized_shape"));
  // The kernel reads the statistics by row whatever their shape; only the layout
  // layer_norm saves them in broadcasts here. With no leading dims there are no row sums.
  if (d.normalized.empty() || d.leading.empty() || rw.type(mean_in).shape != d.stats ||
      rw.type(rstd_in).shape != d.stats)
    return std::nullopt;
  const DType compute = compute_dtype(xt.dtype);
  const DType param = c.outputs[1].dtype;
  const std::string& src = c.source;

  const Value g = cast_to(rw, cast_to(rw, g_in, xt.dtype), compute);  // the kernel reads g in x's dtype
  const Value rstd = cast_to(rw, rstd_in, compute);
  const Value xhat = rw.add_op1(
      "mul", {rw.add_op1("sub", {cast_to(rw, x, compute), cast_to(rw, mean_in, compute)}, {}, src), rstd}, {}, src);
  const Value gw = w.defined() ? rw.add_op1("mul", {g, cast_to(rw, w, compute)}, {}, src) : g;

  // Products of two compute-type values are exact in f64, as the kernel forms them.
  auto f64_product = [&](Value a, Value b) {
    return rw.add_op1("mul", {cast_to(rw, a, DType::f64), cast_to(rw, b, DType::f64)}, {}, src);
  };
  const Value dw = cast_to(rw, rw.add_op1("sum", {f64_product(g, xhat)}, reduce_attrs(d.leading, false), src), param);
  const Value db = cast_to(rw, rw.add_op1("sum", {g}, reduce_attrs(d.leading, false, DType::f64), src), param);

  const Value mean_g = rw.add_op1("mean", {gw}, reduce_attrs(d.normalized, true, DType::f64), src);
  const Value mean_gx = rw.add_op1("mean", {f64_product(gw, xhat)}, reduce_attrs(d.normalized, true), src);
  const Value centered = rw.add_op1("sub", {gw, cast_to(rw, mean_g, compute)}, {}, src);
  const Value dx = rw.add_op1(
      "mul", {rstd, rw.add_op1("sub", {centered, rw.add_op1("mul", {xhat, cast_to(rw, mean_gx, compute)}, {}, src)}, {}, src)},
      {}, src);
  return Values{cast_to(rw, dx, xt.dtype), dw, db};
}

}  // namespace

const std::vector<Rule>& decompose_rules() {
  static const std::vector<Rule> rules = {
      {"decompose_layer_norm", {"layer_norm"}, layer_norm},
      {"decompose_layer_norm_backward", {"layer_norm_backward"}, layer_norm_backward},
  };
  return rules;
}

// The pass applies the rules to values on CUDA only. On the CPU the eager kernels
// (kernels/cpu/norm.cpp: each row's passes while it is in cache) beat the decomposed form,
// whose generated reductions and pointwise kernels each walk the whole tensor: in BERT-mini's
// compiled step the layer norms took ~14 ms as eager kernels against ~50 ms as generated
// ones (docs/compiler.md, "Passes"). The rules still cover the CPU, where the tests check
// their arithmetic against the eager kernels.
Graph decompose(const Graph& graph, RewriteLog* log) {
  static const std::vector<Rule> on_cuda = [] {
    std::vector<Rule> rules = decompose_rules();
    for (Rule& r : rules)
      r.apply = [inner = r.apply](Rewriter& rw, const Candidate& c) -> Replacement {
        if (!c.outputs[0].device.is_cuda()) return std::nullopt;
        return inner(rw, c);
      };
    return rules;
  }();
  return rewrite(graph, on_cuda, log);
}

}  // namespace kiln::compiler
