#pragma once
// The training loop behind kiln-train and `kiln-bench train`: data set and model from a
// Config, exact gradient accumulation, validation, logs, checkpoints and resume.
//
// A run is a pure function of its Config: the model's initial weights come from
// manual_seed(seed), the loader's order and augmentations from (seed, epoch, sample), and a
// checkpoint holds everything that changes during a run (weights, optimizer state, the
// schedule's step, the random generator, the loader's epoch and batch, the history). So a
// run that is interrupted and resumed ends with the same weights as one that is not.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "data/dataset.h"
#include "dist/data_parallel.h"
#include "models/module.h"
#include "models/state_dict.h"
#include "optim/accumulation.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"

namespace kiln::train {

struct Config {
  // synthetic | fashion-mnist | shapes | a folder with train/ (and val/) for the image
  // models; wordnet | a text file (documents separated by blank lines) for the transformers
  std::string data = "synthetic";
  std::string arch = "resnet50";  // resnet18|34|50|101|152 | mlp | cnn | bert-tiny|mini|base|large | gpt2-tiny|mini|small
  // What the transformers learn: mlm (masked LM, BERT's pretraining), clm (next token,
  // GPT-2's) or classify (a label per text: WordNet's glosses and their 45 lexicographer
  // files, BERT only). parse_args resolves the default: mlm for bert-*, clm for gpt2-*,
  // classify for the image models (the only task they have).
  std::string task;
  int64_t seq_len = 128;           // tokens per sequence (packed blocks; classification's longest text)
  std::filesystem::path vocab;     // a WordPiece vocab.txt (empty: --init's, or one trained on the corpus)
  int64_t vocab_size = 4096;       // the vocabulary trained when there is none to read
  double mlm_probability = 0.15;   // mlm: the share of tokens masked (BERT's 15%; 80/10/10 of them)
  std::filesystem::path init;      // start from these weights: a checkpoint folder or a .safetensors file
  int64_t epochs = 1;
  int64_t steps = 0;             // stop after this many optimizer steps in all (0: epochs decide)
  int64_t batch = 32;            // the global batch: samples per optimizer step
  int64_t micro_batch = 0;       // samples per forward/backward (0: the whole batch)
  bool micro_batch_auto = false;  // measure, then pick the largest micro-batch that fits
  int64_t memory_budget = 0;     // bytes for micro_batch_auto (0: half the memory available)
  double lr = 0.1;
  std::string lr_schedule = "cosine";  // constant | cosine | step | multistep | onecycle
  int64_t warmup = 0;                  // linear warmup steps before the schedule
  std::string optimizer = "sgd";       // sgd | adamw
  double momentum = 0.9;
  bool nesterov = false;  // SGD's Nesterov momentum
  double weight_decay = 5e-5;
  std::string weight_decay_scope = "all";  // all (as PyTorch) | no-norm-bias (1-d parameters exempt)
  double label_smoothing = 0.0;
  bool zero_init_residual = false;  // each ResNet block's last batch norm weight starts at 0
  int64_t image_size = 0;  // resize to this (0: the data set's natural size)
  int64_t pad = 0;         // then pad each side with this many black pixels
  int64_t workers = 2;
  bool skip_bad_images = false;  // skip and count unreadable images instead of stopping
  int64_t max_image_pixels = 0;  // refuse images larger than this (0: data::kDefaultMaxImagePixels)
  std::string device = "cpu";
  bool compile = false;  // run each micro-step (forward, loss, backward, accumulation) compiled
  // With compile: the whole optimizer step (micro-steps and update) as one graph, also where
  // choose_step_graph would pick the micro-steps (the CPU); data-parallel runs still cannot.
  bool compile_whole_step = false;
  bool sync_bn = false;  // data parallel: batch norm statistics over every rank's batch (SyncBatchNorm)
  std::string compile_mode = "default";  // kiln::compile's mode
  std::string amp = "off";          // off | bf16 | fp16 | auto: the dtype autocast runs GEMMs and convolutions in
  std::string loss_scale = "auto";  // auto (dynamic with fp16, none otherwise) | dynamic | none
  double clip_grad_norm = 0;        // clip the gradients' total 2-norm to this before each step (0: off)
  // NHWC batches and convolution regions (eager and compiled). Off by default on the CPU;
  // on by default on CUDA for convolutional archs, where cuDNN's tensor-core convolutions
  // are NHWC (--no-channels-last keeps NCHW). parse_args resolves the default.
  bool channels_last = false;
  bool no_channels_last = false;  // --no-channels-last
  uint64_t seed = 0;
  std::filesystem::path checkpoint_dir;  // empty: no checkpoints (Ctrl-C still saves one)
  bool resume = false;
  std::filesystem::path log_file;   // JSON lines; empty: none
  std::filesystem::path plot_file;  // SVG of loss and accuracy; empty: <checkpoint_dir>/curves.svg or none
  int64_t train_samples = 0;  // train on an evenly spaced subset of this many samples (0: all)
  int64_t val_samples = 0;    // validate on an evenly spaced subset (0: all)
  int64_t print_every = 50;   // steps between plain progress lines when not on a terminal
  std::filesystem::path cache_dir;  // where --data shapes is generated (empty: $KILN_CACHE_DIR or ~/.cache/kiln)
  int64_t synthetic_size = 1024;     // samples of --data synthetic
  int64_t synthetic_classes = 1000;
  // Stop after this many optimizer steps of this run and save a checkpoint, as Ctrl-C
  // does (0: never). Tests interrupt runs with it.
  int64_t stop_after_steps = 0;
  bool quiet = false;  // no progress output (tests)
};

// config.task, or the default for config.arch: mlm for bert-*, clm for gpt2-*, classify for
// the image models.
std::string task_of(const Config& config);

// Parses kiln-train's command line (argv[0] is skipped) and validates it. --help throws
// HelpRequested.
Config parse_args(int argc, const char* const* argv);
// Throws kiln::Error naming the setting when a value is out of range or a name is unknown
// (what needs no data set or device: sizes, counts, rates, names, combinations). Limits:
inline constexpr int64_t kMaxWorkers = 256;
inline constexpr int64_t kMaxImageSize = 4096;             // --image-size, and with --pad
inline constexpr int64_t kMaxBatch = int64_t{1} << 24;     // --batch
inline constexpr int64_t kMaxEpochs = 1'000'000;           // --epochs
inline constexpr int64_t kMaxSteps = 1'000'000'000'000;    // --steps, --warmup, --stop-after
inline constexpr int64_t kMaxSeqLen = 65536;               // --seq-len
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 20;  // --vocab-size
void validate(const Config& config);
// The settings of `config` that differ from PyTorch's defaults (torchvision's ResNet,
// torch.optim, nn.CrossEntropyLoss, torchvision's datasets), one phrase each, such as
// "zero-init-residual on"; empty when there are none.
std::vector<std::string> pytorch_differences(const Config& config);
struct HelpRequested {
  std::string text;
};
std::string usage();

struct EpochRecord {
  int64_t epoch = 0;  // from 0
  double train_loss = 0, train_accuracy = 0;
  double val_loss = 0, val_accuracy = 0;
  double images_per_second = 0;  // tokens per second for the transformers
};

struct Result {
  StateDict model;  // the final weights and buffers
  std::vector<EpochRecord> epochs;
  std::vector<double> step_losses;  // every optimizer step's global-batch mean loss (per token: mlm, clm)
  int64_t steps = 0;                // optimizer steps done in all
  int64_t micro_batch = 0;          // the micro-batch used
  bool interrupted = false;         // stopped early by Ctrl-C or stop_after_steps
  int64_t skipped = 0;              // training samples skipped as unreadable (skip_bad_images)
  std::filesystem::path checkpoint;  // the last checkpoint written, if any
};

// Trains as the config says, writing progress to `out`. Throws kiln::Error for bad
// configurations, and --device cuda where CUDA is not available. Started by a launcher
// (kiln-run, torchrun, mpirun, srun: dist/launch_env.h) as one rank of several, it trains
// data-parallel on the CPU: its shard of every global batch of config.batch, gradients
// averaged by dist::DistributedDataParallel, the statistics of the global batch; only rank
// 0 writes to `out`, the log, the plot and checkpoints.
Result run(const Config& config, std::ostream& out);

// Asks a running run() to stop after the current optimizer step and save a checkpoint
// (what kiln-train's SIGINT handler calls; safe from a signal handler).
void request_stop();

// The zoo model for `arch` taking [N, channels, size, size] to `classes` logits;
// zero_init_residual as torchvision's ResNet option (ignored by mlp and cnn).
std::shared_ptr<nn::Module> make_model(const std::string& arch, int64_t classes, int64_t channels,
                                       int64_t image_size, bool zero_init_residual = false);

// Whether `arch` is one of the transformers (bert-*, gpt2-*), which train on token sequences.
bool is_text_arch(const std::string& arch);
// The transformer `arch` for `task` (mlm: BertForMaskedLM, clm: GPT2LMHeadModel, classify:
// BertForSequenceClassification with `classes` labels) over `vocab_size` tokens and
// sequences of up to seq_len (the position table grows to it), padding id pad_id.
std::shared_ptr<nn::Module> make_text_model(const std::string& arch, const std::string& task, int64_t vocab_size,
                                            int64_t classes, int64_t seq_len, int64_t pad_id = 0);
// The model on a batch: images [N, C, H, W] (the MLP flattens them), or token ids [N, L]
// with their mask [N, L] (1: a token, 0: padding; undefined: no padding) for the
// transformers. Logits [N, classes], or [N, L, vocab] for the language models.
Tensor call_model(nn::Module& model, const Tensor& input, const Tensor& mask = {});

// Whether the model holds a batch norm layer (which needs 2+ samples per micro-batch).
bool has_batch_norm(nn::Module& model);

// How long a run of `config` is with `per_epoch` (> 0) batches an epoch: --steps, or
// --epochs of per_epoch steps; and the epochs that takes. A count that overflows is an error.
struct RunLength {
  int64_t steps = 0;
  int64_t epochs = 0;
};
RunLength run_length(const Config& config, int64_t per_epoch);

// Mixed precision of a step: the dtype autocast lowers GEMMs and convolutions to (none:
// f32 throughout), the loss scaler (null: none) and gradient clipping (0: off).
struct Precision {
  std::optional<DType> autocast;
  optim::GradScaler* scaler = nullptr;
  double clip_grad_norm = 0;
};
// A rank's part in data-parallel training (kiln-train under kiln-run, torchrun, mpirun or
// srun): its DDP wrapper (attached to the step's Accumulation) and the world size. A step
// then splits the rank's shard of the global batch (Accumulation::split_shard, weights of
// the whole global batch), syncs the gradients on its last micro-step only, and returns
// the global batch's statistics, summed over the ranks.
struct DataParallelStep {
  dist::DistributedDataParallel* ddp = nullptr;
  int world_size = 1;
  int64_t global_samples = 0;  // this step's global batch
};
// What --amp and --loss-scale choose on `device` ("cpu" or "cuda"): `auto` is bf16 on the
// CPU and on GPUs of compute capability 8.0 and newer (bf16 has f32's range: no scaler
// needed), fp16 before (no bf16 tensor cores) with the scaler. `why` says so in words.
struct AmpChoice {
  std::optional<DType> dtype;
  bool loss_scaling = false;
  std::string why;
};
// `gpu`: the device index this process trains on (its rank's GPU in a data-parallel job).
AmpChoice choose_amp(const Config& config, int gpu = 0);

// One optimizer step on a global batch, cut into balanced micro-batches of at most
// accumulation's micro_batch samples (optim::balanced_sizes): returns
// the global batch's mean loss and the number of correct top-1 predictions. With a scaler,
// each micro-step's loss is scaled and the gradients are unscaled once, before clipping
// and the step; a step whose gradients overflowed is skipped.
//
// Per-token targets ([N, L], kIgnoreIndex where nothing is predicted: mlm, clm) weigh
// every predicted token of the global batch alike: the loss is their mean over the whole
// global batch (over every rank's too), however the tokens fall into micro-batches, and
// `predicted` counts them; the accuracy is correct / predicted.
struct StepStats {
  double loss = 0;
  int64_t correct = 0;
  int64_t samples = 0;
  int64_t predicted = 0;  // the predictions the loss and the accuracy are over: samples, or tokens
};
// A step's statistics as the step left them: on the batch's device (host tensors in
// data-parallel runs, whose all-reduce reads them anyway). read_steps reads those of many
// steps in one transfer, so that kiln-train on a GPU waits for the device once per printed
// or logged line and at an epoch's end, not once per step or micro-step.
struct PendingStepStats {
  Tensor loss;       // 0-d f64: the global batch's mean loss
  Tensor correct;    // 0-d: correct predictions
  Tensor predicted;  // 0-d: predicted tokens; undefined: `samples` predictions
  int64_t samples = 0;
};
// The host values of `steps`, in order, exactly as each step's own reads would give them,
// through one read (one host read reported, as "read_steps").
std::vector<StepStats> read_steps(const std::vector<PendingStepStats>& steps);

// `mask` is the token batches' padding mask (undefined for images).
StepStats train_step(nn::Module& model, optim::Optimizer& optimizer, const optim::Accumulation& accumulation,
                     const Tensor& input, const Tensor& target, double label_smoothing,
                     const Precision& precision = {}, const DataParallelStep* data_parallel = nullptr,
                     const Tensor& mask = {});

// The micro-step as a function kiln::compile can trace: args {input, target, weight (0-d
// f64)[, mask]} -> {loss (0-d, the micro-batch's mean), correct (0-d i64)}; it runs backward() on
// loss * weight (times the scaler's scale), accumulating into the parameters' .grad, with
// the forward under autocast when precision says so. With per-token targets [N, L] the
// loss is the sum over the predicted tokens and `weight` the weight of one token (the
// global batch's 1 / count), so that micro-batches of any mix of tokens add up exactly.
// It refers to `model` and the scaler
// (and whole_step_function also to `optimizer`), which must outlive it. train_step runs it
// eagerly.
compiler::TracedFunction micro_step_function(nn::Module& model, double label_smoothing,
                                             const Precision& precision = {});
// The whole optimizer step as one function kiln::compile can trace (tools/whole_step.cpp):
// args {input, target[, mask]} -> {loss (0-d f64: the global batch's mean, per predicted
// token for per-token targets), correct (0-d i64)[, predicted (0-d f64: the predicted
// tokens, per-token targets only)]}: zero the gradients (in place), the micro-steps of
// `accumulation` (balanced sizes, each weighted as train_step weighs it), the optimizer's
// update (finish_step: unscale, clip, step, the scaler's update). Not data parallel. The
// optimizer's first step creates its state and must run eagerly before compiling.
compiler::TracedFunction whole_step_function(nn::Module& model, optim::Optimizer& optimizer,
                                             const optim::Accumulation& accumulation, double label_smoothing,
                                             const Precision& precision = {});
// The optimizer's part of a step, after its last micro-step: the scaler's unscale (once),
// clipping, the optimizer's step (skipped on overflow) and the scaler's update.
void finish_step(optim::Optimizer& optimizer, const Precision& precision);

// Which graph kiln-train --compile runs: the whole optimizer step (whole_step_function), or
// the micro-steps with the update eager (micro_step_function); `why` says which and why in
// words, for the progress header.
struct StepGraphChoice {
  bool whole = false;
  std::string why;
};
// The whole step where it can be one graph and is worth it: --compile-whole-step, or on
// CUDA in the modes that replay CUDA graphs (one replay per optimizer step). The
// micro-steps otherwise: on the CPU by default (the whole step was no faster there and held
// the gradients longer), and always in data-parallel runs (world > 1: the gradients'
// all-reduce runs in eager hooks between the micro-steps and the update).
StepGraphChoice choose_step_graph(const Config& config, int world_size);

// A step run by `whole` (whole_step_function, called eagerly or compiled): its results as
// train_step's. Unlike train_step it leaves the gradients defined (the next step zeroes
// them in place), so that a compiled whole step is traced once, with them defined: run the
// first step (the optimizer's state) with the eager whole_step_function, then compiled.
StepStats train_step_whole(const compiler::TracedFunction& whole, const Tensor& input, const Tensor& target,
                           const Tensor& mask = {});
// The same, its statistics left unread.
PendingStepStats run_whole_step(const compiler::TracedFunction& whole, const Tensor& input, const Tensor& target,
                                const Tensor& mask = {});
// train_step (micro_step: micro_step_function, called eagerly or compiled), its statistics
// left unread.
PendingStepStats run_micro_steps(const compiler::TracedFunction& micro_step, optim::Optimizer& optimizer,
                                 const optim::Accumulation& accumulation, const Tensor& input, const Tensor& target,
                                 const Precision& precision = {}, const DataParallelStep* data_parallel = nullptr,
                                 const Tensor& mask = {});

// train_step with each micro-step run by `compiled` (made from micro_step_function with the
// same precision).
StepStats train_step_compiled(compiler::CompiledFunction& compiled, optim::Optimizer& optimizer,
                              const optim::Accumulation& accumulation, const Tensor& input, const Tensor& target,
                              const Precision& precision = {}, const DataParallelStep* data_parallel = nullptr,
                              const Tensor& mask = {});

// Peak bytes of one forward and backward of `micro_batch` samples shaped `sample_shape`
// (model state and gradients are restored afterwards), for choose_micro_batch.
int64_t measure_step_bytes(nn::Module& model, const std::vector<int64_t>& sample_shape, int64_t classes,
                           int64_t micro_batch);
// Half of MemAvailable from /proc/meminfo.
int64_t default_memory_budget();

// Writes an SVG with the loss per step and per epoch, and train and validation accuracy
// per epoch (atomically: temporary file, rename).
void write_plot(const std::filesystem::path& path, const std::vector<double>& step_losses,
                const std::vector<EpochRecord>& epochs, const std::string& title);
// An axis's ticks: the multiples of a round step (1, 2 or 5 times a power of ten) from
// the largest at or below `low` to the smallest at or above `high`, about `count` steps.
std::vector<double> axis_ticks(double low, double high, int count);

}  // namespace kiln::train
