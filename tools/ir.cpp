// kiln-ir: dumps of kiln's compiler stages for a zoo model's step, and the op registry.
//
//   kiln-ir resnet18 --train --batch 2 --image-size 32 --stage simplified
//   kiln-ir mlp --train --diff trace simplified
//   kiln-ir resnet50 --train --stage cuda
//   kiln-ir resnet50 --train --amp bf16 --stage fused
//   kiln-ir --ops
#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <kiln.h>

#include "compiler/codegen/cpp.h"
#include "compiler/codegen/cuda.h"
#include "compiler/cost.h"
#include "compiler/fusion.h"
#include "compiler/passes/passes.h"
#include "kernels/cuda/nvrtc.h"
#include "tools/report_errors.h"
#include "tools/step_graph.h"
#include "tools/trainer.h"

using namespace kiln;

namespace {

int list_ops() {
  const auto ops = all_ops();
  fmt::print("{:<28} {:<8} {:<10} {:<9} {}\n", "op", "kind", "devices", "backward", "notes");
  for (const OpDef* op : ops) {
    std::string devices;
    if (op->kind == OpKind::view) devices = "any";
    for (int d = 0; d < kNumDeviceTypes; ++d) {
      if (!op->kernels[d]) continue;
      if (!devices.empty()) devices += ",";
      devices += d == static_cast<int>(DeviceType::cpu) ? "cpu" : "cuda";
    }
    std::string notes;
    if (op->random) notes += "random ";
    if (op->mutated_inputs_of) {
      notes += "writes inputs (per call)";
    } else if (!op->mutated_inputs.empty()) {
      notes += "writes input";
      for (int i : op->mutated_inputs) notes += fmt::format(" {}", i);
    }
    fmt::print("{:<28} {:<8} {:<10} {:<9} {}\n", op->name,
               op->kind == OpKind::view ? "view" : "compute", devices.empty() ? "-" : devices,
               op->backward ? "yes" : "no", notes);
  }
  fmt::print("{} ops\n", ops.size());
  return 0;
}

struct ModelOptions {
  std::string arch;
  bool train = false;
  int64_t batch = 2, image_size = 32, classes = 10, channels = 3;
  int64_t seq = 128;  // --seq: the transformers' sequence length
  std::string stage = "simplified";
  std::string dot_file;
  std::string diff_a, diff_b;
  std::string gpu_arch = "sm_90";
  std::optional<DType> amp;  // --amp: the forward (and loss) traced under autocast to this dtype
  std::optional<compiler::LayoutPolicy> layout;  // --layout; else the target's automatic choice
  compiler::BatchNormSplit batch_norm_split = compiler::BatchNormSplit::always;  // --batch-norm-split
  compiler::GemmActivations gemm_activations = compiler::GemmActivations::always;  // --gemm-activations
  bool cost = false;         // --cost: the GPU cost model's table instead of a stage
  std::string gpu = "h200";  // --gpu: the GPU it models
  bool tf32 = true;          // --no-tf32: f32 products on CUDA cores
  bool wants(const std::string& s) const { return stage == s || diff_a == s || diff_b == s; }
};

// The stages kiln-ir can print, in pipeline order.
const std::vector<std::string> kStages = {"trace", "simplified", "fused", "kernels", "source",
                                         "cuda-source", "cuda"};

struct Stages {
  std::vector<std::pair<std::string, std::string>> texts;  // (stage, text)
  compiler::Graph simplified;
  std::vector<compiler::PassRecord> passes;
  std::vector<compiler::ScheduleStep> groups;
  std::string cast_summary;  // the stand-alone cast count line (fused and cuda stages)

