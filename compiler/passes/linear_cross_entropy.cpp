// fuse_linear_cross_entropy (compiler/passes/passes.h): a language model's head and its
// loss as one op, linear_cross_entropy (core/ops/linear_cross_entropy.h), whose products run
// over the rows whose target is not ignore_index.
//
// The traced chain, after simplify (x: [N, L, ..., H], per-token rows; W: [V, H]; t: i64
// [M], M the rows of x):
//
//   logits  = matmul(x, permute(W, [1,0]))          [..., V]
//   biased  = add(logits, b)                         (optional; b: [V])
//   flat    = view(biased, [M, V])                   (optional: x 2-d)
//   lsm     = log_softmax(flat, dim=1)
//   loss    = nll_loss(lsm, t, none) {mean|sum, ignore_index}
//   g       = log_softmax_backward(nll_loss_backward(dl, lsm, t, none), lsm)
//   then, each optional, through views of g:
//   grad_bias   = sum(g, every dim but the last)
//   grad_input  = matmul(g, W)
//   grad_weight = matmul(permute(g, [1,0]), view(x, [M, H]))
//   and the count of correct predictions, sum(eq(argmax(biased or flat, -1), t)), where t
//   may be read through a view (kiln-train's accuracy).
//
// becomes linear_cross_entropy(view(x, [M, H]), W, b, t) -> (loss, correct, lse, logits) and
// linear_cross_entropy_backward(dl, ..., lse, logits) -> (grad_input, grad_weight,
// grad_bias), each result viewed back to the shape it replaces. The rewrite happens only
// when nothing else reads any value of the chain (no other reader of the logits, the
// log-probabilities or g, none of them a graph output), in f32 or f64 on the CPU, and on
// CUDA unless the caller says not (the CUDA op reads the target back: kiln::compile keeps
// the chain in a step it captures as a CUDA graph).
//
// What changes: the logits of rows whose target is ignored are never computed (a masked-LM
// batch predicts 15% of its tokens), and log_softmax, its backward and the [M, V]
// gradient's passes become row passes over the counted rows. Results agree with the chain
// to rounding (the GEMMs' blocking differs with the row count, the row sums are f64), not
// bit for bit. An ignored row whose input holds a NaN or an infinity gets a zero gradient
// here, where the chain's product 0 * inf would make it NaN.
#include <algorithm>
#include <unordered_map>
#include <vector>

#include "compiler/passes/passes.h"

namespace kiln::compiler {

namespace {

enum class Site : uint8_t { loss, correct, grad_input, grad_weight, grad_bias };

struct Chain {
  Value x, w, b, t, dl;  // values of the old graph (b, dl may be none)
  Attrs attrs;           // {reduction, ignore_index}
  int64_t m = 0, h = 0, v = 0;
};

// The old graph's readers: per value, the live op nodes that read it, and whether it leaves
// the graph (an output or a write-back).
class Readers {
 public:
  explicit Readers(const Graph& g) : g_(g) {
    const std::vector<bool> live = live_nodes(g);
    for (size_t n = 0; n < g.nodes().size(); ++n) {
      if (!live[n] || g.nodes()[n].kind != NodeKind::op) continue;
      for (Value v : g.nodes()[n].inputs)
        if (v.defined()) readers_[key(v)].push_back(static_cast<int32_t>(n));
    }
    for (Value v : g.outputs()) escapes_.push_back(key(v));
    for (const auto& wb : g.write_backs()) escapes_.push_back(key(wb.second));
  }
  // The distinct live nodes that read v; empty when v escapes (so no rule can claim it).
  std::vector<int32_t> of(Value v, bool* escapes) const {
    *escapes = std::find(escapes_.begin(), escapes_.end(), key(v)) != escapes_.end();
    const auto it = readers_.find(key(v));
    std::vector<int32_t> r = it == readers_.end() ? std::vector<int32_t>{} : it->second;
    std::sort(r.begin(), r.end());
    r.erase(std::unique(r.begin(), r.end()), r.end());
    return r;
  }

