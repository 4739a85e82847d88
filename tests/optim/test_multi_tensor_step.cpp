// SGD and AdamW steps through the multi-tensor updates (core/ops/optim_ops.h): one update
// call per parameter group, split by dtype (and, for SGD, by a momentum buffer's first
// update), each parameter bit for bit what one single update per parameter gives.
#include <map>
#include <string>

#include "core/ops/optim_ops.h"
#include "core/registry.h"
#include "kernels/cpu/wide.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "testing.h"

using namespace kiln;

namespace {

// The update ops an optimizer step calls, by name.
std::map<std::string, int> update_calls(optim::Optimizer& optimizer) {
  std::map<std::string, int> calls;
  OpHookGuard guard([&](const OpCall& call) {
    if (call.op.name.find("update") != std::string::npos) ++calls[call.op.name];
  });
  optimizer.step();
  return calls;
}

Tensor grad_for(const Tensor& p, int k, int s) {
  return sin(arange(p.numel(), {.dtype = p.dtype()}).reshape(p.shape()) * (0.4 + 0.2 * k) + 1.3 * s);
}

void check_identical(const Tensor& actual, const Tensor& expected) {
  CHECK(actual.dtype() == expected.dtype());
  KILN_CHECK_EQUAL(actual, expected);
}

Tensor f64_scalar(double v) { return scalar_tensor(v, DType::f64); }

// torch's single-tensor SGD with one sgd_update_ per parameter (what SGD::step did before
// it made one call per group).
struct SGDByParameter {
  std::vector<Tensor> params, buffers;
  optim::SGDOptions o;
  SGDByParameter(const std::vector<Tensor>& ps, optim::SGDOptions options) : o(options) {
    for (const Tensor& p : ps) params.push_back(p.detach().clone());
    buffers.resize(ps.size());
  }
  void step(const std::vector<Tensor>& grads) {  // undefined: no gradient this step
    const SGDHyper h{f64_scalar(o.lr), f64_scalar(o.momentum), f64_scalar(o.dampening), f64_scalar(o.weight_decay)};
    for (size_t k = 0; k < params.size(); ++k) {
      if (!grads[k].defined()) continue;
      SGDFlags flags{o.nesterov, o.maximize, false};
      if (o.momentum != 0 && !buffers[k].defined()) {
        buffers[k] = zeros_like(params[k]);
        flags.first = true;
      }
      sgd_update_(params[k], grads[k], buffers[k], h, flags);
    }
  }
};

}  // namespace

TEST_CASE("SGD makes one update call per parameter group", "[optim][multitensor]") {
  manual_seed(5);
  std::vector<Tensor> group = {randn({4, 3}).requires_grad_(), randn({3}).requires_grad_(),
                               randn({3, 2}).requires_grad_(), randn({2}).requires_grad_()};
  Tensor lone = randn({5}).requires_grad_();
  optim::SGD sgd({{group, {}}, {{lone}, {{"lr", 0.01}}}}, {.lr = 0.1, .momentum = 0.9});
  for (int s = 0; s < 2; ++s) {
    int k = 0;
    for (Tensor p : sgd.param_groups()[0].params) p.set_grad(grad_for(p, k++, s));
    lone.set_grad(grad_for(lone, 9, s));
    const auto calls = update_calls(sgd);
    INFO("step " << s);
    CHECK(calls.size() == 2);
    CHECK(calls.at("sgd_update_multi_") == 1);  // the group of four
    CHECK(calls.at("sgd_update_") == 1);        // the lone parameter
  }
}

