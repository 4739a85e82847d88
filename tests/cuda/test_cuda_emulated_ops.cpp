// The CUDA kernels of ops built on hand-written kernel families (kernels/cuda/
// hand_kernels.h), run on CPU tensors with the emulator executing their device code
// (tests/cuda/cuda_emulator.h), against the CPU kernels. Each case records the op calls of
// a CPU computation, then gives each call's inputs and attributes to the op's CUDA kernel
// function and compares its outputs with the CPU's: exactly where the CUDA kernel promises
// the CPU's result (orders, indices, integer and ordered sums), to 1e-6 otherwise. The host
// side of each CUDA kernel runs for real here (its shapes, strides, launch arguments); the
// device code runs with kernels/scalar.h's host functions.
#include <functional>
#include <limits>
#include <tuple>
#include <set>

#include "compiler/compiler_testing.h"
#include "cuda/cuda_emulator.h"
#include "kernels/cuda/optim.h"
#include "testing.h"

using namespace kiln;
using kiln::testing::EmulatedHandKernels;
using kiln::testing::TempCache;

namespace {

struct Recorded {
  const OpDef* op;
  std::vector<Tensor> inputs;
  Attrs attrs;
  std::vector<Tensor> outputs;
};

// The top-level op calls `f` makes (in-place ones left out: their inputs are gone). The
// cases write nothing in place, so the tensors are kept as they are (a clone here would
// be an op call reported to this hook).
std::vector<Recorded> record(const std::function<void()>& f) {
  std::vector<Recorded> calls;
  OpHookGuard hook([&](const OpCall& c) {
    if (c.inplace) return;
    calls.push_back({&c.op, {c.inputs.begin(), c.inputs.end()}, c.attrs, {c.outputs.begin(), c.outputs.end()}});
  });
  f();
  return calls;
}

// Replays every call of `f` named in `ops` through its op's CUDA kernel (each op of `ops`
// must be called); rtol 0 is exact.
void check_cuda_kernels(const std::vector<std::string>& ops, double rtol, const std::function<void()>& f) {
  std::set<std::string> replayed;
  for (const Recorded& call : record(f)) {
    if (std::find(ops.begin(), ops.end(), call.op->name) == ops.end()) continue;
    INFO("op " << call.op->name << " " << call.attrs.to_string());
    const KernelFn cuda = call.op->kernels[static_cast<size_t>(DeviceType::cuda)];
    REQUIRE(cuda != nullptr);
    std::vector<Tensor> out;
    for (const Tensor& o : call.outputs) {
      Tensor t = make_tensor(o.shape(), o.dtype(), Device::cpu(), o.suggest_memory_format());
      t.fill_(7);  // what the kernel does not write shows
      out.push_back(t);
    }
    const int64_t before = EmulatedHandKernels::launches();
    {
      EmulatedHandKernels emulated;
      cuda(call.inputs, out, call.attrs);
    }
    CHECK(EmulatedHandKernels::launches() > before);  // its device code ran in the emulator
    for (size_t i = 0; i < out.size(); ++i) {
      INFO("output " << i);
      if (rtol == 0 || !is_floating(out[i].dtype())) KILN_CHECK_EQUAL(out[i], call.outputs[i]);
      else KILN_CHECK_CLOSE(out[i], call.outputs[i], rtol, 1e-6);
    }
    replayed.insert(call.op->name);
  }
  CHECK(replayed == std::set<std::string>(ops.begin(), ops.end()));
}

// Values with ties and NaNs, for the orders.
Tensor tied(Shape shape, DType dtype = DType::f32) {
  Tensor x = mul(randint(0, 6, shape).to(DType::f32), 0.5);
  if (is_floating(dtype) && x.numel() > 3) {
    Tensor flat = x.view({x.numel()});
    flat.slice(0, 1, 2).fill_(std::nan(""));
    flat.slice(0, x.numel() - 2, x.numel() - 1).fill_(std::nan(""));
  }
  return x.to(dtype);
}

}  // namespace