 private:
  int64_t key(Value v) const { return g_.value_number(v); }
  const Graph& g_;
  std::unordered_map<int64_t, std::vector<int32_t>> readers_;
  std::vector<int64_t> escapes_;
};

bool is_op(const Graph& g, Value v, std::string_view op) {
  const Node& n = g.node(v);
  return n.kind == NodeKind::op && n.op == op;
}
bool is_product(const Node& n) { return n.kind == NodeKind::op && (n.op == "matmul" || n.op == "mm"); }
Value out0(int32_t node) { return Value{node, 0}; }

// The last dim of `type` named by `dim` (-1 or rank - 1).
bool is_last_dim(int64_t dim, const TensorType& type) {
  return dim == -1 || dim == static_cast<int64_t>(type.shape.size()) - 1;
}

// Finds the chains of `g` and the node (by its first value's number) each result replaces.
class Matcher {
 public:
  // cuda: chains on CUDA values too (else the CPU's alone).
  Matcher(const Graph& g, bool cuda) : g_(g), readers_(g), cuda_(cuda) {
    for (size_t n = 0; n < g.nodes().size(); ++n)
      if (g.nodes()[n].kind == NodeKind::op && g.nodes()[n].op == "nll_loss") match(static_cast<int32_t>(n));
  }
  std::vector<Chain> chains;
  std::unordered_map<int64_t, std::pair<size_t, Site>> sites;  // old value number -> (chain, site)

 private:
  // The readers of v, or nothing when v escapes the graph.
  std::optional<std::vector<int32_t>> readers(Value v) const {
    bool escapes = false;
    std::vector<int32_t> r = readers_.of(v, &escapes);
    if (escapes) return std::nullopt;
    return r;
  }

  void match(int32_t loss_node) {
    const Node& nll = g_.nodes()[static_cast<size_t>(loss_node)];
    if (nll.inputs.size() != 3 || nll.inputs[2].defined()) return;  // class weights: not this op
    const std::string& reduction = nll.attrs.str("reduction");
    if (reduction != "mean" && reduction != "sum") return;
    const Value lsm = nll.inputs[0], t = nll.inputs[1];
    if (!is_op(g_, lsm, "log_softmax")) return;
    const Node& log_softmax = g_.node(lsm);
    const Value flat = log_softmax.inputs[0];
    const TensorType& flat_type = g_.type(flat);
    if (flat_type.shape.size() != 2 || !is_last_dim(log_softmax.attrs.i("dim"), flat_type)) return;
    Value biased = flat;
    if (is_op(g_, flat, "view")) biased = g_.node(flat).inputs[0];
    Value logits = biased, b{};
    if (is_op(g_, biased, "add")) {
      const Node& add = g_.node(biased);
      if (const auto alpha = add.attrs.optional_scalar("alpha"); alpha && alpha->to_double() != 1.0) return;
      const bool left = is_product(g_.node(add.inputs[0]));
      logits = add.inputs[left ? 0 : 1];
      b = add.inputs[left ? 1 : 0];
    }
    if (!is_product(g_.node(logits))) return;
    const Value x = g_.node(logits).inputs[0], wt = g_.node(logits).inputs[1];
    if (!is_op(g_, wt, "permute") || g_.node(wt).attrs.ints("dims") != std::vector<int64_t>{1, 0}) return;
    const Value w = g_.node(wt).inputs[0];

    Chain c{.x = x, .w = w, .b = b, .t = t, .attrs = {{"reduction", reduction},
                                                      {"ignore_index", nll.attrs.i("ignore_index")}}};
    const TensorType &xt = g_.type(x), &wt_type = g_.type(w);
    // Per-token predictions ([N, L, H] and up: a language model's head) only. Its rows are
    // tokens, of which a masked-LM batch or padding ignores most; a classifier's [N, H]
    // head counts every row, saves little, and keeps eager code's bits this way.
    if (wt_type.shape.size() != 2 || xt.shape.size() < 3) return;
    c.v = wt_type.shape[0];
    c.h = wt_type.shape[1];
    if (xt.shape.back() != c.h || c.h == 0) return;
    c.m = numel_of(xt.shape) / c.h;
    const bool floating = xt.dtype == DType::f32 || xt.dtype == DType::f64;
    const bool device = xt.device.is_cpu() || (cuda_ && xt.device.is_cuda());
    if (!floating || wt_type.dtype != xt.dtype || !device || wt_type.device != xt.device) return;
    if (xt.layout != MemoryFormat::contiguous || !dense(g_, x)) return;
    if (b.defined() && !(g_.type(b).shape == Shape{c.v} && g_.type(b).dtype == xt.dtype)) return;
    if (flat_type.shape != Shape({c.m, c.v}) || g_.type(t).shape != Shape{c.m}) return;

    std::vector<std::pair<int32_t, Site>> found{{loss_node, Site::loss}};
    // The logits, their biased and flat forms: read by the next link and by argmax chains.
    std::vector<Value> links{logits};
    if (b.defined()) links.push_back(biased);
    if (flat != biased) links.push_back(flat);
    for (size_t i = 0; i < links.size(); ++i) {
      const auto r = readers(links[i]);
      if (!r) return;
      const int32_t next = i + 1 < links.size() ? links[i + 1].node : lsm.node;
      for (int32_t reader : *r) {
        if (reader == next) continue;
        // An argmax of the product before its bias is not the op's count.
        if ((b.defined() && links[i] == logits) || !counts_correct(reader, t, found)) return;
      }
    }
    // The log-probabilities: the loss, and the backward pair.
    const auto lsm_readers = readers(lsm);
    if (!lsm_readers) return;
    int32_t nll_backward = -1, lsm_backward = -1;
    for (int32_t reader : *lsm_readers) {
      const Node& n = g_.nodes()[static_cast<size_t>(reader)];
      if (reader == loss_node) continue;
      if (n.op == "nll_loss_backward" && nll_backward < 0 && n.inputs[1] == lsm && n.inputs[2] == t &&
          !n.inputs[3].defined() && n.attrs.str("reduction") == reduction &&
          n.attrs.i("ignore_index") == nll.attrs.i("ignore_index"))
        nll_backward = reader;
      else if (n.op == "log_softmax_backward" && lsm_backward < 0 && n.inputs[1] == lsm)
        lsm_backward = reader;
      else
        return;
    }
    if ((nll_backward < 0) != (lsm_backward < 0)) return;
    if (nll_backward >= 0) {
      const Node& nb = g_.nodes()[static_cast<size_t>(nll_backward)];
      const Node& sb = g_.nodes()[static_cast<size_t>(lsm_backward)];
      const auto nb_readers = readers(out0(nll_backward));
      if (!nb_readers || *nb_readers != std::vector<int32_t>{lsm_backward} || sb.inputs[0] != out0(nll_backward) ||
          sb.attrs.i("dim") != log_softmax.attrs.i("dim"))
        return;
      c.dl = nb.inputs[0];
      const TensorType& dl = g_.type(c.dl);
      if (dl.dtype != xt.dtype || !dl.shape.empty()) return;
      if (!gradient_readers(out0(lsm_backward), c, found)) return;
    }
    // Each replaced node must come after every operand the new ops read (an accuracy
    // computed before the loss's target view exists is left alone).
    const int32_t forward_operand = std::max({c.x.node, c.w.node, c.b.node, c.t.node});
    for (const auto& [node, site] : found) {
      const bool gradient = site != Site::loss && site != Site::correct;
      if (node <= std::max(forward_operand, gradient ? c.dl.node : -1)) return;
    }
    const size_t index = chains.size();
    chains.push_back(c);
    for (const auto& [node, site] : found) sites[g_.value_number(out0(node))] = {index, site};
  }

