// kiln-bench train --arch bert-*|gpt2-*: the transformer models' training step on a
// synthetic batch of token ids (BERT: masked-LM loss over 15% of the positions; GPT-2: the
// causal-LM loss), AdamW, eager against compiled in one run, on the CPU or a GPU
// (--device cuda). tools/bench.cpp dispatches here; tools/bench_vs_torch.py runs it against
// tools/bench_torch.py's same models on the CPU, make gpu-check (tools/gpu-check.sh) on a GPU.
#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <ranges>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <kiln.h>

#include "models/bert.h"
#include "models/gpt2.h"
#include "tools/bench_common.h"

namespace kiln::bench {

namespace {

struct TextBenchOptions {
  std::string arch = "bert-mini";
  std::string device = "cpu";  // or "cuda": the model, the batch and the steps on GPU 0
  int64_t batch = 32, seq = 128, vocab = 0, steps = 10, warmup = 2;  // vocab 0: the model's own
  bool compile = false;   // also time the compiled modes, in the same run
  bool profile = false;   // where the time goes, per op (eager) and per kernel (compiled), on stderr
  bool dropout = true;    // the configs' dropout (0.1, as HF's); --no-dropout turns it off
  std::vector<std::string> only;  // time these modes alone (empty: all)
  std::optional<DType> amp;       // also the steps with the forward under autocast (f16: with a GradScaler)
};

bool is_bert(const std::string& arch) { return arch.starts_with("bert-"); }

// The model of `arch` with its loss over a batch {input_ids, labels}.
struct TextModel {
  std::shared_ptr<nn::Module> module;
  std::function<Tensor(const Tensor& ids, const Tensor& labels)> loss;
  int64_t vocab = 0, max_length = 0;
};

TextModel make_text_model(const TextBenchOptions& o) {
  const std::string size = o.arch.substr(o.arch.find('-') + 1);
  TextModel m;
  if (is_bert(o.arch)) {
    const int64_t vocab = o.vocab > 0 ? o.vocab : 30522;
    models::BertConfig c = size == "tiny"   ? models::BertConfig::tiny(vocab)
                           : size == "mini" ? models::BertConfig::mini(vocab)
                           : size == "base" ? models::BertConfig::base(vocab)
                           : size == "large"
                               ? models::BertConfig::large(vocab)
                               : (fail("kiln-bench train: --arch {}: expected bert-tiny, bert-mini, "
                                       "bert-base, bert-large, gpt2-tiny, gpt2-mini or gpt2-small",
                                       o.arch),
                                  models::BertConfig{});
    if (!o.dropout) c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0.0;
    auto bert = std::make_shared<models::BertForMaskedLM>(c);
    m.loss = [bert](const Tensor& ids, const Tensor& labels) {
      return models::masked_lm_loss(bert->forward(ids, {}, {}), labels);
    };
    m.module = bert;
    m.vocab = c.vocab_size;
    m.max_length = c.max_position_embeddings;
  } else {
    const int64_t vocab = o.vocab > 0 ? o.vocab : 50257;
    models::GPT2Config c = size == "tiny"    ? models::GPT2Config::tiny(vocab)
                           : size == "mini"  ? models::GPT2Config::mini(vocab)
                           : size == "small" ? models::GPT2Config::small(vocab)
                                             : (fail("kiln-bench train: --arch {}: expected bert-tiny, "
                                                     "bert-mini, bert-base, bert-large, gpt2-tiny, "
                                                     "gpt2-mini or gpt2-small",
                                                     o.arch),
                                                models::GPT2Config{});
    if (!o.dropout) c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.0;
    auto gpt = std::make_shared<models::GPT2LMHeadModel>(c);
    m.loss = [gpt](const Tensor& ids, const Tensor& labels) {
      return models::causal_lm_loss(gpt->forward(ids, {}), labels);
    };
    m.module = gpt;
    m.vocab = c.vocab_size;
    m.max_length = c.n_positions;
  }
  return m;
}

// "eager,compiled" as {"eager", "compiled"} (empty items dropped).
std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> items;
  for (const auto piece : std::views::split(list, ',')) {
    std::string item(piece.begin(), piece.end());
    if (!item.empty()) items.push_back(std::move(item));
  }
  return items;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Where an eager step's time goes: the time from the end of one op to the end of the next
// charged to the latter (its kernel and the host work before it), summed per op and output
// shape, the least of three steps (a shared machine's other processes only add time), on
// stderr. On a GPU the device is synchronized after every op, so each op's time is its own.
void profile_eager_step(const std::function<void()>& step, Device device) {
  auto wait = [device] {
    if (device.is_cuda()) cuda::synchronize(device.index);
  };
  std::map<std::string, std::pair<double, int64_t>> best;  // ms, calls
  double best_total = 0;
  for (int run = 0; run < 3; ++run) {
    std::map<std::string, std::pair<double, int64_t>> per_op;
    wait();
    auto last = std::chrono::steady_clock::now();
    const auto start = last;
    {
      OpHookGuard hook([&](const OpCall& call) {
        wait();
        const auto now = std::chrono::steady_clock::now();
        std::string key = call.op.name;
        if (!call.outputs.empty() && call.outputs[0].defined())
          key += " " + fmt::format("{}", fmt::join(call.outputs[0].shape(), "x"));
        auto& [ms, calls] = per_op[key];
        ms += std::chrono::duration<double, std::milli>(now - last).count();
        ++calls;
        last = now;
      });
      step();
      wait();
    }
    const double total = ms_since(start);
    best_total = run == 0 ? total : std::min(best_total, total);
    for (const auto& [key, v] : per_op) {
      auto [it, fresh] = best.try_emplace(key, v);
      if (!fresh) it->second.first = std::min(it->second.first, v.first);
    }
  }
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(best.begin(), best.end());
  std::ranges::sort(rows, [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::cerr << fmt::format("eager step, per op and output shape, least of 3 steps: {:.1f} ms (least step)\n"
                           "{:<52}{:>10}{:>8}{:>8}\n", best_total, "op", "ms", "calls", "%");
  for (const auto& [name, v] : rows)
    if (v.first >= 0.005 * best_total)
      std::cerr << fmt::format("{:<52}{:>10.2f}{:>8}{:>7.1f}%\n", name, v.first, v.second,
                               100.0 * v.first / best_total);
}

}  // namespace

// kiln-bench train for the text models: one JSON line per mode (eager; with --compile,
// compiled: forward and backward as one graph, AdamW eager; compiled-whole-step: gradients
// zeroed, forward, backward and AdamW as one graph): median step ms, tokens/s, peak bytes.
int bench_text_train(const TextBenchOptions& o) {
  KILN_CHECK(o.device == "cpu" || o.device == "cuda", "kiln-bench train: --device {}: expected cpu or cuda",
             o.device);
  const Device device = o.device == "cuda" ? Device::cuda() : Device::cpu();
  if (device.is_cuda()) {
    KILN_CHECK(cuda::is_available(), "kiln-bench train: --arch {} --device cuda: CUDA is not available: {}",
               o.arch, cuda::unavailable_reason());
    // As tools/bench_torch.py runs PyTorch: TF32 for f32 products.
    cuda::set_allow_tf32(true);
  }
  manual_seed(0);
  TextModel m = make_text_model(o);
  KILN_CHECK(o.seq <= m.max_length, "kiln-bench train: --seq {} is longer than {}'s {} positions", o.seq,
             o.arch, m.max_length);
  nn::Module& model = *m.module;
  model.to(device);
  model.train();
  std::vector<Tensor> params = model.parameters();
  int64_t parameters = 0;
  for (const Tensor& p : params) parameters += p.numel();
  // PyTorch's AdamW defaults (lr 1e-3, weight decay 1e-2), as tools/bench_torch.py has them.
  optim::AdamW adamw(params);

  // The batch: ids drawn uniformly (BERT's from 1: 0 is its padding id); BERT's labels at
  // 15% of the positions (the rest -100), GPT-2's the ids themselves (the loss shifts them).
  // Drawn on the CPU, so that both devices train on the same batch.
  Tensor ids = randint(1, m.vocab, {o.batch, o.seq});
  Tensor labels = ids;
  if (is_bert(o.arch)) {
    const Tensor chosen = lt(rand({o.batch, o.seq}), 0.15);
    labels = where(chosen, randint(1, m.vocab, {o.batch, o.seq}), Scalar(int64_t{-100}));
  }
  ids = ids.to(device);
  labels = labels.to(device);

  auto forward_backward = [&m](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    Tensor loss = m.loss(a[0], a[1]);
    loss.backward();
    return {loss.detach()};
  };
  auto eager_step = [&] {
    adamw.zero_grad();
    forward_backward({ids, labels});
    adamw.step();
  };
  // --amp: the forward and the loss under autocast, the backward outside it (as kiln-train's
  // --amp and PyTorch's recipe); f16 scales the loss and steps through a GradScaler.
  std::optional<optim::GradScaler> scaler;
  if (o.amp == DType::f16) scaler.emplace(optim::GradScalerOptions{.device = device});
  auto amp_forward_backward = [&m, &o, &scaler, device](const std::vector<Tensor>& a) -> std::vector<Tensor> {
    Tensor loss;
    {
      autocast scope({.device_type = device.type, .dtype = o.amp});
      loss = m.loss(a[0], a[1]);
    }
    (scaler ? scaler->scale(loss) : loss).backward();
    return {loss.detach()};
  };
  auto amp_update = [&] {
    if (!scaler) return adamw.step();
    scaler->step(adamw);
    scaler->update();
  };
  using Mode = StepMode;
  std::vector<Mode> modes;
  modes.push_back({"eager", eager_step, o.warmup});
  std::optional<CompiledFunction> compiled, whole;
  if (o.compile) {
    // The first call traces with .grad undefined (after zero_grad); one graph.
    compiled = compile(forward_backward, {.profile = o.profile});
    modes.push_back({"compiled",
                     [&] {
                       adamw.zero_grad();
                       (*compiled)({ids, labels});
                       adamw.step();
                     },
                     std::max<int64_t>(o.warmup, 2), {}, 0, 0, &*compiled});
    // The gradients zeroed in place (clearing them to none would change the guard), forward,
    // backward and the update in one graph; AdamW's state must exist before tracing, so the
    // eager steps run first.
    whole = compile(
        [&](const std::vector<Tensor>& a) {
          adamw.zero_grad(/*set_to_none=*/false);
          std::vector<Tensor> out = forward_backward(a);
          adamw.step();
          return out;
        },
        {.profile = o.profile});
    modes.push_back({"compiled-whole-step", [&] { (*whole)({ids, labels}); }, std::max<int64_t>(o.warmup, 2), {},
                     0, 0, &*whole});
  }
  std::optional<CompiledFunction> compiled_amp;
  if (o.amp) {
    const char* amp_name = o.amp == DType::f16 ? "fp16" : "bf16";
    modes.push_back({fmt::format("eager-amp-{}", amp_name),
                     [&] {
                       adamw.zero_grad();
                       amp_forward_backward({ids, labels});
                       amp_update();
                     },
                     o.warmup});
    if (o.compile) {
      compiled_amp = compile(amp_forward_backward, {.profile = o.profile});
      modes.push_back({fmt::format("compiled-amp-{}", amp_name),
                       [&] {
                         adamw.zero_grad();
                         (*compiled_amp)({ids, labels});
                         amp_update();
                       },
                       std::max<int64_t>(o.warmup, 2), {}, 0, 0, &*compiled_amp});
    }
  }
  if (!o.only.empty()) {
    // The named modes, in the order given (a mode not traced is never compiled).
    std::vector<Mode> chosen;
    for (size_t i = 0; i < o.only.size(); ++i) {
      const std::string& name = o.only[i];
      const auto it = std::ranges::find(modes, name, &Mode::name);
      if (it == modes.end() || std::ranges::count(o.only, name) > 1)
        fail("kiln-bench train: --only {}: expected distinct modes among {} (the compiled modes need --compile)",
             fmt::join(o.only, ","), fmt::join(modes | std::views::transform(&Mode::name), ", "));
      // AdamW's state must exist before the whole step is traced: an eager or compiled
      // mode's warm-up before it makes it, else one eager step here.
      if (name == "compiled-whole-step" && i == 0) eager_step();
      chosen.push_back(*it);
    }
    modes = std::move(chosen);
  }

  // As kiln-bench train: the timed steps in rounds, a few of each mode per round. On a GPU
  // each step ends with a synchronization, so its time is the device's work.
  time_in_rounds(
      modes, o.steps,
      [device](Mode& mode) {
        const auto t0 = std::chrono::steady_clock::now();
        mode.step();
        if (device.is_cuda()) cuda::synchronize(device.index);
        return ms_since(t0);
      },
      [device] { reset_peak_memory(device.type); },
      [device] { return static_cast<double>(memory_stats(device.type).peak) / 1048576.0; });
  // What a GPU run adds: TF32, the allocator's reserved peak, any op that ran on the host.
  std::string device_fields = blas_field();
  if (device.is_cuda()) {
    const std::vector<std::string> fallback = cuda::host_fallback_ops();
    device_fields = fmt::format(
        R"(,"tf32":true,"reserved_mib":{:.1f},"host_fallback_ops":[{}])",
        static_cast<double>(cuda::allocator_stats(device.index).peak_reserved) / 1048576.0,
        fmt::join(fallback | std::views::transform([](const std::string& n) { return "\"" + n + "\""; }), ","));
  }

  const double eager_ms = modes[0].name == "eager" ? median_of(modes[0].ms) : 0;
  const double eager_peak = modes[0].peak;
  for (const Mode& mode : modes) {
    const double ms = median_of(mode.ms);
    const auto [fastest, slowest] = std::ranges::minmax(mode.ms);
    std::string extra;
    if (o.amp && mode.name.find("-amp-") != std::string::npos)
      extra = fmt::format(R"(,"amp":"{}","loss_scaling":{})", o.amp == DType::f16 ? "fp16" : "bf16",
                          scaler.has_value());
    if (mode.compiled) {
      extra += fmt::format(R"(,"graphs":{})", mode.compiled->cache_size());
      if (eager_ms > 0)
        extra += fmt::format(R"(,"speedup_vs_eager":{:.3f},"peak_ratio_vs_eager":{:.3f})", eager_ms / ms,
                             mode.peak / eager_peak);
    }
    std::cout << fmt::format(
        R"({{"bench":"train","mode":"{}","arch":"{}","device":"{}","batch":{},"seq":{},"vocab":{},)"
        R"("loss":"{}","optimizer":"adamw","dropout":{},"parameters":{},"steps":{},"median_step_ms":{:.1f},)"
        R"("min_step_ms":{:.1f},"max_step_ms":{:.1f},"tokens_per_s":{:.0f},"samples_per_s":{:.2f},)"
        R"("peak_mib":{:.1f},"first_call_s":{:.2f}{}{}}})"
        "\n",
        mode.name, o.arch, o.device, o.batch, o.seq, m.vocab, is_bert(o.arch) ? "masked_lm" : "causal_lm", o.dropout,
        parameters, o.steps, ms, fastest, slowest, 1000.0 * static_cast<double>(o.batch * o.seq) / ms,
        1000.0 * static_cast<double>(o.batch) / ms, mode.peak, mode.first_call_s, extra, device_fields);
  }
  if (o.profile) {
    for (const Mode& mode : modes)
      if (mode.compiled) std::cerr << mode.name << ":\n" << mode.compiled->profile();
    profile_eager_step(eager_step, device);
  }
  return 0;
}

bool is_text_arch(int argc, char** argv) {
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--arch")
      return std::string(argv[i + 1]).starts_with("bert-") || std::string(argv[i + 1]).starts_with("gpt2-");
  return false;
}

int bench_text_train(int argc, char** argv) {
  TextBenchOptions o;
  for (int i = 2; i < argc; ++i) {
    const std::string option = argv[i];
    if (option == "--compile" || option == "--profile") {
      (option == "--compile" ? o.compile : o.profile) = true;
      continue;
    }
    if (option == "--no-dropout") {
      o.dropout = false;
      continue;
    }
    KILN_CHECK(i + 1 < argc, "kiln-bench train: {} needs a value", option);
    const std::string value = argv[++i];
    auto number = [&] { return parse_integer("kiln-bench train", option, value); };
    if (option == "--arch") o.arch = value;
    else if (option == "--only") {
      o.only = split_list(value);
      KILN_CHECK(!o.only.empty(), "kiln-bench train: --only {}: expected a mode or a comma-separated list", value);
    }
    else if (option == "--device") o.device = value;
    else if (option == "--batch") o.batch = number();
    else if (option == "--seq") o.seq = number();
    else if (option == "--vocab") o.vocab = number();
    else if (option == "--steps") o.steps = number();
    else if (option == "--warmup") o.warmup = number();
    else if (option == "--amp") {
      if (value == "bf16") o.amp = DType::bf16;
      else if (value == "f16" || value == "fp16") o.amp = DType::f16;
      else fail("kiln-bench train: --amp {}: expected bf16 or fp16", value);
    }
    else fail("kiln-bench train: unknown option {} for --arch {} (the text models take --batch, --seq, "
              "--vocab, --steps, --warmup, --device, --amp, --compile, --only, --profile, --no-dropout)", option, o.arch);
  }
  check_range("kiln-bench train: --batch", o.batch, 1, 1 << 16);
  check_range("kiln-bench train: --seq", o.seq, 1, 1 << 16);
  if (o.vocab != 0) check_range("kiln-bench train: --vocab", o.vocab, 2, 1 << 22);
  check_range("kiln-bench train: --steps", o.steps, 1, 1'000'000);
  check_range("kiln-bench train: --warmup", o.warmup, 1, 1'000'000);
  KILN_CHECK(o.device == "cpu" || o.device == "cuda", "kiln-bench train: --device {}: expected cpu or cuda",
             o.device);
  return bench_text_train(o);
}

}  // namespace kiln::bench
