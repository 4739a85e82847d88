// The tracer (compiler/trace.h): one eager run of a function under the op registry's hook,
// turning each reported op call into a graph node (compiler/trace_recorder.h); and a Trace's replay.
#include "compiler/trace.h"

#include <optional>

#include "autograd/meta.h"
#include "compiler/run_graph.h"
#include "compiler/trace_recorder.h"
#include "core/generator.h"
#include "core/registry.h"

namespace kiln::compiler {

std::vector<Tensor> Trace::inputs_for(const std::vector<Tensor>& args) const {
  KILN_CHECK(static_cast<int64_t>(args.size()) == num_args,
             "Trace::inputs_for: the traced function took {} arguments, got {}", num_args,
             args.size());
  std::vector<Tensor> inputs = args;
  inputs.insert(inputs.end(), captured.begin(), captured.end());
  // A gradient accumulated in place is whatever its leaf holds now: a later call may run
  // after set_grad (or a grad effect) gave the leaf another tensor.
  for (size_t i = 0; i < inputs.size() && i < grad_of.size(); ++i)
    if (grad_of[i] >= 0) inputs[i] = inputs.at(static_cast<size_t>(grad_of[i])).grad();
  return inputs;
}

std::vector<Tensor> Trace::replay(const std::vector<Tensor>& args) const {
  const std::vector<Tensor> inputs = replay_inputs(args);
  return replay_results(inputs, interpret(graph, inputs));
}

std::vector<Tensor> Trace::replay_inputs(const std::vector<Tensor>& args) const {
  KILN_CHECK(!broken(), "Trace::replay: the trace stopped at a graph break ({}) and has no graph",
             break_reason);
  std::vector<Tensor> inputs = inputs_for(args);
  // The counters the traced function drew from the default generator, drawn again: the
  // random ops get fresh numbers, and the stream ends where eager code would leave it.
  if (random_input >= 0 || random_count > 0) {
    const Generator::Reservation r = default_generator().reserve(random_count);
    if (random_input >= 0) inputs.at(static_cast<size_t>(random_input)) = random_base_tensor(r.seed, r.offset);
  }
  return inputs;
}

std::vector<Tensor> Trace::replay_results(const std::vector<Tensor>& inputs, std::vector<Tensor> outputs) const {
  size_t next = static_cast<size_t>(num_results);
  for (const GradEffect& effect : grad_effects) {
    const Tensor& leaf = inputs.at(static_cast<size_t>(effect.input));
    // Like AccumulateGrad: a gradient that is a view, or shares memory with another output,
    // is copied; one the graph made for this leaf alone is kept.
    leaf.set_grad(effect.value.defined() ? own_gradient(std::move(outputs.at(next++)), leaf) : Tensor());
  }
  outputs.resize(static_cast<size_t>(num_results));
  return outputs;
}

Trace trace(const TracedFunction& fn, const std::vector<Tensor>& args,
            const TraceOptions& options) {
  Trace result;
  result.num_args = static_cast<int64_t>(args.size());
  tracing::Tracer tracer(result, options);
  for (size_t i = 0; i < args.size(); ++i) tracer.add_argument(args[i], i);
  std::vector<Tensor> returned;
  {
    // After a break, with record_after_break, the rest is recorded piece by piece.
    std::optional<tracing::RestRecorder> rest;
    auto after_break = [&] {
      if (result.broken() && options.allow_break && options.record_after_break)
        rest.emplace(args, options, result.after_break);
    };
    // Inside a split run (compiler/split.cpp) fn runs eagerly here all the same: the trace
    // records values it computes.
    DeferHookGuard no_deferral(nullptr);
    OpHookGuard hook([&](const OpCall& call) {
      if (rest) return rest->on_call(call);
      tracer.on_call(call);
      after_break();
    });
    HostReadHookGuard host_reads([&](const Tensor& t, const char* reader, bool guarded) {
      if (!guarded) return;
      if (rest) return rest->on_host_read(t, reader);
      tracer.on_host_read(t, reader);
      after_break();
    });
    SetGradHookGuard set_grads([&tracer](const Tensor& t) { tracer.on_set_grad(t); });
    returned = fn(args);
    if (rest) rest->finish();
  }
  result.num_results = static_cast<int64_t>(returned.size());
  try {
    if (result.broken()) {
      result.results = std::move(returned);
      return result;
    }
    tracer.check_versions();
    tracer.finish_random();
    std::vector<Value> outputs;
    for (size_t i = 0; i < returned.size(); ++i)
      outputs.push_back(tracer.result_value(returned[i], i));
    tracer.record_grad_effects();
    tracer.find_gradients();
    for (const GradEffect& effect : result.grad_effects)
      if (effect.value.defined()) outputs.push_back(effect.value);
    result.graph.set_outputs(std::move(outputs));
  } catch (const Error& e) {
    if (!options.allow_break) throw;
    tracer.stop("", e.what());
  }
  result.results = std::move(returned);
  return result;
}

}  // namespace kiln::compiler
