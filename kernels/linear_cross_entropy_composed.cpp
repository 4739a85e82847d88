// linear_cross_entropy and its backward op composed of eager ops
// (kernels/linear_cross_entropy_composed.h). The counted rows are found on the host (one
// read of the target: a device sync on CUDA, which is why kiln::compile leaves the head as
// the chain of ops in a step it captures as a CUDA graph), gathered, and the products run
// over them alone, as the CPU kernels do. The log-sum-exps are the rows' logsumexp in the
// input's dtype, widened to f64, and the loss and the bias gradient sum in f64.
#include "kernels/linear_cross_entropy_composed.h"

#include <limits>

#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/indexing.h"
#include "core/ops/linalg.h"
#include "core/ops/reduce.h"

namespace kiln {

std::vector<int64_t> counted_rows(const Tensor& target, int64_t classes, int64_t ignore_index, const char* op,
                                  const Tensor& input) {
  const int64_t* t = target.data_ptr<int64_t>();
  std::vector<int64_t> rows;
  for (int64_t r = 0, m = target.numel(); r < m; ++r) {
    if (t[r] == ignore_index) continue;
    KILN_CHECK(t[r] >= 0 && t[r] < classes,
               "{}: target {} is out of bounds for {} classes (input {}, target {}, ignore_index {})", op, t[r],
               classes, input.meta_str(), target.meta_str(), ignore_index);
    rows.push_back(r);
  }
  return rows;
}

namespace {

// The counted rows as an i64 tensor on the input's device, and how many there are.
struct Counted {
  Tensor index;  // [R]
  int64_t count = 0;
  bool all = false;  // every row counts
};
Counted counted(const Tensor& target, const Tensor& input, int64_t classes, int64_t ignore_index, const char* op) {
  const std::vector<int64_t> rows =
      counted_rows(target.to(Device::cpu()).contiguous(), classes, ignore_index, op, input);
  Counted c;
  c.count = static_cast<int64_t>(rows.size());
  c.all = c.count == input.size(0);
  c.index = from_vector(rows, {.dtype = DType::i64}).to(input.device());
  return c;
}

Tensor zeros_on(const Shape& shape, DType dtype, Device device) { return zeros(shape, {.dtype = dtype, .device = device}); }

}  // namespace

// in: (input [M, H], weight [V, H], bias [V]?, target [M]); out: (loss, correct, log_sum_exp
// f64 [M], logits [M, V] workspace).
void linear_cross_entropy_composed(std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& attrs) {
  NoGradGuard no_grad;
  const Tensor &x = in[0], &w = in[1], &b = in[2], &target = in[3];
  const int64_t v = w.size(0);
  const Counted c = counted(target, x, v, attrs.i("ignore_index"), "linear_cross_entropy");
  const bool mean = attrs.str("reduction") == "mean";
  Tensor(out[2]).zero_();
  if (c.count == 0 || v == 0) {
    Tensor(out[0]).fill_(mean && c.count == 0 ? std::numeric_limits<double>::quiet_NaN() : 0.0);
    Tensor(out[1]).fill_(0);
    return;
  }
  const Tensor rows = c.all ? x : index_select(x, 0, c.index);
  const Tensor logits = b.defined() ? addmm(b, rows, w.t()) : mm(rows, w.t());  // [R, V]
  Tensor(out[3]).slice(0, 0, c.count).copy_(logits);
  const Tensor t = c.all ? target : index_select(target, 0, c.index);
  const Tensor lse = logsumexp(logits, {1}).to(DType::f64);
  Tensor(out[2]).copy_(scatter_add(out[2], 0, c.index, lse));
  const Tensor picked = gather(logits, 1, t.unsqueeze(1)).squeeze(1).to(DType::f64);
  Tensor total = sum(sub(lse, picked));
  if (mean) total = div(total, static_cast<double>(c.count));
  Tensor(out[0]).copy_(total.to(out[0].dtype()));
  Tensor(out[1]).copy_(sum(eq(argmax(logits, 1), t)).to(DType::i64));
}

// in: (grad_loss, input, weight, bias?, target, log_sum_exp, logits); out: (grad_input,
// grad_weight, grad_bias).
void linear_cross_entropy_backward_composed(std::span<const Tensor> in, std::span<const Tensor> out,
                                            const Attrs& attrs) {
  NoGradGuard no_grad;
  const Tensor &grad_loss = in[0], &x = in[1], &w = in[2], &target = in[4], &lse = in[5], &logits = in[6];
  const int64_t m = x.size(0), h = x.size(1), v = w.size(0);
  const Counted c = counted(target, x, v, attrs.i("ignore_index"), "linear_cross_entropy_backward");
  if (c.count == 0 || v == 0) {
    for (const Tensor& o : out) Tensor(o).zero_();
    return;
  }
  // G = s * softmax(logits) - s * onehot(target) over the counted rows, s the loss's
  // gradient (over the count for "mean"), as a device value: nothing is read back here.
  Tensor s = grad_loss.to(DType::f64);
  if (attrs.str("reduction") == "mean") s = div(s, static_cast<double>(c.count));
  s = s.to(x.dtype());
  const Tensor l = logits.slice(0, 0, c.count);
  const Tensor row_lse = (c.all ? lse : index_select(lse, 0, c.index)).to(x.dtype()).unsqueeze(1);
  const Tensor t = (c.all ? target : index_select(target, 0, c.index)).unsqueeze(1);
  Tensor g = mul(exp(sub(l, row_lse)), s);
  g = scatter_add(g, 1, t, neg(s).expand({c.count, 1}).contiguous());
  const Tensor rows = c.all ? x : index_select(x, 0, c.index);
  const Tensor dx_rows = mm(g, w);  // [R, H]
  if (c.all) {
    Tensor(out[0]).copy_(dx_rows);
  } else {
    const Tensor index = c.index.unsqueeze(1).expand({c.count, h}).contiguous();
    Tensor(out[0]).copy_(scatter_add(zeros_on({m, h}, x.dtype(), x.device()), 0, index, dx_rows));
  }
  Tensor(out[1]).copy_(mm(g.t(), rows));
  Tensor(out[2]).copy_(sum(g.to(DType::f64), {0}).to(x.dtype()));
}

}  // namespace kiln
