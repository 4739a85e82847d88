#pragma once
// One traced step of a zoo model, run through kiln::compile's passes and fused: what
// kiln-ir prints stage by stage and what kiln-bench plan costs on a GPU
// (compiler/cost.h). The step is traced on the CPU with a random batch: a training step
// is forward, cross entropy and backward (the forward and loss under autocast with amp),
// an inference step is a forward without gradients. The transformers (bert-*, gpt2-*)
// take a batch of `batch` sequences of `seq` random tokens, with BERT's masked-LM loss over
// 15% of them (the rest ignore_index) or GPT-2's causal-LM loss, as kiln-train's.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <kiln.h>

#include "compiler/fusion.h"
#include "compiler/passes/passes.h"

namespace kiln::train {

struct StepGraphOptions {
  std::string arch;  // a zoo model (make_model's names)
  bool train = false;
  int64_t batch = 2, image_size = 32, classes = 10, channels = 3;
  int64_t seq = 128;  // the transformers' sequence length (their vocabularies are the models' own)
  std::optional<DType> amp;
  compiler::LayoutPolicy layout = compiler::LayoutPolicy::automatic;
  // The graph is traced on the CPU, but what kiln-ir's stages and the cost model show is the
  // CUDA target's schedule, in which batch norm is split (split_batch_norm): `always` by
  // default; `cuda` gives the CPU's schedule (kiln-ir --batch-norm-split cuda).
  compiler::BatchNormSplit batch_norm_split = compiler::BatchNormSplit::always;
  // Likewise a Linear's activation in cuBLASLt's epilogue (gemm_activations): `always` by
  // default, `cuda` for the CPU's schedule (kiln-ir --gemm-activations cuda).
  compiler::GemmActivations gemm_activations = compiler::GemmActivations::always;
  // (A language model's head and loss stay the chain of ops, as kiln::compile leaves them
  // in a step captured as a CUDA graph: the fused op's work depends on how many targets
  // count, which a plan cannot know.)
};

struct StepGraph {
  compiler::Graph traced;      // as recorded
  compiler::Graph simplified;  // after kiln::compile's passes
  std::vector<compiler::PassRecord> passes;
  std::vector<compiler::ScheduleStep> schedule;  // fuse(simplified)
};

StepGraph trace_step_graph(const StepGraphOptions& o);

}  // namespace kiln::train
