// A zoo model's step traced, compiled and fused (tools/step_graph.h).
#include "tools/step_graph.h"

#include "core/autocast.h"
#include "models/bert.h"
#include "models/gpt2.h"
#include "tools/trainer.h"

namespace kiln::train {

StepGraph trace_step_graph(const StepGraphOptions& o) {
  manual_seed(0);
  const bool text = is_text_arch(o.arch), bert = o.arch.starts_with("bert-");
  const int64_t vocab = bert ? 30522 : 50257;
  std::shared_ptr<nn::Module> model = text ? make_text_model(o.arch, bert ? "mlm" : "clm", vocab, 2, o.seq)
                                           : make_model(o.arch, o.classes, o.channels, o.image_size);
  model->train(o.train);
  const compiler::TraceOptions names = compiler::module_names(*model);
  const bool flatten = o.arch == "mlp";
  Tensor x, y;
  if (text) {
    x = randint(0, vocab, {o.batch, o.seq});
    y = bert ? where(lt(rand({o.batch, o.seq}), 0.15), x, full({}, int64_t{-100})) : x;
  } else {
    x = randn({o.batch, o.channels, o.image_size, o.image_size});
    y = randint(0, o.classes, {o.batch});
  }
  auto loss_of = [&](const Tensor& logits, const Tensor& target) {
    if (!text) return cross_entropy(logits, target);
    return bert ? models::masked_lm_loss(logits, target) : models::causal_lm_loss(logits, target);
  };
  auto forward = [&](const Tensor& input) { return text ? call_model(*model, input) : (*model)(input); };
  auto step = [&](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    Tensor input = flatten ? a[0].flatten(1) : a[0];
    // As in PyTorch: the forward and the loss under autocast, backward outside the scope
    // (its gradients take the dtypes of the forward's values, parameters' stay f32).
    std::optional<autocast> amp;
    if (o.amp) amp.emplace(AutocastOptions{.dtype = o.amp});
    if (!o.train) {
      NoGradGuard no_grad;
      return {forward(input)};
    }
    Tensor loss = loss_of(forward(input), a[1]);
    amp.reset();
    loss.backward();
    return {loss};
  };
  StepGraph s;
  s.traced = compiler::trace(step, {x, y}, names).graph;
  s.simplified = compiler::run_pipeline(s.traced, compiler::default_compile_passes(o.layout, o.batch_norm_split, /*linear_cross_entropy=*/false, o.gemm_activations), &s.passes);
  s.schedule = compiler::fuse(s.simplified);
  return s;
}

}  // namespace kiln::train