TEST_CASE("cuda emulated ops: sort and topk give the CPU's stable permutation exactly", "[cuda_emulated]") {
  TempCache cache;
  manual_seed(3);
  for (int64_t n : {1, 2, 5, 37, 300}) {
    INFO("line length " << n);
    const Tensor rows = tied({3, n});
    check_cuda_kernels({"sort"}, 0, [&] {
      sort(rows, -1, false);
      sort(rows, -1, true);
    });
    const Tensor cols = tied({n, 4});  // lines along dim 0: inner 4
    check_cuda_kernels({"sort", "topk"}, 0, [&] {
      sort(cols, 0, true);
      topk(cols, std::min<int64_t>(n, 3), 0, true);
      topk(cols, std::min<int64_t>(n, 2), 0, false);
    });
  }
  for (DType t : {DType::f64, DType::f16, DType::i64, DType::boolean}) {
    INFO("dtype " << name(t));
    const Tensor x = tied({2, 19}, t == DType::boolean ? DType::f32 : t);
    const Tensor v = t == DType::boolean ? gt(x, 1.0) : x;
    check_cuda_kernels({"sort", "topk"}, 0, [&] {
      sort(v, -1, false);
      topk(v, 4, -1, true);
    });
  }
}

TEST_CASE("cuda emulated ops: scatter_add, gather, index_select and embedding_backward", "[cuda_emulated]") {
  TempCache cache;
  manual_seed(4);
  const Tensor x = randn({4, 6});
  const Tensor index = randint(0, 6, {4, 9});  // duplicates along dim 1
  const Tensor src = randn({4, 9});
  check_cuda_kernels({"scatter_add"}, 0, [&] { scatter_add(x, 1, index, src); });
  const Tensor index0 = randint(0, 4, {7, 6});
  check_cuda_kernels({"scatter_add"}, 0, [&] { scatter_add(x, 0, index0, randn({7, 6})); });
  check_cuda_kernels({"scatter_add"}, 0, [&] {
    scatter_add(randint(0, 5, {4, 6}), 1, index, randint(0, 5, {4, 9}));  // i64
  });
  check_cuda_kernels({"gather"}, 0, [&] { gather(x, 1, index); });
  check_cuda_kernels({"index_select"}, 0, [&] { index_select(x, 0, randint(0, 4, {5})); });
  const Tensor ids = randint(0, 10, {3, 5});
  check_cuda_kernels({"embedding_backward"}, 1e-6, [&] { embedding_backward(randn({3, 5, 4}), ids, 10, -1); });
}

TEST_CASE("cuda emulated ops: arange, linspace, eye, one_hot, flip, tril and triu", "[cuda_emulated]") {
  TempCache cache;
  manual_seed(5);
  for (DType t : {DType::f32, DType::f64, DType::i64, DType::i32, DType::u8, DType::f16}) {
    INFO("dtype " << name(t));
    check_cuda_kernels({"arange", "linspace", "eye"}, 0, [&] {
      arange(2, 40, 3, {.dtype = t});
      linspace(-3.0, 5.0, 17, {.dtype = t});
      linspace(1.0, 1.0, 1, {.dtype = t});
      eye(4, 6, {.dtype = t});
    });
  }
  const Tensor x = randn({3, 4, 5});
  check_cuda_kernels({"one_hot"}, 0, [&] { one_hot(randint(0, 6, {2, 3}), 6); });
  check_cuda_kernels({"flip"}, 0, [&] {
    flip(x, {0, 2});
    flip(x.transpose(0, 2), {1});
  });
  check_cuda_kernels({"tril", "triu"}, 0, [&] {
    tril(x, 1);
    triu(x, -1);
  });
}

TEST_CASE("cuda emulated ops: the losses and their backwards, in the CPU's order", "[cuda_emulated]") {
  TempCache cache;
  manual_seed(6);
  const Tensor logits = randn({6, 5});
  const Tensor log_probs = log_softmax(logits, 1);
  const Tensor target = randint(0, 5, {6});
  const Tensor probs = softmax(randn({6, 5}), 1);
  check_cuda_kernels({"cross_entropy_prob_loss", "cross_entropy_prob_loss_backward"}, 0, [&] {
    cross_entropy_prob_loss(log_probs, probs);
    cross_entropy_prob_loss_backward(ones({}), log_probs, probs);
  });
  check_cuda_kernels({"cross_entropy_loss", "cross_entropy_loss_backward"}, 0, [&] {
    cross_entropy_loss(log_probs, target);
    cross_entropy_loss_backward(ones({}), log_probs, target);
  });
  const Tensor a = randn({4, 7}), b = randn({4, 7});
  check_cuda_kernels({"mse_loss"}, 0, [&] { mse_loss(a, b); });
}