  const std::string& text(const std::string& stage) const {
    for (const auto& [name, text] : texts)
      if (name == stage) return text;
    fail("kiln-ir: no stage '{}' (stages: {})", stage, fmt::join(kStages, ", "));
  }
};

// Per kernel: what ptxas reports for its CUDA version (registers, spills, static shared
// memory, stack), compiled with NVRTC for `arch`.
std::string cuda_table(const std::vector<compiler::codegen::Kernel>& kernels, const std::string& arch) {
  std::vector<std::pair<std::string, std::string>> sources;
  size_t width = 6;
  for (const compiler::codegen::Kernel& k : kernels) {
    sources.push_back({compiler::codegen::render_cuda(k), compiler::codegen::cuda_symbol(k)});
    width = std::max(width, sources.back().second.size());
  }
  const int64_t before = cuda::nvrtc_invocations();
  const std::vector<cuda::CudaBinary> binaries = cuda::compile_cuda_batch(sources, {.arch = arch}, 2);
  std::string out = fmt::format("{:<{}}  {:>9}  {:>5}  {:>6}  {:>6}  {:>8}  {}\n", "kernel", width, "registers",
                                "spill", "smem", "stack", "cubin", "kind");
  int max_registers = 0, spill = 0;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const cuda::CudaBinary& b = binaries[i];
    const int spilled = b.spill_store_bytes + b.spill_load_bytes;
    out += fmt::format("{:<{}}  {:>9}  {:>5}  {:>6}  {:>6}  {:>8}  {}\n", b.name, width, b.registers, spilled,
                       b.shared_bytes, b.stack_bytes, b.cubin.size(),
                       kernels[i].num_reduced > 0 ? "reduction" : "pointwise");
    max_registers = std::max(max_registers, b.registers);
    spill += spilled;
  }
  out += fmt::format("{} kernels for {}: at most {} registers, {} spill bytes; {} NVRTC compiles (the rest cached)\n",
                     kernels.size(), arch, max_registers, spill, cuda::nvrtc_invocations() - before);
  return out;
}

// Traces one step of the model (tools/step_graph.h) and keeps each stage's text.
Stages build_stages(const ModelOptions& o) {
  const compiler::LayoutPolicy layout = o.layout ? *o.layout : compiler::LayoutPolicy::automatic;
  train::StepGraph step = train::trace_step_graph({.arch = o.arch,
                                                   .train = o.train,
                                                   .batch = o.batch,
                                                   .image_size = o.image_size,
                                                   .classes = o.classes,
                                                   .channels = o.channels,
                                                   .seq = o.seq,
                                                   .amp = o.amp,
                                                   .layout = layout,
                                                   .batch_norm_split = o.batch_norm_split,
                                                   .gemm_activations = o.gemm_activations});
  Stages s;
  s.texts.emplace_back("trace", compiler::print(step.traced));
  s.simplified = std::move(step.simplified);
  s.passes = std::move(step.passes);
  s.texts.emplace_back("simplified", compiler::print(s.simplified));
  s.groups = std::move(step.schedule);
  std::string fused, kernels, source, cuda_source;
  std::vector<compiler::codegen::Kernel> generated;
  int64_t num_kernels = 0, num_eager = 0;
  const compiler::CastSteps casts = compiler::stand_alone_casts(s.simplified, s.groups);
  auto is_cast = [&](const std::vector<size_t>& steps, size_t i) {
    return std::find(steps.begin(), steps.end(), i) != steps.end();
  };
  for (size_t i = 0; i < s.groups.size(); ++i) {
    const compiler::ScheduleStep& group = s.groups[i];
    std::string members;
    for (int32_t n : group.nodes)
      members += fmt::format(" %{}={}", s.simplified.value_number({n, 0}), s.simplified.nodes()[static_cast<size_t>(n)].op);
    if (is_cast(casts.of_computed, i)) members += "  (stand-alone cast)";
    if (is_cast(casts.of_inputs, i)) members += "  (stand-alone cast of an input)";
    if (group.is_kernel()) {
      ++num_kernels;
      fused += fmt::format("{:<10} {}:{}\n", compiler::kind_name(group.kind), group.kernel.name, members);
      kernels += compiler::codegen::print(group.kernel) + "\n";
      source += compiler::codegen::render_cpp(group.kernel) + "\n";
      cuda_source += compiler::codegen::render_cuda(group.kernel) + "\n";
      generated.push_back(group.kernel);
    } else {
      num_eager += group.kind == compiler::ScheduleStep::eager;
      fused += fmt::format("{:<10}{}\n", compiler::kind_name(group.kind), members);
    }
  }
  fused += fmt::format("{} steps: {} generated kernels, {} library/eager ops\n", s.groups.size(), num_kernels,
                       num_eager);
  s.cast_summary = fmt::format("{} stand-alone cast steps: {} of computed values, {} of graph inputs\n",
                               casts.total(), casts.of_computed.size(), casts.of_inputs.size());
  fused += s.cast_summary;
  s.texts.emplace_back("fused", fused);
  s.texts.emplace_back("kernels", kernels);
  s.texts.emplace_back("source", source);
  s.texts.emplace_back("cuda-source", cuda_source);
  // NVRTC takes a second or so for a ResNet: only when asked for.
  // The CUDA kernels are the same schedule's: the same casts stand alone there.
  if (o.wants("cuda")) s.texts.emplace_back("cuda", cuda_table(generated, o.gpu_arch) + s.cast_summary);
  return s;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A line diff ("-" only in a, "+" only in b, " " both) by longest common subsequence.
std::string diff(const std::string& a_text, const std::string& b_text) {
  const std::vector<std::string> a = lines_of(a_text), b = lines_of(b_text);
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int32_t>> lcs(n + 1, std::vector<int32_t>(m + 1, 0));
  for (size_t i = n; i-- > 0;)
    for (size_t j = m; j-- > 0;)
      lcs[i][j] = a[i] == b[j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
  std::string out;
  size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] == b[j]) {
      out += "  " + a[i++] + "\n";
      ++j;
    } else if (j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j])) {
      out += "+ " + b[j++] + "\n";
    } else {
      out += "- " + a[i++] + "\n";
    }
  }
  return out;
}

