// BERT: Hugging Face's parameter names and counts, the forward against a reference written
// from ops and the state dict's HF names (f64), the padding mask, gradients, a safetensors
// round trip with HF's extra keys, and errors that name the model.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "models/bert.h"
#include "models/safetensors.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;
using models::BertConfig;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A BERT small enough to check element by element: 2 layers, hidden 16, 2 heads.
BertConfig small_config() {
  BertConfig c = BertConfig::tiny(/*vocab_size=*/50);
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.intermediate_size = 24;
  c.max_position_embeddings = 12;
  return c;
}

// The parameter count of HF's BertModel, by hand from the config.
int64_t bert_parameter_count(const BertConfig& c, bool pooler) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const int64_t embeddings =
      (c.vocab_size + c.max_position_embeddings + c.type_vocab_size) * H + 2 * H;
  const int64_t layer = 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H;
  return embeddings + c.num_hidden_layers * layer + (pooler ? H * H + H : 0);
}

int64_t count(const nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

// The names HF's BertModel gives its parameters, under `prefix`.
std::set<std::string> bert_names(const std::string& prefix, int64_t layers, bool pooler) {
  std::set<std::string> names;
  auto wb = [&](const std::string& m) {
    names.insert(prefix + m + ".weight");
    names.insert(prefix + m + ".bias");
  };
  for (const char* e : {"word_embeddings", "position_embeddings", "token_type_embeddings"})
    names.insert(prefix + "embeddings." + e + ".weight");
  wb("embeddings.LayerNorm");
  for (int64_t i = 0; i < layers; ++i) {
    const std::string l = "encoder.layer." + std::to_string(i) + ".";
    for (const char* m : {"attention.self.query", "attention.self.key", "attention.self.value",
                          "attention.output.dense", "attention.output.LayerNorm",
                          "intermediate.dense", "output.dense", "output.LayerNorm"})
      wb(l + m);
  }
  if (pooler) wb("pooler.dense");
  return names;
}

std::set<std::string> names_of(const nn::Module& m) {
  std::set<std::string> names;
  for (const auto& [name, t] : m.named_parameters()) names.insert(name);
  return names;
}

// BERT's computation written from ops and the state dict's HF names, attention one head at a
// time with the padding as -inf scores: the last hidden state [N, L, H].
Tensor reference_encoder(const StateDict& sd, const BertConfig& c, const Tensor& ids,
                         const Tensor& types, const Tensor& mask) {
  auto w = [&](const std::string& name) { return sd.at(name); };
  auto linear = [&](const Tensor& x, const std::string& m) {
    return add(matmul(x, w(m + ".weight").t()), w(m + ".bias"));
  };
  auto norm = [&](const Tensor& x, const std::string& m) {
    return layer_norm(x, {c.hidden_size}, w(m + ".weight"), w(m + ".bias"), c.layer_norm_eps);
  };
  const int64_t n = ids.size(0), L = ids.size(1), H = c.hidden_size;
  const int64_t heads = c.num_attention_heads, D = H / heads;
  auto rows = [&](const std::string& table, const Tensor& idx) {
    return index_select(w(table), 0, idx.reshape({-1})).view({n, L, H});
  };
  Tensor x = add(add(rows("bert.embeddings.word_embeddings.weight", ids),
                     rows("bert.embeddings.token_type_embeddings.weight", types)),
                 w("bert.embeddings.position_embeddings.weight").slice(0, 0, L));
  x = norm(x, "bert.embeddings.LayerNorm");
  const Tensor padding = eq(mask, 0).view({n, 1, L});  // true: a key to ignore
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string l = "bert.encoder.layer." + std::to_string(i) + ".";
    const Tensor q = linear(x, l + "attention.self.query");
    const Tensor k = linear(x, l + "attention.self.key");
    const Tensor v = linear(x, l + "attention.self.value");
    std::vector<Tensor> outs;
    for (int64_t h = 0; h < heads; ++h) {
      auto head = [&](const Tensor& t) { return t.slice(2, h * D, (h + 1) * D); };
      Tensor scores = div(matmul(head(q), head(k).transpose(1, 2)), std::sqrt(double(D)));
      scores = where(padding, -kInf, scores);
      outs.push_back(matmul(softmax(scores, -1), head(v)));
    }
    const Tensor a = norm(add(linear(cat(outs, -1), l + "attention.output.dense"), x),
                          l + "attention.output.LayerNorm");
    const Tensor inter = gelu(linear(a, l + "intermediate.dense"));
    x = norm(add(linear(inter, l + "output.dense"), a), l + "output.LayerNorm");
  }
  return x;
}

