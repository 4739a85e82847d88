// GPT-2: Hugging Face's parameter names, shapes and counts, the initialization, the forward
// against a reference written from ops and the state dict's HF names (f64), the causal
// property, padding, the causal-LM loss, gradients, a safetensors round trip with HF's extra
// keys, and errors that name the model.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <string>

#include "models/gpt2.h"
#include "models/safetensors.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::testing;
using models::GPT2Config;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// 2 layers, 16 wide, 2 heads, 12 positions, 40 tokens.
GPT2Config small_config() {
  GPT2Config c = GPT2Config::tiny(/*vocab_size=*/40);
  c.n_embd = 16;
  c.n_positions = 12;
  return c;
}

// The parameter count of HF's GPT2LMHeadModel (lm_head tied), by hand from the config.
int64_t gpt2_parameter_count(const GPT2Config& c) {
  const int64_t E = c.n_embd, I = c.n_inner > 0 ? c.n_inner : 4 * E;
  const int64_t block =
      2 * E + (E * 3 * E + 3 * E) + (E * E + E) + 2 * E + (E * I + I) + (I * E + E);
  return (c.vocab_size + c.n_positions) * E + c.n_layer * block + 2 * E;
}

int64_t count(const nn::Module& m) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  return n;
}

// GPT-2's computation written from ops and the state dict's HF names, attention one head at a
// time with the causal and padding masks as -inf scores: logits [N, L, V].
Tensor reference_logits(const StateDict& sd, const GPT2Config& c, const Tensor& ids,
                        const Tensor& mask) {
  auto w = [&](const std::string& name) { return sd.at(name); };
  auto conv1d = [&](const Tensor& x, const std::string& m) {  // weight [in, out]
    return add(matmul(x, w(m + ".weight")), w(m + ".bias"));
  };
  auto norm = [&](const Tensor& x, const std::string& m) {
    return layer_norm(x, {c.n_embd}, w(m + ".weight"), w(m + ".bias"), c.layer_norm_epsilon);
  };
  const int64_t n = ids.size(0), L = ids.size(1), E = c.n_embd, D = E / c.n_head;
  const Tensor wte = w("transformer.wte.weight");
  Tensor x = add(index_select(wte, 0, ids.reshape({-1})).view({n, L, E}),
                 w("transformer.wpe.weight").slice(0, 0, L));
  // true: a score to drop (a later key, or a padded one).
  Tensor hidden = gt(arange(L).unsqueeze(0), arange(L).unsqueeze(1)).unsqueeze(0);
  if (mask.defined()) hidden = logical_or(hidden, eq(mask, 0).unsqueeze(1));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string b = "transformer.h." + std::to_string(i) + ".";
    const Tensor qkv = conv1d(norm(x, b + "ln_1"), b + "attn.c_attn");
    std::vector<Tensor> outs;
    for (int64_t h = 0; h < c.n_head; ++h) {
      auto head = [&](int64_t part) {
        return qkv.slice(2, part * E + h * D, part * E + (h + 1) * D);
      };
      Tensor scores = div(matmul(head(0), head(1).transpose(1, 2)), std::sqrt(double(D)));
      // A row with every key dropped (a left-padded query) attends to nothing: zeros, the
      // attention op's rule, where softmax alone would give NaN.
      const Tensor p = where(hidden, 0.0, softmax(where(hidden, -kInf, scores), -1));
      outs.push_back(matmul(p, head(2)));
    }
    x = add(x, conv1d(cat(outs, -1), b + "attn.c_proj"));
    const Tensor m = gelu(conv1d(norm(x, b + "ln_2"), b + "mlp.c_fc"), "tanh");
    x = add(x, conv1d(m, b + "mlp.c_proj"));
  }
  return matmul(norm(x, "transformer.ln_f"), wte.t());
}

// A relative bound for f64 results that the model and the reference compute in different
// orders: the longest sum has 64 terms (mlp.c_proj), gamma(64) in f64 is 7.1e-15 of the
// terms' magnitudes, which the LayerNorms and 2 blocks do not raise by more than a hundred
// times: 1e-12.
constexpr double kF64Tolerance = 1e-12;

}  // namespace

