// A zoo model's step traced, compiled and fused (tools/step_graph.h).
#include "tools/step_graph.h"

#include "core/autocast.h"
#include "tools/trainer.h"

namespace kiln::train {

StepGraph trace_step_graph(const StepGraphOptions& o) {
  manual_seed(0);
  std::shared_ptr<nn::Module> model = make_model(o.arch, o.classes, o.channels, o.image_size);
  model->train(o.train);
  const compiler::TraceOptions names = compiler::module_names(*model);
  const bool flatten = o.arch == "mlp";
  Tensor x = randn({o.batch, o.channels, o.image_size, o.image_size});
  Tensor y = randint(0, o.classes, {o.batch});
  auto step = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    Tensor input = flatten ? a[0].flatten(1) : a[0];
    // As in PyTorch: the forward and the loss under autocast, backward outside the scope
    // (its gradients take the dtypes of the forward's values, parameters' stay f32).
    std::optional<autocast> amp;
    if (o.amp) amp.emplace(AutocastOptions{.dtype = o.amp});
    if (!o.train) {
      NoGradGuard no_grad;
      return {(*model)(input)};
    }
    Tensor loss = cross_entropy((*model)(input), a[1]);
    amp.reset();
    loss.backward();
    return {loss};
  };
  StepGraph s;
  s.traced = compiler::trace(step, {x, y}, names).graph;
  s.simplified = compiler::run_pipeline(s.traced, compiler::default_compile_passes(o.layout, o.batch_norm_split, true, o.gemm_activations), &s.passes);
  s.schedule = compiler::fuse(s.simplified);
  return s;
}

}  // namespace kiln::train
