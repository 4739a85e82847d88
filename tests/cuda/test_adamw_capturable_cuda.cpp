// Capturable AdamW on a GPU (optim/adamw.h): step counts and hyperparameters in device
// memory, the factors computed there (kernels/cuda/optim.cpp's adamw_factors kernel), against
// the default AdamW on the CPU; and its update captured in a CUDA graph, replayed with new
// step counts, lr and found_inf.
//
// Tolerances. The elementwise update is kernels/scalar.h's on both devices in the same order
// (NVRTC gets --fmad=false), and exp_avg and exp_avg_sq use no factor that pow makes, so they
// are equal bit for bit. Only the step's factors may differ: CUDA's f64 pow is within 2 ulp
// (the CUDA C programming guide's table) where glibc's is within 1, so beta^t differs by at
// most 3 ulp, 3 * 2^-52 relative; 1 - beta^t then differs by beta^t / (1 - beta^t) times that,
// at most 999x for beta2 = 0.999 at step 1: 6.7e-13, halved by the sqrt to 3.4e-13, and 9x
// (6e-15) for beta1 = 0.9. An update's size is at most Adam's bound lr (1 - beta1) / sqrt(1 - beta2) =
// 3.2 lr, under 0.16 here (lr at most 0.05), and the parameters, in (-1, 1) at the start,
// stay under 2. In f64 an update then moves by at most 0.16 * 3.4e-13 = 5.4e-14 and p's
// rounding by one ulp (2.2e-16 under 2): the four steps that are not skipped stay under
// 2.2e-13, so rtol 0 and atol 2e-12 (9x slack). In f32 a factor
// that close to a rounding boundary of f32 rounds to the neighbouring float: the update is off
// by at most 2^-23 relative (0.16 * 1.2e-7 = 1.9e-8) and p's rounding by one ulp (1.2e-7
// under 2): four steps stay under 5.6e-7, so atol 1e-6. exp_avg, exp_avg_sq and
// max_exp_avg_sq: equal.
#include "core/ops/optim_ops.h"
#include "cuda/cuda_testing.h"
#include "kernels/cuda/optim.h"
#include "optim/adamw.h"

using namespace kiln;
using kiln::testing::gpu;
using kiln::testing::host;
using kiln::testing::values_in;

namespace {

// 18 parameters of different sizes: on the GPU, two launch groups of kAdamGroup (16) and 2.
std::vector<Shape> shapes() {
  std::vector<Shape> s;
  for (int64_t k = 0; k < cuda::kAdamGroup + 2; ++k) s.push_back({k % 4 + 1, 2 * k + 3});
  return s;
}

double atol_of(DType dtype) { return dtype == DType::f64 ? 2e-12 : 1e-6; }

}  // namespace

TEST_CASE("capturable AdamW on the GPU equals the CPU's AdamW, lr changes and skipped steps included", "[cuda]") {
  KILN_NEEDS_GPU();
  const Device device = Device::cuda();
  for (DType dtype : {DType::f32, DType::f64}) {
    for (const bool amsgrad : {false, true}) {
      for (const bool maximize : {false, true}) {
        INFO(name(dtype) << " amsgrad " << amsgrad << " maximize " << maximize);
        std::vector<Tensor> on_cpu, on_gpu;
        uint64_t seed = 40;
        for (const Shape& s : shapes()) {
          const Tensor v = values_in(s, -1, 1, dtype, seed++);
          on_cpu.push_back(v.clone().requires_grad_());
          on_gpu.push_back(gpu(v).detach().requires_grad_());
        }
        const optim::AdamWOptions options{.lr = 0.05, .weight_decay = 0.01, .amsgrad = amsgrad, .maximize = maximize};
        optim::AdamW cpu_adam(on_cpu, options);
        optim::AdamWOptions capturable = options;
        capturable.capturable = true;
        optim::AdamW gpu_adam(on_gpu, capturable);
        gpu_adam.move_hyperparameters(optim::AdamW::tensor_hyperparameters(), device);
        Tensor found_inf = zeros({}, {.dtype = DType::f32, .device = device});
        for (int step = 0; step < 6; ++step) {
          for (size_t k = 0; k < on_cpu.size(); ++k) {
            const Tensor g = values_in(on_cpu[k].shape(), -1, 1, dtype, 100 * static_cast<uint64_t>(step) + k);
            on_cpu[k].set_grad(g);
            on_gpu[k].set_grad(gpu(g));
          }
          const double lr = 0.05 / (step + 1);
          cpu_adam.param_groups()[0].set_lr(lr);
          gpu_adam.param_groups()[0].set_lr(lr);
          const float skip = step == 2 || step == 4 ? 1.0f : 0.0f;
          found_inf.fill_(skip);
          cpu_adam.step(full({}, skip, {.dtype = DType::f32}));
          gpu_adam.step(found_inf);
          for (size_t k = 0; k < on_cpu.size(); ++k) {
            INFO("step " << step << " parameter " << k);
            KILN_CHECK_CLOSE(host(on_gpu[k]), on_cpu[k].detach(), 0.0, atol_of(dtype));
            KILN_CHECK_EQUAL(host(gpu_adam.state(on_gpu[k]).at("exp_avg")), cpu_adam.state(on_cpu[k]).at("exp_avg"));
            KILN_CHECK_EQUAL(host(gpu_adam.state(on_gpu[k]).at("exp_avg_sq")),
                             cpu_adam.state(on_cpu[k]).at("exp_avg_sq"));
          }
        }
        for (const Tensor& p : on_gpu) {
          CHECK(gpu_adam.state(p).at("step").device() == device);
          CHECK(gpu_adam.state(p).at("step").item<double>() == 4.0);  // 6 steps, 2 skipped
        }
      }
    }
  }
}

