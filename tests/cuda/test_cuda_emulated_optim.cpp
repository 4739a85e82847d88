// The CUDA kernels of the single optimizer updates (sgd_update(_), adamw_update(_): the
// multi-tensor kernels of kernels/cuda/optim.cpp run for one parameter), with the emulator
// executing their device code (tests/cuda/cuda_emulator.h), against the CPU kernels, bit for
// bit: both compute through kernels/scalar.h's sgd_update and adamw_update from
// kernels/optim_factors.h's f64 factors. Dense tensors take the kernels directly; tensors
// in no dense memory order are updated through contiguous copies.
#include <cmath>
#include <array>
#include <cstring>
#include <limits>

#include "compiler/compiler_testing.h"
#include "core/ops/amp_ops.h"
#include "cuda/cuda_emulator.h"
#include "kernels/cuda/optim.h"
#include "testing.h"

using namespace kiln;
using kiln::testing::EmulatedHandKernels;
using kiln::testing::TempCache;

namespace {

// Equal bit for bit, a zero's sign included; NaNs are equal whatever their sign and payload
// (the host compiler may rewrite p - lr * -g as p + lr * g, which flips a NaN's sign).
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor x = a.contiguous().to(DType::f64), y = b.contiguous().to(DType::f64);
  const double *u = x.data_ptr<double>(), *v = y.data_ptr<double>();
  for (int64_t i = 0; i < x.numel(); ++i)
    if (!(std::isnan(u[i]) && std::isnan(v[i])) && std::memcmp(&u[i], &v[i], sizeof(double)) != 0) return false;
  return true;
}

#define CHECK_SAME_BITS(actual, expected)                          \
  do {                                                             \
    INFO("actual:   " << ::kiln::testing::describe(actual));       \
    INFO("expected: " << ::kiln::testing::describe(expected));     \
    CHECK(same_bits(actual, expected));                            \
  } while (0)

KernelFn cuda_kernel(const char* op) {
  const KernelFn k = find_op(op).kernels[static_cast<size_t>(DeviceType::cuda)];
  REQUIRE(k != nullptr);
  return k;
}

// Runs `op`'s CUDA kernel function in the emulator; it must launch a kernel family.
void run_emulated(const char* op, std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& attrs) {
  const int64_t before = EmulatedHandKernels::launches();
  {
    EmulatedHandKernels emulated;
    cuda_kernel(op)(in, out, attrs);
  }
  CHECK(EmulatedHandKernels::launches() > before);
}

// t's values stored in a non-dense layout: every other element of a wider tensor.
Tensor strided(const Tensor& t) {
  Shape wide = t.shape();
  wide.back() *= 2;
  Tensor w = full(wide, 5.0, {.dtype = t.dtype()});
  Tensor view = w.slice(-1, 0, wide.back(), 2);
  view.copy_(t);
  return view;
}

// A few special values: infinities and NaNs in the gradient, an infinite parameter.
void poison(Tensor& param, Tensor& grad) {
  Tensor p = param.view({param.numel()}), g = grad.view({grad.numel()});
  g.select(0, 0).fill_(std::numeric_limits<double>::infinity());
  g.select(0, 1).fill_(std::numeric_limits<double>::quiet_NaN());
  p.select(0, 2).fill_(-std::numeric_limits<double>::infinity());
}

}  // namespace

