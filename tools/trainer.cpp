#include "tools/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>

#include "core/autocast.h"
#include "core/cuda.h"
#include "core/disk_cache.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/grad_mode.h"
#include "core/ops/elementwise.h"
#include "core/ops/factory.h"
#include "core/ops/loss.h"
#include "core/ops/join.h"
#include "core/ops/reduce.h"
#include "core/storage.h"
#include "data/datasets.h"
#include "data/image.h"
#include "dist/launch_env.h"
#include "dist/process_group.h"
#include "dist/sync_batch_norm.h"
#include "data/loader.h"
#include "data/text.h"
#include "data/wordnet.h"
#include "data/wordpiece.h"
#include "models/bert.h"
#include "models/containers.h"
#include "models/gpt2.h"
#include "models/layers.h"
#include "models/resnet.h"
#include "models/safetensors.h"
#include "models/small_models.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "tools/checkpoint.h"
#include "tools/device_batches.h"
#include "tools/progress.h"
#include "tools/train_data.h"

namespace kiln::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<bool> stop_requested{false};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// capturable: AdamW keeps its step counts on the parameters' device (a CUDA graph of the
// whole step can hold its update).
std::unique_ptr<optim::Optimizer> make_optimizer(const Config& c, const nn::Module& model, bool capturable) {
  // PyTorch's optimizers decay every parameter they are given; no-norm-bias is the common
  // recipe that exempts biases and norm weights.
  const std::vector<optim::ParamGroupSpec> groups =
      c.weight_decay_scope == "no-norm-bias" ? optim::param_groups_no_decay(model, c.weight_decay)
                                             : std::vector<optim::ParamGroupSpec>{{model.parameters(), {}}};
  if (c.optimizer == "sgd")
    return std::make_unique<optim::SGD>(groups, optim::SGDOptions{.lr = c.lr, .momentum = c.momentum,
                                                                   .weight_decay = c.weight_decay,
                                                                   .nesterov = c.nesterov});
  if (c.optimizer == "adamw")
    return std::make_unique<optim::AdamW>(
        groups, optim::AdamWOptions{.lr = c.lr, .weight_decay = c.weight_decay, .capturable = capturable});
  fail("kiln-train: --optimizer {}: expected sgd or adamw", c.optimizer);
}

std::shared_ptr<optim::LRSchedule> make_schedule(const Config& c, int64_t total_steps) {
  const int64_t after = std::max<int64_t>(total_steps - c.warmup, 1);
  std::shared_ptr<optim::LRSchedule> s;
  if (c.lr_schedule == "constant") s = std::make_shared<optim::LinearWarmup>(0);
  else if (c.lr_schedule == "cosine") s = std::make_shared<optim::Cosine>(after);
  else if (c.lr_schedule == "linear") s = std::make_shared<optim::LinearDecay>(after);
  else if (c.lr_schedule == "step") s = std::make_shared<optim::StepDecay>(std::max<int64_t>(after / 3, 1), 0.1);
  else if (c.lr_schedule == "multistep")
    s = std::make_shared<optim::MultiStep>(std::vector<int64_t>{after / 2, after * 3 / 4}, 0.1);
  else if (c.lr_schedule == "onecycle") s = std::make_shared<optim::OneCycle>(after);
  else fail("kiln-train: --lr-schedule {}: expected constant, cosine, linear, step, multistep or onecycle",
            c.lr_schedule);
  return c.warmup > 0 ? optim::chain(c.warmup, s) : s;
}

// What validate() cannot see: the features not built yet and this machine's devices.
void check_available(const Config& c) {
  KILN_CHECK(c.device == "cpu" || cuda::is_available(), "kiln-train: --device cuda: CUDA is not available: {}",
             cuda::unavailable_reason());
  KILN_CHECK(c.device == "cpu" || !c.micro_batch_auto,
             "kiln-train: --micro-batch auto is not available yet with --device cuda (it measures the CPU "
             "allocator); give --micro-batch N");
}

// Makes `file`'s folder and checks that a file can be created there, so that a run does
// not train for hours and then fail to write its log or plot.
void check_writable(const fs::path& file, const std::string& option) {
  std::error_code ec;
  if (file.has_parent_path()) fs::create_directories(file.parent_path(), ec);
  KILN_CHECK(!ec, "kiln-train: {} {}: cannot create the folder {}: {}", option, file.string(),
             file.parent_path().string(), ec.message());
  const fs::path probe = file.string() + fmt::format(".probe-{}", ::getpid());
  const bool writable = std::ofstream(probe, std::ios::app).good();
  fs::remove(probe, ec);
  KILN_CHECK(writable, "kiln-train: {} {}: cannot create a file in {}", option, file.string(),
             file.has_parent_path() ? file.parent_path().string() : std::string("the current folder"));
}

