// kiln-bench: speed measured as ratios in one run. This file: `train` and `mlp-block`,
// which time training steps, and the command line; `ops` (single ops, one JSON line each)
// is in tools/bench_ops.cpp, `convs` (a model's convolutions) in tools/bench_convs.cpp, `plan`
// (the GPU cost model's prediction) in tools/bench_plan.cpp, `ddp` (data-parallel training) in
// tools/bench_ddp.cpp.
// tools/bench_vs_torch.py runs them against PyTorch.
#include <algorithm>
#include <array>
#include <ranges>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <kiln.h>

#include "kernels/cpu/gemm.h"
#include "tools/bench_common.h"
#include "tools/report_errors.h"
#include "tools/trainer.h"

using namespace kiln;
using namespace kiln::bench;

namespace {

struct TrainBenchOptions {
  std::string arch = "resnet50";
  std::string device = "cpu";
  int64_t batch = 8, micro_batch = 0, image_size = 64, classes = 1000, steps = 10, warmup = 2;
  bool compile = false;  // also time the compiled step, in the same run
  std::string only;      // time this one mode alone ("eager", "compiled", ...; empty: all)
  bool profile = false;  // print where the compiled step's time goes (to stderr)
  bool channels_last = false;  // the batch (so eager's whole step) channels-last
  compiler::LayoutPolicy layout = compiler::LayoutPolicy::automatic;  // the compiled modes' layout pass
  std::optional<DType> amp;  // also time the step with autocast to this dtype (f16: with a GradScaler)
};

struct TrainTiming {
  double median_ms = 0, peak_mib = 0, first_call_s = 0;
  double min_ms = 0, max_ms = 0;  // the fastest and slowest timed step (time_steps)
};

// Times `step` (after `warmup` calls, the first of which is timed on its own: tracing and
// compiling happen there) and measures the peak of live tensor bytes during the timed steps.
// On a GPU each step ends with a device synchronization, so the time is the GPU's work.
TrainTiming time_steps(const std::function<void()>& step, int64_t warmup, int64_t steps,
                       Device device = Device::cpu()) {
  auto run = [&] {
    step();
    if (device.is_cuda()) cuda::synchronize(device.index);
  };
  TrainTiming t;
  for (int64_t i = 0; i < warmup; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    if (i == 0) t.first_call_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  reset_peak_memory(device.type);
  std::vector<double> ms;
  for (int64_t i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  t.median_ms = median_of(ms);
  const auto [fastest, slowest] = std::ranges::minmax(ms);
  t.min_ms = fastest;
  t.max_ms = slowest;
  t.peak_mib = static_cast<double>(memory_stats(device.type).peak) / 1048576.0;
  return t;
}

// Where an eager GPU step's time goes: one step with the device synchronized after every
// op, the time from the end of one op to the end of the next charged to the latter (its
// GPU work, its launch and the host work before it), summed per op name, on stderr.
void profile_cuda_step(const std::function<void()>& step, Device device) {
  std::map<std::string, std::pair<double, int64_t>> per_op;  // ms, calls
  cuda::synchronize(device.index);
  auto last = std::chrono::steady_clock::now();
  const auto start = last;
  {
    OpHookGuard hook([&](const OpCall& call) {
      cuda::synchronize(device.index);
      const auto now = std::chrono::steady_clock::now();
      auto& [ms, calls] = per_op[call.op.name];
      ms += std::chrono::duration<double, std::milli>(now - last).count();
      ++calls;
      last = now;
    });
    step();
    cuda::synchronize(device.index);
  }
  const double total = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(per_op.begin(), per_op.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::cerr << fmt::format("eager GPU step, synchronized after every op: {:.1f} ms\n{:<32}{:>10}{:>8}{:>8}\n", total,
                           "op", "ms", "calls", "%");
  for (const auto& [name, v] : rows)
    std::cerr << fmt::format("{:<32}{:>10.2f}{:>8}{:>7.1f}%\n", name, v.first, v.second, 100.0 * v.first / total);
  const std::vector<std::string> fallback = cuda::host_fallback_ops();
  std::cerr << fmt::format("host fallback ops: {}\n", fmt::join(fallback, ", "));
}

// `s` as a JSON string literal.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) out += fmt::format("\\u{:04x}", static_cast<int>(ch));
    else out += ch;
  }
  return out + "\"";
}

// One JSON line: the median time of an optimizer step (forward, backward, SGD update) of
// `arch` on a synthetic batch, images per second, and the peak bytes of live tensors
// during the timed steps (parameters, gradients and optimizer state included).
int bench_train(const TrainBenchOptions& o) {
  KILN_CHECK(o.device == "cpu" || o.device == "cuda", "kiln-bench train: --device {}: expected cpu or cuda", o.device);
  const Device device = o.device == "cuda" ? Device::cuda() : Device::cpu();
  if (device.is_cuda()) {
    KILN_CHECK(cuda::is_available(), "kiln-bench train: --device cuda: CUDA is not available: {}",
               cuda::unavailable_reason());
    // As PyTorch's benchmark (tools/bench_torch.py) runs: TF32 for f32 products and
    // convolutions, convolution algorithms chosen by timing.
    cuda::set_allow_tf32(true);
    cuda::set_cudnn_benchmark(true);
  }
  KILN_CHECK(o.batch > 0 && o.steps > 0 && o.warmup >= 1 && o.image_size > 0,
             "kiln-bench train: --batch, --steps, --warmup and --image-size must be positive");
  manual_seed(0);
  std::shared_ptr<nn::Module> model = train::make_model(o.arch, o.classes, 3, o.image_size);
  model->to(device);
  optim::SGD sgd(model->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 5e-5});
  const optim::Accumulation accumulation({.batch = o.batch, .micro_batch = o.micro_batch > 0 ? o.micro_batch : o.batch});
  Tensor x = randn({o.batch, 3, o.image_size, o.image_size}).to(device);
  if (o.channels_last) x = x.contiguous(MemoryFormat::channels_last);
  Tensor y = randint(0, o.classes, {o.batch}).to(device);
  int64_t parameters = 0;
  for (const Tensor& p : model->parameters()) parameters += p.numel();
  auto line = [&](const char* mode, const TrainTiming& t, const std::string& extra) {
    std::cout << fmt::format(
        R"({{"bench":"train","mode":"{}","arch":"{}","device":"{}","batch":{},"micro_batch":{},"image_size":{},)"
        R"("input_layout":"{}","layout_pass":"{}",)"
        R"("parameters":{},"steps":{},"median_step_ms":{:.1f},"img_per_s":{:.1f},"peak_mib":{:.1f},"first_call_s":{:.2f}{}}})"
        "\n",
        mode, o.arch, o.device, o.batch, accumulation.options().micro_batch, o.image_size,
        o.channels_last ? "channels_last" : "contiguous", compiler::layout_policy_name(o.layout), parameters, o.steps,
        t.median_ms, 1000.0 * static_cast<double>(o.batch) / t.median_ms, t.peak_mib, t.first_call_s, extra);
  };
  // The modes share the model and optimizer. Warm-ups run mode by mode (the first call of a
  // compiled mode traces and compiles); then the timed steps run in rounds, a few steps of
  // each mode per round, so that a shared machine's drift (seen here: +-20% from one
  // minute to the next) hits every mode alike and the ratios hold. Each block of steps
  // starts with .grad cleared, as an eager step leaves it.
  using Mode = StepMode;
  std::vector<Mode> modes;
  modes.push_back({"eager", [&] { train::train_step(*model, sgd, accumulation, x, y, 0.0); }, o.warmup});
  std::optional<compiler::CompiledFunction> compiled, whole, split, graphed, tuned;
  if (o.compile) {
    // The forward and backward of each micro-step compiled; the SGD update eager (as
    // kiln-train --compile runs it). Two warm-up calls at least: the first traces with
    // .grad undefined, the second with it defined (accumulation), each a graph of its own.
    compiled = compiler::compile(train::micro_step_function(*model, 0.0), {.layout = o.layout, .profile = o.profile});
    modes.push_back({"compiled", [&] { train::train_step_compiled(*compiled, sgd, accumulation, x, y); },
                     std::max<int64_t>(o.warmup, 2)});
    // The whole optimizer step (micro-steps, accumulation and the SGD update) as one graph.
    // The program runs the updates in place (Program's in-place write-backs); the graph
    // zero-fills .grad instead of freeing it, so it holds the gradients through the step.
    whole = compiler::compile(train::whole_step_function(*model, sgd, accumulation, 0.0),
                              {.layout = o.layout, .profile = o.profile});
    modes.push_back({"compiled-whole-step", [&] { (*whole)({x, y}); }, std::max<int64_t>(o.warmup, 2)});
    // The eager training step as it is written (it reads each micro-step's loss and
    // accuracy on the host: graph breaks) compiled whole: later calls run split, the
    // pieces between the reads compiled (compiler/trace.h, run_split).
    split = compiler::compile(
        [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
          train::train_step(*model, sgd, accumulation, a[0], a[1], 0.0);
          return {};
        },
        {.layout = o.layout, .profile = o.profile});
    modes.push_back({"compiled-split", [&] { (*split)({x, y}); }, std::max<int64_t>(o.warmup, 2)});
    if (device.is_cuda()) {
      // The micro-steps as CUDA graphs (mode reduce-overhead): each graph's first replay
      // warms up, its second captures; so three warm-up calls per micro-step graph.
      graphed = compiler::compile(train::micro_step_function(*model, 0.0),
                                  {.mode = "reduce-overhead", .layout = o.layout});
      modes.push_back({"compiled-reduce-overhead", [&] { train::train_step_compiled(*graphed, sgd, accumulation, x, y); },
                       std::max<int64_t>(o.warmup, 3)});
      tuned = compiler::compile(train::micro_step_function(*model, 0.0), {.mode = "max-autotune", .layout = o.layout});
      modes.push_back({"compiled-max-autotune", [&] { train::train_step_compiled(*tuned, sgd, accumulation, x, y); },
                       std::max<int64_t>(o.warmup, 3)});
    }
  }
  // The autocast steps last, so that the compiled modes keep their indices: kiln-train's
  // --amp step (tools/trainer.h, Precision), f16 with dynamic loss scaling.
  const size_t amp_index = modes.size();
  std::optional<optim::GradScaler> scaler;
  if (o.amp == DType::f16) scaler.emplace(optim::GradScalerOptions{.device = device});
  const train::Precision precision{o.amp, scaler ? &*scaler : nullptr};
  std::optional<compiler::CompiledFunction> compiled_amp;
  if (o.amp) {
    modes.push_back({fmt::format("eager-amp-{}", name(*o.amp)),
                     [&] { train::train_step(*model, sgd, accumulation, x, y, 0.0, precision); }, o.warmup});
    if (o.compile) {
      compiled_amp = compiler::compile(train::micro_step_function(*model, 0.0, precision),
                                       {.layout = o.layout, .profile = o.profile});
      modes.push_back({fmt::format("compiled-amp-{}", name(*o.amp)),
                       [&] { train::train_step_compiled(*compiled_amp, sgd, accumulation, x, y, precision); },
                       std::max<int64_t>(o.warmup, 2)});
    }
  }
  auto run = [&](Mode& m) {
    const auto t0 = std::chrono::steady_clock::now();
    m.step();
    if (device.is_cuda()) cuda::synchronize(device.index);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  // Read after the timed steps: the CUDA fields include the allocator's peak.
  auto device_fields = [&]() -> std::string {
    if (device.is_cpu()) return blas_field();
    const std::vector<std::string> fallback = cuda::host_fallback_ops();
    return fmt::format(
        R"(,"tf32":true,"cudnn_benchmark":true,"reserved_mib":{:.1f},"host_fallback_ops":[{}])",
        static_cast<double>(cuda::allocator_stats(device.index).peak_reserved) / 1048576.0,
        fmt::join(
            fallback | std::views::transform([](const std::string& n) { return "\"" + n + "\""; }),
            ","));
  };
  if (!o.only.empty()) {
    // One mode alone, in a process of its own (tools/bench_vs_torch.py runs each mode so,
    // interleaved with PyTorch's), with the range of its step times.
    const auto it = std::ranges::find(modes, o.only, &Mode::name);
    if (it == modes.end())
      fail("kiln-bench train: --only {}: expected one of {} (the compiled modes need --compile)",
           o.only, fmt::join(modes | std::views::transform(&Mode::name), ", "));
    const TrainTiming t = time_steps(it->step, it->warmup, o.steps, device);
    line(it->name.c_str(), t,
         fmt::format(R"({},"min_step_ms":{:.1f},"max_step_ms":{:.1f})", device_fields(), t.min_ms,
                     t.max_ms));
    return 0;
  }
  time_in_rounds(
      modes, o.steps, run,
      [&] {
        sgd.zero_grad();
        reset_peak_memory(device.type);
      },
      [&] { return static_cast<double>(memory_stats(device.type).peak) / 1048576.0; });
  std::vector<TrainTiming> timing;
  for (const Mode& m : modes) timing.push_back({median_of(m.ms), m.peak, m.first_call_s});

  const std::string extra = device_fields();
  line("eager", timing[0], extra);
  if (o.compile) {
    const CompiledFunction* functions[] = {nullptr, &*compiled, &*whole, &*split, graphed ? &*graphed : nullptr,
                                           tuned ? &*tuned : nullptr};
    for (size_t i = 1; i < amp_index; ++i) {
      const CompiledFunction& f = *functions[i];
      std::string pieces =
          f.split_calls() > 0 ? fmt::format(R"(,"pieces":{},"piece_programs":{})", f.last_split().size(), f.piece_programs())
                              : "";
      if (f.cuda_graphs().captures + f.cuda_graphs().uncaptured_runs > 0) {
        const compiler::CudaGraphStats g = f.cuda_graphs();
        pieces += fmt::format(R"(,"cuda_graphs_captured":{},"replays":{},"uncaptured_runs":{},"pool_mib":{:.1f},"not_captured":[{}])",
                              g.captures, g.replays, g.uncaptured_runs, static_cast<double>(g.pool_bytes) / 1048576.0,
                              fmt::join(g.skipped | std::views::transform([](const std::string& r) { return json_string(r); }), ","));
      }
      line(modes[i].name.c_str(), timing[i],
           fmt::format(R"(,"graphs":{}{},"speedup_vs_eager":{:.3f},"peak_ratio_vs_eager":{:.3f})", f.cache_size(),
                       pieces, timing[0].median_ms / timing[i].median_ms, timing[i].peak_mib / timing[0].peak_mib));
    }
    if (o.profile) std::cerr << compiled->profile() << whole->profile() << split->profile();
    if (o.profile && compiled_amp) std::cerr << compiled_amp->profile();
    if (tuned) std::cerr << "max-autotune's launches:\n" << tuned->autotune_report();
  }
  if (o.amp) {
    // The CPU's bf16 products run on AVX-512 BF16 where it has it (kernels/cpu/gemm.h).
    const std::string path =
        device.is_cpu() ? fmt::format(R"(,"bf16_gemm":"{}")", bf16_gemm_name()) : "";
    for (size_t i = amp_index; i < modes.size(); ++i) {
      const bool compiled_mode = i > amp_index;  // compiled-amp against the compiled f32 step
      const TrainTiming& base = timing[compiled_mode ? 1 : 0];
      line(modes[i].name.c_str(), timing[i],
           fmt::format(R"({}{},"amp":"{}","loss_scaling":{},"speedup_vs_{}_f32":{:.3f},"peak_ratio_vs_{}_f32":{:.3f})",
                       extra, path, name(*o.amp), scaler.has_value(), compiled_mode ? "compiled" : "eager",
                       base.median_ms / timing[i].median_ms, compiled_mode ? "compiled" : "eager",
                       timing[i].peak_mib / base.peak_mib));
    }
  }
  if (o.profile && device.is_cuda()) profile_cuda_step([&] { train::train_step(*model, sgd, accumulation, x, y, 0.0); }, device);
  return 0;
}

struct MlpBlockOptions {
  int64_t batch = 256, width = 1024, hidden = 0, steps = 10, warmup = 2;  // hidden 0: 4 * width
  int64_t blocks = 1;       // blocks in a row, each feeding the next
  int64_t micro_steps = 1;  // backward passes accumulated into .grad per step (one batch each)
  bool adamw = false;       // end each step with an AdamW update (eager, in both modes)
  std::string only;         // time this one mode alone: eager or compiled (empty: both)
  bool describe = false;    // print the compiled program's steps (stderr)
  bool profile = false;     // print where the compiled step's time goes (stderr)
};

// The parameters of y = x + fc2(gelu(fc1(layer_norm(x)))).
struct MlpBlock {
  Tensor ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias;
  MlpBlock(int64_t width, int64_t hidden) {
    auto param = [](Tensor t) {
      t.requires_grad_(true);
      return t;
    };
    const double s1 = 1.0 / std::sqrt(static_cast<double>(width)),
                 s2 = 1.0 / std::sqrt(static_cast<double>(hidden));
    ln_weight = param(ones({width}) + randn({width}) * 0.1);
    ln_bias = param(randn({width}) * 0.1);
    fc1_weight = param(randn({hidden, width}) * s1);
    fc1_bias = param(randn({hidden}) * 0.1);
    fc2_weight = param(randn({width, hidden}) * s2);
    fc2_bias = param(randn({width}) * 0.1);
  }
  std::vector<Tensor> parameters() const {
    return {ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias};
  }
  Tensor forward(const Tensor& x) const {
    const Tensor h = layer_norm(x, {x.size(-1)}, ln_weight, ln_bias, 1e-5);
    const Tensor a = gelu(matmul(h, fc1_weight.t()) + fc1_bias);
    return x + (matmul(a, fc2_weight.t()) + fc2_bias);
  }
};

// MLP blocks in a row and their training step: forward, the loss mean(y^2), backward (the
// gradients become the parameters' .grad).
struct MlpStack {
  std::vector<MlpBlock> blocks;
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> all;
    for (const MlpBlock& b : blocks) std::ranges::copy(b.parameters(), std::back_inserter(all));
    return all;
  }
  std::vector<Tensor> step(const std::vector<Tensor>& args) const {
    Tensor y = args[0];
    for (const MlpBlock& b : blocks) y = b.forward(y);
    Tensor loss = mean(y * y);
    loss.backward();
    return {loss.detach()};
  }
  void clear_grads() const {
    for (const Tensor& p : parameters()) p.set_grad(Tensor());
  }
};

// One JSON line per mode (eager, compiled): the median time of the blocks' training step
// on one batch, and the peak bytes of live tensors, with the compiled step's speedup.
int bench_mlp_block(const MlpBlockOptions& o) {
  KILN_CHECK(o.batch > 0 && o.width > 0 && o.hidden >= 0 && o.steps > 0 && o.warmup >= 1 &&
                 o.micro_steps > 0,
             "kiln-bench mlp-block: --batch, --width, --steps, --warmup and --micro-steps must be "
             "positive");
  manual_seed(0);
  const int64_t hidden = o.hidden > 0 ? o.hidden : 4 * o.width;
  MlpStack stack;
  for (int64_t b = 0; b < o.blocks; ++b) stack.blocks.emplace_back(o.width, hidden);
  const Tensor x = randn({o.batch, o.width});
  // PyTorch's AdamW defaults (lr 1e-3, weight decay 1e-2), as tools/bench_torch.py has them.
  std::optional<optim::AdamW> adamw;
  if (o.adamw) adamw.emplace(stack.parameters());
  auto line = [&](const std::string& mode, const TrainTiming& t, const std::string& extra) {
    std::cout << fmt::format(
        R"({{"bench":"mlp-block","mode":"{}","batch":{},"width":{},"hidden":{},"blocks":{},"optimizer":"{}",)"
        R"("micro_steps":{},"steps":{},"median_step_ms":{:.2f},"peak_mib":{:.1f},"first_call_s":{:.2f}{}}})"
        "\n",
        mode, o.batch, o.width, hidden, o.blocks, o.adamw ? "adamw" : "none", o.micro_steps,
        o.steps, t.median_ms, t.peak_mib, t.first_call_s, extra);
  };
  compiler::CompiledFunction compiled =
      compiler::compile([&stack](const std::vector<Tensor>& args) { return stack.step(args); },
                        {.profile = o.profile});
  // Micro-steps after the first accumulate into .grad (a graph of their own when compiled).
  auto eager_step = [&] {
    stack.clear_grads();
    for (int64_t m = 0; m < o.micro_steps; ++m) stack.step({x});
    if (adamw) adamw->step();
  };
  auto compiled_step = [&] {
    stack.clear_grads();
    for (int64_t m = 0; m < o.micro_steps; ++m) compiled({x});
    if (adamw) adamw->step();
  };
  auto report_compiled = [&] {
    if (o.describe)
      for (const compiler::Trace* t : compiled.traces()) std::cerr << compiler::print(t->graph);
    if (o.profile) std::cerr << compiled.profile();
  };
  if (!o.only.empty()) {
    // One mode alone, in a process of its own (tools/bench_vs_torch.py runs each mode so,
    // interleaved with PyTorch's), with the range of its step times.
    const bool eager_only = o.only == "eager";
    const TrainTiming t = eager_only
                              ? time_steps(eager_step, o.warmup, o.steps)
                              : time_steps(compiled_step, std::max<int64_t>(o.warmup, 2), o.steps);
    line(o.only, t,
         fmt::format(R"({},"min_step_ms":{:.2f},"max_step_ms":{:.2f})", blas_field(), t.min_ms,
                     t.max_ms));
    if (!eager_only) report_compiled();
    return 0;
  }
  // The two steps alternate, so that both see the same load on a shared machine; each peak
  // is measured over a run of its own steps.
  TrainTiming eager, timed;
  auto seconds_of = [](const std::function<void()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  eager.first_call_s = seconds_of(eager_step);
  timed.first_call_s = seconds_of(compiled_step);
  for (int64_t i = 1; i < o.warmup; ++i) {
    eager_step();
    compiled_step();
  }
  // The step's six matrix products per block alone (the shapes and operand layouts the
  // step's forward and backward give them), timed in the same rounds: both modes run them
  // through the same GEMM, so the time outside them is what fusion can change.
  const Tensor h = randn({o.batch, o.width}), a = randn({o.batch, hidden});
  const Tensor g1 = randn({o.batch, hidden}), g2 = randn({o.batch, o.width});
  auto gemms = [&] {
    NoGradGuard no_grad;
    for (int64_t m = 0; m < o.micro_steps; ++m)
      for (const MlpBlock& b : stack.blocks) {
        matmul(h, b.fc1_weight.t());
        matmul(a, b.fc2_weight.t());
        matmul(g2, b.fc2_weight);
        matmul(g2.t(), a);
        matmul(g1, b.fc1_weight);
        matmul(g1.t(), h);
      }
  };
  gemms();
  std::vector<double> eager_ms, compiled_ms, gemm_ms;
  for (int64_t i = 0; i < o.steps; ++i) {
    eager_ms.push_back(1e3 * seconds_of(eager_step));
    compiled_ms.push_back(1e3 * seconds_of(compiled_step));
    gemm_ms.push_back(1e3 * seconds_of(gemms));
  }
  eager.median_ms = median_of(eager_ms);
  timed.median_ms = median_of(compiled_ms);
  eager.peak_mib = time_steps(eager_step, 1, 1).peak_mib;
  timed.peak_mib = time_steps(compiled_step, 1, 1).peak_mib;
  line("eager", eager, blas_field());
  // The two modes' gradients of the same parameters (an optimizer would have moved them).
  std::string grad_diff;
  if (!adamw) {
    std::vector<Tensor> grads;
    for (const Tensor& p : stack.parameters()) grads.push_back(p.grad());
    eager_step();
    double max_error = 0;
    for (size_t i = 0; i < grads.size(); ++i)
      max_error =
          std::max(max_error, max(abs(grads[i] - stack.parameters()[i].grad())).item<double>());
    grad_diff = fmt::format(R"(,"max_grad_diff":{:.3g})", max_error);
  }
  const double gemm = median_of(gemm_ms);
  line("compiled", timed,
       fmt::format(R"(,"speedup_vs_eager":{:.3f},"peak_ratio_vs_eager":{:.3f}{},)"
                   R"("gemm_ms":{:.2f},"speedup_outside_gemm":{:.3f})",
                   eager.median_ms / timed.median_ms, timed.peak_mib / eager.peak_mib, grad_diff,
                   gemm, (eager.median_ms - gemm) / std::max(timed.median_ms - gemm, 1e-3)));
  report_compiled();
  return 0;
}

MlpBlockOptions parse_mlp_block_options(int argc, char** argv) {
  MlpBlockOptions o;
  for (int i = 2; i < argc; ++i) {
    const std::string option = argv[i];
    if (option == "--describe" || option == "--profile") {
      (option == "--describe" ? o.describe : o.profile) = true;
      continue;
    }
    KILN_CHECK(i + 1 < argc, "kiln-bench mlp-block: {} needs a value", option);
    const std::string value = argv[++i];
    if (option == "--optimizer") {
      KILN_CHECK(value == "none" || value == "adamw", "kiln-bench mlp-block: --optimizer {}: expected none or adamw", value);
      o.adamw = value == "adamw";
      continue;
    }
    if (option == "--only") {
      KILN_CHECK(value == "eager" || value == "compiled", "kiln-bench mlp-block: --only {}: expected eager or compiled", value);
      o.only = value;
      continue;
    }
    const int64_t v = parse_integer("kiln-bench mlp-block", option, value);
    if (option == "--batch") o.batch = v;
    else if (option == "--width") o.width = v;
    else if (option == "--hidden") o.hidden = v;
    else if (option == "--steps") o.steps = v;
    else if (option == "--warmup") o.warmup = v;
    else if (option == "--micro-steps") o.micro_steps = v;
    else if (option == "--blocks") o.blocks = v;
    else fail("kiln-bench mlp-block: unknown option {}", option);
  }
  check_range("kiln-bench mlp-block: --batch", o.batch, 1, 1 << 20);
  check_range("kiln-bench mlp-block: --width", o.width, 1, 1 << 16);
  check_range("kiln-bench mlp-block: --hidden", o.hidden, 0, 1 << 18);
  check_range("kiln-bench mlp-block: --steps", o.steps, 1, 1'000'000);
  check_range("kiln-bench mlp-block: --warmup", o.warmup, 1, 1'000'000);
  check_range("kiln-bench mlp-block: --micro-steps", o.micro_steps, 1, 1'000'000);
  check_range("kiln-bench mlp-block: --blocks", o.blocks, 1, 1024);
  return o;
}

TrainBenchOptions parse_train_options(int argc, char** argv) {
  TrainBenchOptions o;
  for (int i = 2; i < argc; ++i) {
    const std::string option = argv[i];
    if (option == "--compile" || option == "--profile" || option == "--channels-last") {
      (option == "--compile" ? o.compile : option == "--profile" ? o.profile : o.channels_last) = true;
      continue;
    }
    KILN_CHECK(i + 1 < argc, "kiln-bench train: {} needs a value", option);
    const std::string value = argv[++i];
    auto number = [&] { return parse_integer("kiln-bench train", option, value); };
    if (option == "--arch") o.arch = value;
    else if (option == "--device") o.device = value;
    else if (option == "--only") o.only = value;
    else if (option == "--batch") o.batch = number();
    else if (option == "--micro-batch") o.micro_batch = number();
    else if (option == "--image-size") o.image_size = number();
    else if (option == "--classes") o.classes = number();
    else if (option == "--steps") o.steps = number();
    else if (option == "--warmup") o.warmup = number();
    else if (option == "--amp") {
      if (value == "bf16") o.amp = DType::bf16;
      else if (value == "f16" || value == "fp16") o.amp = DType::f16;
      else fail("kiln-bench train: --amp {}: expected bf16 or fp16", value);
    }
    else if (option == "--layout") {
      if (value == "auto") o.layout = compiler::LayoutPolicy::automatic;
      else if (value == "keep") o.layout = compiler::LayoutPolicy::keep;
      else if (value == "channels_last") o.layout = compiler::LayoutPolicy::channels_last;
      else fail("kiln-bench train: --layout {}: expected auto, keep or channels_last", value);
    }
    else fail("kiln-bench train: unknown option {}", option);
  }
  check_range("kiln-bench train: --batch", o.batch, 1, 1 << 16);
  check_range("kiln-bench train: --micro-batch", o.micro_batch, 0, o.batch);
  check_range("kiln-bench train: --image-size", o.image_size, 1, train::kMaxImageSize);
  check_range("kiln-bench train: --classes", o.classes, 1, 1 << 20);
  check_range("kiln-bench train: --steps", o.steps, 1, 1'000'000);
  check_range("kiln-bench train: --warmup", o.warmup, 1, 1'000'000);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  return tools::report_errors("kiln-bench", 1, [&] {
    if (argc == 2 && std::strcmp(argv[1], "ops") == 0) return bench_ops();
    if (argc == 4 && std::strcmp(argv[1], "ops") == 0 && std::strcmp(argv[2], "--device") == 0) {
      if (std::strcmp(argv[3], "cuda") == 0) return bench_ops_cuda();
      if (std::strcmp(argv[3], "cpu") == 0) return bench_ops();
      fail("kiln-bench ops: --device {}: expected cpu or cuda", argv[3]);
    }
    if (argc >= 2 && std::strcmp(argv[1], "train") == 0 && is_text_arch(argc, argv)) return bench_text_train(argc, argv);
    if (argc >= 2 && std::strcmp(argv[1], "train") == 0) return bench_train(parse_train_options(argc, argv));
    if (argc >= 2 && std::strcmp(argv[1], "mlp-block") == 0) return bench_mlp_block(parse_mlp_block_options(argc, argv));
    if (argc >= 2 && std::strcmp(argv[1], "convs") == 0) return bench_convs(argc, argv);
    if (argc >= 2 && std::strcmp(argv[1], "plan") == 0) return bench_plan(argc, argv);
    if (argc >= 2 && std::strcmp(argv[1], "ddp") == 0) return bench_ddp(argc, argv);
    if (argc >= 2 && std::strcmp(argv[1], "attention") == 0) return bench_attention(argc, argv);
    std::cerr << "usage: kiln-bench ops | train [options] | mlp-block [options] | convs [options] | plan [options]\n"
                 "                  | ddp [options] | attention [options]\n"
                 "  ops    GFLOP/s of a 1024^3 f32 matmul, GB/s of a 64M-element add against\n"
                 "         memcpy, ms of ResNet-50-sized conv2d ops; bf16 products and convolutions\n"
                 "         with their speedup over f32; one JSON line each. --device cuda:\n"
                 "         GB/s of the generated elementwise kernels and a sum, TFLOP/s of cuBLAS products\n"
                 "  train  median step time, img/s and peak memory of training a zoo model on a\n"
                 "         synthetic batch: --arch resnet50 --batch 8 --micro-batch N --image-size 64\n"
                 "         --classes 1000 --steps 10 --warmup 2 --device cpu [--compile: compiled too, with\n"
                 "         the speedup and peak-memory ratios against eager measured in the same run]\n"
                 "         [--channels-last: the batch NHWC, so eager runs NHWC too] [--layout auto|keep|\n"
                 "         channels_last: where the compiled modes' layout pass runs convolutions NHWC]\n"
                 "         [--amp bf16|fp16: kiln-train's --amp step too (fp16 with dynamic loss scaling),\n"
                 "         eager and, with --compile, compiled, with speedups against the f32 steps]\n"
                 "         [--only MODE: time that mode alone (eager, compiled, compiled-whole-step, ...), with\n"
                 "         the fastest and slowest step]\n"
                 "         --arch bert-tiny|bert-mini|bert-base|bert-large|gpt2-tiny|gpt2-mini|gpt2-small: the\n"
                 "         text models' masked-LM or causal-LM step with AdamW: --batch 32 --seq 128 --vocab N\n"
                 "         --steps 10 --warmup 2 --device cpu|cuda [--compile] [--no-dropout] [--profile]\n"
                 "         [--only MODE[,MODE...]: those modes alone, in one run] [--amp bf16|fp16: the\n"
                 "         forward under autocast too, eager and (with --compile) compiled; fp16 with a GradScaler]\n"
                 "  mlp-block  eager against compiled training step (forward, loss mean(y^2), backward) of\n"
                 "         y = x + fc2(gelu(fc1(layer_norm(x)))): --batch 256 --width 1024 --hidden 4*width\n"
                 "         --steps 10 --warmup 2 --micro-steps 1 (backward passes accumulated per step)\n"
                 "         [--describe: the traced graph on stderr; --profile: where the\n"
                 "         compiled step's time goes, on stderr; KILN_DUMP=DIR: every stage]; the compiled\n"
                 "         line adds the time of the step's six matmuls alone and the speedup outside them\n"
                 "         [--blocks N: N blocks in a row] [--optimizer none|adamw: an AdamW update ends\n"
                 "         each step] [--only eager|compiled: that mode alone, with its fastest and slowest step]\n"
                 "  convs  every distinct conv2d of a model's forward (traced), with its uses per forward:\n"
                 "         median ms and GFLOP/s of forward, backward-input and backward-weight, one JSON line\n"
                 "         each: --model ARCH:BATCH:IMAGE_SIZE (repeatable; default resnet18:64:32,\n"
                 "         resnet50:8:64, resnet50:32:32) --reps 5 [--channels-last] [--list: shapes only]\n"
                 "         [--dtype f32|bf16|f16: the tensors' dtype, as under autocast]\n"
                 "  plan   the GPU cost model's prediction for a compiled training step (compiler/cost.h),\n"
                 "         traced on this machine: planned and minimum traffic, launches, roofline ms and\n"
                 "         img/s, one JSON line per layout (keep = NCHW, channels_last): --arch resnet50\n"
                 "         --batch 128 --image-size 224 --classes 1000 --gpu h200|h100|a100 [--amp bf16|fp16]\n"
                 "         [--no-tf32] [--layout keep|channels_last] [--gemm-activations always|never];\n"
                 "         --arch bert-*|gpt2-* --batch N --seq 128: a transformer's step, in tokens/s\n"
                 "  ddp    one process with N threads against N ranks with one thread each (Gloo, loopback),\n"
                 "         training on the same synthetic global batch: median step, img/s and, for the ranks,\n"
                 "         the all-reduce ms per step and the share of it that overlapped backward; one JSON\n"
                 "         line each: --ranks 2 --arch resnet18 --batch 64 --image-size 32 --classes 10\n"
                 "         --steps 5 --warmup 2 [--compile: forward and backward compiled] [--views]\n"
                 "  attention  scaled_dot_product_attention's forward and backward against the math path\n"
                 "         (causal, f32, one batch of --heads 2 heads of --dim 64) for N = L = S doubling from\n"
                 "         --min-n 512 to --max-n 4096: ms and the extra peak memory of each, one JSON line\n"
                 "         each, then the growth of the peak from the shortest N to the longest (the op's is\n"
                 "         linear in N, the math path's quadratic) [--math-max-n N: the math path only up to N]\n";
    return 2;
  });
}
