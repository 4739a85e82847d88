// split_batch_norm (compiler/passes/passes.h): a training batch norm and its backward as
// per-channel statistics ops plus pointwise work, which fusion merges with the ReLU, the
// residual add and ReLU's backward mask around them.
//
// The two statistics ops are the compiler's own (only this pass makes them; eager code never
// calls them), with CPU kernels in kernels/cpu/norm.cpp and CUDA kernels in
// kernels/cuda/norm_split.cpp:
//
//   batch_norm_train_stats(x, weight?, bias?, running_mean, running_var) {momentum, eps}
//     -> (save_mean, save_invstd, new_running_mean, new_running_var, scale, shift)
//   the batch statistics and the running statistics' update exactly as batch_norm_update
//   computes them, and the per-channel factors of its output, scale = invstd * weight and
//   shift = bias - mean * invstd * weight, in the compute type (rounded from f64 as the CPU
//   kernel rounds them), so that y = x * scale + shift;
//
//   batch_norm_grad_stats(grad_out, x, weight?, save_mean, save_invstd, relu_out?)
//     -> (grad_weight, grad_bias, mean_dy, k, scale)
//   the per-channel sums of batch_norm_backward (training): grad_bias = sum dy, grad_weight
//   = sum dy (x - mean) * invstd, and the factors of the input gradient dx = ((dy - mean_dy)
//   - (x - mean) k) scale in the compute type. Given relu_out, dy is where(relu_out > 0,
//   grad_out, 0): ReLU's backward read from its saved output inside the sums, so the masked
//   gradient is never stored.
//
// Statistics keep the statistics dtype (f32, f64 for f64 inputs); 16-bit inputs are read
// and the results written in 16 bit, the arithmetic in f32 and the sums in f64.
#include <algorithm>
#include <string>

#include "compiler/passes/passes.h"
#include "core/error.h"
#include "core/registry.h"

