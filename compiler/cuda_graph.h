#pragma once
// compile's reduce-overhead mode: a Program replayed as one CUDA graph per cached entry
// (../shared/COMPILER.md, "Targets"), as torch.compile's mode of that name does.
//
//   GraphReplay r(program, staged, pool);
//   r.run(inputs);  // 1st: runs the program (a warm-up: lazy kernels, cuDNN's algorithms)
//   r.run(inputs);  // 2nd: captures the program's run into a graph, then replays it
//   r.run(inputs);  // later: copies the staged inputs in, replays, copies results out
//
// A captured graph holds the addresses of everything it read and wrote, so:
// - inputs marked `staged` (the arguments, whose tensors change every call, and gradients
//   accumulated in place, which the optimizer's zero_grad frees) are copied into tensors
//   of the replay's own before each replay, and back out after it where the graph writes
//   them; the other inputs (parameters, optimizer and batch-norm state) are used where they
//   are, and a replay whose unstaged input lives elsewhere than at capture captures again
//   (after kMaxCaptures captures the program runs uncaptured from then on);
// - the program's values live in `pool` (cuda::MemPool): the blocks a capture used stay
//   with the graph; entries of one compiled function share a pool, as their replays never
//   overlap and no value survives a replay in the pool;
// - results are copied out of the pool after each replay, so a result the caller keeps is
//   not overwritten by the next replay (a result that is an input is that input).
// A program that cannot be captured (Program::cuda_graph_blocker; a CPU program; a capture
// CUDA refused; profiling) runs uncaptured, as in the default mode, and says why in
// skip_reason().
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "compiler/program.h"
#include "compiler/trace.h"
#include "core/cuda.h"

namespace kiln::compiler {

// What captures a run and replays it: a CUDA graph (cuda_graph_recorder), or in tests a
// stand-in that runs on the CPU. capture() returns what `run` returned (their memory is what
// replays write: run may not have run yet); replay() does the work of one run again.
class GraphRecorder {
 public:
  virtual ~GraphRecorder() = default;
  virtual std::vector<Tensor> capture(const std::function<std::vector<Tensor>()>& run) = 0;
  virtual void replay() = 0;
};
using RecorderFactory = std::function<std::unique_ptr<GraphRecorder>()>;

// CUDA graphs whose allocations come from `pool`.
RecorderFactory cuda_graph_recorder(std::shared_ptr<cuda::MemPool> pool);

// Per input of t's graph, whether reduce-overhead copies it in at each replay: the
// arguments (a new batch every call) and the gradients accumulated in place (zero_grad
// frees them); parameters and state stay where they are.
std::vector<bool> staged_inputs(const Trace& t);

class GraphReplay {
 public:
  static constexpr int64_t kMaxCaptures = 4;

  // `staged`: per graph input, whether it is copied in (see above). `pool` may be null
  // when the program cannot be captured (Program::cuda_graph_blocker says why).
  GraphReplay(std::shared_ptr<Program> program, std::vector<bool> staged, std::shared_ptr<cuda::MemPool> pool);
  // With another recorder (tests): captures whatever device the program runs on.
  GraphReplay(std::shared_ptr<Program> program, std::vector<bool> staged, RecorderFactory recorder);

  // What Program::run returns for `inputs`.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs);

  // max-autotune: cuDNN chooses convolution algorithms by timing during every run of the
  // program (cuda::ThreadCudnnBenchmark: this thread only).
  void set_time_library_algorithms(bool on) { time_library_algorithms_ = on; }

  const std::string& skip_reason() const { return skip_reason_; }  // "" while it captures
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  int64_t uncaptured_runs() const { return uncaptured_runs_; }

 private:
  std::vector<Tensor> uncaptured(const std::vector<Tensor>& inputs);
  void capture(const std::vector<Tensor>& inputs);
  bool same_memory(const std::vector<Tensor>& inputs) const;
  std::vector<Tensor> results(const std::vector<Tensor>& inputs) const;
  void drop_graph();

  std::shared_ptr<Program> program_;
  std::vector<bool> staged_;
  std::vector<bool> written_;  // per input: whether the graph writes it back
  RecorderFactory make_recorder_;
  std::string skip_reason_;
  bool warmed_up_ = false;
  bool time_library_algorithms_ = false;
  std::unique_ptr<GraphRecorder> graph_;
  std::vector<Tensor> static_inputs_;   // what the graph reads: staged copies, or the inputs
  std::vector<Tensor> static_outputs_;  // what the graph's run returned (in the pool)
  int64_t captures_ = 0, replays_ = 0, uncaptured_runs_ = 0;
};

}  // namespace kiln::compiler