TEST_CASE("SGD by group equals SGD by parameter bit for bit with mixed dtypes and late starters",
          "[optim][multitensor]") {
  for (const optim::SGDOptions& o :
       {optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01},
        optim::SGDOptions{.lr = 0.05, .momentum = 0.8, .nesterov = true, .maximize = true},
        optim::SGDOptions{.lr = 0.2, .weight_decay = 0.1}}) {
    INFO("momentum " << o.momentum << " nesterov " << o.nesterov);
    manual_seed(6);
    std::vector<Tensor> params;
    const DType dtypes[] = {DType::f32, DType::f64, DType::f32, DType::f64, DType::f32};
    for (DType d : dtypes) params.push_back(randn({3, 4}, {.dtype = d}).requires_grad_());
    optim::SGD sgd(params, o);
    SGDByParameter reference(params, o);
    for (int s = 0; s < 3; ++s) {
      INFO("step " << s);
      // Parameter 4 gets its first gradient at step 1: its momentum buffer starts later.
      std::vector<Tensor> grads;
      for (size_t k = 0; k < params.size(); ++k) {
        grads.push_back(k == 4 && s == 0 ? Tensor() : grad_for(params[k], static_cast<int>(k), s));
        params[k].set_grad(grads.back());
      }
      const auto calls = update_calls(sgd);
      reference.step(grads);
      // f32 and f64 are separate calls; at step 1 the late starter's first update is its own.
      if (o.momentum != 0 && s == 1) CHECK(calls.at("sgd_update_") == 1);
      CHECK(calls.at("sgd_update_multi_") == 2);
      for (size_t k = 0; k < params.size(); ++k) {
        INFO("parameter " << k);
        check_identical(params[k], reference.params[k]);
        CHECK(sgd.state(params[k]).count("momentum_buffer") == static_cast<size_t>(reference.buffers[k].defined()));
        if (reference.buffers[k].defined())
          check_identical(sgd.state(params[k]).at("momentum_buffer"), reference.buffers[k]);
      }
    }
  }
}

TEST_CASE("AdamW by group equals AdamW by parameter bit for bit with mixed dtypes", "[optim][multitensor]") {
  for (bool amsgrad : {false, true}) {
    INFO("amsgrad " << amsgrad);
    manual_seed(7);
    std::vector<Tensor> params;
    for (DType d : {DType::f64, DType::f32, DType::f64, DType::f64}) params.push_back(randn({2, 5}, {.dtype = d}).requires_grad_());
    const optim::AdamWOptions o{.lr = 0.01, .weight_decay = 0.1, .amsgrad = amsgrad};
    optim::AdamW adamw(params, o);
    std::vector<Tensor> ref_p;
    std::vector<AdamWState> ref_s;
    for (const Tensor& p : params) {
      ref_p.push_back(p.detach().clone());
      ref_s.push_back({zeros_like(p), zeros_like(p), amsgrad ? zeros_like(p) : Tensor(), f64_scalar(0)});
    }
    const AdamWHyper h{f64_scalar(o.lr), f64_scalar(o.beta1), f64_scalar(o.beta2), f64_scalar(o.eps), f64_scalar(o.weight_decay)};
    for (int s = 0; s < 3; ++s) {
      INFO("step " << s);
      for (size_t k = 0; k < params.size(); ++k) {
        const Tensor g = grad_for(params[k], static_cast<int>(k), s);
        params[k].set_grad(g);
        ref_s[k].step.add_(1);
        adamw_update_(ref_p[k], g, ref_s[k], h, {amsgrad, false});
      }
      const auto calls = update_calls(adamw);
      CHECK(calls.at("adamw_update_multi_") == 1);  // the three f64 parameters
      CHECK(calls.at("adamw_update_") == 1);        // the f32 one
      for (size_t k = 0; k < params.size(); ++k) {
        INFO("parameter " << k);
        const optim::ParamState& state = adamw.state(params[k]);
        check_identical(params[k], ref_p[k]);
        check_identical(state.at("exp_avg"), ref_s[k].exp_avg);
        check_identical(state.at("exp_avg_sq"), ref_s[k].exp_avg_sq);
        if (amsgrad) check_identical(state.at("max_exp_avg_sq"), ref_s[k].max_exp_avg_sq);
        CHECK(state.at("step").item<double>() == s + 1);
      }
    }
  }
}