TEST_CASE("cuda emulated ops: layer norm, cumsum, prod and the arg reductions", "[cuda_emulated]") {
  TempCache cache;
  manual_seed(7);
  const Tensor x = randn({5, 12}), w = randn({12}), b = randn({12});
  check_cuda_kernels({"layer_norm"}, 1e-6, [&] { layer_norm(x, {12}, w, b, 1e-5); });
  const LayerNormResult r = layer_norm_with_stats(x, {12}, w, b, 1e-5);
  const Tensor g = randn({5, 12});
  check_cuda_kernels({"layer_norm_backward"}, 1e-6, [&] {
    layer_norm_backward(g, x, {12}, r.mean, r.rstd, w);
    layer_norm_backward(g, x, {12}, r.mean, r.rstd);
  });
  check_cuda_kernels({"cumsum", "prod"}, 1e-6, [&] {
    cumsum(x, 1);
    cumsum(x, 0);
    prod(x, {1});
  });
  const Tensor t = tied({4, 9});
  check_cuda_kernels({"argmax", "argmin"}, 0, [&] {
    argmax(t, 1);
    argmin(t, 0);
  });
}

// batch norm's statistics ops (compiler/passes/batch_norm_split.cpp), whose kernels
// (kernels/cuda/norm_split.cpp) add the CPU kernels' f64 terms in another order (chunks of
// rows, then 8 row lanes): the sums differ by f64 rounding, some 1e-15 of the sum of the
// terms' magnitudes, far below the results' rounding to f32, so the results differ by at
// most one f32 rounding step (1e-6 relative), or by 1e-6 absolute where a sum cancels (unit
// data, at most 300 rows). 16-bit inputs are read as they are, in f32 arithmetic. Shapes with
// more than one chunk (64 rows) and more than one tile (32 channels), NCHW and channels_last.
TEST_CASE("cuda emulated ops: batch norm's statistics and gradient sums, 16-bit read as it is",
          "[cuda_emulated][batch_norm_split]") {
  TempCache cache;
  manual_seed(12);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16})
    for (bool channels_last : {false, true})
      for (const Shape& shape : {Shape{3, 5, 4, 3}, Shape{5, 40, 6, 10}}) {
        INFO(kiln::name(dtype) << (channels_last ? " channels_last " : " nchw ") << shape_str(shape));
        const DType stats = dtype == DType::f64 ? DType::f64 : DType::f32;
        auto layout = [&](const Tensor& t) {
          return channels_last ? t.contiguous(MemoryFormat::channels_last) : t.contiguous();
        };
        const int64_t c = shape[1];
        const Tensor x = layout((randn(shape) * 2.0 + 0.5).to(dtype));
        const Tensor w = (rand({c}) + 0.5).to(stats), b = randn({c}).to(stats);
        const Tensor rm = randn({c}).to(stats), rv = (rand({c}) + 0.5).to(stats);
        const Attrs attrs{{"momentum", 0.1}, {"eps", 1e-5}};
        std::vector<Tensor> st;
        check_cuda_kernels({"batch_norm_train_stats"}, 1e-6, [&] {
          st = call_op(find_op("batch_norm_train_stats"), {x, w, b, rm, rv}, attrs);
          call_op(find_op("batch_norm_train_stats"), {x, Tensor(), Tensor(), rm, rv}, attrs);
        });
        const Tensor g = layout(randn(shape).to(dtype));
        const Tensor r = layout(relu(randn(shape)).to(dtype));
        check_cuda_kernels({"batch_norm_grad_stats"}, 1e-6, [&] {
          call_op(find_op("batch_norm_grad_stats"), {g, x, w, st[0], st[1], Tensor()});
          call_op(find_op("batch_norm_grad_stats"), {g, x, w, st[0], st[1], r});
          call_op(find_op("batch_norm_grad_stats"), {g, x, Tensor(), st[0], st[1], r});
        });
      }
}

TEST_CASE("cuda emulated ops: random ops draw the CPU's Philox stream", "[cuda_emulated]") {
  TempCache cache;
  manual_seed(8);
  check_cuda_kernels({"randint", "uniform", "normal", "dropout"}, 0, [&] {
    randint(-5, 9, {3, 7});
    rand_like(zeros({4, 5}));
    randn_like(zeros({4, 5}));
    dropout(ones({6, 5}), 0.3, true);
  });
}