// Graphviz: one box per op node, inputs as ellipses, edges along data flow; the nodes of
// each generated kernel drawn inside a cluster named after it.
std::string dot_of(const compiler::Graph& g, const std::vector<compiler::ScheduleStep>& groups) {
  std::string out = "digraph kiln {\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n";
  int64_t cluster = 0;
  for (const compiler::ScheduleStep& group : groups) {
    if (!group.is_kernel()) continue;
    out += fmt::format("  subgraph cluster_{} {{\n    label=\"{}\"; style=filled; color=\"#dbe9f6\";\n", cluster++,
                       group.kernel.name);
    for (int32_t n : group.nodes) out += fmt::format("    n{};\n", n);
    out += "  }\n";
  }
  for (size_t n = 0; n < g.nodes().size(); ++n) {
    const compiler::Node& node = g.nodes()[n];
    const compiler::Value v{static_cast<int32_t>(n), 0};
    const std::string label = node.kind == compiler::NodeKind::input
                                  ? fmt::format("%{} {}\\n{}", g.value_number(v), node.name, node.outputs[0].str())
                                  : fmt::format("%{} {}\\n{}", g.value_number(v), node.op, node.outputs[0].str());
    out += fmt::format("  n{} [label=\"{}\", shape={}];\n", n, label,
                       node.kind == compiler::NodeKind::op ? "box" : "ellipse");
    for (const compiler::Value in : node.inputs)
      if (in.defined()) out += fmt::format("  n{} -> n{};\n", in.node, n);
  }
  return out + "}\n";
}

