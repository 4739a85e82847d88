// fuse_linear_cross_entropy (compiler/passes/linear_cross_entropy.cpp): a language model's
// head and loss become linear_cross_entropy where nothing else reads the chain, and the
// compiled step then equals eager to rounding. Compared in f64, where rounding is 2^-53 per
// operation: the rewrite reorders the head's sums (GEMM blocking over the counted rows,
// f64 row sums), which moves each gradient by a few hundred ulps at most after the
// backward's amplification through these small models, so 1e-10 relative is far from both
// the rounding and any real error (a wrong row or a missing term moves results by O(1)).
#include <functional>
#include <memory>
#include <vector>

#include "compiler/compile.h"
#include "compiler/passes/passes.h"
#include "compiler_testing.h"
#include "models/bert.h"
#include "models/gpt2.h"
#include "transformer_testing.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using kiln::testing::count_ops;

namespace {

using Args = std::vector<Tensor>;
constexpr double kRtol = 1e-10;

// The optimized graph of f's first trace (the passes kiln::compile runs).
Graph optimized(const CompiledFunction& f, bool fuse = true) {
  return run_pipeline(f.traces().at(0)->graph, default_compile_passes(LayoutPolicy::automatic, BatchNormSplit::cuda, fuse),
                      nullptr, false);
}

// compare_steps on f64 models, every output and parameter within kRtol (transformer_testing.h).
template <class Model>
CompiledFunction check_step_close(const std::function<Model()>& make,
                                  const std::function<Args(Model&, const Args&)>& outputs_of, const Args& args) {
  return testing::check_step_close(make, outputs_of, args, kRtol);
}

models::BertConfig small_bert() {
  models::BertConfig c = models::BertConfig::tiny(/*vocab_size=*/60);
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.intermediate_size = 64;
  c.max_position_embeddings = 16;
  return c;
}

}  // namespace

TEST_CASE("linear_cross_entropy: a BERT masked-LM step with its accuracy count fuses its head and loss",
          "[linear_cross_entropy][bert]") {
  const models::BertConfig c = small_bert();
  Generator gen(51);
  const Tensor ids = randint(1, 60, {3, 11}, {}, &gen);
  const Tensor mask = lt(arange(11).unsqueeze(0), testing::tensor_of({11, 8, 5}, {3, 1}, DType::i64)).to(DType::i64);
  const Tensor labels =
      where(lt(rand({3, 11}, {}, &gen), 0.3), randint(1, 60, {3, 11}, {}, &gen), full({}, int64_t{-100}));
  std::function<models::BertForMaskedLM()> make = [c] {
    manual_seed(52);
    return models::BertForMaskedLM(c);
  };
  // kiln-train's micro-step: the summed loss, and the count of right predictions.
  std::function<Args(models::BertForMaskedLM&, const Args&)> step = [](models::BertForMaskedLM& m, const Args& a) {
    const Tensor logits = m.forward(a[0], a[1], {});
    const Tensor loss = cross_entropy(logits.reshape({-1, logits.size(2)}), a[2].reshape({-1}), {.reduction = "sum"});
    NoGradGuard no_grad;
    return Args{loss, sum(eq(argmax(logits.detach(), -1), a[2]))};
  };
  CompiledFunction f = check_step_close(make, step, {ids, mask, labels});
  const Graph g = optimized(f);
  CHECK(count_ops(g, "linear_cross_entropy") == 1);
  CHECK(count_ops(g, "linear_cross_entropy_backward") == 1);
  CHECK(count_ops(g, "log_softmax") == 0);
  CHECK(count_ops(g, "argmax") == 0);
  // Without the pass the chain stays.
  CHECK(count_ops(optimized(f, false), "log_softmax") == 1);
}

TEST_CASE("linear_cross_entropy: a GPT-2 step fuses its tied head and shifted loss", "[linear_cross_entropy][gpt2]") {
  Generator gen(53);
  const Tensor ids = randint(0, 60, {3, 13}, {}, &gen);
  const std::function<models::GPT2LMHeadModel()> make = testing::make_gpt2(testing::small_gpt2(), 54);
  std::function<Args(models::GPT2LMHeadModel&, const Args&)> step = [](models::GPT2LMHeadModel& m, const Args& a) {
    return Args{models::causal_lm_loss(m.forward(a[0]), a[0])};
  };
  CompiledFunction f = check_step_close(make, step, {ids});
  CHECK(count_ops(optimized(f), "linear_cross_entropy") == 1);
  CHECK(count_ops(optimized(f), "log_softmax") == 0);
}

TEST_CASE("linear_cross_entropy: the chain stays where something else reads the logits", "[linear_cross_entropy]") {
  const models::BertConfig c = small_bert();
  Generator gen(55);
  const Tensor ids = randint(1, 60, {2, 7}, {}, &gen);
  const Tensor labels = where(lt(rand({2, 7}, {}, &gen), 0.5), randint(1, 60, {2, 7}, {}, &gen), full({}, int64_t{-100}));
  std::function<models::BertForMaskedLM()> make = [c] {
    manual_seed(56);
    return models::BertForMaskedLM(c);
  };
  SECTION("the logits are an output") {
    std::function<Args(models::BertForMaskedLM&, const Args&)> step = [](models::BertForMaskedLM& m, const Args& a) {
      const Tensor logits = m.forward(a[0], {}, {});
      return Args{models::masked_lm_loss(logits, a[1]), logits};
    };
    CompiledFunction f = check_step_close(make, step, {ids, labels});
    CHECK(count_ops(optimized(f), "linear_cross_entropy") == 0);
  }
  SECTION("a softmax of the logits is an output") {
    std::function<Args(models::BertForMaskedLM&, const Args&)> step = [](models::BertForMaskedLM& m, const Args& a) {
      const Tensor logits = m.forward(a[0], {}, {});
      const Tensor loss = models::masked_lm_loss(logits, a[1]);
      NoGradGuard no_grad;
      return Args{loss, softmax(logits.detach(), -1)};
    };
    CompiledFunction f = check_step_close(make, step, {ids, labels});
    CHECK(count_ops(optimized(f), "linear_cross_entropy") == 0);
  }
}

TEST_CASE("linear_cross_entropy: an inference loss without backward fuses too", "[linear_cross_entropy]") {
  const models::BertConfig c = small_bert();
  manual_seed(57);
  models::BertForMaskedLM model(c);
  model.eval();
  Generator gen(58);
  const Tensor ids = randint(1, 60, {2, 7}, {}, &gen);
  const Tensor labels = where(lt(rand({2, 7}, {}, &gen), 0.5), randint(1, 60, {2, 7}, {}, &gen), full({}, int64_t{-100}));
  const TracedFunction fn = [&model](const Args& a) -> Args {
    NoGradGuard no_grad;
    return {models::masked_lm_loss(model.forward(a[0], {}, {}), a[1])};
  };
  CompiledFunction f = compile(fn, {.fullgraph = true, .trace = module_names(model)});
  const Tensor got = f({ids, labels}).at(0), want = fn({ids, labels}).at(0);
  // f32: the loss is a mean of per-row lse - logit, each off by a few ulps of the logits'
  // magnitude (a 32-term dot product per logit): 1e-5 relative is far above that.
  KILN_CHECK_CLOSE(got, want, 1e-5, 0);
  CHECK(count_ops(optimized(f), "linear_cross_entropy") == 1);
  CHECK(count_ops(optimized(f), "linear_cross_entropy_backward") == 0);
}
