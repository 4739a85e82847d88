// The tracing hook sees every op: calling each public function once records every op the
// registry holds, so no public function bypasses dispatch and no registered op is
// unreachable. Every compute op also has a CPU kernel.
#include <set>

#include "core/ops/amp_ops.h"
#include "core/ops/optim_ops.h"
#include "testing.h"

using namespace kiln;

TEST_CASE("the op hook sees every registered op", "[hook][registry]") {
  std::set<std::string> seen;
  {
    OpHookGuard guard([&](const OpCall& call) { seen.insert(call.op.name); });
    manual_seed(0);
    Tensor x = randn({2, 3, 4, 4});
    Tensor m = rand({3, 4});
    Tensor i = randint(0, 3, {2});

    // views and copies
    x.view({2, 3, 16});
    x.permute({0, 2, 3, 1});
    x.slice(1, 0, 2);
    x.select(0, 1);
    m.expand({2, 3, 4});
    x.squeeze();
    x.unsqueeze(0);
    x.as_strided({2}, {1}, 0);
    x.to(DType::f64);
    x.clone();
    // Tensor::to(device) skips the op on the same device; a CPU-only build has no other.
    call_op1(find_op("to_device"), {x}, {{"device", Device::cpu()}});
    Tensor y = empty({3, 4});
    y.fill_(1);
    y = full({3, 4}, 2.0);
    arange(5);
    linspace(0, 1, 5);
    eye(3);
    Tensor u = zeros({3});
    normal_(u);
    uniform_(u);

    // elementwise
    for (auto f : {neg, abs, sign, exp, log, log1p, expm1, sqrt, rsqrt, reciprocal, sin, cos, tanh,
                   sigmoid, relu, silu, logical_not})
      f(m);
    gelu(m);
    gelu_backward(m, m);
    softplus(m);
    clamp(m, 0.1, 0.5);
    add(m, m);
    sub(m, m);
    mul(m, m);
    div(m, m);
    pow(m, 2);
    maximum(m, m);
    minimum(m, m);
    eq(m, m);
    ne(m, m);
    lt(m, m);
    le(m, m);
    gt(m, m);
    ge(m, m);
    logical_and(m, m);
    logical_or(m, m);
    where(m > 0.5, m, m);

    // reductions
    sum(m);
    mean(m);
    prod(m);
    max(m);
    min(m);
    amax(m, {0});
    amin(m, {0});
    argmax(m);
    argmin(m);
    var(m);
    kiln::std(m);
    logsumexp(m, {1});
    all(m);
    any(m);
    norm(m);

    // linear algebra and convolution
    matmul(m, m.t());
    mm(m, m.t());
    bmm(m.unsqueeze(0), m.t().unsqueeze(0));
    addmm(zeros({3, 3}), m, m.t());
    // The compiler's activation epilogues (compiler/passes/epilogue.cpp, gemm_activations).
    const AddmmActivation act = addmm_activation(zeros({3}), m, m.t(), "gelu_tanh");
    mm_gelu_backward(m, m.t(), act.pre);
    Tensor w = randn({5, 3, 3, 3});
    Tensor c = conv2d(x, w, {}, {.padding = {1, 1}});
    conv2d_backward_input(c, w, x.shape(), {.padding = {1, 1}});
    conv2d_backward_weight(c, x, w.shape(), {.padding = {1, 1}});

    // pooling and normalization
    auto mp = max_pool2d_with_indices(x, {2, 2});
    max_pool2d_backward(mp.values, mp.indices, x.shape());
    Tensor ap = avg_pool2d(x, {2, 2});
    avg_pool2d_backward(ap, x.shape(), {2, 2});
    Tensor aap = adaptive_avg_pool2d(x, {1, 1});
    adaptive_avg_pool2d_backward(aap, x.shape());
    Tensor rm = zeros({3}), rv = ones({3});
    auto bn = batch_norm_with_stats(x, ones({3}), zeros({3}), rm, rv, true, 0.1, 1e-5);
    batch_norm_stats_update(x, rm, rv, 0.1);
    call_op(find_op("batch_norm_update"), {x, ones({3}), zeros({3}), rm, rv},
            {{"training", true}, {"momentum", 0.1}, {"eps", 1e-5}});
    batch_norm_backward(bn.output, x, ones({3}), bn.save_mean, bn.save_invstd, true, 1e-5);
    // The compiler's batch norm split (compiler/passes/batch_norm_split.cpp) makes these two;
    // eager code never calls them.
    call_op(find_op("batch_norm_train_stats"), {x, ones({3}), zeros({3}), rm, rv},
            {{"momentum", 0.1}, {"eps", 1e-5}});
    call_op(find_op("batch_norm_grad_stats"), {bn.output, x, ones({3}), bn.save_mean, bn.save_invstd, Tensor()});
    auto ln = layer_norm_with_stats(x, {4, 4}, {}, {}, 1e-5);
    layer_norm_backward(ln.output, x, {4, 4}, ln.mean, ln.rstd);

    // softmax and losses
    Tensor logits = randn({2, 3});
    Tensor sm = softmax(logits, 1);
    Tensor lsm = log_softmax(logits, 1);
    softmax_backward(sm, sm, 1);
    log_softmax_backward(lsm, lsm, 1);
    Tensor nll = nll_loss(lsm, i);
    nll_loss_backward(nll, lsm, i);
    Tensor ce = cross_entropy(logits, i, {.label_smoothing = 0.1});
    cross_entropy_loss_backward(ce, lsm, i, {.label_smoothing = 0.1});
    Tensor probs = softmax(randn({2, 3}), 1);
    Tensor cep = cross_entropy(logits, probs);
    cross_entropy_prob_loss_backward(cep, lsm, probs);
    Tensor lce_target = zeros({3}, {.dtype = DType::i64});
    LinearCrossEntropyResult lce = linear_cross_entropy_with_stats(m, randn({5, 4}), Tensor(), lce_target);
    linear_cross_entropy_backward(lce.loss, m, randn({5, 4}), Tensor(), lce_target, lce.log_sum_exp, lce.logits);
    Tensor mse = mse_loss(m, m);
    mse_loss_backward(mse, m, m);

    // attention
    AttentionResult att = scaled_dot_product_attention_with_stats(x, x, x, {.is_causal = true});
    scaled_dot_product_attention_backward(att.out, x, x, x, {}, att.out, att.logsumexp,
                                          att.rng_state, true, 0.0, 0.5);

    // indexing, joining, dropout
    gather(m, 1, zeros({3, 2}, {.dtype = DType::i64}));
    scatter_add(m, 1, zeros({3, 2}, {.dtype = DType::i64}), ones({3, 2}));
    index_select(m, 0, i);
    Tensor e = embedding(m, i);
    embedding_backward(e, i, 3);
    one_hot(i, 3);
    flip(m, {0});
    tril(m);
    triu(m);
    cumsum(m, 1);
    topk(m, 2);
    sort(m);
    cat({m, m});
    stack({m, m});
    pad(m, {1, 1});
    dropout(m, 0.5);

    // optimizer updates
    Tensor p = zeros({3}), h = scalar_tensor(0.1, DType::f64);
    sgd_update_(p, ones({3}), zeros({3}), {h, h, h, h}, {});
    sgd_update(p, ones({3}), zeros({3}), {h, h, h, h}, {});
    const AdamWState adam_state{zeros({3}), zeros({3}), {}, scalar_tensor(1.0, DType::f64)};
    adamw_update_(p, ones({3}), adam_state, {h, h, h, h, h}, {});
    adamw_update(p, ones({3}), adam_state, {h, h, h, h, h}, {});
    const std::vector<Tensor> ps = {p, zeros({2})}, gs = {ones({3}), ones({2})};
    sgd_update_multi_(ps, gs, {}, {h, h, h, h}, {});
    sgd_update_multi(ps, gs, {}, {h, h, h, h}, {});
    const std::vector<AdamWState> adam_states = {adam_state, {zeros({2}), zeros({2}), {}, adam_state.step}};
    adamw_update_multi_(ps, gs, adam_states, {h, h, h, h, h}, {});
    adamw_update_multi(ps, gs, adam_states, {h, h, h, h, h}, {});

    // the loss scaler's ops
    const Tensor found = zeros({}, {.dtype = DType::f32}), scale = full({}, 2.0, {.dtype = DType::f32});
    const Tensor tracker = zeros({}, {.dtype = DType::i32});
    amp_unscale_(gs, found, scale);
    amp_unscale(gs, found, scale);
    amp_update_scale_(scale, tracker, found, {});
    amp_update_scale(scale, tracker, found, {});
  }
  std::set<std::string> missing;
  for (const OpDef* op : all_ops())
    if (!seen.count(op->name)) missing.insert(op->name);
  std::string list;
  for (const auto& name : missing) list += name + " ";
  INFO("registered ops the calls above did not reach: " << list);
  CHECK(missing.empty());
}

