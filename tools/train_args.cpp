// kiln-train's command line.
#include <fmt/format.h>

#include <charconv>
#include <functional>
#include <map>
#include <string>

#include "core/error.h"
#include "tools/trainer.h"

namespace kiln::train {

namespace {

int64_t parse_int(const std::string& option, const std::string& text) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  KILN_CHECK(ec == std::errc() && end == text.data() + text.size(), "kiln-train: {} {}: expected an integer", option,
             text);
  return v;
}

double parse_double(const std::string& option, const std::string& text) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  fail("kiln-train: {} {}: expected a number", option, text);
}

// "512M", "8G", "1000000": bytes.
int64_t parse_bytes(const std::string& option, const std::string& text) {
  KILN_CHECK(!text.empty(), "kiln-train: {}: expected a size such as 4G", option);
  int64_t scale = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K': case 'k': scale = int64_t{1} << 10; digits.pop_back(); break;
    case 'M': case 'm': scale = int64_t{1} << 20; digits.pop_back(); break;
    case 'G': case 'g': scale = int64_t{1} << 30; digits.pop_back(); break;
    default: break;
  }
  return parse_int(option, digits) * scale;
}

}  // namespace

std::string usage() {
  return R"(usage: kiln-train [options]

Trains a model of kiln's zoo on an image data set, eagerly on the CPU.

data and model:
  --data D             synthetic | fashion-mnist | shapes | DIR (DIR/train/<class>/*.jpg, DIR/val/...)  [synthetic]
  --arch A             resnet18 | resnet34 | resnet50 | resnet101 | resnet152 | mlp | cnn  [resnet50]
  --image-size N       resize images to N x N  [the data set's own: 224, 28, 64]
  --train-samples N    train on an evenly spaced subset of N samples  [all]
  --val-samples N      validate on an evenly spaced subset of N samples  [all]
  --workers N          loader threads  [2]
  --skip-bad-images    skip (and count) unreadable or corrupt images instead of stopping
optimization:
  --epochs N           passes over the training data  [1]
  --steps N            stop after N optimizer steps in all (overrides --epochs)
  --batch N            global batch: samples per optimizer step  [32]
  --micro-batch N|auto samples per forward/backward; gradients accumulate exactly  [--batch]
  --memory-budget B    bytes --micro-batch auto may use, e.g. 4G  [half the available memory]
  --optimizer O        sgd | adamw  [sgd]
  --lr X               learning rate  [0.1]
  --lr-schedule S      constant | cosine | step | multistep | onecycle  [cosine]
  --warmup N           linear warmup steps  [0]
  --momentum X         SGD momentum  [0.9]
  --weight-decay X     decoupled for adamw; biases and norm weights exempt  [5e-5]
  --label-smoothing X  [0]
  --seed N             weights, order and augmentation all follow from it  [0]
run:
  --checkpoint DIR     save a checkpoint there after every epoch (and on Ctrl-C)
  --resume             continue from DIR's latest checkpoint (same settings)
  --log FILE           JSON lines: one per step, one per epoch
  --plot FILE          SVG of loss and accuracy  [DIR/curves.svg with --checkpoint]
  --print-every N      steps between progress lines when not on a terminal  [50]
  --cache-dir DIR      where --data shapes is generated  [$KILN_CACHE_DIR or ~/.cache/kiln]
  --device cpu|cuda    [cpu]
  --compile [MODE]     run forward, loss and backward compiled (kiln::compile; MODE: default,
                       reduce-overhead (CUDA graphs) or max-autotune (and timed launches))  [default]
  --channels-last      NHWC batches: eager and compiled steps run their convolution region NHWC
  --amp                not available yet (a later issue)
  --help
)";
}

Config parse_args(int argc, const char* const* argv) {
  Config c;
  using Setter = std::function<void(const std::string& option, const std::string& value)>;
  const std::map<std::string, Setter> valued = {
      {"--data", [&](auto&, auto& v) { c.data = v; }},
      {"--arch", [&](auto&, auto& v) { c.arch = v; }},
      {"--epochs", [&](auto& o, auto& v) { c.epochs = parse_int(o, v); }},
      {"--steps", [&](auto& o, auto& v) { c.steps = parse_int(o, v); }},
      {"--batch", [&](auto& o, auto& v) { c.batch = parse_int(o, v); }},
      {"--micro-batch",
       [&](auto& o, auto& v) {
         if (v == "auto") c.micro_batch_auto = true;
         else {
           c.micro_batch = parse_int(o, v);
           KILN_CHECK(c.micro_batch > 0, "kiln-train: --micro-batch {}: expected a positive integer or auto", v);
         }
       }},
      {"--memory-budget", [&](auto& o, auto& v) { c.memory_budget = parse_bytes(o, v); }},
      {"--lr", [&](auto& o, auto& v) { c.lr = parse_double(o, v); }},
      {"--lr-schedule", [&](auto&, auto& v) { c.lr_schedule = v; }},
      {"--warmup", [&](auto& o, auto& v) { c.warmup = parse_int(o, v); }},
      {"--optimizer", [&](auto&, auto& v) { c.optimizer = v; }},
      {"--momentum", [&](auto& o, auto& v) { c.momentum = parse_double(o, v); }},
      {"--weight-decay", [&](auto& o, auto& v) { c.weight_decay = parse_double(o, v); }},
      {"--label-smoothing", [&](auto& o, auto& v) { c.label_smoothing = parse_double(o, v); }},
      {"--image-size", [&](auto& o, auto& v) { c.image_size = parse_int(o, v); }},
      {"--train-samples", [&](auto& o, auto& v) { c.train_samples = parse_int(o, v); }},
      {"--val-samples", [&](auto& o, auto& v) { c.val_samples = parse_int(o, v); }},
      {"--workers", [&](auto& o, auto& v) { c.workers = parse_int(o, v); }},
      {"--device", [&](auto&, auto& v) { c.device = v; }},
      {"--seed", [&](auto& o, auto& v) { c.seed = static_cast<uint64_t>(parse_int(o, v)); }},
      {"--checkpoint", [&](auto&, auto& v) { c.checkpoint_dir = v; }},
      {"--log", [&](auto&, auto& v) { c.log_file = v; }},
      {"--plot", [&](auto&, auto& v) { c.plot_file = v; }},
      {"--print-every", [&](auto& o, auto& v) { c.print_every = parse_int(o, v); }},
      {"--cache-dir", [&](auto&, auto& v) { c.cache_dir = v; }},
  };
  const std::map<std::string, bool*> flags = {
      {"--amp", &c.amp}, {"--channels-last", &c.channels_last}, {"--resume", &c.resume},
      {"--skip-bad-images", &c.skip_bad_images}};

  for (int i = 1; i < argc; ++i) {
    std::string option = argv[i], value;
    if (option == "--help" || option == "-h") throw HelpRequested{usage()};
    const size_t eq = option.find('=');
    const bool inline_value = option.starts_with("--") && eq != std::string::npos;
    if (inline_value) {
      value = option.substr(eq + 1);
      option = option.substr(0, eq);
    }
    if (option == "--compile") {
      c.compile = true;
      // An optional mode: --compile=MODE, or --compile MODE with a mode's name.
      if (inline_value) c.compile_mode = value;
      else if (i + 1 < argc && (std::string(argv[i + 1]) == "default" || std::string(argv[i + 1]) == "reduce-overhead" ||
                                std::string(argv[i + 1]) == "max-autotune"))
        c.compile_mode = argv[++i];
      continue;
    }
    if (auto f = flags.find(option); f != flags.end()) {
      KILN_CHECK(!inline_value, "kiln-train: {} takes no value", option);
      *f->second = true;
      continue;
    }
    auto s = valued.find(option);
    KILN_CHECK(s != valued.end(), "kiln-train: unknown option {} (see kiln-train --help)", option);
    if (!inline_value) {
      KILN_CHECK(i + 1 < argc, "kiln-train: {} needs a value", option);
      value = argv[++i];
    }
    s->second(option, value);
  }
  return c;
}

}  // namespace kiln::train