int model_stages(const ModelOptions& o) {
  const Stages s = build_stages(o);
  if (o.cost) {
    const compiler::GpuSpec& gpu = compiler::gpu_spec(o.gpu);
    const compiler::CostReport r = compiler::estimate_cost(s.simplified, s.groups, gpu, {.tf32 = o.tf32});
    const std::string shape = train::is_text_arch(o.arch) ? fmt::format("{} tokens", o.seq)
                                                           : fmt::format("{}x{}", o.image_size, o.image_size);
    std::cout << fmt::format("cost model: {} {} step, batch {}, {}, on {} ({}), {}, layout {}, batch norm split {}, "
                             "gemm activations {}\n",
                             o.arch, o.train ? "training" : "inference", o.batch, shape, gpu.name,
                             gpu.description, o.amp ? fmt::format("autocast {}", *o.amp) : o.tf32 ? "tf32" : "f32",
                             compiler::layout_policy_name(o.layout ? *o.layout : compiler::LayoutPolicy::automatic),
                             compiler::batch_norm_split_name(o.batch_norm_split),
                             compiler::gemm_activations_name(o.gemm_activations))
              << compiler::cost_table(r);
    return 0;
  }
  if (!o.diff_a.empty()) {
    std::cout << diff(s.text(o.diff_a), s.text(o.diff_b));
    return 0;
  }
  std::cout << s.text(o.stage);
  if (o.stage == "simplified") std::cout << "\n" << compiler::timing_table(s.passes);
  if (!o.dot_file.empty()) {
    std::ofstream f(o.dot_file);
    f << dot_of(s.simplified, s.groups);
    KILN_CHECK(f.good(), "kiln-ir: cannot write {}", o.dot_file);
  }
  return 0;
}

// Where a CUDA-target rewrite applies, from an option's value: cuda, always or never.
template <class Where>
Where where(const std::string& option, const std::string& v) {
  if (v == "cuda") return Where::cuda;
  if (v == "always") return Where::always;
  if (v == "never") return Where::never;
  fail("kiln-ir: {} {}: expected cuda, always or never", option, v);
}

ModelOptions parse_model_options(int argc, char** argv) {
  ModelOptions o;
  o.arch = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string option = argv[i];
    auto value = [&]() -> std::string {
      KILN_CHECK(i + 1 < argc, "kiln-ir: {} needs a value", option);
      return argv[++i];
    };
    auto number = [&] {
      const std::string v = value();
      try {
        return static_cast<int64_t>(std::stoll(v));
      } catch (const std::exception&) {
        fail("kiln-ir: {} {}: expected an integer", option, v);
      }
    };
    if (option == "--train") o.train = true;
    else if (option == "--batch") o.batch = number();
    else if (option == "--image-size") o.image_size = number();
    else if (option == "--classes") o.classes = number();
    else if (option == "--channels") o.channels = number();
    else if (option == "--seq") o.seq = number();
    else if (option == "--stage") o.stage = value();
    else if (option == "--dot") o.dot_file = value();
    else if (option == "--gpu-arch") o.gpu_arch = value();
    else if (option == "--cost") o.cost = true;
    else if (option == "--gpu") o.gpu = value();
    else if (option == "--no-tf32") o.tf32 = false;
    else if (option == "--layout") {
      const std::string v = value();
      if (v == "auto") o.layout = compiler::LayoutPolicy::automatic;
      else if (v == "keep") o.layout = compiler::LayoutPolicy::keep;
      else if (v == "channels_last" || v == "channels-last") o.layout = compiler::LayoutPolicy::channels_last;
      else fail("kiln-ir: --layout {}: expected auto, keep or channels_last", v);
    }
    else if (option == "--batch-norm-split") o.batch_norm_split = where<compiler::BatchNormSplit>(option, value());
    else if (option == "--gemm-activations") o.gemm_activations = where<compiler::GemmActivations>(option, value());
    else if (option == "--amp") {
      const std::string v = value();
      if (v == "bf16") o.amp = DType::bf16;
      else if (v == "fp16" || v == "f16") o.amp = DType::f16;
      else fail("kiln-ir: --amp {}: expected bf16 or fp16", v);
    }
    else if (option == "--diff") {
      o.diff_a = value();
      o.diff_b = value();
    } else fail("kiln-ir: unknown option {}", option);
  }
  // One traced step: bounds that keep its tensors (batch x channels x size^2) allocatable.
  auto check_range = [](const char* option, int64_t v, int64_t most) {
    KILN_CHECK(v >= 1 && v <= most, "kiln-ir: {} {} must be between 1 and {}", option, v, most);
  };
  check_range("--batch", o.batch, 4096);
  check_range("--image-size", o.image_size, 4096);
  check_range("--classes", o.classes, 1 << 20);
  check_range("--channels", o.channels, 4096);
  if (o.cost) compiler::gpu_spec(o.gpu);  // an unknown GPU fails before the trace
  return o;
}