TEST_CASE("the AdamW update's AVX-512 build gives the plain build's bits", "[optim][multitensor]") {
  // kernels/cpu/optim_ops.cpp runs the element loop vectorized where the CPU has AVX-512,
  // without FMA contraction: every operation rounds as in the plain build (and the CUDA
  // kernel), so the results are equal bit for bit, amsgrad and maximize included.
  cpu::set_wide_loops(false);
  const bool has_wide = testing::wide_loops_available();
  if (!has_wide) {
    WARN("this CPU has no AVX-512: one build only");
    return;
  }
  for (DType dtype : {DType::f32, DType::f64})
    for (bool amsgrad : {false, true})
      for (bool maximize : {false, true}) {
        INFO(name(dtype) << " amsgrad " << amsgrad << " maximize " << maximize);
        manual_seed(3);
        // 1003 elements: whole vectors and a tail.
        const Tensor p = randn({1003}, {.dtype = dtype}), g = randn({1003}, {.dtype = dtype}) * 3.0;
        const AdamWState s{randn({1003}, {.dtype = dtype}) * 0.1, rand({1003}, {.dtype = dtype}) * 0.01,
                           amsgrad ? rand({1003}, {.dtype = dtype}) * 0.02 : Tensor(), f64_scalar(3)};
        const AdamWHyper h{f64_scalar(1e-3), f64_scalar(0.9), f64_scalar(0.999), f64_scalar(1e-8), f64_scalar(0.01)};
        AdamWUpdate result[2];
        for (int wide : {0, 1}) {
          cpu::set_wide_loops(wide == 1);
          result[wide] = adamw_update(p, g, s, h, {amsgrad, maximize});
        }
        check_identical(result[1].param, result[0].param);
        check_identical(result[1].exp_avg, result[0].exp_avg);
        check_identical(result[1].exp_avg_sq, result[0].exp_avg_sq);
        if (amsgrad) check_identical(result[1].max_exp_avg_sq, result[0].max_exp_avg_sq);
      }
  cpu::set_wide_loops(true);
}

TEST_CASE("an in-place update walks a channels_last parameter, and refuses state in another order",
          "[optim][multitensor]") {
  // The loop writes flat: a parameter and the state it writes share one dense memory order
  // (Module::to(channels_last) and the optimizers make them so); the gradient it only reads
  // may lie in any order. The result is the contiguous update's, bit for bit.
  manual_seed(9);
  const Tensor p = randn({3, 4, 2, 5}), g = randn({3, 4, 2, 5}), buf = randn({3, 4, 2, 5});
  const SGDHyper h{f64_scalar(0.1), f64_scalar(0.9), f64_scalar(0.0), f64_scalar(0.01)};
  const Tensor p_ref = p.clone(), buf_ref = buf.clone();
  sgd_update_(p_ref, g, buf_ref, h, {});
  const Tensor p_nhwc = p.contiguous(MemoryFormat::channels_last), buf_nhwc = buf.contiguous(MemoryFormat::channels_last);
  sgd_update_(p_nhwc, g, buf_nhwc, h, {});
  CHECK(p_nhwc.is_contiguous(MemoryFormat::channels_last));
  check_identical(p_nhwc.contiguous(), p_ref);
  check_identical(buf_nhwc.contiguous(), buf_ref);
  const Tensor p2 = p.contiguous(MemoryFormat::channels_last), buf_nchw = buf.clone();
  CHECK_THROWS_WITH(sgd_update_(p2, g, buf_nchw, h, {}),
                    Catch::Contains("sgd_update_") && Catch::Contains("momentum_buffer") &&
                        Catch::Contains("memory order"));
  CHECK_THROWS_WITH(sgd_update_(p.transpose(0, 1), g.transpose(0, 1), buf.transpose(0, 1), h, {}),
                    Catch::Contains("contiguous or channels_last"));
}