struct Inputs {
  Tensor ids, types, mask;
};

// Two sequences of 9 tokens, the second padded after 6 (its padding ids arbitrary).
Inputs inputs(const BertConfig& c, uint64_t seed) {
  Generator gen(seed);
  Inputs in;
  in.ids = randint(1, c.vocab_size, {2, 9}, {}, &gen);
  in.types = randint(0, c.type_vocab_size, {2, 9}, {}, &gen);
  std::vector<double> m(18, 1.0);
  for (size_t i = 15; i < 18; ++i) m[i] = 0;
  in.mask = tensor_of(m, {2, 9}, DType::i64);
  return in;
}

// A relative bound for f64 results that the model and the reference compute in different
// orders: the longest sum has 24 terms (the intermediate projection), gamma(24) in f64 is
// 2.7e-15 of the terms' magnitudes, which LayerNorm's division by a standard deviation of
// order 1 and the 2 layers do not raise by more than a few hundred times: 1e-12.
constexpr double kF64Tolerance = 1e-12;

}  // namespace

TEST_CASE("BERT has Hugging Face's parameter names", "[bert][models]") {
  const BertConfig c = small_config();
  models::BertForMaskedLM mlm(c);
  std::set<std::string> want = bert_names("bert.", 2, /*pooler=*/false);
  for (const char* m : {"cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm"}) {
    want.insert(std::string(m) + ".weight");
    want.insert(std::string(m) + ".bias");
  }
  want.insert("cls.predictions.bias");
  CHECK(names_of(mlm) == want);
  CHECK(mlm.state_dict().size() == want.size());  // no buffers: position ids come from L

  models::BertForSequenceClassification cls(c, 3);
  want = bert_names("bert.", 2, /*pooler=*/true);
  want.insert("classifier.weight");
  want.insert("classifier.bias");
  CHECK(names_of(cls) == want);
  CHECK(cls.named_parameters().back().second.shape() == Shape{3});

  CHECK(names_of(models::BertModel(c)) == bert_names("", 2, true));
  CHECK(count(mlm) == bert_parameter_count(c, false) + 16 * 16 + 3 * 16 + 50);
  CHECK(count(cls) == bert_parameter_count(c, true) + 16 * 3 + 3);
}

TEST_CASE("BERT's configurations and BERT-base's published parameter count", "[bert][models]") {
  const BertConfig tiny = BertConfig::tiny(), mini = BertConfig::mini(), base = BertConfig::base(),
                   large = BertConfig::large();
  CHECK((tiny.num_hidden_layers == 2 && tiny.hidden_size == 128 && tiny.num_attention_heads == 2));
  CHECK((mini.num_hidden_layers == 4 && mini.hidden_size == 256 && mini.num_attention_heads == 4));
  CHECK(
      (base.num_hidden_layers == 12 && base.hidden_size == 768 && base.num_attention_heads == 12));
  CHECK((large.num_hidden_layers == 24 && large.hidden_size == 1024 &&
         large.num_attention_heads == 16));
  for (const BertConfig& c : {tiny, mini, base, large}) {
    CHECK(c.intermediate_size == 4 * c.hidden_size);
    CHECK((c.vocab_size == 30522 && c.max_position_embeddings == 512 && c.type_vocab_size == 2));
    CHECK((c.layer_norm_eps == 1e-12 && c.hidden_dropout_prob == 0.1 &&
           c.attention_probs_dropout_prob == 0.1));
  }
  // The built model has the formula's count (every size counts alike; BERT-base itself
  // takes 7 s to build and initialize on 2 cores, too long for a unit test) ...
  CHECK(count(models::BertModel(BertConfig::mini(1000))) ==
        bert_parameter_count(BertConfig::mini(1000), true));
  CHECK(count(models::BertModel(tiny)) == bert_parameter_count(tiny, true));
  // ... which for bert-base-uncased's BertModel is HF's 109,482,240 ("110M").
  CHECK(bert_parameter_count(base, true) == 109'482'240);
  // bert-large-uncased: 335,141,888 (by the same formula; not built here, 1.3 GB in f32).
  CHECK(bert_parameter_count(large, true) == 335'141'888);
}

