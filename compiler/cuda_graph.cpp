// GraphReplay (compiler/cuda_graph.h): a Program captured into a CUDA graph and replayed.
#include "compiler/cuda_graph.h"

#include <fmt/format.h>

#include <unordered_map>

#include "core/error.h"
#include "core/grad_mode.h"

namespace kiln::compiler {

namespace {

// A fresh tensor holding t's elements in t's layout (a result copied out of the pool, a
// staged input's copy).
Tensor copy_of(const Tensor& t) {
  Tensor out = make_tensor(t.shape(), t.dtype(), t.device(), t.suggest_memory_format());
  out.impl()->wrapped_number = t.is_wrapped_number();
  out.copy_(t);
  return out;
}

class CudaGraphRecorder final : public GraphRecorder {
 public:
  explicit CudaGraphRecorder(std::shared_ptr<cuda::MemPool> pool) : pool_(std::move(pool)) {}
  std::vector<Tensor> capture(const std::function<std::vector<Tensor>()>& run) override {
    std::vector<Tensor> outputs;
    graph_.capture(*pool_, [&] { outputs = run(); });
    return outputs;
  }
  void replay() override { graph_.replay(); }

 private:
  std::shared_ptr<cuda::MemPool> pool_;  // declared first: outlives the graph
  cuda::CudaGraph graph_;
};

// A new tensor object viewing the same memory as t (the caller may change its metadata
// without touching the replay's own).
Tensor alias_of(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>(*t.impl());
  impl->autograd = nullptr;
  impl->requires_grad = false;
  return Tensor(std::move(impl));
}

}  // namespace

std::vector<bool> staged_inputs(const Trace& t) {
  std::vector<bool> staged(t.graph.inputs().size(), false);
  for (size_t i = 0; i < staged.size(); ++i)
    staged[i] = static_cast<int64_t>(i) < t.num_args || (i < t.grad_of.size() && t.grad_of[i] >= 0);
  return staged;
}

RecorderFactory cuda_graph_recorder(std::shared_ptr<cuda::MemPool> pool) {
  return [pool] { return std::make_unique<CudaGraphRecorder>(pool); };
}

GraphReplay::GraphReplay(std::shared_ptr<Program> program, std::vector<bool> staged,
                         std::shared_ptr<cuda::MemPool> pool)
    : GraphReplay(std::move(program), std::move(staged), pool ? cuda_graph_recorder(pool) : RecorderFactory()) {
  // What keeps the program out of a graph, before the missing pool that follows from it.
  if (std::string blocker = program_->cuda_graph_blocker(); !blocker.empty()) skip_reason_ = std::move(blocker);
}

GraphReplay::GraphReplay(std::shared_ptr<Program> program, std::vector<bool> staged, RecorderFactory recorder)
    : program_(std::move(program)), staged_(std::move(staged)), make_recorder_(std::move(recorder)) {
  const Graph& g = program_->graph();
  KILN_CHECK(staged_.size() == g.inputs().size(), "GraphReplay: {} staging flags for {} graph inputs",
             staged_.size(), g.inputs().size());
  written_.assign(g.inputs().size(), false);
  for (const auto& [input, value] : g.write_backs())
    for (size_t i = 0; i < g.inputs().size(); ++i)
      if (g.inputs()[i].node == input.node) written_[i] = true;
  if (!make_recorder_) skip_reason_ = "no graph recorder was given";
}

std::vector<Tensor> GraphReplay::uncaptured(const std::vector<Tensor>& inputs) {
  ++uncaptured_runs_;
  return program_->run(inputs);
}

void GraphReplay::drop_graph() {
  graph_.reset();
  static_outputs_.clear();
  static_inputs_.clear();
}

bool GraphReplay::same_memory(const std::vector<Tensor>& inputs) const {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!staged_[i] && !same_view(inputs[i], static_inputs_[i])) return false;
  return true;
}

