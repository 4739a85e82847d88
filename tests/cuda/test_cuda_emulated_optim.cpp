// The CUDA kernels of the single optimizer updates (sgd_update(_), adamw_update(_): the
// multi-tensor kernels of kernels/cuda/optim.cpp run for one parameter), with the emulator
// executing their device code (tests/cuda/cuda_emulator.h), against the CPU kernels, bit for
// bit: both compute through kernels/scalar.h's sgd_update and adamw_update from
// kernels/optim_factors.h's f64 factors. Dense tensors take the kernels directly; tensors
// in no dense memory order are updated through contiguous copies.
#include <cmath>
#include <cstring>
#include <limits>

#include "compiler/compiler_testing.h"
#include "cuda/cuda_emulator.h"
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
