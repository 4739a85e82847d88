// The kiln half of the Hugging Face transformers parity check (transformers_parity.py holds
// the transformers half).
//
//   kiln-transformers-parity-dump MODEL WEIGHTS.safetensors BATCH.safetensors OUT.safetensors [--compile]
//
// MODEL is bert-mlm (BertForMaskedLM), bert-cls (BertForSequenceClassification) or gpt2
// (GPT2LMHeadModel). WEIGHTS is the model.safetensors file HF's save_pretrained wrote,
// loaded through the model's load_hf_state_dict as a user would load it. BATCH holds the
// config's sizes as 0-d i64 tensors named "config.<HF name>" (dropout is off: parity needs
// the same numbers, and the two libraries' random streams differ), and input_ids,
// attention_mask, token_type_ids (BERT) and labels. The program runs one training-mode
// forward, HF's loss for the model (masked_lm_loss, cross_entropy, causal_lm_loss) and
// backward, eagerly or, with --compile, as one kiln::compile'd step, and writes to OUT:
// "loss" (0-d), "logits" and "grad.<parameter>" for every parameter.
#include <kiln.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/bert.h"
#include "models/gpt2.h"

namespace {

using namespace kiln;

int64_t config_value(const StateDict& batch, const std::string& name) {
  const auto it = batch.find("config." + name);
  KILN_CHECK(it != batch.end(), "transformers_parity_dump: the batch file lacks config.{}", name);
  return it->second.item<int64_t>();
}

Tensor entry(const StateDict& batch, const std::string& name) {
  const auto it = batch.find(name);
  KILN_CHECK(it != batch.end(), "transformers_parity_dump: the batch file lacks {}", name);
  return it->second;
}

models::BertConfig bert_config(const StateDict& batch) {
  return {.vocab_size = config_value(batch, "vocab_size"),
          .hidden_size = config_value(batch, "hidden_size"),
          .num_hidden_layers = config_value(batch, "num_hidden_layers"),
          .num_attention_heads = config_value(batch, "num_attention_heads"),
          .intermediate_size = config_value(batch, "intermediate_size"),
          .max_position_embeddings = config_value(batch, "max_position_embeddings"),
          .type_vocab_size = config_value(batch, "type_vocab_size"),
          .hidden_dropout_prob = 0.0,
          .attention_probs_dropout_prob = 0.0,
          .pad_token_id = config_value(batch, "pad_token_id")};
}

models::GPT2Config gpt2_config(const StateDict& batch) {
  return {.vocab_size = config_value(batch, "vocab_size"),
          .n_positions = config_value(batch, "n_positions"),
          .n_embd = config_value(batch, "n_embd"),
          .n_layer = config_value(batch, "n_layer"),
          .n_head = config_value(batch, "n_head"),
          .resid_pdrop = 0.0,
          .embd_pdrop = 0.0,
          .attn_pdrop = 0.0};
}

int run(const std::string& kind, const std::string& weights_path, const std::string& batch_path,
        const std::string& out_path, bool compiled) {
  const StateDict weights = load_safetensors(weights_path);
  const StateDict batch = load_safetensors(batch_path);
  // The step's arguments: input_ids, attention_mask, labels and (BERT) token_type_ids.
  std::vector<Tensor> args = {entry(batch, "input_ids"), entry(batch, "attention_mask"),
                              entry(batch, "labels")};

  // The model, and its forward and loss over the arguments.
  std::shared_ptr<nn::Module> model;
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> forward;
  if (kind == "bert-mlm" || kind == "bert-cls") {
    args.push_back(entry(batch, "token_type_ids"));
    if (kind == "bert-mlm") {
      auto m = std::make_shared<models::BertForMaskedLM>(bert_config(batch));
      m->load_hf_state_dict(weights);
      forward = [m](const std::vector<Tensor>& a) {
        const Tensor logits = m->forward(a[0], a[1], a[3]);
        return std::vector<Tensor>{models::masked_lm_loss(logits, a[2]), logits};
      };
      model = m;
    } else {
      auto m = std::make_shared<models::BertForSequenceClassification>(
          bert_config(batch), config_value(batch, "num_labels"));
      m->load_hf_state_dict(weights);
      forward = [m](const std::vector<Tensor>& a) {
        const Tensor logits = m->forward(a[0], a[1], a[3]);
        return std::vector<Tensor>{nn::functional::cross_entropy(logits, a[2]), logits};
      };
      model = m;
    }
  } else if (kind == "gpt2") {
    auto m = std::make_shared<models::GPT2LMHeadModel>(gpt2_config(batch));
    m->load_hf_state_dict(weights);
    forward = [m](const std::vector<Tensor>& a) {
      const Tensor logits = m->forward(a[0], a[1]);
      return std::vector<Tensor>{models::causal_lm_loss(logits, a[2]), logits};
    };
    model = m;
  } else {
    fail("transformers_parity_dump: MODEL {}: expected bert-mlm, bert-cls or gpt2", kind);
  }
  model->train();  // dropout is 0: training mode computes what eval would

  auto step = [&forward](const std::vector<Tensor>& a) {
    std::vector<Tensor> out = forward(a);
    out[0].backward();
    return std::vector<Tensor>{out[0].detach(), out[1].detach()};
  };
  const std::vector<Tensor> out = compiled ? compile(step, {.fullgraph = true})(args) : step(args);

  StateDict result{{"loss", out[0]}, {"logits", out[1]}};
  for (const auto& [name, p] : model->named_parameters()) {
    KILN_CHECK(p.grad().defined(), "transformers_parity_dump: parameter {} got no gradient", name);
    result["grad." + name] = p.grad();
  }
  save_safetensors(result, out_path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool compiled = argc == 6 && std::strcmp(argv[5], "--compile") == 0;
  if (argc != 5 && !compiled) {
    std::fprintf(stderr,
                 "usage: %s bert-mlm|bert-cls|gpt2 WEIGHTS.safetensors BATCH.safetensors "
                 "OUT.safetensors [--compile]\n",
                 argv[0]);
    return 2;
  }
  try {
    return run(argv[1], argv[2], argv[3], argv[4], compiled);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