TEST_CASE("cuda emulated ops: the single SGD update equals the CPU's bit for bit", "[cuda_emulated]") {
  TempCache cache;
  manual_seed(21);
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor p = randn({5, 7}).to(dt), g = randn({5, 7}).to(dt);
    poison(p, g);
    const Tensor buf = randn({5, 7}).to(dt);
    // A weight decay that rounds to 0 in f32 still applies (0 * inf is NaN), as on the CPU.
    for (double weight_decay : {0.0, 0.01, 1e-60}) {
      for (double momentum : {0.9, 0.0, 1e-50}) {
        const SGDHyper hyper{full({}, 0.1), full({}, momentum), full({}, 0.25), full({}, weight_decay)};
        for (const SGDFlags flags : {SGDFlags{}, SGDFlags{.nesterov = true}, SGDFlags{.maximize = true},
                                     SGDFlags{.first = true}}) {
          for (bool with_buf : {true, false}) {
            for (bool dense : {true, false}) {
              INFO(name(dt) << " weight_decay " << weight_decay << " momentum " << momentum << " nesterov "
                            << flags.nesterov << " maximize " << flags.maximize << " first " << flags.first
                            << " buffer " << with_buf << " dense " << dense);
              const Tensor b = with_buf ? buf : Tensor();
              const SGDUpdate expected = sgd_update(p, g, b, hyper, flags);
              const Attrs attrs{{"nesterov", flags.nesterov}, {"maximize", flags.maximize}, {"first", flags.first}};
              auto layout = [&](const Tensor& t) { return dense ? t.clone() : strided(t); };
              const std::vector<Tensor> in = {layout(p), layout(g), with_buf ? layout(buf) : Tensor(),
                                              hyper.lr, hyper.momentum, hyper.dampening, hyper.weight_decay};
              // The pure form into outputs that are not dense either (when !dense).
              std::vector<Tensor> out = {layout(full({5, 7}, 7.0, {.dtype = dt}))};
              if (with_buf) out.push_back(layout(full({5, 7}, 7.0, {.dtype = dt})));
              run_emulated("sgd_update", in, out, attrs);
              CHECK_SAME_BITS(out[0], expected.param);
              if (with_buf) CHECK_SAME_BITS(out[1], expected.momentum_buffer);
              // The in-place form, over its inputs.
              run_emulated("sgd_update_", in, {}, attrs);
              CHECK_SAME_BITS(in[0], expected.param);
              if (with_buf) CHECK_SAME_BITS(in[2], expected.momentum_buffer);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("cuda emulated ops: the single AdamW update equals the CPU's bit for bit", "[cuda_emulated]") {
  TempCache cache;
  manual_seed(22);
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor p = randn({4, 6}).to(dt), g = randn({4, 6}).to(dt);
    poison(p, g);
    const Tensor m = mul(randn({4, 6}), 0.1).to(dt), v = mul(rand_like(zeros({4, 6})), 0.01).to(dt),
                 vmax = mul(rand_like(zeros({4, 6})), 0.02).to(dt);
    const AdamWHyper hyper{full({}, 1e-3), full({}, 0.9), full({}, 0.999), full({}, 1e-8), full({}, 0.01)};
    for (double step : {1.0, 7.0}) {
      for (const AdamWFlags flags : {AdamWFlags{}, AdamWFlags{.amsgrad = true}, AdamWFlags{.maximize = true},
                                     AdamWFlags{.amsgrad = true, .maximize = true}}) {
        for (bool dense : {true, false}) {
          INFO(name(dt) << " step " << step << " amsgrad " << flags.amsgrad << " maximize " << flags.maximize
                        << " dense " << dense);
          const AdamWState state{m, v, flags.amsgrad ? vmax : Tensor(), full({}, step)};
          const AdamWUpdate expected = adamw_update(p, g, state, hyper, flags);
          const Attrs attrs{{"amsgrad", flags.amsgrad}, {"maximize", flags.maximize}};
          auto layout = [&](const Tensor& t) { return dense ? t.clone() : strided(t); };
          const std::vector<Tensor> in = {layout(p),  layout(g),  layout(m),  layout(v),
                                          flags.amsgrad ? layout(vmax) : Tensor(), state.step,
                                          hyper.lr,   hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay};
          std::vector<Tensor> out;
          for (int i = 0; i < (flags.amsgrad ? 4 : 3); ++i) out.push_back(layout(full({4, 6}, 7.0, {.dtype = dt})));
          run_emulated("adamw_update", in, out, attrs);
          CHECK_SAME_BITS(out[0], expected.param);
          CHECK_SAME_BITS(out[1], expected.exp_avg);
          CHECK_SAME_BITS(out[2], expected.exp_avg_sq);
          if (flags.amsgrad) CHECK_SAME_BITS(out[3], expected.max_exp_avg_sq);
          run_emulated("adamw_update_", in, {}, attrs);
          CHECK_SAME_BITS(in[0], expected.param);
          CHECK_SAME_BITS(in[2], expected.exp_avg);
          CHECK_SAME_BITS(in[3], expected.exp_avg_sq);
          if (flags.amsgrad) CHECK_SAME_BITS(in[4], expected.max_exp_avg_sq);
        }
      }
    }
  }
}

// Capturable AdamW on a GPU: the step counts and hyperparameters are device tensors, so
// kernels/cuda/optim.cpp computes each parameter's factors on the device (the adamw_factors
// kernel, one launch per kAdamGroup parameters) for adamw_multi to read. Here the emulator
// runs both kernels, asked for the device path with CPU tensors; its pow is the host's, so
// the factors, and every element, must be the CPU kernel's bit for bit. 18 parameters of
// different sizes and step counts: two launch groups (16 + 2), each with its own factors'
// launch, so a row read from the wrong group or parameter shows.
TEST_CASE("cuda emulated ops: AdamW with factors computed on the device equals the CPU's bit for bit",
          "[cuda_emulated][amp]") {
  TempCache cache;
  manual_seed(25);
  const int64_t n = cuda::kAdamGroup + 2;
  for (DType dt : {DType::f32, DType::f64}) {
    std::vector<Tensor> params, grads, m, v, vmax, steps;
    for (int64_t k = 0; k < n; ++k) {
      const Shape shape = {k % 4 + 2, 2 * k + 3};
      params.push_back(randn(shape).to(dt));
      grads.push_back(randn(shape).to(dt));
      m.push_back(mul(randn(shape), 0.1).to(dt));
      v.push_back(mul(rand_like(zeros(shape)), 0.01).to(dt));
      vmax.push_back(mul(rand_like(zeros(shape)), 0.02).to(dt));
      steps.push_back(full({}, static_cast<double>(1 + 3 * k), {.dtype = DType::f64}));
    }
    poison(params[0], grads[0]);
    for (const AdamWFlags flags : {AdamWFlags{}, AdamWFlags{.amsgrad = true}, AdamWFlags{.maximize = true},
                                   AdamWFlags{.amsgrad = true, .maximize = true}}) {
      for (float flag : {0.0f, 1.0f}) {
        INFO(name(dt) << " amsgrad " << flags.amsgrad << " maximize " << flags.maximize << " found_inf " << flag);
        const AdamWHyper hyper{full({}, 1e-3), full({}, 0.9),  full({}, 0.999),
                               full({}, 1e-8), full({}, 0.01), full({}, flag, {.dtype = DType::f32})};
        std::vector<AdamWState> states;
        for (int64_t k = 0; k < n; ++k) {
          const auto i = static_cast<size_t>(k);
          states.push_back({m[i], v[i], flags.amsgrad ? vmax[i] : Tensor(), steps[i]});
        }
        const std::vector<AdamWUpdate> expected = adamw_update_multi(params, grads, states, hyper, flags);
        const Attrs attrs{{"amsgrad", flags.amsgrad}, {"maximize", flags.maximize}, {"count", n}};
        for (const auto where : {cuda::AdamWFactorsOn::device, cuda::AdamWFactorsOn::host,
                                 cuda::AdamWFactorsOn::automatic}) {
          for (bool in_place : {false, true}) {
            const bool on_device = where == cuda::AdamWFactorsOn::device;
            INFO((on_device ? "device" : "host") << " factors, in place " << in_place);
            std::vector<Tensor> in;
            for (const std::vector<Tensor>* role : {&params, &grads, &m, &v, &vmax})
              for (const Tensor& t : *role) in.push_back(role == &vmax && !flags.amsgrad ? Tensor() : t.clone());
            in.insert(in.end(), steps.begin(), steps.end());
            in.insert(in.end(), {hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay, hyper.found_inf});
            std::vector<Tensor> fresh;
            for (int64_t r = 0; r < (flags.amsgrad ? 4 : 3); ++r)
              for (int64_t k = 0; k < n; ++k) fresh.push_back(full(params[static_cast<size_t>(k)].shape(), 7.0, {.dtype = dt}));
            // The outputs: the inputs' param, exp_avg, exp_avg_sq and max_exp_avg_sq, or fresh tensors.
            const std::span<const Tensor> all = in_place ? std::span<const Tensor>(in) : std::span<const Tensor>(fresh);
            const auto role = [&](int64_t r) -> std::span<const Tensor> {
              if (r == 3 && !flags.amsgrad) return {};
              const int64_t at = in_place ? std::array<int64_t, 4>{0, 2, 3, 4}[static_cast<size_t>(r)] : r;
              return all.subspan(static_cast<size_t>(at * n), static_cast<size_t>(n));
            };
            const int64_t before = EmulatedHandKernels::launches();
            {
              EmulatedHandKernels emulated;
              CHECK(cuda::adamw_update_multi_tensor(in, {role(0), role(1), role(2), role(3)}, attrs, where).empty());
            }
            // Two launches of adamw_multi, each after one of adamw_factors on the device path;
            // host tensors take the host path when the choice is automatic.
            CHECK(EmulatedHandKernels::launches() - before == (on_device ? 4 : 2));
            for (int64_t k = 0; k < n; ++k) {
              const auto i = static_cast<size_t>(k);
              INFO("parameter " << k);
              CHECK_SAME_BITS(role(0)[i], expected[i].param);
              CHECK_SAME_BITS(role(1)[i], expected[i].exp_avg);
              CHECK_SAME_BITS(role(2)[i], expected[i].exp_avg_sq);
              if (flags.amsgrad) CHECK_SAME_BITS(role(3)[i], expected[i].max_exp_avg_sq);
            }
          }
        }
      }
    }
  }
}

// A launch group whose parameters are all empty is not launched (for_each_group): the next
// group's factors must still come from its own parameters' step counts.
TEST_CASE("cuda emulated ops: AdamW's device factors after a group of empty parameters", "[cuda_emulated]") {
  TempCache cache;
  manual_seed(26);
  const int64_t n = cuda::kAdamGroup + 2;
  std::vector<Tensor> params, grads, m, v, steps;
  for (int64_t k = 0; k < n; ++k) {
    const Shape shape = {k < cuda::kAdamGroup ? 0 : k};
    params.push_back(randn(shape));
    grads.push_back(randn(shape));
    m.push_back(mul(randn(shape), 0.1));
    v.push_back(mul(rand_like(zeros(shape)), 0.01));
    steps.push_back(full({}, static_cast<double>(1 + 5 * k), {.dtype = DType::f64}));
  }
  const AdamWHyper hyper{full({}, 1e-3), full({}, 0.9), full({}, 0.999), full({}, 1e-8), full({}, 0.01)};
  std::vector<AdamWState> states;
  for (int64_t k = 0; k < n; ++k) {
    const auto i = static_cast<size_t>(k);
    states.push_back({m[i], v[i], Tensor(), steps[i]});
  }
  const std::vector<AdamWUpdate> expected = adamw_update_multi(params, grads, states, hyper, {});
  std::vector<Tensor> in;
  for (const std::vector<Tensor>* role : {&params, &grads, &m, &v})
    for (const Tensor& t : *role) in.push_back(t.clone());
  in.insert(in.end(), static_cast<size_t>(n), Tensor());  // no max_exp_avg_sq
  in.insert(in.end(), steps.begin(), steps.end());
  in.insert(in.end(), {hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, hyper.weight_decay});
  const std::span<const Tensor> all(in);
  const auto role = [&](int64_t r) { return all.subspan(static_cast<size_t>(r * n), static_cast<size_t>(n)); };
  const int64_t before = EmulatedHandKernels::launches();
  {
    EmulatedHandKernels emulated;
    const Attrs attrs{{"amsgrad", false}, {"maximize", false}, {"count", n}};
    CHECK(cuda::adamw_update_multi_tensor(in, {role(0), role(2), role(3), {}}, attrs, cuda::AdamWFactorsOn::device)
              .empty());
  }
  CHECK(EmulatedHandKernels::launches() - before == 2);  // the second group's factors and update
  for (int64_t k = cuda::kAdamGroup; k < n; ++k) {
    INFO("parameter " << k);
    const auto i = static_cast<size_t>(k);
    CHECK_SAME_BITS(role(0)[i], expected[i].param);
    CHECK_SAME_BITS(role(2)[i], expected[i].exp_avg);
    CHECK_SAME_BITS(role(3)[i], expected[i].exp_avg_sq);
  }
}

// Mixed precision's skipped steps: with found_inf set, the CUDA updates' pure forms return
// their inputs and the in-place forms write nothing; with found_inf 0 they update as without.
TEST_CASE("cuda emulated ops: updates with found_inf skip or run as the CPU's", "[cuda_emulated][amp]") {
  TempCache cache;
  manual_seed(23);
  const Tensor p = randn({3, 5}), g = randn({3, 5}), buf = randn({3, 5}), m = randn({3, 5}) * 0.1,
               v = rand_like(zeros({3, 5})) * 0.01;
  for (float flag : {0.0f, 1.0f}) {
    INFO("found_inf " << flag);
    const Tensor found_inf = full({}, flag, {.dtype = DType::f32});
    const SGDHyper sgd{full({}, 0.1), full({}, 0.9), full({}, 0.0), full({}, 0.01), found_inf};
    const SGDUpdate sgd_expected = sgd_update(p, g, buf, sgd, {});
    CHECK_SAME_BITS(sgd_expected.param, flag != 0 ? p : sgd_update(p, g, buf, {sgd.lr, sgd.momentum, sgd.dampening, sgd.weight_decay}, {}).param);
    const Attrs sgd_attrs{{"nesterov", false}, {"maximize", false}, {"first", false}};
    const std::vector<Tensor> sgd_in = {p.clone(), g, buf.clone(), sgd.lr, sgd.momentum, sgd.dampening,
                                        sgd.weight_decay, found_inf};
    std::vector<Tensor> sgd_out = {full({3, 5}, 7.0), full({3, 5}, 7.0)};
    run_emulated("sgd_update", sgd_in, sgd_out, sgd_attrs);
    CHECK_SAME_BITS(sgd_out[0], sgd_expected.param);
    CHECK_SAME_BITS(sgd_out[1], sgd_expected.momentum_buffer);
    run_emulated("sgd_update_", sgd_in, {}, sgd_attrs);
    CHECK_SAME_BITS(sgd_in[0], sgd_expected.param);
    CHECK_SAME_BITS(sgd_in[2], sgd_expected.momentum_buffer);

    const AdamWHyper adam{full({}, 1e-3), full({}, 0.9), full({}, 0.999), full({}, 1e-8), full({}, 0.01), found_inf};
    const AdamWState state{m, v, Tensor(), full({}, 3.0)};
    const AdamWUpdate adam_expected = adamw_update(p, g, state, adam, {});
    if (flag != 0) CHECK_SAME_BITS(adam_expected.exp_avg, m);
    const Attrs adam_attrs{{"amsgrad", false}, {"maximize", false}};
    const std::vector<Tensor> adam_in = {p.clone(), g, m.clone(), v.clone(), Tensor(), state.step, adam.lr,
                                         adam.beta1, adam.beta2, adam.eps, adam.weight_decay, found_inf};
    std::vector<Tensor> adam_out = {full({3, 5}, 7.0), full({3, 5}, 7.0), full({3, 5}, 7.0)};
    run_emulated("adamw_update", adam_in, adam_out, adam_attrs);
    CHECK_SAME_BITS(adam_out[0], adam_expected.param);
    CHECK_SAME_BITS(adam_out[1], adam_expected.exp_avg);
    CHECK_SAME_BITS(adam_out[2], adam_expected.exp_avg_sq);
    run_emulated("adamw_update_", adam_in, {}, adam_attrs);
    CHECK_SAME_BITS(adam_in[0], adam_expected.param);
    CHECK_SAME_BITS(adam_in[2], adam_expected.exp_avg);
    CHECK_SAME_BITS(adam_in[3], adam_expected.exp_avg_sq);
  }
}

TEST_CASE("cuda emulated ops: the loss scaler's kernels equal the CPU's", "[cuda_emulated][amp]") {
  TempCache cache;
  manual_seed(24);
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (bool poisoned : {false, true}) {
      INFO(name(dt) << " poisoned " << poisoned);
      Tensor a = (randn({4, 9}) * 1000).to(dt), b = (randn({70}) * 1000).to(dt);
      if (poisoned) b.select(0, 69).fill_(std::numeric_limits<double>::quiet_NaN());
      const Tensor inv = full({}, 1.0f / 3.0f, {.dtype = DType::f32});
      std::vector<Tensor> cpu_grads = {a.clone(), b.clone()};
      Tensor cpu_found = zeros({}, {.dtype = DType::f32});
      amp_unscale_(cpu_grads, cpu_found, inv);
      const Attrs attrs{{"count", int64_t{2}}};
      // The in-place form, and the pure form into outputs of which one is not dense.
      const std::vector<Tensor> in = {a.clone(), strided(b), zeros({}, {.dtype = DType::f32}), inv};
      std::vector<Tensor> out = {full({4, 9}, 7.0, {.dtype = dt}), strided(full({70}, 7.0, {.dtype = dt})),
                                 full({}, 5.0f, {.dtype = DType::f32})};
      run_emulated("amp_unscale", in, out, attrs);
      CHECK_SAME_BITS(out[0], cpu_grads[0]);
      CHECK_SAME_BITS(out[1], cpu_grads[1]);
      CHECK(out[2].item<float>() == cpu_found.item<float>());
      run_emulated("amp_unscale_", in, {}, attrs);
      CHECK_SAME_BITS(in[0], cpu_grads[0]);
      CHECK_SAME_BITS(in[1], cpu_grads[1]);
      CHECK(in[2].item<float>() == (poisoned ? 1.0f : 0.0f));
    }
  }
  const Attrs update_attrs{{"growth_factor", 2.0}, {"backoff_factor", 0.5}, {"growth_interval", int64_t{2}}};
  for (float flag : {0.0f, 1.0f}) {
    for (int tracker : {0, 1}) {
      const std::vector<Tensor> in = {full({}, 1024.0f, {.dtype = DType::f32}), full({}, tracker, {.dtype = DType::i32}),
                                      full({}, flag, {.dtype = DType::f32})};
      const AmpScaleState expected = amp_update_scale(in[0], in[1], in[2], {2.0, 0.5, 2});
      std::vector<Tensor> out = {zeros({}, {.dtype = DType::f32}), zeros({}, {.dtype = DType::i32})};
      run_emulated("amp_update_scale", in, out, update_attrs);
      CHECK(out[0].item<float>() == expected.scale.item<float>());
      CHECK(out[1].item<int32_t>() == expected.growth_tracker.item<int32_t>());
      run_emulated("amp_update_scale_", in, {}, update_attrs);
      CHECK(in[0].item<float>() == expected.scale.item<float>());
      CHECK(in[1].item<int32_t>() == expected.growth_tracker.item<int32_t>());
    }
  }
}
