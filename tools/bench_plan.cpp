// kiln-bench plan: the GPU cost model's prediction (compiler/cost.h) for a zoo model's
// compiled training step (a CNN's, one JSON line per layout, or a transformer's), computed
// on any machine. make
// gpu-check prints it beside the measured kiln lines.
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <kiln.h>

#include "compiler/cost.h"
#include "tools/bench_common.h"
#include "tools/step_graph.h"
#include "tools/trainer.h"

namespace kiln::bench {
namespace {

struct PlanOptions {
  train::StepGraphOptions step{.arch = "resnet50", .train = true, .batch = 128, .image_size = 224, .classes = 1000};
  std::vector<compiler::LayoutPolicy> layouts = {compiler::LayoutPolicy::keep, compiler::LayoutPolicy::channels_last};
  std::string gpu = "h200";
  bool tf32 = true;
};

PlanOptions parse_options(int argc, char** argv) {
  PlanOptions o;
  auto integer = [](const std::string& option, const std::string& value) {
    return parse_integer("kiln-bench plan", option, value);
  };
  for (int i = 2; i < argc; ++i) {
    const std::string option = argv[i];
    if (option == "--no-tf32") {
      o.tf32 = false;
      continue;
    }
    KILN_CHECK(i + 1 < argc, "kiln-bench plan: {} needs a value", option);
    const std::string value = argv[++i];
    if (option == "--arch") o.step.arch = value;
    else if (option == "--batch") o.step.batch = integer(option, value);
    else if (option == "--image-size") o.step.image_size = integer(option, value);
    else if (option == "--seq") o.step.seq = integer(option, value);
    else if (option == "--gemm-activations") {
      if (value == "always") o.step.gemm_activations = compiler::GemmActivations::always;
      else if (value == "never") o.step.gemm_activations = compiler::GemmActivations::never;
      else fail("kiln-bench plan: --gemm-activations {}: expected always or never", value);
    }
    else if (option == "--classes") o.step.classes = integer(option, value);
    else if (option == "--gpu") o.gpu = value;
    else if (option == "--amp") {
      KILN_CHECK(value == "bf16" || value == "fp16", "kiln-bench plan: --amp {}: expected bf16 or fp16", value);
      o.step.amp = value == "bf16" ? DType::bf16 : DType::f16;
    } else if (option == "--layout") {
      if (value == "keep") o.layouts = {compiler::LayoutPolicy::keep};
      else if (value == "channels_last") o.layouts = {compiler::LayoutPolicy::channels_last};
      else fail("kiln-bench plan: --layout {}: expected keep or channels_last", value);
    } else {
      fail("kiln-bench plan: unknown option {}", option);
    }
  }
  check_range("kiln-bench plan: --batch", o.step.batch, 1, 4096);
  check_range("kiln-bench plan: --image-size", o.step.image_size, 1, train::kMaxImageSize);
  check_range("kiln-bench plan: --classes", o.step.classes, 1, 1 << 20);
  check_range("kiln-bench plan: --seq", o.step.seq, 1, 1 << 16);
  if (train::is_text_arch(o.step.arch)) o.layouts = {compiler::LayoutPolicy::keep};  // no convolutions
  compiler::gpu_spec(o.gpu);  // an unknown GPU fails before the trace
  return o;
}

}  // namespace

int bench_plan(int argc, char** argv) {
  const PlanOptions o = parse_options(argc, argv);
  const compiler::GpuSpec& gpu = compiler::gpu_spec(o.gpu);
  for (const compiler::LayoutPolicy layout : o.layouts) {
    train::StepGraphOptions step = o.step;
    step.layout = layout;
    const train::StepGraph s = train::trace_step_graph(step);
    const compiler::CostReport r = compiler::estimate_cost(s.simplified, s.schedule, gpu, {.tf32 = o.tf32});
    const bool text = train::is_text_arch(step.arch);
    // A transformer's batch is sequences: its rate is tokens, a CNN's images.
    std::cout << fmt::format(
                     R"({{"bench":"plan","arch":"{}","batch":{},"{}":{},"precision":"{}","layout":"{}",)"
                     R"("gemm_activations":"{}",{},"predicted_{}_per_s":{:.0f}}})",
                     step.arch, step.batch, text ? "seq" : "image_size", text ? step.seq : step.image_size,
                     step.amp ? fmt::format("{}", *step.amp) : o.tf32 ? "tf32" : "f32",
                     compiler::layout_policy_name(layout), compiler::gemm_activations_name(step.gemm_activations),
                     compiler::cost_json_fields(r), text ? "tokens" : "img",
                     static_cast<double>(step.batch * (text ? step.seq : 1)) / (r.seconds + r.launch_s))
              << std::endl;
  }
  return 0;
}

}  // namespace kiln::bench