void usage(std::ostream& os) {
  os << "usage: kiln-ir MODEL [--train] [--batch N] [--image-size N] [--classes N] [--channels N] [--seq N]\n"
        "               [--stage STAGE] [--dot FILE] [--diff STAGE_A STAGE_B] [--gpu-arch sm_XX]\n"
        "               [--amp bf16|fp16] [--layout auto|keep|channels_last]\n"
        "               [--batch-norm-split always|cuda|never] [--gemm-activations always|cuda|never]\n"
        "               [--cost [--gpu h200|h100|a100] [--no-tf32]]\n"
        "       kiln-ir --ops\n"
        "  MODEL   resnet18|resnet34|resnet50|resnet101|resnet152|mlp|cnn, or bert-tiny|bert-mini|\n"
        "          bert-base|bert-large|gpt2-tiny|gpt2-mini|gpt2-small (--batch sequences of --seq\n"
        "          random tokens, 128 by default; masked-LM or causal-LM loss): traces one step\n"
        "          (--train: forward, cross entropy and backward; else an inference forward)\n"
        "  STAGE   trace (as recorded) | simplified (after folding, algebra, dead code; with\n"
        "          the pass timing table) | fused (the schedule: kernels and library ops) |\n"
        "          kernels (kernel IR) | source (generated C++) | cuda-source (generated CUDA) |\n"
        "          cuda (per kernel: registers, spill, shared and stack bytes from NVRTC for the\n"
        "          --gpu-arch, sm_90 by default)\n"
        "  --amp   traces the forward and the loss under kiln::autocast to bf16 or fp16 (backward\n"
        "          outside it, as in PyTorch); the fused and cuda stages count the stand-alone\n"
        "          cast steps (kernels that only convert a dtype)\n"
        "  --layout  where the layout pass runs convolutions NHWC: auto (NHWC on every device,\n"
        "          as kiln::compile), keep (NCHW), channels_last\n"
        "  --batch-norm-split  where training batch norms become statistics ops and fused\n"
        "          pointwise work: always (the default: the CUDA target's schedule, which the\n"
        "          step traced on the CPU stands for), cuda (the CPU's schedule), never\n"
        "  --gemm-activations  where a Linear's tanh GELU or ReLU (and the GELU's backward)\n"
        "          become cuBLASLt epilogues (addmm_activation, mm_gelu_backward): always (the\n"
        "          default, the CUDA target's schedule), cuda (the CPU's), never\n"
        "  --cost  the GPU cost model of the fused step on CUDA (compiler/cost.h): per step the\n"
        "          bytes read and written, GFLOP, launches and roofline time on --gpu (h200 by\n"
        "          default), totals per kind, and the planned traffic against the minimum\n"
        "  --dot   writes the simplified graph for Graphviz, kernels as clusters\n"
        "  --diff  a line diff of two stages\n"
        "  --ops   list every registered op: kind, devices with a kernel, backward formula\n"
        "(the IR stages of a compiled model arrive with the compiler)\n";
}

}  // namespace

int main(int argc, char** argv) {
  return tools::report_errors("kiln-ir", 1, [&] {
    if (argc == 2 && std::strcmp(argv[1], "--ops") == 0) return list_ops();
    if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
      usage(std::cout);
      return 0;
    }
    if (argc >= 2 && argv[1][0] != '-') return model_stages(parse_model_options(argc, argv));
    usage(std::cerr);
    return 2;
  });
}