TEST_CASE("GPT-2 has Hugging Face's parameter names and shapes", "[gpt2][models]") {
  const GPT2Config c = small_config();
  models::GPT2LMHeadModel m(c);
  std::map<std::string, Shape> want = {{"transformer.wte.weight", {40, 16}},
                                       {"transformer.wpe.weight", {12, 16}},
                                       {"transformer.ln_f.weight", {16}},
                                       {"transformer.ln_f.bias", {16}}};
  for (int i = 0; i < 2; ++i) {
    const std::string b = "transformer.h." + std::to_string(i) + ".";
    want[b + "ln_1.weight"] = want[b + "ln_1.bias"] = {16};
    want[b + "ln_2.weight"] = want[b + "ln_2.bias"] = {16};
    // Conv1D weights are [in, out], as HF stores them.
    want[b + "attn.c_attn.weight"] = {16, 48};
    want[b + "attn.c_attn.bias"] = {48};
    want[b + "attn.c_proj.weight"] = {16, 16};
    want[b + "attn.c_proj.bias"] = {16};
    want[b + "mlp.c_fc.weight"] = {16, 64};
    want[b + "mlp.c_fc.bias"] = {64};
    want[b + "mlp.c_proj.weight"] = {64, 16};
    want[b + "mlp.c_proj.bias"] = {16};
  }
  std::map<std::string, Shape> got;
  for (const auto& [name, t] : m.state_dict()) got[name] = t.shape();
  CHECK(got == want);  // no lm_head.weight: it is transformer.wte.weight
  CHECK(count(m) == gpt2_parameter_count(c));
}

TEST_CASE("GPT-2's configurations and GPT-2 small's 124,439,808 parameters", "[gpt2][models]") {
  const GPT2Config small = GPT2Config::small(), tiny = GPT2Config::tiny(),
                   mini = GPT2Config::mini();
  CHECK((small.n_layer == 12 && small.n_embd == 768 && small.n_head == 12 &&
         small.n_positions == 1024 && small.vocab_size == 50257));
  CHECK((tiny.n_layer == 2 && tiny.n_embd == 128 && tiny.n_head == 2));
  CHECK((mini.n_layer == 4 && mini.n_embd == 256 && mini.n_head == 4));
  CHECK((small.layer_norm_epsilon == 1e-5 && small.resid_pdrop == 0.1 && small.embd_pdrop == 0.1 &&
         small.attn_pdrop == 0.1));
  // The built model has the formula's count (GPT-2 small itself takes seconds to build and
  // initialize on 2 cores) ...
  CHECK(count(models::GPT2LMHeadModel(GPT2Config::tiny(1000))) ==
        gpt2_parameter_count(GPT2Config::tiny(1000)));
  CHECK(count(models::GPT2LMHeadModel(GPT2Config::mini(1000))) ==
        gpt2_parameter_count(GPT2Config::mini(1000)));
  // ... which for GPT-2 small with tied embeddings is HF's 124,439,808.
  CHECK(gpt2_parameter_count(small) == 124'439'808);
}

TEST_CASE("GPT-2's initialization is Hugging Face's", "[gpt2][models]") {
  manual_seed(1);
  models::GPT2LMHeadModel m(GPT2Config::mini(1000));
  const StateDict sd = m.state_dict();
  auto rms = [&](const std::string& name) {
    const Tensor t = sd.at(name);
    return std::sqrt(mean(mul(t, t)).item<double>());
  };
  // N(0, 0.02^2), and 0.02 / sqrt(2 * n_layer) = 0.02 / sqrt(8) for the residual
  // projections; 65,536 draws or more each, so the sample's standard deviation is within
  // 0.3% (one standard error) of it, 5% allowed.
  for (const char* name : {"transformer.wte.weight", "transformer.wpe.weight",
                           "transformer.h.3.attn.c_attn.weight", "transformer.h.0.mlp.c_fc.weight"})
    CHECK(std::abs(rms(name) - 0.02) < 0.02 * 0.05);
  for (const char* name :
       {"transformer.h.0.attn.c_proj.weight", "transformer.h.3.mlp.c_proj.weight"})
    CHECK(std::abs(rms(name) - 0.02 / std::sqrt(8.0)) < 0.02 / std::sqrt(8.0) * 0.05);
  CHECK(values(sd.at("transformer.h.1.attn.c_attn.bias")) == std::vector<double>(768, 0.0));
  CHECK(values(sd.at("transformer.h.1.ln_2.weight")) == std::vector<double>(256, 1.0));
}