TEST_CASE("BERT's initialization is Hugging Face's", "[bert][models]") {
  manual_seed(1);
  const BertConfig c = BertConfig::tiny(/*vocab_size=*/1000);
  models::BertForMaskedLM m(c);
  const StateDict sd = m.state_dict();
  const Tensor word = sd.at("bert.embeddings.word_embeddings.weight");
  CHECK(values(word.select(0, 0)) == std::vector<double>(128, 0.0));  // the [PAD] row
  // N(0, 0.02^2) over 128,000 - 128 draws: the sample standard deviation within 2% of 0.02
  // (its own standard error is 0.02 / sqrt(2 * 127,872) = 0.2%).
  const double sd_word = std::sqrt(mean(mul(word, word)).item<double>() * 1000 / 999);
  CHECK(std::abs(sd_word - 0.02) < 0.02 * 0.02);
  const Tensor q = sd.at("bert.encoder.layer.1.attention.self.query.weight");
  CHECK(std::abs(std::sqrt(mean(mul(q, q)).item<double>()) - 0.02) < 0.02 * 0.05);
  CHECK(values(sd.at("bert.encoder.layer.1.attention.self.query.bias")) ==
        std::vector<double>(128, 0.0));
  CHECK(values(sd.at("cls.predictions.bias")) == std::vector<double>(1000, 0.0));
  CHECK(values(sd.at("bert.encoder.layer.0.output.LayerNorm.weight")) ==
        std::vector<double>(128, 1.0));
}

TEST_CASE("BERT matches a reference written from ops and HF's names", "[bert][models]") {
  manual_seed(2);
  const BertConfig c = small_config();
  models::BertForMaskedLM mlm(c);
  models::BertForSequenceClassification cls(c, 3);
  for (nn::Module* m : {static_cast<nn::Module*>(&mlm), static_cast<nn::Module*>(&cls)}) {
    m->to(DType::f64);
    m->eval();
    // Non-zero biases and LayerNorm shifts, so that one in the wrong place shows.
    NoGradGuard no_grad;
    Generator gen(3);
    for (const auto& [name, p] : m->named_parameters())
      if (p.dim() == 1) Tensor(p).copy_(mul(randn(p.shape(), {.dtype = DType::f64}, &gen), 0.5));
  }
  const Inputs in = inputs(c, 4);
  const Tensor logits = mlm.forward(in.ids, in.mask, in.types);
  CHECK(logits.shape() == Shape{2, 9, 50});
  const StateDict sd = mlm.state_dict();
  auto lin = [&](const Tensor& x, const std::string& m) {
    return add(matmul(x, sd.at(m + ".weight").t()), sd.at(m + ".bias"));
  };
  const Tensor h = reference_encoder(sd, c, in.ids, in.types, in.mask);
  const Tensor t = layer_norm(gelu(lin(h, "cls.predictions.transform.dense")), {16},
                              sd.at("cls.predictions.transform.LayerNorm.weight"),
                              sd.at("cls.predictions.transform.LayerNorm.bias"), c.layer_norm_eps);
  const Tensor want = add(matmul(t, sd.at("bert.embeddings.word_embeddings.weight").t()),
                          sd.at("cls.predictions.bias"));
  KILN_CHECK_CLOSE(logits, want, kF64Tolerance, kF64Tolerance);

  const StateDict cs = cls.state_dict();
  const Tensor ch = reference_encoder(cs, c, in.ids, in.types, in.mask);
  const Tensor pooled = tanh(add(matmul(ch.select(1, 0), cs.at("bert.pooler.dense.weight").t()),
                                 cs.at("bert.pooler.dense.bias")));
  const Tensor cls_want =
      add(matmul(pooled, cs.at("classifier.weight").t()), cs.at("classifier.bias"));
  const Tensor cls_logits = cls.forward(in.ids, in.mask, in.types);
  CHECK(cls_logits.shape() == Shape{2, 3});
  KILN_CHECK_CLOSE(cls_logits, cls_want, kF64Tolerance, kF64Tolerance);

  // Without token types, all are type 0; without a mask, every token attends everywhere.
  const Tensor ones_mask = ones_like(in.mask);
  KILN_CHECK_CLOSE(mlm.forward(in.ids), mlm.forward(in.ids, ones_mask, zeros_like(in.types)), 0, 0);
  const Tensor bare = mlm.bert().forward(in.ids);
  KILN_CHECK_CLOSE(bare, reference_encoder(sd, c, in.ids, zeros_like(in.types), ones_mask),
                   kF64Tolerance, kF64Tolerance);
}