struct Evaluation {
  double loss = 0, accuracy = 0;
};

// One validation batch {input, target[, mask]} through the model as it is (eval mode, no
// grad): the sum of its losses, its count of correct predictions and of predictions (the
// samples, or the tokens whose target is not kIgnoreIndex), as tensors.
std::vector<Tensor> eval_batch(nn::Module& model, MemoryFormat format, const std::vector<Tensor>& batch) {
  const bool tokens = batch[1].dim() == 2;
  const Tensor logits =
      call_model(model, tokens ? batch[0] : batch[0].contiguous(format), batch.size() > 2 ? batch[2] : Tensor());
  return {cross_entropy(logits.reshape({-1, logits.size(-1)}), batch[1].reshape({-1}), {.reduction = "sum"}),
          sum(eq(argmax(logits, -1), batch[1])), sum(ne(batch[1], data::kIgnoreIndex))};
}

// With `compiled` (--compile: eval_batch compiled, a graph per batch shape), the batches
// run as its generated code; the host reads their results between batches.
Evaluation evaluate(nn::Module& model, data::Loader& loader, Device device, MemoryFormat format,
                    compiler::CompiledFunction* compiled) {
  NoGradGuard no_grad;
  model.eval();
  double loss_sum = 0;
  int64_t correct = 0, total = 0;
  for (data::Batch& batch : loader.epoch(0)) {
    std::vector<Tensor> inputs{batch.input.to(device), batch.target.to(device)};
    if (batch.mask.defined()) inputs.push_back(batch.mask.to(device));
    const std::vector<Tensor> result = compiled ? (*compiled)(inputs) : eval_batch(model, format, inputs);
    loss_sum += result[0].item<double>();
    correct += result[1].item<int64_t>();
    total += result[2].item<int64_t>();
  }
  model.train();
  if (total == 0) return {};
  return {loss_sum / total, static_cast<double>(correct) / total};
}

// The model's weights and buffers as CPU tensors (copies when the model is on a GPU).
StateDict state_on_cpu(const nn::Module& model) {
  StateDict state = model.state_dict();
  for (auto& [name, t] : state) t = t.to(Device::cpu());
  return state;
}

std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

}  // namespace

void request_stop() { stop_requested.store(true); }

RunLength run_length(const Config& c, int64_t per_epoch) {
  KILN_CHECK(per_epoch > 0, "kiln-train: an epoch of {} batches", per_epoch);
  RunLength r{c.steps, c.epochs};
  if (c.steps > 0) r.epochs = c.steps / per_epoch + (c.steps % per_epoch != 0);
  else
    KILN_CHECK(!__builtin_mul_overflow(c.epochs, per_epoch, &r.steps),
               "kiln-train: --epochs {} of {} steps each: more steps than can be counted", c.epochs, per_epoch);
  return r;
}

bool has_batch_norm(nn::Module& model) {
  bool found = false;
  model.apply([&](nn::Module& m) { found = found || m.type_name().starts_with("BatchNorm"); });
  return found;
}

Tensor call_model(nn::Module& model, const Tensor& input, const Tensor& mask) {
  if (auto* bert = dynamic_cast<models::BertForMaskedLM*>(&model)) return bert->forward(input, mask);
  if (auto* bert = dynamic_cast<models::BertForSequenceClassification*>(&model)) return bert->forward(input, mask);
  if (auto* gpt2 = dynamic_cast<models::GPT2LMHeadModel*>(&model)) return gpt2->forward(input, mask);
  KILN_CHECK(!mask.defined(), "kiln-train: a {} takes no token mask (it is not a transformer)", model.type_name());
  if (dynamic_cast<models::MLP*>(&model)) return model(input.flatten(1));
  return model(input);
}

AmpChoice choose_amp(const Config& c, int gpu) {
  AmpChoice choice;
  if (c.amp == "off") {
    choice.why = "f32";
  } else if (c.amp == "bf16" || c.amp == "fp16") {
    choice.dtype = c.amp == "bf16" ? DType::bf16 : DType::f16;
    choice.why = fmt::format("--amp {}", c.amp);
  } else if (c.device == "cpu") {
    choice.dtype = DType::bf16;
    choice.why = "--amp auto on the CPU: bf16 (f16 has no fast CPU path, and bf16 needs no loss scaling)";
  } else {
    const cuda::DeviceProperties props = cuda::device_properties(gpu);
    const int major = props.major, minor = props.minor;
    const bool bf16 = major >= 8;
    choice.dtype = bf16 ? DType::bf16 : DType::f16;
    choice.why = fmt::format(
        "--amp auto on a GPU of compute capability {}.{}: {}", major, minor,
        bf16 ? "bf16 (tensor cores for bf16 from 8.0; f32's range, so no loss scaling)"
             : "fp16 with dynamic loss scaling (no bf16 tensor cores before 8.0)");
  }
  choice.loss_scaling = c.loss_scale == "dynamic" || (c.loss_scale == "auto" && choice.dtype == DType::f16);
  if (choice.dtype && c.loss_scale != "auto")
    choice.why += fmt::format(", --loss-scale {}", c.loss_scale);
  return choice;
}