  // sum(eq(argmax(logits, -1), t')) with t' t or what t views, nothing else reading the
  // argmax and the comparison: the count linear_cross_entropy gives.
  bool counts_correct(int32_t node, Value t, std::vector<std::pair<int32_t, Site>>& found) const {
    const Node& argmax = g_.nodes()[static_cast<size_t>(node)];
    if (argmax.op != "argmax" || !argmax.attrs.has("dim") ||
        !is_last_dim(argmax.attrs.i("dim"), g_.type(argmax.inputs[0])) ||
        (argmax.attrs.has("keepdim") && argmax.attrs.b("keepdim")))
      return false;
    const auto eqs = readers(out0(node));
    if (!eqs || eqs->empty()) return false;
    for (int32_t e : *eqs) {
      const Node& eq = g_.nodes()[static_cast<size_t>(e)];
      if (eq.op != "eq" || eq.inputs.size() != 2) return false;
      const Value other = eq.inputs[0] == out0(node) ? eq.inputs[1] : eq.inputs[0];
      const bool same_target = other == t || (is_op(g_, t, "view") && g_.node(t).inputs[0] == other);
      if (!same_target) return false;
      const auto sums = readers(out0(e));
      if (!sums || sums->empty()) return false;
      for (int32_t s : *sums) {
        const Node& sum = g_.nodes()[static_cast<size_t>(s)];
        // No dims (or all of them): the sum of every element.
        const bool over_all = !sum.attrs.has("dims") || sum.attrs.ints("dims").empty() ||
                              sum.attrs.ints("dims").size() == g_.type(out0(e)).shape.size();
        if (sum.op != "sum" || !over_all || !g_.type(out0(s)).shape.empty()) return false;
        found.emplace_back(s, Site::correct);
      }
    }
    return true;
  }