TEST_CASE("BERT: padding changes no unpadded output", "[bert][models]") {
  manual_seed(5);
  const BertConfig c = small_config();
  models::BertForMaskedLM m(c);
  m.to(DType::f64);
  m.eval();
  const Inputs in = inputs(c, 6);
  const Tensor logits = m.forward(in.ids, in.mask, in.types);
  // Other ids and types at the padded positions: the unpadded outputs are the same bits (a
  // masked key's probability is exactly 0).
  Tensor ids = in.ids.clone(), types = in.types.clone();
  ids.select(0, 1).slice(0, 6, 9).fill_(7);
  types.select(0, 1).slice(0, 6, 9).fill_(1);
  const Tensor other = m.forward(ids, in.mask, types);
  KILN_CHECK_EQUAL(other.select(0, 1).slice(0, 0, 6), logits.select(0, 1).slice(0, 0, 6));
  KILN_CHECK_EQUAL(other.select(0, 0), logits.select(0, 0));
  // And they are the outputs of the sequence alone, unpadded (other summation lengths).
  const Tensor alone =
      m.forward(in.ids.slice(0, 1, 2).slice(1, 0, 6), {}, in.types.slice(0, 1, 2).slice(1, 0, 6));
  KILN_CHECK_CLOSE(alone.select(0, 0), logits.select(0, 1).slice(0, 0, 6), kF64Tolerance,
                   kF64Tolerance);
  // A bool mask means the same as the i64 one.
  KILN_CHECK_EQUAL(m.forward(in.ids, ne(in.mask, 0), in.types), logits);
  // Without the mask the padding is attended to, and the outputs change.
  CHECK_FALSE(allclose(m.forward(in.ids, {}, in.types).select(0, 1).slice(0, 0, 6),
                       logits.select(0, 1).slice(0, 0, 6), 0, 1e-6));
}

TEST_CASE("BERT: the masked-LM loss reaches every parameter", "[bert][models]") {
  manual_seed(7);
  const BertConfig c = small_config();
  models::BertForMaskedLM m(c);
  const Inputs in = inputs(c, 8);
  Generator gen(9);
  // Labels at about a third of the positions, -100 elsewhere.
  const Tensor chosen = lt(rand({2, 9}, {}, &gen), 0.35);
  const Tensor labels = where(chosen, randint(1, 50, {2, 9}, {}, &gen), full({}, int64_t{-100}));
  const Tensor logits = m.forward(in.ids, in.mask, in.types);
  const Tensor loss = models::masked_lm_loss(logits, labels);
  // The loss is the mean over the chosen positions of -log_softmax at the label.
  const Tensor lp = log_softmax(logits, -1);
  double total = 0;
  int64_t chosen_count = 0;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 9; ++j) {
      const int64_t label = labels.select(0, i).select(0, j).item<int64_t>();
      if (label == -100) continue;
      total -= lp.select(0, i).select(0, j).select(0, label).item<double>();
      ++chosen_count;
    }
  REQUIRE(chosen_count > 0);
  // f32 sums of at most 18 terms: well inside 1e-5 of their magnitude (about 4 each).
  CHECK(std::abs(loss.item<double>() - total / chosen_count) < 1e-5 * 4);
  loss.backward();
  for (const auto& [name, p] : m.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    CHECK(amax(abs(p.grad())).item<double>() > 0);
  }

  // With [PAD] (id 0) at the padded positions: its embedding row (padding_idx) gets no
  // gradient from the lookup, as in HF. (The masked-LM decoder, tied to the same table, does
  // give it one: HF's does too.)
  Tensor ids = in.ids.clone();
  ids.select(0, 1).slice(0, 6, 9).fill_(0);
  models::BertForSequenceClassification cls(c, 4);
  cross_entropy(cls.forward(ids, in.mask, in.types), tensor_of({1, 3}, {2}, DType::i64)).backward();
  for (const auto& [name, p] : cls.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    CHECK(amax(abs(p.grad())).item<double>() > 0);
  }
  CHECK(values(cls.bert().embeddings().word_embeddings().weight().grad().select(0, 0)) ==
        std::vector<double>(16, 0.0));
}

TEST_CASE("BERT: dropout in training mode, none in eval mode", "[bert][models]") {
  manual_seed(10);
  models::BertForMaskedLM m(small_config());
  const Inputs in = inputs(small_config(), 11);
  m.eval();
  const Tensor a = m.forward(in.ids, in.mask, in.types);
  KILN_CHECK_EQUAL(m.forward(in.ids, in.mask, in.types), a);
  m.train();
  manual_seed(12);
  const Tensor t1 = m.forward(in.ids, in.mask, in.types);
  manual_seed(12);
  KILN_CHECK_EQUAL(m.forward(in.ids, in.mask, in.types), t1);
  CHECK_FALSE(allclose(t1, a, 0, 1e-3));
}

