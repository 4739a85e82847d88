// BERT and GPT-2 training steps (forward with dropout, the model's loss, backward, SGD)
// compiled equal eager bit for bit, as the TransformerEncoderLayer's step in
// test_attention.cpp: one graph, no break, one attention node per layer. The language
// models' head and loss stay the eager op chain here (CompileOptions::linear_cross_entropy
// off): fused, they agree to rounding only (test_linear_cross_entropy.cpp).
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "compiler/compile.h"
#include "compiler_testing.h"
#include "models/bert.h"
#include "models/gpt2.h"
#include "optim/sgd.h"
#include "transformer_testing.h"
#include "testing.h"

using namespace kiln;
using kiln::testing::same_bits;
using namespace kiln::compiler;
using kiln::testing::check_step;
using kiln::testing::count_ops;
using kiln::testing::tensor_of;

namespace {

using Args = std::vector<Tensor>;

}  // namespace

TEST_CASE("transformers: a BERT masked-LM training step compiles as eager", "[bert][equiv]") {
  models::BertConfig c = models::BertConfig::tiny(/*vocab_size=*/60);
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.intermediate_size = 64;
  c.max_position_embeddings = 16;
  Generator gen(31);
  const Tensor ids = randint(1, 60, {3, 11}, {}, &gen);
  const Tensor types = randint(0, 2, {3, 11}, {}, &gen);
  // Lengths 11, 8 and 5, as the data layer's i64 mask.
  const Tensor mask =
      lt(arange(11).unsqueeze(0), tensor_of({11, 8, 5}, {3, 1}, DType::i64)).to(DType::i64);
  const Tensor labels = where(lt(rand({3, 11}, {}, &gen), 0.3), randint(1, 60, {3, 11}, {}, &gen),
                              full({}, int64_t{-100}));
  std::function<models::BertForMaskedLM()> make = [c] {
    manual_seed(32);
    return models::BertForMaskedLM(c);
  };
  std::function<Tensor(models::BertForMaskedLM&, const Args&)> loss = [](models::BertForMaskedLM& m,
                                                                         const Args& a) {
    return models::masked_lm_loss(m.forward(a[0], a[1], a[2]), a[3]);
  };
  CompiledFunction f = check_step(make, loss, {ids, mask, types, labels}, {.linear_cross_entropy = false});
  CHECK(count_ops(f.traces().at(0)->graph, "scaled_dot_product_attention") == 2);
  CHECK(count_ops(f.traces().at(0)->graph, "scaled_dot_product_attention_backward") == 2);
}

TEST_CASE("transformers: a BERT classification training step compiles as eager", "[bert][equiv]") {
  models::BertConfig c = models::BertConfig::tiny(/*vocab_size=*/60);
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.intermediate_size = 64;
  c.max_position_embeddings = 16;
  Generator gen(33);
  const Tensor ids = randint(1, 60, {4, 9}, {}, &gen);
  const Tensor mask = lt(arange(9).unsqueeze(0), tensor_of({9, 4, 7, 2}, {4, 1}, DType::i64));
  const Tensor labels = tensor_of({0, 2, 1, 2}, {4}, DType::i64);
  std::function<models::BertForSequenceClassification()> make = [c] {
    manual_seed(34);
    return models::BertForSequenceClassification(c, 3);
  };
  std::function<Tensor(models::BertForSequenceClassification&, const Args&)> loss =
      [](models::BertForSequenceClassification& m, const Args& a) {
        return cross_entropy(m.forward(a[0], a[1]), a[2]);
      };
  check_step(make, loss, {ids, mask, labels}, {.linear_cross_entropy = false});
}

TEST_CASE("transformers: a GPT-2 training step compiles as eager", "[gpt2][equiv]") {
  Generator gen(35);
  const Tensor ids = randint(0, 60, {3, 13}, {}, &gen);
  const std::function<models::GPT2LMHeadModel()> make = testing::make_gpt2(testing::small_gpt2(), 36);
  std::function<Tensor(models::GPT2LMHeadModel&, const Args&)> loss = [](models::GPT2LMHeadModel& m,
                                                                         const Args& a) {
    return models::causal_lm_loss(m.forward(a[0]), a[0]);
  };
  CompiledFunction f = check_step(make, loss, {ids}, {.linear_cross_entropy = false});
  CHECK(count_ops(f.traces().at(0)->graph, "scaled_dot_product_attention") == 2);
}