TEST_CASE("GPT-2 matches a reference written from ops and HF's names", "[gpt2][models]") {
  manual_seed(2);
  const GPT2Config c = small_config();
  models::GPT2LMHeadModel m(c);
  m.to(DType::f64);
  m.eval();
  {
    NoGradGuard no_grad;
    Generator gen(3);
    for (const auto& [name, p] : m.named_parameters())
      if (p.dim() == 1) Tensor(p).copy_(mul(randn(p.shape(), {.dtype = DType::f64}, &gen), 0.5));
  }
  Generator gen(4);
  const Tensor ids = randint(0, 40, {2, 9}, {}, &gen);
  const Tensor logits = m.forward(ids);
  CHECK(logits.shape() == Shape{2, 9, 40});
  const StateDict sd = m.state_dict();
  KILN_CHECK_CLOSE(logits, reference_logits(sd, c, ids, {}), kF64Tolerance, kF64Tolerance);
  // Left padding: the first 3 tokens of sequence 1 are padding.
  const Tensor mask =
      tensor_of({1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1}, {2, 9}, DType::i64);
  const Tensor padded = m.forward(ids, mask);
  KILN_CHECK_CLOSE(padded, reference_logits(sd, c, ids, mask), kF64Tolerance, kF64Tolerance);
  // The padded positions' ids change no unpadded output (exactly: their probability is 0).
  Tensor other = ids.clone();
  other.select(0, 1).slice(0, 0, 3).fill_(5);
  const Tensor changed = m.forward(other, mask);
  KILN_CHECK_EQUAL(changed.select(0, 1).slice(0, 3, 9), padded.select(0, 1).slice(0, 3, 9));
  KILN_CHECK_EQUAL(changed.select(0, 0), padded.select(0, 0));
}

TEST_CASE("GPT-2 is causal: a later token changes no earlier logits", "[gpt2][models]") {
  manual_seed(5);
  models::GPT2LMHeadModel m(small_config());
  m.eval();
  Generator gen(6);
  const Tensor ids = randint(0, 40, {2, 10}, {}, &gen);
  const Tensor logits = m.forward(ids);
  for (int64_t j : {0, 4, 9}) {
    INFO("token " << j << " changed");
    Tensor other = ids.clone();
    other.select(1, j).copy_(add(mul(ids.select(1, j), -1), 39));  // 39 - id != id
    const Tensor changed = m.forward(other);
    // Row-wise projections and masked keys: the earlier positions' logits are the same bits.
    KILN_CHECK_EQUAL(changed.slice(1, 0, j), logits.slice(1, 0, j));
    CHECK_FALSE(allclose(changed.slice(1, j, j + 1), logits.slice(1, j, j + 1), 0, 1e-6));
  }
}

TEST_CASE("GPT-2: the causal-LM loss, and gradients to every parameter", "[gpt2][models]") {
  manual_seed(7);
  models::GPT2LMHeadModel m(small_config());
  Generator gen(8);
  const Tensor ids = randint(0, 40, {2, 7}, {}, &gen);
  Tensor labels = ids.clone();
  labels.select(0, 1).slice(0, 4, 7).fill_(-100);  // padding at the end of sequence 1
  const Tensor logits = m.forward(ids);
  const Tensor loss = models::causal_lm_loss(logits, labels);
  // Position i predicts labels[i + 1]: the mean over the 6 + 3 shifted labels that count.
  const Tensor lp = log_softmax(logits, -1);
  double total = 0;
  int64_t counted = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i + 1 < 7; ++i) {
      const int64_t label = labels.select(0, b).select(0, i + 1).item<int64_t>();
      if (label == -100) continue;
      total -= lp.select(0, b).select(0, i).select(0, label).item<double>();
      ++counted;
    }
  CHECK(counted == 9);
  // f32 sums of 9 terms of about 3.7 (log 40) each: 1e-5 of their size is far over the bound.
  CHECK(std::abs(loss.item<double>() - total / counted) < 1e-5 * 4);
  // The data layer's CausalLM targets are shifted already: plain cross entropy on them.
  const Tensor shifted = cat({labels.slice(1, 1, 7), full({2, 1}, int64_t{-100})}, 1);
  KILN_CHECK_CLOSE(cross_entropy(logits.reshape({-1, 40}), shifted.reshape({-1})), loss, 1e-6, 0);
  loss.backward();
  for (const auto& [name, p] : m.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    CHECK(amax(abs(p.grad())).item<double>() > 0);
  }
}