  // A sum over every dim of `type` but the last.
  static bool leading_dims(const Node& sum, const TensorType& type) {
    const int64_t rank = static_cast<int64_t>(type.shape.size());
    std::vector<int64_t> dims = sum.attrs.ints("dims");
    for (int64_t& d : dims) d = d < 0 ? d + rank : d;
    std::sort(dims.begin(), dims.end());
    dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
    if (static_cast<int64_t>(dims.size()) != rank - 1) return false;
    for (int64_t i = 0; i < rank - 1; ++i)
      if (dims[static_cast<size_t>(i)] != i) return false;
    return true;
  }

  // Every reader of the logits' gradient g (through views) is one the backward op answers.
  bool gradient_readers(Value g, const Chain& c, std::vector<std::pair<int32_t, Site>>& found) const {
    std::vector<Value> family{g};
    for (size_t i = 0; i < family.size(); ++i) {
      const auto r = readers(family[i]);
      if (!r) return false;
      const TensorType& type = g_.type(family[i]);
      for (int32_t reader : *r) {
        const Node& n = g_.nodes()[static_cast<size_t>(reader)];
        const Value out = out0(reader);
        if (n.op == "view") {
          family.push_back(out);
        } else if (n.op == "sum" && n.attrs.has("dims") && !n.attrs.has("dtype") && leading_dims(n, type) &&
                   numel_of(g_.type(out).shape) == c.v && g_.type(out).shape.back() == c.v) {
          found.emplace_back(reader, Site::grad_bias);
        } else if (is_product(n) && n.inputs[0] == family[i] && n.inputs[1] == c.w) {
          found.emplace_back(reader, Site::grad_input);
        } else if (n.op == "permute" && type.shape.size() == 2 && n.attrs.ints("dims") == std::vector<int64_t>{1, 0}) {
          const auto products = readers(out);
          if (!products || products->empty()) return false;
          for (int32_t p : *products) {
            const Node& product = g_.nodes()[static_cast<size_t>(p)];
            const Value rows = product.inputs.size() == 2 ? product.inputs[1] : Value{};
            const bool rows_are_x =
                rows == c.x || (is_op(g_, rows, "view") && g_.node(rows).inputs[0] == c.x &&
                                g_.type(rows).shape == Shape({c.m, c.h}));
            if (!is_product(product) || product.inputs[0] != out || !rows_are_x) return false;
            found.emplace_back(p, Site::grad_weight);
          }
        } else {
          return false;
        }
      }
    }
    return true;
  }

  const Graph& g_;
  Readers readers_;
  bool cuda_ = false;
};

// The replacement of the node `cand` of the chain `c`: the forward op's loss or count, or a
// gradient of the backward op, in the replaced value's shape.
Replacement replace(Rewriter& rw, const Candidate& cand, const Chain& c, Site site) {
  const Value x = rw.mapped(c.x);
  const Value rows = rw.add_op1("view", {x}, {{"shape", std::vector<int64_t>{c.m, c.h}}});
  const Values operands{rows, rw.mapped(c.w), rw.mapped(c.b), rw.mapped(c.t)};
  const Values forward = rw.add_op("linear_cross_entropy", operands, c.attrs, "linear_cross_entropy");
  // The result `value` in the replaced node's shape.
  auto shaped = [&](Value value) {
    const Shape& want = cand.outputs.at(0).shape;
    if (rw.type(value).shape == want) return value;
    return rw.add_op1("view", {value}, {{"shape", std::vector<int64_t>(want.begin(), want.end())}});
  };
  switch (site) {
    case Site::loss: return Values{forward[0]};
    case Site::correct: return Values{forward[1]};
    default: break;
  }
  const Values backward =
      rw.add_op("linear_cross_entropy_backward",
                {rw.mapped(c.dl), rows, operands[1], operands[2], operands[3], forward[2], forward[3]}, c.attrs,
                "linear_cross_entropy backward");
  const size_t which = site == Site::grad_input ? 0 : site == Site::grad_weight ? 1 : 2;
  return Values{shaped(backward[which])};
}

}  // namespace

Graph fuse_linear_cross_entropy(const Graph& graph, bool cuda, RewriteLog* log) {
  const Matcher matcher(graph, cuda);
  if (matcher.chains.empty()) return rewrite(graph, {}, log);
  const std::vector<Rule> rules{{"linear_cross_entropy", {}, [&matcher](Rewriter& rw, const Candidate& c) -> Replacement {
                                   const auto it = matcher.sites.find(c.old_number);
                                   if (c.old_number < 0 || it == matcher.sites.end()) return std::nullopt;
                                   const auto [chain, site] = it->second;
                                   return replace(rw, c, matcher.chains[chain], site);
                                 }}};
  return rewrite(graph, rules, log);
}

}  // namespace kiln::compiler