namespace kiln::compiler {

namespace {

DType stats_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

void check_per_channel(const TensorMeta& m, int64_t channels, const char* what,
                       std::span<const TensorMeta> in, const char* op) {
  if (!m.defined) return;
  KILN_CHECK(is_floating(m.dtype) && m.shape == Shape{channels},
             "{}: {} must be floating of shape [{}], got {}", op, what, channels, metas_str(in));
}

void check_input(const TensorMeta& x, std::span<const TensorMeta> in, const char* op) {
  KILN_CHECK(x.defined && is_floating(x.dtype) && x.shape.size() >= 2,
             "{}: expects a floating input of shape [N,C,...], got {}", op, metas_str(in));
  const int64_t channels = x.shape[1];
  KILN_CHECK(channels > 0 && numel_of(x.shape) / channels > 1,
             "{}: expected more than 1 value per channel, got {}", op, metas_str(in));
}

// (x, weight?, bias?, running_mean, running_var) -> (save_mean, save_invstd, new_running_mean,
// new_running_var, scale, shift)
std::vector<TensorMeta> infer_train_stats(std::span<const TensorMeta> in, const Attrs& a) {
  constexpr const char* op = "batch_norm_train_stats";
  KILN_CHECK(in.size() == 5, "{}: expects 5 tensors (absent optional ones undefined), got {}", op,
             in.size());
  check_input(in[0], in, op);
  KILN_CHECK(a.has("momentum") && a.has("eps"),
             "{}: attributes 'momentum' and 'eps' are required ({})", op, a.to_string());
  const int64_t channels = in[0].shape[1];
  check_per_channel(in[1], channels, "weight", in, op);
  check_per_channel(in[2], channels, "bias", in, op);
  KILN_CHECK(in[3].defined && in[4].defined, "{}: running_mean and running_var are required ({})",
             op, metas_str(in));
  check_per_channel(in[3], channels, "running_mean", in, op);
  check_per_channel(in[4], channels, "running_var", in, op);
  const Device device = common_device(in, op);
  const TensorMeta s{Shape{channels}, stats_dtype(in[0].dtype), device};
  return {s,
          s,
          TensorMeta{in[3].shape, in[3].dtype, device},
          TensorMeta{in[4].shape, in[4].dtype, device},
          s,
          s};
}

// (grad_out, x, weight?, save_mean, save_invstd, relu_out?) -> (grad_weight, grad_bias,
// mean_dy, k, scale)
std::vector<TensorMeta> infer_grad_stats(std::span<const TensorMeta> in, const Attrs&) {
  constexpr const char* op = "batch_norm_grad_stats";
  KILN_CHECK(in.size() == 6, "{}: expects 6 tensors (absent optional ones undefined), got {}", op,
             in.size());
  const TensorMeta &g = in[0], &x = in[1];
  check_input(x, in, op);
  KILN_CHECK(g.defined && is_floating(g.dtype) && g.shape == x.shape,
             "{}: grad_out must be floating and shaped as the input ({})", op, metas_str(in));
  const int64_t channels = x.shape[1];
  check_per_channel(in[2], channels, "weight", in, op);
  KILN_CHECK(in[3].defined && in[4].defined, "{}: save_mean and save_invstd are required ({})", op,
             metas_str(in));
  check_per_channel(in[3], channels, "save_mean", in, op);
  check_per_channel(in[4], channels, "save_invstd", in, op);
  KILN_CHECK(!in[5].defined || in[5].shape == x.shape,
             "{}: relu_out must be shaped as the input ({})", op, metas_str(in));
  const Device device = common_device(in, op);
  const DType param = in[2].defined ? in[2].dtype : x.dtype;
  const TensorMeta p{Shape{channels}, param, device},
      s{Shape{channels}, stats_dtype(x.dtype), device};
  return {p, p, s, s, s};
}

const OpDef& kTrainStats =
    define_op({.name = "batch_norm_train_stats", .infer = infer_train_stats});
const OpDef& kGradStats = define_op({.name = "batch_norm_grad_stats", .infer = infer_grad_stats});

Value cast_to(Rewriter& rw, Value v, DType dtype, const std::string& src) {
  if (rw.type(v).dtype == dtype) return v;
  return rw.add_op1("cast", {v}, {{"dtype", dtype}}, src);
}

// A [C] statistic viewed as [1, C, 1, ...] to broadcast over an input of rank `rank`.
Value per_channel(Rewriter& rw, Value v, size_t rank, const std::string& src) {
  Shape shape(rank, 1);
  shape[1] = rw.type(v).shape.at(0);
  return rw.add_op1("view", {v}, {{"shape", shape}}, src);
}

bool applies(const Rewriter& rw, Value x, BatchNormSplit split) {
  if (split == BatchNormSplit::never) return false;
  const TensorType& t = rw.type(x);
  return split == BatchNormSplit::always ? (t.device.is_cpu() || t.device.is_cuda())
                                         : t.device.is_cuda();
}

// batch_norm_update(x, w?, b?, rm, rv) -> (y, mean, invstd, new rm, new rv):
// batch_norm_train_stats, then y = x * scale + shift in the compute type, rounded once.
Replacement split_forward(Rewriter& rw, const Candidate& c, BatchNormSplit split) {
  const Value x = c.inputs[0];
  if (!applies(rw, x, split) || !c.attrs.has("eps") || !c.attrs.has("momentum"))
    return std::nullopt;
  const std::string& src = c.source;
  const TensorType& xt = rw.type(x);
  const Values stats =
      rw.add_op("batch_norm_train_stats", {x, c.inputs[1], c.inputs[2], c.inputs[3], c.inputs[4]},
                {{"momentum", c.attrs.f("momentum")}, {"eps", c.attrs.f("eps")}}, src);
  const size_t rank = xt.shape.size();
  // x (16-bit) times a compute-type factor promotes to the compute type, converting x as it
  // reads it: no cast node, which the backward's x - mean would share and so store.
  const Value scaled = rw.add_op1("mul", {x, per_channel(rw, stats[4], rank, src)}, {}, src);
  const Value y = rw.add_op1("add", {scaled, per_channel(rw, stats[5], rank, src)}, {}, src);
  return Values{cast_to(rw, y, xt.dtype, src), stats[0], stats[1], stats[2], stats[3]};
}

// batch_norm_backward(g, x, w?, mean, invstd) {training=true} -> (dx, dw, db):
// batch_norm_grad_stats, then dx = ((dy - mean_dy) - (x - mean) k) scale in the compute type.
// When g is ReLU's backward, where(gt(r, 0), g0, 0), read by nothing else (`masked` holds
// those nodes' numbers in the source graph), the sums read g0 and r themselves and the mask
// is one more line of dx's kernel, which fusion runs after the sums.
Replacement split_backward(Rewriter& rw, const Candidate& c, BatchNormSplit split,
                           const std::vector<int64_t>& masked) {
  const Value g = c.inputs[0], x = c.inputs[1];
  if (!applies(rw, x, split) || !c.attrs.has("training") || !c.attrs.b("training"))
    return std::nullopt;
  const std::string& src = c.source;
  const TensorType& xt = rw.type(x);
  Value grad_source = g, relu_out;
  if (std::find(masked.begin(), masked.end(), c.old_number) != masked.end() &&
      rw.is_op(g, "where")) {
    const Node& where = rw.producer(g);
    const Node& cond = rw.producer(where.inputs[0]);
    grad_source = where.inputs[1];
    relu_out = cond.inputs[0];
  }
  const Values sums =
      rw.add_op("batch_norm_grad_stats",
                {grad_source, x, c.inputs[2], c.inputs[3], c.inputs[4], relu_out}, {}, src);
  const DType compute = stats_dtype(xt.dtype);
  const size_t rank = xt.shape.size();
  // The CPU kernel reads grad_out in x's dtype, then computes in the compute type. 16-bit
  // operands meet compute-type factors, so the ops promote them as they read them (a cast
  // node of x would be the forward's, hash-consed, and stored in f32 for this kernel).
  const Value dy =
      rw.type(g).dtype == xt.dtype ? g : cast_to(rw, cast_to(rw, g, xt.dtype, src), compute, src);
  const Value xmu = rw.add_op1(
      "sub", {x, per_channel(rw, cast_to(rw, c.inputs[3], compute, src), rank, src)}, {}, src);
  const Value centered = rw.add_op1("sub", {dy, per_channel(rw, sums[2], rank, src)}, {}, src);
  const Value projected = rw.add_op1("mul", {xmu, per_channel(rw, sums[3], rank, src)}, {}, src);
  const Value dx = rw.add_op1(
      "mul",
      {rw.add_op1("sub", {centered, projected}, {}, src), per_channel(rw, sums[4], rank, src)}, {},
      src);
  return Values{cast_to(rw, dx, c.outputs[0].dtype, src), sums[0], sums[1]};
}

bool is_zero(const Graph& g, Value v) {
  const Node& n = g.node(v);
  return n.kind == NodeKind::constant && n.attrs.scalar("value").to_double() == 0.0;
}

// The batch_norm_backward nodes of `graph` (their first values' numbers) whose grad_out is
// ReLU's backward, where(gt(r, 0), g, 0), that nothing else reads.
std::vector<int64_t> masked_backwards(const Graph& graph) {
  const std::vector<Node>& nodes = graph.nodes();
  std::vector<int32_t> readers(nodes.size(), 0);
  for (const Node& n : nodes)
    for (Value v : n.inputs)
      if (v.defined()) ++readers[static_cast<size_t>(v.node)];
  for (Value v : graph.outputs()) readers[static_cast<size_t>(v.node)] += 2;
  for (const auto& wb : graph.write_backs()) readers[static_cast<size_t>(wb.second.node)] += 2;
  std::vector<int64_t> out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.kind != NodeKind::op || n.op != "batch_norm_backward") continue;
    const Node& where = graph.node(n.inputs[0]);
    if (where.kind != NodeKind::op || where.op != "where" ||
        readers[static_cast<size_t>(n.inputs[0].node)] != 1)
      continue;
    const Node& cond = graph.node(where.inputs[0]);
    if (cond.kind != NodeKind::op || cond.op != "gt" || !is_zero(graph, cond.inputs[1]) ||
        !is_zero(graph, where.inputs[2]))
      continue;
    const TensorType &r = graph.type(cond.inputs[0]), &g = graph.type(where.inputs[1]);
    if (r.shape != graph.type(n.inputs[1]).shape || g.shape != r.shape ||
        g.dtype != graph.type(n.inputs[0]).dtype)
      continue;
    out.push_back(graph.value_number({static_cast<int32_t>(i), 0}));
  }
  return out;
}

}  // namespace

const char* batch_norm_split_name(BatchNormSplit split) {
  switch (split) {
    case BatchNormSplit::cuda:
      return "cuda";
    case BatchNormSplit::always:
      return "always";
    case BatchNormSplit::never:
      return "never";
  }
  return "?";
}

Graph split_batch_norm(const Graph& graph, BatchNormSplit split, RewriteLog* log) {
  if (split == BatchNormSplit::never) return graph;
  const std::vector<int64_t> masked = masked_backwards(graph);
  const std::vector<Rule> rules = {
      {"split_batch_norm",
       {"batch_norm_update"},
       [split](Rewriter& rw, const Candidate& c) { return split_forward(rw, c, split); }},
      {"split_batch_norm_backward",
       {"batch_norm_backward"},
       [split, masked](Rewriter& rw, const Candidate& c) {
         return split_backward(rw, c, split, masked);
       }},
  };
  return rewrite(graph, rules, log);
}

}  // namespace kiln::compiler
