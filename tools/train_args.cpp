// kiln-train's command line.
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>
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
  int64_t bytes = 0;
  KILN_CHECK(!__builtin_mul_overflow(parse_int(option, digits), scale, &bytes),
             "kiln-train: {} {}: more bytes than can be counted", option, text);
  return bytes;
}

bool one_of(const std::string& value, std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (value == name) return true;
  return false;
}

}  // namespace

std::string task_of(const Config& c) {
  if (!c.task.empty()) return c.task;
  return c.arch.starts_with("bert-") ? "mlm" : c.arch.starts_with("gpt2-") ? "clm" : "classify";
}

void validate(const Config& c) {
  // Names (the data set is checked when it is opened: it may be a folder or a file).
  KILN_CHECK(one_of(c.arch, {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "mlp", "cnn", "bert-tiny",
                             "bert-mini", "bert-base", "bert-large", "gpt2-tiny", "gpt2-mini", "gpt2-small"}),
             "kiln-train: --arch {}: expected resnet18, resnet34, resnet50, resnet101, resnet152, mlp, cnn, bert-tiny, "
             "bert-mini, bert-base, bert-large, gpt2-tiny, gpt2-mini or gpt2-small", c.arch);
  const std::string task = task_of(c);
  KILN_CHECK(one_of(task, {"mlm", "clm", "classify"}), "kiln-train: --task {}: expected mlm, clm or classify", task);
  KILN_CHECK(one_of(c.optimizer, {"sgd", "adamw"}), "kiln-train: --optimizer {}: expected sgd or adamw", c.optimizer);
  KILN_CHECK(one_of(c.lr_schedule, {"constant", "cosine", "linear", "step", "multistep", "onecycle"}),
             "kiln-train: --lr-schedule {}: expected constant, cosine, linear, step, multistep or onecycle",
             c.lr_schedule);
  KILN_CHECK(one_of(c.weight_decay_scope, {"all", "no-norm-bias"}),
             "kiln-train: --weight-decay-scope {}: expected all or no-norm-bias", c.weight_decay_scope);
  KILN_CHECK(c.device == "cpu" || c.device == "cuda", "kiln-train: --device {}: expected cpu or cuda", c.device);
  KILN_CHECK(one_of(c.amp, {"off", "bf16", "fp16", "auto"}), "kiln-train: --amp {}: expected off, bf16, fp16 or auto",
             c.amp);
  KILN_CHECK(one_of(c.loss_scale, {"auto", "dynamic", "none"}),
             "kiln-train: --loss-scale {}: expected auto, dynamic or none", c.loss_scale);
  KILN_CHECK(!c.compile || one_of(c.compile_mode, {"default", "reduce-overhead", "max-autotune"}),
             "kiln-train: --compile {}: expected default, reduce-overhead or max-autotune", c.compile_mode);

  // Counts and sizes. The bounds are far beyond any run that fits a machine; they keep the
  // loop's arithmetic (steps = epochs * batches, batch * sample bytes) from overflowing.
  KILN_CHECK(c.epochs >= 0 && c.epochs <= kMaxEpochs, "kiln-train: --epochs {} must be between 0 and {}", c.epochs,
             kMaxEpochs);
  KILN_CHECK(c.steps >= 0 && c.steps <= kMaxSteps, "kiln-train: --steps {} must be between 0 and {}", c.steps,
             kMaxSteps);
  KILN_CHECK(c.epochs > 0 || c.steps > 0, "kiln-train: give --epochs or --steps a positive value");
  KILN_CHECK(c.batch >= 1 && c.batch <= kMaxBatch, "kiln-train: --batch {} must be between 1 and {}", c.batch,
             kMaxBatch);
  KILN_CHECK(c.micro_batch >= 0 && c.micro_batch <= c.batch,
             "kiln-train: --micro-batch {} must be between 1 and --batch {}", c.micro_batch, c.batch);
  KILN_CHECK(c.memory_budget >= 0, "kiln-train: --memory-budget {} must not be negative", c.memory_budget);
  KILN_CHECK(c.warmup >= 0 && c.warmup <= kMaxSteps, "kiln-train: --warmup {} must be between 0 and {}", c.warmup,
             kMaxSteps);
  KILN_CHECK(c.image_size >= 0 && c.image_size <= kMaxImageSize,
             "kiln-train: --image-size {} must be between 1 and {} (0: the data set's own)", c.image_size,
             kMaxImageSize);
  KILN_CHECK(c.pad >= 0 && c.pad <= kMaxImageSize / 2 && c.image_size + 2 * c.pad <= kMaxImageSize,
             "kiln-train: --pad {} must be 0 or more, and the padded image at most {} pixels wide", c.pad,
             kMaxImageSize);
  KILN_CHECK(c.pad == 0 || c.data != "synthetic",
             "kiln-train: --pad {}: synthetic data are generated at their size (give --image-size)", c.pad);
  KILN_CHECK(c.max_image_pixels >= 0, "kiln-train: --max-image-pixels {} must not be negative (0: the default)",
             c.max_image_pixels);
  KILN_CHECK(c.workers >= 0 && c.workers <= kMaxWorkers, "kiln-train: --workers {} must be between 0 and {}",
             c.workers, kMaxWorkers);
  KILN_CHECK(c.train_samples >= 0, "kiln-train: --train-samples {} must not be negative", c.train_samples);
  KILN_CHECK(c.val_samples >= 0, "kiln-train: --val-samples {} must not be negative", c.val_samples);
  KILN_CHECK(c.print_every >= 1, "kiln-train: --print-every {} must be at least 1", c.print_every);
  KILN_CHECK(c.synthetic_size >= 1 && c.synthetic_size <= (int64_t{1} << 40),
             "kiln-train: {} synthetic samples: expected between 1 and 2^40", c.synthetic_size);
  KILN_CHECK(c.synthetic_classes >= 1 && c.synthetic_classes <= (int64_t{1} << 31),
             "kiln-train: {} synthetic classes: expected between 1 and 2^31", c.synthetic_classes);
  KILN_CHECK(c.stop_after_steps >= 0 && c.stop_after_steps <= kMaxSteps,
             "kiln-train: stop after {} steps: expected between 0 and {}", c.stop_after_steps, kMaxSteps);

  // Rates: finite (an infinite or NaN rate trains on NaN losses).
  KILN_CHECK(std::isfinite(c.lr) && c.lr >= 0, "kiln-train: --lr {} must be a finite number, 0 or more", c.lr);
  KILN_CHECK(std::isfinite(c.momentum) && c.momentum >= 0,
             "kiln-train: --momentum {} must be a finite number, 0 or more", c.momentum);
  KILN_CHECK(std::isfinite(c.weight_decay) && c.weight_decay >= 0,
             "kiln-train: --weight-decay {} must be a finite number, 0 or more", c.weight_decay);
  KILN_CHECK(std::isfinite(c.clip_grad_norm) && c.clip_grad_norm >= 0,
             "kiln-train: --clip-grad-norm {} must be a finite number, 0 (off) or more", c.clip_grad_norm);
  KILN_CHECK(c.label_smoothing >= 0 && c.label_smoothing <= 1, "kiln-train: --label-smoothing {} must be in [0, 1]",
             c.label_smoothing);

  // Combinations.
  KILN_CHECK(!c.nesterov || (c.optimizer == "sgd" && c.momentum > 0),
             "kiln-train: --nesterov needs --optimizer sgd and a positive --momentum (got {}, momentum {})",
             c.optimizer, c.momentum);
  KILN_CHECK(!c.channels_last || !c.no_channels_last, "kiln-train: give --channels-last or --no-channels-last, not both");
  KILN_CHECK(!c.channels_last || c.arch != "mlp",
             "kiln-train: --channels-last needs a convolutional --arch (the mlp flattens its input)");
  KILN_CHECK(!c.resume || !c.checkpoint_dir.empty(), "kiln-train: --resume needs --checkpoint DIR");
  KILN_CHECK(!c.sync_bn || !c.compile,
             "kiln-train: --sync-bn runs the step eagerly (SyncBatchNorm's all-reduces cannot be part of a "
             "compiled program yet): drop --compile, or --sync-bn");
  KILN_CHECK(!c.compile_whole_step || c.compile,
             "kiln-train: --compile-whole-step needs --compile (it compiles the whole optimizer step as one graph)");
  KILN_CHECK(c.loss_scale != "dynamic" || c.amp != "off",
             "kiln-train: --loss-scale dynamic needs --amp (f32 gradients do not underflow)");

  // The transformers train on text; the image models on images.
  if (is_text_arch(c.arch)) {
    KILN_CHECK(c.arch.starts_with("bert-") ? task != "clm" : task == "clm",
               "kiln-train: --arch {} --task {}: {}", c.arch, task,
               c.arch.starts_with("bert-") ? "BERT learns mlm (masked LM) or classify (a label per text)"
                                           : "GPT-2 learns clm (the next token)");
    KILN_CHECK(!one_of(c.data, {"synthetic", "fashion-mnist", "shapes"}),
               "kiln-train: --arch {} trains on text: --data wordnet (WordNet's glosses), a folder of WordNet's data "
               "files or a text file (documents separated by blank lines), not {}",
               c.arch, c.data);
    KILN_CHECK(c.seq_len >= 2 && c.seq_len <= kMaxSeqLen, "kiln-train: --seq-len {} must be between 2 and {}",
               c.seq_len, kMaxSeqLen);
    KILN_CHECK(c.mlm_probability > 0 && c.mlm_probability <= 1,
               "kiln-train: --mlm-probability {} must be in (0, 1]", c.mlm_probability);
    KILN_CHECK(c.vocab_size >= 8 && c.vocab_size <= kMaxVocabSize,
               "kiln-train: --vocab-size {} must be between 8 and {}", c.vocab_size, kMaxVocabSize);
    KILN_CHECK(c.image_size == 0 && c.pad == 0 && !c.channels_last && !c.zero_init_residual,
               "kiln-train: --arch {} trains on text: --image-size, --pad, --channels-last and "
               "--zero-init-residual are for the image models",
               c.arch);
    KILN_CHECK(!c.micro_batch_auto,
               "kiln-train: --micro-batch auto measures image batches; give --arch {} a --micro-batch N", c.arch);
  } else {
    KILN_CHECK(task == "classify", "kiln-train: --task {}: the image models classify (mlm and clm are for bert-* "
               "and gpt2-*)", task);
    KILN_CHECK(c.init.empty() && c.vocab.empty(),
               "kiln-train: --init and --vocab are for the transformers (resume an image model with --resume)");
  }
}