TEST_CASE("every compute op has a CPU kernel", "[registry]") {
  for (const OpDef* op : all_ops()) {
    INFO(op->name);
    if (op->kind == OpKind::compute) CHECK(op->kernels[static_cast<int>(DeviceType::cpu)] != nullptr);
  }
}

TEST_CASE("in-place and pure twins are facts of their registry entries, both ways", "[registry]") {
  // The tracer records an in-place optimizer update as its pure twin; a compiled program
  // finds the in-place op again through the pure one. Both read the entries, not names.
  int pairs = 0;
  for (const OpDef* op : all_ops()) {
    INFO(op->name);
    if (!op->pure_twin.empty()) {
      ++pairs;
      CHECK(op->mutates_inputs());
      const OpDef& pure = find_op(op->pure_twin);
      CHECK(pure.in_place_twin == op);
      CHECK_FALSE(pure.mutates_inputs());
    }
    if (op->in_place_twin) CHECK(op->in_place_twin->pure_twin == op->name);
  }
  CHECK(pairs == 6);  // sgd_update_, adamw_update_, their multi-tensor forms, amp_unscale_, amp_update_scale_
  CHECK(find_op("sgd_update").in_place_twin == &find_op("sgd_update_"));
  CHECK(find_op("add").in_place_twin == nullptr);  // add_ is add's out= form, not a twin
}