TEST_CASE("cuda emulated ops: max pooling and its backward, NCHW and channels_last as they are",
          "[cuda_emulated]") {
  TempCache cache;
  manual_seed(9);
  // Ties, a NaN and -inf, windows past the padding, strides and dilation.
  Tensor x = tied({2, 6, 9, 7});
  x.view({x.numel()}).slice(0, 5, 6).fill_(-std::numeric_limits<double>::infinity());
  for (MemoryFormat format : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
    INFO("layout " << memory_format_name(format));
    const Tensor xf = x.contiguous(format);
    for (auto [k, s, p, d] : {std::tuple{3, 2, 1, 1}, std::tuple{2, 2, 0, 1}, std::tuple{3, 1, 1, 2}}) {
      INFO("kernel " << k << " stride " << s << " padding " << p << " dilation " << d);
      MaxPool2dResult r;
      check_cuda_kernels({"max_pool2d"}, 0, [&] { r = max_pool2d_with_indices(xf, {k, k}, {s, s}, {p, p}, {d, d}); });
      REQUIRE(r.values.is_contiguous(format));
      const Tensor g = randn(r.values.shape()).contiguous(format);
      check_cuda_kernels({"max_pool2d_backward"}, 1e-6, [&] { max_pool2d_backward(g, r.indices, xf.shape(), format); });
    }
  }
  // A CHW input is one image.
  check_cuda_kernels({"max_pool2d"}, 0, [&] { max_pool2d_with_indices(randn({3, 8, 8}), {2, 2}); });
}

TEST_CASE("cuda emulated ops: the multi-tensor SGD update equals the CPU's, 24 parameters a launch",
          "[cuda_emulated]") {
  TempCache cache;
  manual_seed(10);
  // 30 parameters: two launches; one empty; odd sizes.
  std::vector<Tensor> params, grads, buffers;
  for (int64_t k = 0; k < 30; ++k) {
    const Shape shape = k == 5 ? Shape{0} : Shape{k + 1, 3};
    params.push_back(randn(shape));
    grads.push_back(randn(shape));
    buffers.push_back(randn(shape));
  }
  const SGDHyper hyper{full({}, 0.1), full({}, 0.9), full({}, 0.25), full({}, 0.01)};
  for (const SGDFlags flags : {SGDFlags{}, SGDFlags{.nesterov = true}, SGDFlags{.maximize = true},
                               SGDFlags{.first = true}}) {
    INFO("nesterov " << flags.nesterov << " maximize " << flags.maximize << " first " << flags.first);
    check_cuda_kernels({"sgd_update_multi"}, 0, [&] {
      sgd_update_multi(params, grads, buffers, hyper, flags);
      sgd_update_multi(params, grads, {}, hyper, flags);
    });
  }
  // Momentum 0 (a schedule's) leaves the buffers as they are; no weight decay.
  const SGDHyper resting{full({}, 0.1), full({}, 0.0), full({}, 0.0), full({}, 0.0)};
  check_cuda_kernels({"sgd_update_multi"}, 0, [&] { sgd_update_multi(params, grads, buffers, resting, {}); });

  // The in-place form, through its CUDA kernel function, against the CPU op.
  std::vector<Tensor> cpu_p, cpu_b, emu_p, emu_b;
  for (size_t k = 0; k < params.size(); ++k) {
    cpu_p.push_back(params[k].clone());
    cpu_b.push_back(buffers[k].clone());
    emu_p.push_back(params[k].clone());
    emu_b.push_back(buffers[k].clone());
  }
  sgd_update_multi_(cpu_p, grads, cpu_b, hyper, {.nesterov = true});
  std::vector<Tensor> in = emu_p;
  in.insert(in.end(), grads.begin(), grads.end());
  in.insert(in.end(), emu_b.begin(), emu_b.end());
  in.insert(in.end(), {hyper.lr, hyper.momentum, hyper.dampening, hyper.weight_decay});
  const Attrs attrs{{"count", static_cast<int64_t>(params.size())}, {"nesterov", true}, {"maximize", false},
                    {"first", false}};
  {
    EmulatedHandKernels emulated;
    find_op("sgd_update_multi_").kernels[static_cast<size_t>(DeviceType::cuda)](in, {}, attrs);
  }
  for (size_t k = 0; k < params.size(); ++k) {
    KILN_CHECK_EQUAL(emu_p[k], cpu_p[k]);
    KILN_CHECK_EQUAL(emu_b[k], cpu_b[k]);
  }

  // Parameters whose tensors are in different memory orders are left to the caller (the
  // per-parameter kernels); the others are updated. Strides of size-1 dims do not matter.
  const Tensor a = randn({5, 3}), ga = randn({5, 3});
  const Tensor b = randn({4, 3, 2, 2}).contiguous(MemoryFormat::channels_last), gb = randn({4, 3, 2, 2});
  const Tensor c = randn({6, 4, 1, 1}), gc = randn({6, 1, 1, 4}).permute({0, 3, 1, 2});
  REQUIRE(c.strides() != gc.strides());
  const std::vector<Tensor> mixed = {a, b, c, ga, gb, gc, Tensor(), Tensor(), Tensor(),
                                     hyper.lr, hyper.momentum, hyper.dampening, hyper.weight_decay};
  const std::vector<Tensor> outs = {empty({5, 3}), empty({4, 3, 2, 2}), empty({6, 4, 1, 1})};
  Tensor(outs[1]).fill_(7.0);
  std::vector<int64_t> left;
  {
    EmulatedHandKernels emulated;
    left = cuda::sgd_update_multi_tensor(mixed, outs, {}, Attrs{{"count", int64_t{3}}, {"nesterov", false},
                                                                {"maximize", false}, {"first", false}});
  }
  CHECK(left == std::vector<int64_t>{1});
  const SGDUpdate ra = sgd_update(a, ga, {}, hyper, {}), rc = sgd_update(c, gc, {}, hyper, {});
  KILN_CHECK_EQUAL(outs[0], ra.param);
  KILN_CHECK_EQUAL(outs[2], rc.param);
  KILN_CHECK_EQUAL(outs[1], full({4, 3, 2, 2}, 7.0));
}