// The update op with device step counts and hyperparameters, captured once and replayed with
// each step's counts, lr and found_inf written into the same tensors between replays (what
// a CUDA graph of kiln-train's whole step does): a capture fails if anything in it waits for
// the device or copies from the host.
TEST_CASE("capturable AdamW's update is captured in a CUDA graph and replays each step's numbers", "[cuda]") {
  KILN_NEEDS_GPU();
  const Device device = Device::cuda();
  for (DType dtype : {DType::f32, DType::f64}) {
    INFO(name(dtype));
    const AdamWFlags flags{.amsgrad = true, .maximize = false};
    std::vector<Tensor> params, grads, cpu_params, cpu_grads;
    std::vector<AdamWState> states, cpu_states;
    uint64_t seed = 60;
    for (const Shape& s : shapes()) {
      cpu_params.push_back(values_in(s, -1, 1, dtype, seed++));
      cpu_grads.push_back(values_in(s, -1, 1, dtype, seed++));
      cpu_states.push_back({zeros(s, {.dtype = dtype}), zeros(s, {.dtype = dtype}), zeros(s, {.dtype = dtype}),
                            full({}, 0.0, {.dtype = DType::f64})});
      params.push_back(gpu(cpu_params.back()));
      grads.push_back(gpu(cpu_grads.back()));
      states.push_back({gpu(cpu_states.back().exp_avg), gpu(cpu_states.back().exp_avg_sq),
                        gpu(cpu_states.back().max_exp_avg_sq), gpu(cpu_states.back().step)});
    }
    const auto hyper_on = [](Device d) {
      const TensorOptions o{.dtype = DType::f64, .device = d};
      return AdamWHyper{full({}, 0.05, o), full({}, 0.9, o), full({}, 0.999, o), full({}, 1e-8, o), full({}, 0.01, o),
                        zeros({}, {.dtype = DType::f32, .device = d})};
    };
    const AdamWHyper hyper = hyper_on(device), cpu_hyper = hyper_on(Device::cpu());
    // Compiles the kernels before the capture, on copies.
    {
      std::vector<Tensor> p2;
      for (const Tensor& p : params) p2.push_back(p.clone());
      std::vector<AdamWState> s2;
      for (const AdamWState& s : states)
        s2.push_back({s.exp_avg.clone(), s.exp_avg_sq.clone(), s.max_exp_avg_sq.clone(), s.step + 1.0});
      adamw_update_multi_(p2, grads, s2, hyper, flags);
    }
    cuda::MemPool pool;
    cuda::CudaGraph graph;
    graph.capture(pool, [&] { adamw_update_multi_(params, grads, states, hyper, flags); });
    REQUIRE(graph.captured());
    for (int step = 1; step <= 4; ++step) {
      INFO("step " << step);
      const double lr = 0.05 / step;
      const float skip = step == 3 ? 1.0f : 0.0f;
      for (const AdamWHyper* h : {&hyper, &cpu_hyper}) {
        Tensor(h->lr).fill_(lr);
        Tensor(h->found_inf).fill_(skip);
      }
      for (size_t k = 0; k < params.size(); ++k) {
        Tensor(states[k].step).fill_(static_cast<double>(step));
        Tensor(cpu_states[k].step).fill_(static_cast<double>(step));
      }
      graph.replay();
      adamw_update_multi_(cpu_params, cpu_grads, cpu_states, cpu_hyper, flags);
      for (size_t k = 0; k < params.size(); ++k) {
        INFO("parameter " << k);
        KILN_CHECK_CLOSE(host(params[k]), cpu_params[k], 0.0, atol_of(dtype));
        KILN_CHECK_EQUAL(host(states[k].exp_avg), cpu_states[k].exp_avg);
        KILN_CHECK_EQUAL(host(states[k].max_exp_avg_sq), cpu_states[k].max_exp_avg_sq);
      }
    }
  }
}
