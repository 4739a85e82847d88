// The kiln half of the ResNet-18 parity check (resnet18_parity.py holds the torchvision half).
//
//   kiln-resnet18-parity-dump IN.safetensors OUT.safetensors
//
// IN holds "input" [N, 3, H, W] f32, "target" [N] i64 and the model's state dict under
// "model.<key>" (torchvision's keys). The program builds resnet18 with fc's class count,
// loads the state dict strictly, runs one training-mode forward, cross_entropy (mean) and
// backward, and writes to OUT: "loss" (0-d), "logits", "grad.<parameter>" for every
// parameter and "buffer.<name>" for every buffer after the step (BatchNorm's running
// statistics moved by the batch).
#include <kiln.h>

#include <cstdio>
#include <exception>
#include <string>

#include "models/resnet.h"

namespace {

const std::string kModelPrefix = "model.";

int run(const std::string& in_path, const std::string& out_path) {
  using namespace kiln;
  const StateDict in = load_safetensors(in_path);
  StateDict state;
  for (const auto& [name, t] : in) {
    if (name.starts_with(kModelPrefix)) state[name.substr(kModelPrefix.size())] = t;
  }
  KILN_CHECK(in.count("input") && in.count("target") && state.count("fc.weight"),
             "resnet18_parity_dump: {} needs 'input', 'target' and 'model.fc.weight'", in_path);

  models::ResNet net = models::resnet18({.num_classes = state.at("fc.weight").shape()[0]});
  net.load_state_dict(state);
  net.train();
  const Tensor logits = net(in.at("input"));
  const Tensor loss = nn::functional::cross_entropy(logits, in.at("target"));
  loss.backward();

  StateDict out{{"loss", loss.detach()}, {"logits", logits.detach()}};
  for (const auto& [name, p] : net.named_parameters()) {
    KILN_CHECK(p.grad().defined(), "resnet18_parity_dump: parameter {} got no gradient", name);
    out["grad." + name] = p.grad();
  }
  for (const auto& [name, b] : net.named_buffers()) out["buffer." + name] = b;
  save_safetensors(out, out_path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IN.safetensors OUT.safetensors\n", argv[0]);
    return 2;
  }
  try {
    return run(argv[1], argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