TEST_CASE("cuda emulated ops: the multi-tensor AdamW update equals the CPU's, 16 parameters a launch",
          "[cuda_emulated]") {
  TempCache cache;
  manual_seed(11);
  // 20 parameters (two launches), one empty, each with its own step count; f32 and f64.
  for (DType dt : {DType::f32, DType::f64}) {
    INFO("dtype " << name(dt));
    std::vector<Tensor> params, grads;
    std::vector<AdamWState> states;
    for (int64_t k = 0; k < 20; ++k) {
      const Shape shape = k == 7 ? Shape{0} : Shape{k + 2, 3};
      params.push_back(randn(shape).to(dt));
      grads.push_back(randn(shape).to(dt));
      states.push_back({mul(randn(shape), 0.1).to(dt), mul(rand_like(zeros(shape)), 0.01).to(dt),
                        mul(rand_like(zeros(shape)), 0.02).to(dt), full({}, static_cast<double>(k % 5 + 1))});
    }
    std::vector<AdamWState> plain = states;
    for (AdamWState& s : plain) s.max_exp_avg_sq = Tensor();
    const AdamWHyper hyper{full({}, 1e-3), full({}, 0.9), full({}, 0.999), full({}, 1e-8), full({}, 0.01)};
    check_cuda_kernels({"adamw_update_multi"}, 0, [&] {
      adamw_update_multi(params, grads, plain, hyper, {});
      adamw_update_multi(params, grads, states, hyper, {.amsgrad = true, .maximize = true});
    });
    // The in-place form through its CUDA kernel function, against the CPU op.
    auto copy = [](const std::vector<AdamWState>& from) {
      std::vector<AdamWState> to;
      for (const AdamWState& s : from) to.push_back({s.exp_avg.clone(), s.exp_avg_sq.clone(), s.max_exp_avg_sq.clone(), s.step});
      return to;
    };
    std::vector<Tensor> cpu_p, emu_p;
    for (const Tensor& p : params) {
      cpu_p.push_back(p.clone());
      emu_p.push_back(p.clone());
    }
    const std::vector<AdamWState> cpu_s = copy(states), emu_s = copy(states);
    adamw_update_multi_(cpu_p, grads, cpu_s, hyper, {.amsgrad = true});
    std::vector<Tensor> in = emu_p;
    in.insert(in.end(), grads.begin(), grads.end());
    for (auto member : {&AdamWState::exp_avg, &AdamWState::exp_avg_sq, &AdamWState::max_exp_avg_sq, &AdamWState::step})
      for (const AdamWState& s : emu_s) in.push_back(s.*member);
    in.insert(in.end(), {hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay});
    {
      EmulatedHandKernels emulated;
      find_op("adamw_update_multi_").kernels[static_cast<size_t>(DeviceType::cuda)](
          in, {}, Attrs{{"count", static_cast<int64_t>(params.size())}, {"amsgrad", true}, {"maximize", false}});
    }
    for (size_t k = 0; k < params.size(); ++k) {
      KILN_CHECK_EQUAL(emu_p[k], cpu_p[k]);
      KILN_CHECK_EQUAL(emu_s[k].exp_avg, cpu_s[k].exp_avg);
      KILN_CHECK_EQUAL(emu_s[k].exp_avg_sq, cpu_s[k].exp_avg_sq);
      KILN_CHECK_EQUAL(emu_s[k].max_exp_avg_sq, cpu_s[k].max_exp_avg_sq);
    }
  }
}