TEST_CASE("BERT: a safetensors round trip with HF's names", "[bert][models][safetensors]") {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kiln-bert-" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  const BertConfig c = small_config();
  manual_seed(13);
  models::BertForMaskedLM saved(c);
  StateDict file = saved.state_dict();
  // What HF's files may also hold: the tied decoder, old versions' position_ids buffer, and a
  // pretraining checkpoint's pooler and next-sentence head.
  file["cls.predictions.decoder.weight"] = file.at("bert.embeddings.word_embeddings.weight");
  file["cls.predictions.decoder.bias"] = file.at("cls.predictions.bias");
  file["bert.embeddings.position_ids"] = arange(c.max_position_embeddings).unsqueeze(0);
  file["bert.pooler.dense.weight"] = randn({16, 16});
  file["bert.pooler.dense.bias"] = randn({16});
  file["cls.seq_relationship.weight"] = randn({2, 16});
  file["cls.seq_relationship.bias"] = randn({2});
  save_safetensors(file, path);
  manual_seed(14);
  models::BertForMaskedLM loaded(c);
  loaded.load_hf_state_dict(load_safetensors(path));
  saved.eval();
  loaded.eval();
  const Inputs in = inputs(c, 15);
  KILN_CHECK_EQUAL(loaded.forward(in.ids, in.mask, in.types),
                   saved.forward(in.ids, in.mask, in.types));
  // Strict: a key the model does not have is still an error.
  StateDict extra = saved.state_dict();
  extra["bert.encoder.layer.2.output.dense.bias"] = zeros({16});
  CHECK_THROWS_WITH(loaded.load_hf_state_dict(extra),
                    Catch::Matchers::Contains("bert.encoder.layer.2.output.dense.bias"));

  // The classifier loads the same encoder from the pretraining file; its own head is new.
  models::BertForSequenceClassification cls(c, 2);
  StateDict for_cls = load_safetensors(path);
  for_cls["classifier.weight"] = zeros({2, 16});
  for_cls["classifier.bias"] = zeros({2});
  cls.load_hf_state_dict(for_cls);
  KILN_CHECK_EQUAL(cls.state_dict().at("bert.encoder.layer.1.output.dense.weight"),
                   saved.state_dict().at("bert.encoder.layer.1.output.dense.weight"));
  KILN_CHECK_EQUAL(cls.state_dict().at("bert.pooler.dense.bias"),
                   file.at("bert.pooler.dense.bias"));
  std::filesystem::remove(path);
}

TEST_CASE("BERT: bad inputs are errors naming the model and the shapes", "[bert][models]") {
  const BertConfig c = small_config();
  models::BertForMaskedLM m(c);
  const Tensor ids = randint(0, 50, {2, 5});
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(
      m.forward(ids.to(DType::f32)),
      Contains("BertForMaskedLM: input_ids must be i64 [N, L]") && Contains("f32[2,5]"));
  CHECK_THROWS_WITH(m.forward(randint(0, 50, {10})),
                    Contains("BertForMaskedLM") && Contains("i64[10]"));
  CHECK_THROWS_WITH(m.forward(randint(0, 50, {2, 13})),
                    Contains("BertForMaskedLM: input_ids i64[2,13]") &&
                        Contains("sequences of 13 tokens; the model takes 1 to 12"));
  CHECK_THROWS_WITH(m.forward(full({2, 5}, int64_t{50})),
                    Contains("BertForMaskedLM: input_ids i64[2,5]") && Contains("[0, 50)"));
  CHECK_THROWS_WITH(m.forward(ids, {}, full({2, 5}, int64_t{2})),
                    Contains("BertForMaskedLM: token_type_ids i64[2,5]") && Contains("[0, 2)"));
  CHECK_THROWS_WITH(m.forward(ids, ones({2, 4}, {.dtype = DType::i64})),
                    Contains("BertForMaskedLM: attention_mask must be") && Contains("i64[2,4]"));
  CHECK_THROWS_WITH(m.forward(ids, ones({2, 5})),
                    Contains("attention_mask") && Contains("f32[2,5]"));
  CHECK_THROWS_WITH(m.bert().embeddings().forward(randint(0, 50, {1, 13})),
                    Contains("BertEmbeddings: input_ids i64[1,13]"));
  models::BertForSequenceClassification cls(c, 2);
  CHECK_THROWS_WITH(cls.forward(ids.to(DType::i32)),
                    Contains("BertForSequenceClassification: input_ids must be i64"));
  CHECK_THROWS_WITH(models::masked_lm_loss(randn({2, 5, 50}), ids.to(DType::i32)),
                    Contains("masked_lm_loss") && Contains("i32[2,5]"));
}