int64_t measure_step_bytes(nn::Module& model, const std::vector<int64_t>& sample_shape, int64_t classes,
                           int64_t micro_batch) {
  const StateDict saved = [&] {
    StateDict copy;
    for (const auto& [name, t] : model.state_dict()) copy[name] = t.clone();
    return copy;
  }();
  model.zero_grad();
  Shape shape{micro_batch};
  for (int64_t s : sample_shape) shape.push_back(s);
  Tensor x = zeros(shape);
  Tensor y = zeros({micro_batch}, {.dtype = DType::i64});
  const bool flatten_input = dynamic_cast<models::MLP*>(&model) != nullptr;
  const int64_t before = memory_stats().allocated;
  reset_peak_memory();
  {
    Tensor logits = model(flatten_input ? x.flatten(1) : x);
    cross_entropy(logits, y).backward();
  }
  const int64_t peak = memory_stats().peak - before;
  model.zero_grad();
  model.load_state_dict(saved);  // undo the batch norm statistics of the trial
  (void)classes;
  return peak;
}

int64_t default_memory_budget() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024 / 2;
  return int64_t{4} << 30;
}

Result run(const Config& given, std::ostream& given_out) {
  validate(given);
  // Data parallel: a rank of a job that kiln-run, torchrun, mpirun or srun started. Every
  // rank trains its shard of each global batch (--batch stays the global batch); rank 0
  // alone prints, logs, plots and writes checkpoints, and every rank reads a checkpoint
  // to resume (the folder must be shared).
  const std::optional<dist::LaunchEnv> launch = dist::read_launch_env();
  const int world = launch ? launch->world_size : 1;
  // The GPU of this process: cuda:0, or in a job of several ranks with --device cuda the
  // launcher's LOCAL_RANK modulo the GPUs visible (one GPU per rank on each node, as
  // torchrun's convention and the NCCL backend's default have it).
  int gpu = 0;
  if (world > 1) {
    if (given.device == "cuda") {
      KILN_CHECK(cuda::is_available(), "kiln-train: --device cuda: CUDA is not available: {}",
                 cuda::unavailable_reason());
      const std::string why = dist::nccl_unavailable_reason();
      KILN_CHECK(why.empty(), "kiln-train: data-parallel training on CUDA (a job of {} ranks) needs NCCL: {}", world,
                 why);
      gpu = launch->local_rank % cuda::device_count();
      // This process's CUDA calls outside an op (the loader's pinned batches, on its
      // workers) go to that GPU too, not to a context of their own on cuda:0.
      cuda::set_device(gpu);
      // The gradients' all-reduces go through NCCL, the step's statistics (CPU tensors)
      // through Gloo.
      if (!dist::is_initialized()) dist::init_process_group({.backend = "auto", .device = gpu});
    } else if (!dist::is_initialized()) {
      dist::init_process_group({.backend = "gloo"});
    }
  }
  const int rank = world > 1 ? dist::get_rank() : 0;
  Config c = given;
  std::ostream silent(nullptr);
  std::ostream& out = rank == 0 ? given_out : silent;
  if (rank != 0) {
    c.quiet = true;
    c.log_file.clear();
    c.plot_file.clear();
  }
  data::set_max_image_pixels(c.max_image_pixels > 0 ? c.max_image_pixels : data::kDefaultMaxImagePixels);
  check_available(c);
  stop_requested.store(false);
  Result result;
  // The outputs are checked before any training.
  const fs::path plot = !c.plot_file.empty()                      ? c.plot_file
                        : !c.checkpoint_dir.empty() && rank == 0 ? c.checkpoint_dir / "curves.svg"
                                                                 : fs::path();
  if (!c.log_file.empty()) check_writable(c.log_file, "--log");
  if (!plot.empty()) check_writable(plot, c.plot_file.empty() ? "--checkpoint" : "--plot");

  const bool text = is_text_arch(c.arch);
  const std::string task = task_of(c);
  std::shared_ptr<const data::WordPiece> tokenizer;
  std::string vocab_source;
  DataSets d = text ? make_text_data(c, tokenizer, vocab_source) : make_data(c);
  const std::vector<int64_t> shape = d.train->sample_shape();
  KILN_CHECK(text || shape.size() == 3, "kiln-train: samples of {} are not images [C, H, W]", d.train->describe());
  const int64_t classes = d.train->num_classes();
  manual_seed(c.seed);
  std::shared_ptr<nn::Module> model =
      text ? make_text_model(c.arch, task, tokenizer->vocab_size(), classes, c.seq_len, tokenizer->pad_id())
           : make_model(c.arch, classes, shape[0], shape[1], c.zero_init_residual);
  // Fine-tuning: the weights of --init (a resumed run then loads its own checkpoint over them).
  const std::string init_report = c.init.empty() ? std::string() : load_init(*model, init_weights_file(c.init));
  // The vocabulary goes with the checkpoints, so that --init DIR and --resume read it back.
  if (text && rank == 0 && !c.checkpoint_dir.empty() && vocab_source != (c.checkpoint_dir / "vocab.txt").string()) {
    std::error_code ec;
    fs::create_directories(c.checkpoint_dir, ec);
    tokenizer->save(c.checkpoint_dir / "vocab.txt");
  }
  // The loader makes batches on the CPU; each step copies its batch to the device.
  const Device device = c.device == "cuda" ? Device::cuda(gpu) : Device::cpu();
  const MemoryFormat format = c.channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
  model->to(device);
  // On CUDA the weights too: cuDNN's NHWC convolutions then read them without a transpose
  // (on the CPU the convolutions take OIHW weights, so they stay so there).
  if (c.channels_last && device.is_cuda()) model->to(MemoryFormat::channels_last);
  if (device.is_cuda()) {
    // As PyTorch users are told to: TF32 tensor cores for f32 products and convolutions,
    // and cuDNN's algorithm search for the run's fixed shapes.
    cuda::set_allow_tf32(true);
    cuda::set_cudnn_benchmark(true);
  }
  const AmpChoice amp = choose_amp(c, gpu);
  std::optional<optim::GradScaler> scaler;
  // Made on the device now, not at its first use: a compiled micro-step must find the scale
  // tensor there before it is traced.
  if (amp.loss_scaling) scaler.emplace(optim::GradScalerOptions{.device = device});
  const Precision precision{amp.dtype, scaler ? &*scaler : nullptr, c.clip_grad_norm};
  // Batch norm in training mode rejects a batch of one sample (one value per channel at
  // the last stage), so a last batch of one is dropped, as PyTorch users do with drop_last.
  const bool batch_norm = has_batch_norm(*model);
  const bool drop_last = batch_norm && d.train->size() % c.batch == 1;
  // On a GPU the batches come in pinned memory: their copies to the device run at full speed.
  const bool pin = device.is_cuda();
  // Texts to classify are padded to a multiple of 16 tokens: a compiled step meets at most
  // seq_len / 16 lengths (packed blocks all have seq_len tokens).
  const int64_t pad_multiple = text && task == "classify" ? 16 : 0;
  data::Loader train_loader(d.train, {.batch_size = c.batch, .shuffle = true, .drop_last = drop_last,
                                      .workers = c.workers, .seed = c.seed, .skip_bad_samples = c.skip_bad_images,
                                      .pin_memory = pin, .rank = rank, .world_size = world,
                                      .pad_multiple = pad_multiple});
  std::unique_ptr<data::Loader> val_loader;
  if (d.val)
    val_loader = std::make_unique<data::Loader>(
        d.val, data::LoaderOptions{.batch_size = std::max<int64_t>(c.batch, 64), .workers = c.workers, .seed = c.seed,
                                   .skip_bad_samples = c.skip_bad_images, .pin_memory = pin,
                                   .pad_multiple = pad_multiple});

  const StepGraphChoice step_graph = choose_step_graph(c, world);
  // On a GPU the whole step's update reads everything it needs from the device (below).
  std::unique_ptr<optim::Optimizer> optimizer = make_optimizer(c, *model, step_graph.whole && device.is_cuda());
  const int64_t per_epoch = train_loader.batches_per_epoch();
  const int64_t samples = d.train->size();
  KILN_CHECK(per_epoch > 0, "kiln-train: {} training sample{} give{} no full batch of {}{}", samples,
             samples == 1 ? "" : "s", samples == 1 ? "s" : "", c.batch,
             drop_last ? fmt::format(" with drop_last ({} has batch norm, which cannot train on a batch of 1 sample, "
                                     "so a last batch of 1 is dropped)", c.arch)
                       : std::string());
  const RunLength length = run_length(c, per_epoch);
  const int64_t total_steps = length.steps, epochs = length.epochs;
  const std::shared_ptr<optim::LRSchedule> schedule = make_schedule(c, total_steps);
  optim::Scheduler scheduler(*optimizer, schedule);

  int64_t micro = c.micro_batch > 0 ? c.micro_batch : c.batch;
  KILN_CHECK(!batch_norm || micro >= 2 || c.micro_batch_auto,
             "kiln-train: --micro-batch 1: {} has batch norm, which needs at least 2 samples per micro-batch in "
             "training", c.arch);
  TrainingState state;
  if (c.resume) {
    state = load_checkpoint(c, per_epoch, *model, *optimizer, scaler ? &*scaler : nullptr);  // checks the fingerprint first
    scheduler.set_step(state.step);
    micro = state.micro_batch;
    result.epochs = state.epochs;
    result.step_losses = state.step_losses;
  } else if (c.micro_batch_auto) {
    const int64_t budget = c.memory_budget > 0 ? c.memory_budget : default_memory_budget();
    // Per rank: its shard of the global batch.
    const optim::MicroBatchChoice choice = optim::choose_micro_batch(
        (c.batch + world - 1) / world, budget, [&](int64_t b) { return measure_step_bytes(*model, shape, classes, b); },
        batch_norm ? 2 : 1);
    micro = choice.micro_batch;
    if (!c.quiet) {
      std::string tried;
      for (auto [b, bytes] : choice.measured) tried += fmt::format(" {}:{:.0f}MiB", b, bytes / 1048576.0);
      out << fmt::format("micro-batch auto: budget {:.0f} MiB, measured{} -> {}\n", budget / 1048576.0, tried, micro);
    }
  }
  optim::Accumulation accumulation({.batch = c.batch, .micro_batch = micro});
  result.micro_batch = micro;
  // After the resume: rank 0's parameters and buffers are every rank's (the same anyway).
  std::optional<dist::DistributedDataParallel> ddp;
  if (world > 1) {
    if (c.sync_bn) dist::convert_sync_batchnorm(*model);
    ddp.emplace(*model);
    ddp->attach(accumulation);
  }
  std::optional<compiler::CompiledFunction> compiled, compiled_whole, compiled_eval;
  compiler::TracedFunction eager_whole;  // the whole step's first run: the optimizer's state
  if (c.compile) {
    // --channels-last runs the whole step NHWC; otherwise the layout pass chooses (NHWC
    // convolutions on the CPU).
    const compiler::CompileOptions options{
        .mode = c.compile_mode,
        .trace = compiler::module_names(*model),
        .layout = c.channels_last ? compiler::LayoutPolicy::channels_last : compiler::LayoutPolicy::automatic};
    // On the CPU the micro-steps are compiled and the optimizer's update stays eager: a
    // graph holding the update too (whole_step_function) updates in place but was no faster
    // there (ResNet-50, kiln-bench train --compile: 1.02-1.05x eager against 1.08-1.13x for
    // the micro-steps) and holds the gradients through the step (1.07x eager's peak). With
    // CUDA graphs the whole step is one replay (choose_step_graph).
    if (step_graph.whole) {
      // On a GPU the update kernels read the hyperparameters (SGD's lr, momentum, dampening
      // and weight decay; AdamW's lr, betas, eps and weight decay) and AdamW's step counts
      // (capturable, from make_optimizer) from the device, so that the step's CUDA graph
      // holds no host tensor and replays each step's values.
      if (device.is_cuda())
        optimizer->move_hyperparameters(c.optimizer == "sgd" ? optim::SGD::tensor_hyperparameters()
                                                             : optim::AdamW::tensor_hyperparameters(),
                                        device);
      eager_whole = whole_step_function(*model, *optimizer, accumulation, c.label_smoothing, precision);
      compiled_whole = compiler::compile(eager_whole, options);
    } else {
      compiled = compiler::compile(micro_step_function(*model, c.label_smoothing, precision), options);
    }
    // Validation too: the forward in eval mode, no grad (guards of their own).
    compiled_eval = compiler::compile(
        [&model, format, dtype = amp.dtype](const std::vector<Tensor>& batch) {
          autocast scope({.device_type = batch[0].device().type, .dtype = dtype, .enabled = dtype.has_value()});
          return eval_batch(*model, format, batch);
        },
        options);
  }

  std::ofstream log;
  if (!c.log_file.empty()) {
    log.open(c.log_file, c.resume ? std::ios::app : std::ios::trunc);
    KILN_CHECK(log.good(), "kiln-train: cannot write the log file {}", c.log_file.string());
  }
  if (!c.quiet) {
    out << fmt::format("kiln-train: {}{} on {}{}\n", c.arch,
                       text ? fmt::format(" ({})", task == "mlm"   ? "masked LM"
                                                   : task == "clm" ? "causal LM"
                                                                   : fmt::format("classifier of {} classes", classes))
                            : "",
                       d.train->describe(), d.val ? fmt::format("; validating on {}", d.val->describe()) : "");
    if (text)
      out << fmt::format("  vocabulary: {} WordPiece tokens, {}; sequences of up to {} tokens\n",
                         tokenizer->vocab_size(), vocab_source, c.seq_len);
    if (!init_report.empty()) out << "  init: " << init_report << '\n';
    out << fmt::format("  {} steps of batch {} (micro-batch {}, {} per step), {} epochs, {} lr {} {}, {} workers, {}\n",
                       total_steps, c.batch, micro, accumulation.steps(c.batch), epochs, c.optimizer, c.lr,
                       c.lr_schedule, c.workers, c.compile ? "compiled (" + c.compile_mode + ")" : std::string("eager"));
    std::vector<std::string> differences = pytorch_differences(c);
    if (drop_last) differences.push_back("drops each epoch's last batch of 1 sample (batch norm)");
    if (c.compile) out << fmt::format("  compiled step: {}\n", step_graph.why);
    out << fmt::format("  differs from PyTorch's defaults: {}\n",
                       differences.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(differences, ", ")));
    out << fmt::format("  precision: {}{}{}\n", amp.why, amp.loss_scaling ? ", dynamic loss scaling" : "",
                       c.clip_grad_norm > 0 ? fmt::format(", gradients clipped to norm {}", c.clip_grad_norm) : "");
    if (world > 1)
      out << fmt::format("  data parallel: {} ranks ({}), each its shard of every global batch of {}{}\n", world,
                         launch->source, c.batch, c.sync_bn ? ", batch norm over all ranks (--sync-bn)" : "");
    if (c.resume)
      out << fmt::format("  resumed at step {} (epoch {}, batch {})\n", state.step, state.epoch + 1, state.batch);
  }
  Progress progress(out, c.quiet ? ProgressMode::off : (isatty(STDOUT_FILENO) ? ProgressMode::bar : ProgressMode::lines),
                    c.print_every, text ? "tok/s" : "img/s");
  progress.start_run(state.step, total_steps);

  int64_t step = state.step;
  auto save = [&](int64_t epoch, int64_t batch_in_epoch, const fs::path& dir, double loss_sum, int64_t correct,
                  int64_t seen) {
    TrainingState s;
    s.step = step;
    s.epoch = epoch;
    s.batch = batch_in_epoch;
    s.micro_batch = micro;
    s.epoch_loss_sum = loss_sum;
    s.epoch_correct = correct;
    s.epoch_seen = seen;
    s.fingerprint = fingerprint(c);
    s.epochs = result.epochs;
    s.step_losses = result.step_losses;
    result.checkpoint = save_checkpoint(dir, s, *model, *optimizer, scaler ? &*scaler : nullptr);
  };

  int64_t steps_this_run = 0;
  DeviceBatchCopier copier(device);
  for (int64_t epoch = state.epoch; epoch < epochs && step < total_steps; ++epoch) {
    const int64_t start = epoch == state.epoch ? state.batch : 0;
    // A resumed epoch continues the sums of the batches run before the interruption.
    double loss_sum = start > 0 ? state.epoch_loss_sum : 0;
    int64_t correct = start > 0 ? state.epoch_correct : 0, seen = start > 0 ? state.epoch_seen : 0;
    const auto epoch_start = Clock::now();
    int64_t seen_now = 0;  // samples of this epoch run by this process, for the rates
    progress.start_epoch(epoch, epochs, std::min(per_epoch, start + total_steps - step));
    int64_t batch_index = start;
    // Steps whose statistics are still where the step left them (on a GPU, the device), with
    // what the host knew of each: read together (read_steps) when a progress line is due,
    // for every log line, before a checkpoint and at the epoch's end, and only then added to
    // the epoch's sums, the step losses and the log, and checked for a loss that is not
    // finite, in step order: the same numbers as a read per step, one wait per read.
    struct Unread {
      PendingStepStats stats;
      int64_t step = 0, batch_index = 0;
      double lr = 0, rate = 0;
    };
    std::vector<Unread> unread;
    auto read_unread = [&] {
      std::vector<PendingStepStats> pending;
      for (const Unread& u : unread) pending.push_back(u.stats);
      const std::vector<StepStats> read = read_steps(pending);
      const std::vector<Unread> steps = std::move(unread);
      unread.clear();
      for (size_t i = 0; i < read.size(); ++i) {
        const StepStats& s = read[i];
        const Unread& u = steps[i];
        // The epoch's means are over the predictions: samples, or predicted tokens (mlm, clm).
        loss_sum += s.loss * s.predicted;
        correct += s.correct;
        seen += s.predicted;
        result.step_losses.push_back(s.loss);
        if (log.is_open())
          log << fmt::format(R"({{"step":{},"epoch":{},"loss":{},"lr":{},"{}":{:.1f},"accuracy":{}{}}})", u.step,
                             epoch + 1, json_number(s.loss), json_number(u.lr), text ? "tok_per_s" : "img_per_s",
                             u.rate, json_number(static_cast<double>(s.correct) / std::max<int64_t>(s.predicted, 1)),
                             scaler ? fmt::format(R"(,"loss_scale":{})", json_number(scaler->get_scale())) : "")
              << '\n'
              << std::flush;
        // Nothing can be learnt past a NaN or infinite loss (the weights it updated are lost
        // too; a loss scaler skips steps whose gradients overflow, not a loss that did).
        // Found when the step is read: with no log, at the next progress line or the epoch's end.
        if (!std::isfinite(s.loss)) {
          progress.finish();
          fail("kiln-train: step {} (epoch {}, batch {} of {}): the loss is {}; stopped (a smaller --lr, or "
               "--warmup, may help)",
               u.step, epoch + 1, u.batch_index, per_epoch, std::isnan(s.loss) ? "NaN" : s.loss > 0 ? "inf" : "-inf");
        }
      }
    };
    // One batch ahead: the next batch's copies to the device are queued before the current
    // step (on a GPU on a copy stream of their own, so they overlap it; DeviceBatchCopier).
    data::Loader::Epoch batches = train_loader.epoch(epoch, start);
    auto next = batches.begin();
    std::optional<DeviceBatch> ahead;
    if (next != batches.end()) ahead = copier.start(std::move(*next));
    while (ahead) {
      const DeviceBatch current = std::move(*ahead);
      ahead.reset();
      if (++next != batches.end()) ahead = copier.start(std::move(*next));
      const data::Batch& batch = current.host;
      const auto t0 = Clock::now();
      copier.wait(current);
      const Tensor input = current.input.contiguous(format), &target = current.target, &mask = current.mask;
      const DataParallelStep data_parallel{.ddp = ddp ? &*ddp : nullptr, .world_size = world,
                                           .global_samples = batch.global_size};
      const DataParallelStep* dp = ddp ? &data_parallel : nullptr;
      // The whole-step graph holds the update, which must find the optimizer's state made,
      // and is traced once with the gradients defined: this run's first step is eager.
      const compiler::TracedFunction micro_step =
          compiled ? [&](const std::vector<Tensor>& a) { return (*compiled)(a); }
                   : micro_step_function(*model, c.label_smoothing, precision);
      PendingStepStats s =
          compiled_whole
              ? run_whole_step(steps_this_run == 0 ? eager_whole
                                                   : [&](const std::vector<Tensor>& a) { return (*compiled_whole)(a); },
                               input, target, mask)
              : run_micro_steps(micro_step, *optimizer, accumulation, input, target, precision, dp, mask);
      // The step's lr as the schedule computes it on the host (what the scheduler wrote into
      // the groups, which may live on the device).
      const double lr = schedule->lr(scheduler.last_step(), scheduler.base_lrs().front());
      scheduler.step();
      ++step;
      ++steps_this_run;
      batch_index = batch.index + 1;  // the loader's position: a batch of bad images only is skipped
      // The rate counts images, or tokens that are not padding (this rank's times the ranks).
      const int64_t units = text ? (batch.mask.defined() ? sum(batch.mask).item<int64_t>() : batch.input.numel()) * world
                                 : s.samples;
      seen_now += units;
      unread.push_back({std::move(s), step, batch_index, lr, units / std::max(seconds_since(t0), 1e-9)});
      const bool show = progress.due(batch_index);
      if (show || log.is_open()) read_unread();
      if (show)
        progress.step(batch_index, step, loss_sum / std::max<int64_t>(seen, 1),
                      seen_now / std::max(seconds_since(epoch_start), 1e-9),
                      text ? std::optional<double>(static_cast<double>(correct) / std::max<int64_t>(seen, 1))
                           : std::nullopt);
      bool stop = stop_requested.load() || (c.stop_after_steps > 0 && steps_this_run >= c.stop_after_steps);
      if (world > 1) {
        // Every rank stops after the same step (Ctrl-C reaches them at different moments).
        const Tensor any = scalar_tensor(stop ? 1.0 : 0.0, DType::f64).reshape({1});
        dist::all_reduce(any, dist::ReduceOp::max).wait();
        stop = any.data_ptr<double>()[0] > 0;
      }
      if (stop && step < total_steps) {
        read_unread();
        progress.finish();
        const fs::path dir = c.checkpoint_dir.empty() ? fs::path("kiln-train-interrupted") : c.checkpoint_dir;
        if (rank == 0) save(epoch, batch_index, dir, loss_sum, correct, seen);
        if (!c.quiet)
          out << fmt::format("stopped at step {}; checkpoint in {}; continue with --checkpoint {} --resume\n", step,
                             result.checkpoint.string(), dir.string());
        result.interrupted = true;
        result.steps = step;
        result.model = state_on_cpu(*model);
        return result;
      }
      if (step >= total_steps) break;
    }
    read_unread();
    progress.finish();
    EpochRecord record{.epoch = epoch,
                       .train_loss = seen ? loss_sum / seen : 0,
                       .train_accuracy = seen ? static_cast<double>(correct) / seen : 0,
                       .images_per_second = seen_now / std::max(seconds_since(epoch_start), 1e-9)};
    if (val_loader) {
      autocast scope({.device_type = device.type, .dtype = amp.dtype, .enabled = amp.dtype.has_value()});
      const Evaluation e = evaluate(*model, *val_loader, device, format, compiled_eval ? &*compiled_eval : nullptr);
      record.val_loss = e.loss;
      record.val_accuracy = e.accuracy;
    }
    result.epochs.push_back(record);
    if (!c.quiet)
      out << fmt::format("epoch {}/{}: loss {:.4f}, train accuracy {:.1f}%{}, {:.1f} {}, {:.0f} s\n", epoch + 1,
                         epochs, record.train_loss, 100 * record.train_accuracy,
                         val_loader ? fmt::format(", validation accuracy {:.2f}% (loss {:.4f})",
                                                  100 * record.val_accuracy, record.val_loss)
                                    : "",
                         record.images_per_second, text ? "tok/s" : "img/s", seconds_since(epoch_start));
    if (log.is_open())
      log << fmt::format(R"({{"epoch":{},"step":{},"train_loss":{},"train_accuracy":{},"val_loss":{},"val_accuracy":{}}})",
                         epoch + 1, step, json_number(record.train_loss), json_number(record.train_accuracy),
                         json_number(record.val_loss), json_number(record.val_accuracy))
          << '\n'
          << std::flush;
    if (!c.checkpoint_dir.empty() && rank == 0) save(epoch + 1, 0, c.checkpoint_dir, 0, 0, 0);
  }
  result.skipped = train_loader.skipped();
  if (result.skipped > 0 && !c.quiet) out << fmt::format("skipped {} unreadable training images\n", result.skipped);

  if (!plot.empty()) {
    write_plot(plot, result.step_losses, result.epochs,
               fmt::format("kiln-train {} on {}: {}, {}", c.arch, c.data,
                           c.compile ? "compiled (" + c.compile_mode + ")" : std::string("eager"), c.device));
    if (!c.quiet) out << "plot: " << plot.string() << '\n';
  }
  if (c.compile && !c.quiet) {
    const compiler::CompiledFunction& training = compiled_whole ? *compiled_whole : *compiled;
    out << fmt::format("compiled: {} training graphs{} ({} recompiles{}), {} validation graphs\n", training.cache_size(),
                       compiled_whole ? " of the whole step" : "", training.recompiles(),
                       training.graph_breaks() > 0 ? fmt::format(", {} with graph breaks, run split", training.graph_breaks())
                                                   : "",
                       compiled_eval->cache_size());
    // KILN_PROFILE=1 timed every kernel and library op of the programs: where the time went.
    if (const char* env = std::getenv("KILN_PROFILE"); env && std::string(env) == "1") out << training.profile();
    if (c.compile_mode != "default") {
      const compiler::CudaGraphStats g = training.cuda_graphs(), e = compiled_eval->cuda_graphs();
      out << fmt::format("CUDA graphs: {} captured, {} replays (validation: {} captured, {} replays){}\n",
                         g.captures, g.replays, e.captures, e.replays,
                         g.skipped.empty() ? "" : fmt::format("; not captured: {}", fmt::join(g.skipped, "; ")));
    }
  }
  result.steps = step;
  result.model = state_on_cpu(*model);
  return result;
}

}  // namespace kiln::train