std::vector<std::string> pytorch_differences(const Config& c) {
  std::vector<std::string> out;
  if (c.zero_init_residual && c.arch.starts_with("resnet")) out.push_back("zero-init-residual on");
  if (c.weight_decay > 0 && c.weight_decay_scope == "no-norm-bias")
    out.push_back("weight decay skips norms and biases");
  if (c.nesterov) out.push_back("Nesterov momentum");
  if (c.label_smoothing > 0) out.push_back(fmt::format("label smoothing {}", c.label_smoothing));
  if (c.data == "fashion-mnist" && c.image_size > 0 && c.image_size != 28)
    out.push_back(fmt::format("images stretched 28 -> {} (bilinear)", c.image_size));
  return out;
}

std::string usage() {
  return fmt::format(R"(usage: kiln-train [options]

Trains a model of kiln's zoo on an image data set, or a transformer on text (masked or
causal language modelling, or fine-tuning a classifier): eagerly, or compiled with --compile;
on the CPU, or on a CUDA GPU with --device cuda. The first lines of a run list the
settings that differ from PyTorch's defaults.

data and model:
  --data D             synthetic | fashion-mnist | shapes | DIR (DIR/train/<class>/*.jpg, DIR/val/...)  [synthetic]
  --arch A             resnet18 | resnet34 | resnet50 | resnet101 | resnet152 | mlp | cnn  [resnet50]
                       | bert-tiny | bert-mini | bert-base | bert-large | gpt2-tiny | gpt2-mini | gpt2-small
  --image-size N       resize images to N x N, bilinear (1 to {})  [the data set's own: 224, 28, 64]
  --pad N              then pad each side with N black pixels, e.g. Fashion-MNIST 28 -> 32 with --pad 2  [0]
  --zero-init-residual each ResNet block's last batch norm weight starts at 0 (off, as torchvision)
  --train-samples N    train on an evenly spaced subset of N samples  [all]
  --val-samples N      validate on an evenly spaced subset of N samples  [all]
  --workers N          loader threads (0 to {})  [2]
  --skip-bad-images    skip (and count) unreadable or corrupt images instead of stopping
  --max-image-pixels N refuse a decoded or resized image of more pixels (a corrupt or hostile header)  [2^27]
text (the transformers):
  --data wordnet|FILE  WordNet's glosses (Debian's wordnet-base; a folder of its data files works
                       too), or a text file of documents separated by blank lines  [wordnet]
  --task T             mlm (masked LM, 15% of tokens, 80/10/10) | clm (next token) | classify
                       (WordNet's glosses labelled with their 45 lexicographer files)
                       [mlm for bert-*, clm for gpt2-*]
  --mlm-probability X  mlm: the share of tokens chosen, then 80% [MASK], 10% random, 10% kept  [0.15]
  --seq-len N          tokens per sequence: packed blocks (mlm, clm), the longest text (classify)  [128]
  --vocab FILE         a WordPiece vocab.txt  [--init's, else one trained on the training corpus,
                       saved as DIR/vocab.txt with --checkpoint]
  --vocab-size N       the size of the vocabulary trained  [4096]
  --init PATH          start from these weights (fine-tuning): a checkpoint folder (its latest),
                       one step-N folder or a .safetensors file (Hugging Face's names load); the
                       weights the model has and the file lacks (a new head) start fresh
  the transformers' defaults: --optimizer adamw --lr 5e-4 --lr-schedule linear --weight-decay 0.01
  --weight-decay-scope no-norm-bias --clip-grad-norm 1
optimization:
  --epochs N           passes over the training data  [1]
  --steps N            stop after N optimizer steps in all (overrides --epochs)
  --batch N            global batch: samples per optimizer step; with batch norm, a last batch
                       of 1 sample is dropped  [32]
  --micro-batch N|auto samples per forward/backward; gradients accumulate exactly  [--batch]
  --memory-budget B    bytes --micro-batch auto may use, e.g. 4G  [half the available memory]
  --optimizer O        sgd | adamw  [sgd]
  --lr X               learning rate  [0.1]
  --lr-schedule S      constant | cosine | linear | step | multistep | onecycle  [cosine]
  --warmup N           linear warmup steps  [0]
  --momentum X         SGD momentum  [0.9]
  --nesterov           SGD with Nesterov momentum
  --weight-decay X     L2 for sgd, decoupled for adamw  [5e-5]
  --weight-decay-scope all | no-norm-bias: decay every parameter (as PyTorch), or exempt
                       biases and norm weights (every 1-d parameter)  [all]
  --label-smoothing X  [0]
  --seed N             weights, order and augmentation all follow from it  [0]
run:
  --checkpoint DIR     save a checkpoint there after every epoch (and on Ctrl-C)
  --resume             continue from DIR's latest checkpoint (same settings)
  --log FILE           JSON lines: one per step, one per epoch
  --plot FILE          SVG of loss and accuracy  [DIR/curves.svg with --checkpoint]
  --print-every N      steps between progress lines when not on a terminal  [50]
  --cache-dir DIR      where --data shapes is generated  [the kernel cache's root: $KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln or ~/.cache/kiln]
  --device cpu|cuda    [cpu]
  --compile [MODE]     run forward, loss and backward compiled (kiln::compile; MODE: default,
                       reduce-overhead (CUDA graphs) or max-autotune (and timed launches))  [default]
  --compile-whole-step with --compile: the whole optimizer step (micro-steps and update) as one
                       graph, also on the CPU  [with --device cuda and reduce-overhead or
                       max-autotune; never in data-parallel runs]
  --channels-last      NHWC batches: eager and compiled steps run their convolution region NHWC
                       [on with --device cuda for convolutional archs, off on the CPU]
  --no-channels-last   NCHW batches (a compiled step's layout pass still runs its convolutions NHWC)
  --amp off|bf16|fp16|auto
                       mixed precision: autocast runs GEMMs and convolutions in bf16 or f16
                       (weights and their gradients stay f32); auto picks bf16 on the CPU and on
                       GPUs from compute capability 8.0, fp16 with loss scaling before  [off]
  --loss-scale auto|dynamic|none
                       dynamic loss scaling (optim::GradScaler); auto: with fp16 only  [auto]
  --clip-grad-norm X   clip the gradients' total 2-norm to X before each step (0: off)  [0]
  --sync-bn            under a launcher (data parallel): batch norm statistics over every
                       rank's batch (dist::SyncBatchNorm; eager steps only)
  --help
progress: the epoch's running mean loss (per token for mlm and clm, with its accuracy), images
or tokens per second and the time left of the whole run.
A step whose loss is not finite stops the run with an error naming it.
)",
                     kMaxImageSize, kMaxWorkers);
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
      {"--weight-decay-scope", [&](auto&, auto& v) { c.weight_decay_scope = v; }},
      {"--pad", [&](auto& o, auto& v) { c.pad = parse_int(o, v); }},
      {"--label-smoothing", [&](auto& o, auto& v) { c.label_smoothing = parse_double(o, v); }},
      {"--image-size", [&](auto& o, auto& v) { c.image_size = parse_int(o, v); }},
      {"--max-image-pixels", [&](auto& o, auto& v) { c.max_image_pixels = parse_int(o, v); }},
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
      {"--amp", [&](auto&, auto& v) { c.amp = v; }},
      {"--loss-scale", [&](auto&, auto& v) { c.loss_scale = v; }},
      {"--clip-grad-norm", [&](auto& o, auto& v) { c.clip_grad_norm = parse_double(o, v); }},
      {"--task", [&](auto&, auto& v) { c.task = v; }},
      {"--seq-len", [&](auto& o, auto& v) { c.seq_len = parse_int(o, v); }},
      {"--vocab", [&](auto&, auto& v) { c.vocab = v; }},
      {"--vocab-size", [&](auto& o, auto& v) { c.vocab_size = parse_int(o, v); }},
      {"--init", [&](auto&, auto& v) { c.init = v; }},
      {"--mlm-probability", [&](auto& o, auto& v) { c.mlm_probability = parse_double(o, v); }},
  };
  // Options given, so that the transformers' defaults fill only the others.
  std::set<std::string> given;
  const std::map<std::string, bool*> flags = {
      {"--channels-last", &c.channels_last}, {"--no-channels-last", &c.no_channels_last}, {"--resume", &c.resume},
      {"--skip-bad-images", &c.skip_bad_images}, {"--nesterov", &c.nesterov},
      {"--zero-init-residual", &c.zero_init_residual}, {"--sync-bn", &c.sync_bn},
      {"--compile-whole-step", &c.compile_whole_step}};

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
      given.insert(option);
      c.compile = true;
      // An optional mode: --compile=MODE, or --compile MODE with a mode's name.
      if (inline_value) c.compile_mode = value;
      else if (i + 1 < argc && (std::string(argv[i + 1]) == "default" || std::string(argv[i + 1]) == "reduce-overhead" ||
                                std::string(argv[i + 1]) == "max-autotune"))
        c.compile_mode = argv[++i];
      continue;
    }
    given.insert(option);
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
  // The transformers' usual recipe (BERT's and GPT-2's papers, Hugging Face's Trainer):
  // AdamW, linear decay, weight decay 0.01 that spares biases and LayerNorm weights, the
  // gradients' norm clipped to 1.
  if (is_text_arch(c.arch)) {
    const auto fill = [&](const char* option, auto& field, auto value) {
      if (!given.contains(option)) field = value;
    };
    fill("--data", c.data, std::string("wordnet"));
    fill("--optimizer", c.optimizer, std::string("adamw"));
    fill("--lr", c.lr, 5e-4);
    fill("--lr-schedule", c.lr_schedule, std::string("linear"));
    fill("--weight-decay", c.weight_decay, 0.01);
    fill("--weight-decay-scope", c.weight_decay_scope, std::string("no-norm-bias"));
    fill("--clip-grad-norm", c.clip_grad_norm, 1.0);
  }
  validate(c);
  // channels-last is CUDA's default for convolutional archs (cuDNN's tensor-core kernels are NHWC).
  if (c.device == "cuda" && c.arch != "mlp" && !c.no_channels_last) c.channels_last = true;
  return c;
}

}  // namespace kiln::train