void GraphReplay::capture(const std::vector<Tensor>& inputs) {
  // A staged input gets memory of its own, so a staged input sharing memory with another
  // input (which the program may rely on) would stop sharing it.
  std::unordered_map<const StorageImpl*, int> users;
  for (const Tensor& t : inputs)
    if (t.defined()) ++users[t.storage().get()];
  const Graph& g = program_->graph();
  auto name = [&](size_t i) { return g.node(g.inputs()[i]).name; };
  for (size_t i = 0; i < inputs.size(); ++i)
    KILN_CHECK(!staged_[i] || !inputs[i].defined() || users[inputs[i].storage().get()] == 1,
               "input \"{}\" shares memory with another input", name(i));
  static_inputs_.assign(inputs.size(), Tensor());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& in = inputs[i];
    if (!staged_[i] || !in.defined()) {
      static_inputs_[i] = in;
      continue;
    }
    KILN_CHECK(in.is_contiguous(in.suggest_memory_format()), "input \"{}\" ({}) is not dense in memory", name(i),
               in.meta_str());
    static_inputs_[i] = copy_of(in);  // in its layout: the strides the program was made for
  }
  std::unique_ptr<GraphRecorder> graph = make_recorder_();
  static_outputs_ = graph->capture([this] { return program_->run(static_inputs_); });
  graph_ = std::move(graph);
  ++captures_;
}

std::vector<Tensor> GraphReplay::results(const std::vector<Tensor>& inputs) const {
  std::vector<Tensor> out;
  out.reserve(static_outputs_.size());
  for (const Tensor& o : static_outputs_) {
    Tensor result;
    for (size_t i = 0; i < static_inputs_.size() && o.defined(); ++i) {
      const Tensor& s = static_inputs_[i];
      if (!s.defined() || s.storage() != o.storage()) continue;
      if (o.same(s)) result = inputs[i];           // a written-back input: the caller's tensor
      else if (!staged_[i]) result = alias_of(o);  // a view of an input used where it is (a fresh one)
      break;                                       // (a view of a staged copy is copied out)
    }
    // In the pool (or a staged copy): the next replay writes it again.
    if (o.defined() && !result.defined()) result = copy_of(o);
    out.push_back(std::move(result));
  }
  return out;
}

std::vector<Tensor> GraphReplay::run(const std::vector<Tensor>& inputs) {
  NoGradGuard no_grad;  // the copies in and out record no autograd history
  const cuda::ThreadCudnnBenchmark timed(time_library_algorithms_);
  if (skip_reason_.empty() && program_->profiling())
    skip_reason_ = "profiling times every step, which a graph cannot";
  if (!skip_reason_.empty()) return uncaptured(inputs);
  KILN_CHECK(inputs.size() == staged_.size(), "GraphReplay::run: {} inputs for a graph of {}", inputs.size(),
             staged_.size());
  if (!warmed_up_) {
    // The first run compiles what compiles lazily (eager kernels, cuDNN's algorithm choice,
    // which times candidates when benchmarking) outside any capture.
    std::vector<Tensor> out = uncaptured(inputs);
    warmed_up_ = true;
    return out;
  }
  if (graph_ && !same_memory(inputs)) drop_graph();
  if (!graph_) {
    if (captures_ >= kMaxCaptures) {
      skip_reason_ = fmt::format("captured {} times: inputs it does not copy kept moving to other memory", captures_);
      return uncaptured(inputs);
    }
    try {
      capture(inputs);
    } catch (const Error& e) {
      drop_graph();
      skip_reason_ = fmt::format("capture failed: {}", e.what());
      return uncaptured(inputs);
    }
  } else {
    for (size_t i = 0; i < inputs.size(); ++i)
      if (staged_[i] && inputs[i].defined()) static_inputs_[i].copy_(inputs[i]);
  }
  graph_->replay();
  ++replays_;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!written_[i] || !inputs[i].defined()) continue;
    if (staged_[i]) Tensor(inputs[i]).copy_(static_inputs_[i]);  // (copy_ bumps its version)
    else bump_version(inputs[i]);  // written by the graph in place, as the program's run would
  }
  return results(inputs);
}

}  // namespace kiln::compiler