TEST_CASE("GPT-2: dropout in training mode, none in eval mode", "[gpt2][models]") {
  manual_seed(9);
  models::GPT2LMHeadModel m(small_config());
  const Tensor ids = randint(0, 40, {2, 6});
  m.eval();
  const Tensor a = m.forward(ids);
  KILN_CHECK_EQUAL(m.forward(ids), a);
  m.train();
  manual_seed(10);
  const Tensor t1 = m.forward(ids);
  manual_seed(10);
  KILN_CHECK_EQUAL(m.forward(ids), t1);
  CHECK_FALSE(allclose(t1, a, 0, 1e-3));
}

TEST_CASE("GPT-2: a safetensors round trip with HF's names", "[gpt2][models][safetensors]") {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kiln-gpt2-" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  const GPT2Config c = small_config();
  manual_seed(11);
  models::GPT2LMHeadModel saved(c);
  saved.eval();
  StateDict file = saved.state_dict();
  // What HF's files may also hold: the tied head and older versions' mask buffers.
  file["lm_head.weight"] = file.at("transformer.wte.weight");
  for (int i = 0; i < 2; ++i) {
    const std::string b = "transformer.h." + std::to_string(i) + ".attn.";
    file[b + "bias"] = ones({1, 1, 12, 12});
    file[b + "masked_bias"] = full({}, -1e4);
  }
  save_safetensors(file, path);
  const Tensor ids = randint(0, 40, {2, 8});
  manual_seed(12);
  models::GPT2LMHeadModel loaded(c);
  loaded.eval();
  loaded.load_hf_state_dict(load_safetensors(path));
  KILN_CHECK_EQUAL(loaded.forward(ids), saved.forward(ids));

  // A GPT2Model file (the hub's gpt2 checkpoint): the same names without "transformer.".
  StateDict bare;
  for (const auto& [name, t] : file)
    if (name.starts_with("transformer.")) bare[name.substr(12)] = t;
  save_safetensors(bare, path);
  manual_seed(13);
  models::GPT2LMHeadModel from_bare(c);
  from_bare.eval();
  from_bare.load_hf_state_dict(load_safetensors(path));
  KILN_CHECK_EQUAL(from_bare.forward(ids), saved.forward(ids));
  std::filesystem::remove(path);

  // Strict: a key the model does not have is still an error.
  StateDict extra = saved.state_dict();
  extra["transformer.h.2.ln_1.weight"] = ones({16});
  CHECK_THROWS_WITH(loaded.load_hf_state_dict(extra),
                    Catch::Matchers::Contains("transformer.h.2.ln_1.weight"));
}

TEST_CASE("GPT-2: bad inputs are errors naming the model and the shapes", "[gpt2][models]") {
  models::GPT2LMHeadModel m(small_config());
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(
      m.forward(randint(0, 40, {2, 5}).to(DType::i32)),
      Contains("GPT2LMHeadModel: input_ids must be i64 [N, L]") && Contains("i32[2,5]"));
  CHECK_THROWS_WITH(
      m.forward(randint(0, 40, {1, 13})),
      Contains("GPT2LMHeadModel: input_ids i64[1,13]") && Contains("the model takes 1 to 12"));
  CHECK_THROWS_WITH(m.forward(full({2, 5}, int64_t{40})),
                    Contains("GPT2LMHeadModel: input_ids i64[2,5]") && Contains("[0, 40)"));
  CHECK_THROWS_WITH(m.forward(randint(0, 40, {2, 5}), ones({5, 2}, {.dtype = DType::i64})),
                    Contains("GPT2LMHeadModel: attention_mask") && Contains("i64[5,2]"));
  CHECK_THROWS_WITH(models::causal_lm_loss(randn({2, 1, 40}), randint(0, 40, {2, 1})),
                    Contains("causal_lm_loss") && Contains("L >= 2"));
  CHECK_THROWS_WITH(models::GPT2LMHeadModel(GPT2Config{.n_embd = 10, .n_head = 3}),
                    Contains("n_embd (10) must be a positive multiple of n_head (3)"));
}
