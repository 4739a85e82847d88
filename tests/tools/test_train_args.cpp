// kiln-train's command line (tools/train_args.cpp): values as the next argument or after
// '=', flags, sizes with K/M/G suffixes, --micro-batch auto, --help, and errors for unknown
// options, missing values, malformed numbers and values out of range (validate); the
// settings named as differing from PyTorch's defaults.
#include "testing.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <utility>
#include <vector>

#include "tools/trainer.h"

using namespace kiln;
using Catch::Matchers::Contains;
namespace train = kiln::train;

namespace {

train::Config parse(std::vector<std::string> args) {
  args.insert(args.begin(), "kiln-train");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return train::parse_args(static_cast<int>(argv.size()), argv.data());
}

}  // namespace

TEST_CASE("train args: no options give the documented defaults", "[trainer]") {
  const train::Config c = parse({});
  CHECK(c.data == "synthetic");
  CHECK(c.arch == "resnet50");
  CHECK(c.epochs == 1);
  CHECK(c.batch == 32);
  CHECK(c.micro_batch == 0);
  CHECK_FALSE(c.micro_batch_auto);
  CHECK(c.lr == 0.1);
  CHECK(c.lr_schedule == "cosine");
  CHECK(c.optimizer == "sgd");
  CHECK(c.workers == 2);
  CHECK(c.device == "cpu");
  CHECK_FALSE(c.resume);
  CHECK_FALSE(c.quiet);
}

TEST_CASE("train args: values flags and sizes", "[trainer]") {
  const train::Config c =
      parse({"--data", "shapes", "--arch=cnn", "--epochs", "3", "--batch", "64", "--micro-batch", "16", "--lr=0.5",
             "--lr-schedule", "onecycle", "--warmup", "10", "--optimizer", "adamw", "--momentum", "0.8",
             "--weight-decay", "1e-4", "--label-smoothing", "0.1", "--image-size", "32", "--train-samples", "100",
             "--val-samples", "50", "--workers", "0", "--seed", "7", "--checkpoint", "/tmp/ck", "--resume", "--log",
             "l.jsonl", "--plot", "p.svg", "--print-every", "5", "--cache-dir", "/tmp/cache", "--steps", "9",
             "--memory-budget", "2G", "--device", "cpu"});
  CHECK(c.data == "shapes");
  CHECK(c.arch == "cnn");
  CHECK(c.epochs == 3);
  CHECK(c.batch == 64);
  CHECK(c.micro_batch == 16);
  CHECK(c.lr == 0.5);
  CHECK(c.lr_schedule == "onecycle");
  CHECK(c.warmup == 10);
  CHECK(c.optimizer == "adamw");
  CHECK(c.momentum == 0.8);
  CHECK(c.weight_decay == 1e-4);
  CHECK(c.label_smoothing == 0.1);
  CHECK(c.image_size == 32);
  CHECK(c.train_samples == 100);
  CHECK(c.val_samples == 50);
  CHECK(c.workers == 0);
  CHECK(c.seed == 7);
  CHECK(c.checkpoint_dir == "/tmp/ck");
  CHECK(c.resume);
  CHECK(c.log_file == "l.jsonl");
  CHECK(c.plot_file == "p.svg");
  CHECK(c.print_every == 5);
  CHECK(c.cache_dir == "/tmp/cache");
  CHECK(c.steps == 9);
  CHECK(c.memory_budget == (int64_t{2} << 30));

  CHECK(parse({"--memory-budget", "512M"}).memory_budget == (int64_t{512} << 20));
  CHECK(parse({"--memory-budget", "64k"}).memory_budget == (int64_t{64} << 10));
  CHECK(parse({"--memory-budget", "1000000"}).memory_budget == 1000000);
  const train::Config later = parse({"--compile", "--amp", "bf16", "--channels-last"});
  CHECK(later.compile);
  CHECK(later.compile_mode == "default");
  const train::Config moded = parse({"--compile", "default", "--epochs", "2"});
  CHECK(moded.compile);
  CHECK(moded.epochs == 2);
  CHECK(parse({"--compile=max-autotune"}).compile_mode == "max-autotune");
  CHECK(parse({"--compile", "--epochs", "3"}).epochs == 3);  // no mode: the next option is not eaten
  CHECK(later.amp == "bf16");
  CHECK(later.loss_scale == "auto");
  const train::Config scaled = parse({"--amp=fp16", "--loss-scale", "dynamic", "--clip-grad-norm", "1.5"});
  CHECK(scaled.amp == "fp16");
  CHECK(scaled.loss_scale == "dynamic");
  CHECK(scaled.clip_grad_norm == 1.5);
  CHECK_THROWS_WITH(parse({"--amp", "f8"}), Contains("--amp f8") && Contains("bf16"));
  CHECK_THROWS_WITH(parse({"--amp"}), Contains("--amp needs a value"));
  CHECK_THROWS_WITH(parse({"--loss-scale", "static"}), Contains("--loss-scale static"));
  CHECK_THROWS_WITH(parse({"--loss-scale", "dynamic"}), Contains("needs --amp"));
  CHECK_THROWS_WITH(parse({"--clip-grad-norm", "-1"}), Contains("--clip-grad-norm -1"));
  CHECK(later.channels_last);
  CHECK_FALSE(later.skip_bad_images);
  CHECK(parse({"--skip-bad-images"}).skip_bad_images);
}

TEST_CASE("train args: channels-last is CUDA's default for convolutional archs", "[trainer][train_args]") {
  CHECK_FALSE(parse({}).channels_last);  // the CPU: off unless asked
  CHECK(parse({"--device", "cuda"}).channels_last);
  CHECK_FALSE(parse({"--device", "cuda", "--no-channels-last"}).channels_last);
  CHECK_FALSE(parse({"--device", "cuda", "--arch", "mlp"}).channels_last);  // flattens its input
  CHECK(parse({"--channels-last"}).channels_last);
}

TEST_CASE("train args: micro-batch auto", "[trainer]") {
  const train::Config c = parse({"--micro-batch", "auto"});
  CHECK(c.micro_batch_auto);
  CHECK(c.micro_batch == 0);
  CHECK(parse({"--micro-batch=auto"}).micro_batch_auto);
  REQUIRE_THROWS_WITH(parse({"--micro-batch", "0"}), Contains("--micro-batch 0"));
  REQUIRE_THROWS_WITH(parse({"--micro-batch", "-2"}), Contains("--micro-batch -2"));
  REQUIRE_THROWS_WITH(parse({"--micro-batch", "some"}), Contains("expected an integer"));
}

TEST_CASE("train args: --help throws HelpRequested with the usage", "[trainer]") {
  for (const char* option : {"--help", "-h"}) {
    INFO(option);
    try {
      parse({"--epochs", "2", option});
      FAIL("no HelpRequested");
    } catch (const train::HelpRequested& help) {
      CHECK(help.text == train::usage());
      CHECK_THAT(help.text, Contains("usage: kiln-train") && Contains("--micro-batch N|auto"));
    }
  }
}

TEST_CASE("train args: bad command lines are errors naming the option", "[trainer]") {
  REQUIRE_THROWS_AS(parse({"--bogus"}), Error);
  REQUIRE_THROWS_WITH(parse({"--bogus"}), Contains("unknown option --bogus") && Contains("--help"));
  REQUIRE_THROWS_WITH(parse({"--bogus=3"}), Contains("unknown option --bogus"));
  REQUIRE_THROWS_WITH(parse({"stray"}), Contains("unknown option stray"));
  REQUIRE_THROWS_WITH(parse({"--epochs"}), Contains("--epochs needs a value"));
  REQUIRE_THROWS_WITH(parse({"--epochs", "two"}), Contains("--epochs two") && Contains("expected an integer"));
  REQUIRE_THROWS_WITH(parse({"--epochs", "3x"}), Contains("expected an integer"));
  REQUIRE_THROWS_WITH(parse({"--lr", "fast"}), Contains("--lr fast") && Contains("expected a number"));
  REQUIRE_THROWS_WITH(parse({"--lr=0.1.2"}), Contains("expected a number"));
  REQUIRE_THROWS_WITH(parse({"--memory-budget", "2X"}), Contains("--memory-budget"));
  REQUIRE_THROWS_WITH(parse({"--memory-budget", "G"}), Contains("--memory-budget"));
  REQUIRE_THROWS_WITH(parse({"--memory-budget="}), Contains("--memory-budget"));
  REQUIRE_THROWS_WITH(parse({"--resume=yes"}), Contains("--resume takes no value"));
}

TEST_CASE("train args: the flags for PyTorch's recipes", "[trainer][train_args]") {
  const train::Config defaults = parse({});
  CHECK_FALSE(defaults.nesterov);
  CHECK_FALSE(defaults.zero_init_residual);  // torchvision's default
  CHECK(defaults.weight_decay_scope == "all");  // PyTorch's optimizers decay every parameter
  CHECK(defaults.pad == 0);
  const train::Config c = parse({"--data", "fashion-mnist", "--nesterov", "--zero-init-residual", "--pad", "2",
                                 "--weight-decay-scope", "no-norm-bias"});
  CHECK(c.nesterov);
  CHECK(c.zero_init_residual);
  CHECK(c.pad == 2);
  CHECK(c.weight_decay_scope == "no-norm-bias");
  CHECK(parse({"--weight-decay-scope=all"}).weight_decay_scope == "all");
  REQUIRE_THROWS_WITH(parse({"--nesterov=1"}), Contains("--nesterov takes no value"));
  REQUIRE_THROWS_WITH(parse({"--weight-decay-scope", "none"}),
                      Contains("--weight-decay-scope none: expected all or no-norm-bias"));
  REQUIRE_THROWS_WITH(parse({"--nesterov", "--momentum", "0"}), Contains("--nesterov needs"));
  REQUIRE_THROWS_WITH(parse({"--nesterov", "--optimizer", "adamw"}), Contains("--nesterov needs --optimizer sgd"));
  REQUIRE_THROWS_WITH(parse({"--pad", "2"}), Contains("--pad 2: synthetic data"));
}

TEST_CASE("train args: out-of-range values are errors naming the option", "[trainer][train_args]") {
  // Each of these once crashed kiln-train (a division by zero, an allocation, a thread) or
  // trained nothing and exited 0.
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--batch", "9223372036854775807"}, "--batch 9223372036854775807 must be between 1 and"},
      {{"--batch", "0"}, "--batch 0"},
      {{"--steps", "9223372036854775807"}, "--steps 9223372036854775807 must be between 0 and"},
      {{"--steps", "-1"}, "--steps -1"},
      {{"--epochs", "9223372036854775807"}, "--epochs 9223372036854775807 must be between 0 and"},
      {{"--epochs", "-3"}, "--epochs -3"},
      {{"--epochs", "0"}, "give --epochs or --steps a positive value"},
      {{"--warmup", "-1"}, "--warmup -1"},
      {{"--image-size", "200000"}, "--image-size 200000 must be between 1 and 4096"},
      {{"--image-size", "-1"}, "--image-size -1"},
      {{"--data", "shapes", "--pad", "-1"}, "--pad -1"},
      {{"--data", "shapes", "--image-size", "4000", "--pad", "100"}, "--pad 100"},
      {{"--workers", "100000"}, "--workers 100000 must be between 0 and 256"},
      {{"--workers", "-1"}, "--workers -1"},
      {{"--train-samples", "-5"}, "--train-samples -5"},
      {{"--val-samples", "-5"}, "--val-samples -5"},
      {{"--print-every", "0"}, "--print-every 0"},
      {{"--memory-budget", "-1"}, "--memory-budget -1"},
      {{"--memory-budget", "9000000000000G"}, "--memory-budget 9000000000000G: more bytes than can be counted"},
      {{"--lr", "inf"}, "--lr inf must be a finite number"},
      {{"--lr", "nan"}, "--lr nan must be a finite number"},
      {{"--lr", "-0.1"}, "--lr -0.1"},
      {{"--lr", "1e999"}, "--lr 1e999"},
      {{"--momentum", "inf"}, "--momentum inf"},
      {{"--weight-decay", "nan"}, "--weight-decay nan"},
      {{"--label-smoothing", "nan"}, "--label-smoothing nan"},
      {{"--arch", "resnet9"}, "--arch resnet9"},
      {{"--optimizer", "lamb"}, "--optimizer lamb"},
      {{"--lr-schedule", "poly"}, "--lr-schedule poly"},
      {{"--device", "tpu"}, "--device tpu"},
      {{"--compile=fastest"}, "--compile fastest"},
      {{"--resume"}, "--resume needs --checkpoint DIR"},
      {{"--arch", "mlp", "--channels-last"}, "--channels-last needs a convolutional --arch"},
      {{"--channels-last", "--no-channels-last"}, "--channels-last or --no-channels-last, not both"},
  };
  for (const auto& [args, message] : cases) {
    INFO(fmt::format("{}", fmt::join(args, " ")));
    REQUIRE_THROWS_AS(parse(args), Error);
    REQUIRE_THROWS_WITH(parse(args), Contains(message));
  }
  // The limits themselves are accepted.
  CHECK(parse({"--workers", "256"}).workers == 256);
  CHECK(parse({"--image-size", "4096"}).image_size == 4096);
  CHECK(parse({"--steps", "1000000000000"}).steps == 1'000'000'000'000);
}

TEST_CASE("train args: validate checks a Config as the command line does", "[trainer][train_args]") {
  train::validate(train::Config{});
  train::Config c;
  SECTION("synthetic size") {
    c.synthetic_size = 0;
    REQUIRE_THROWS_WITH(train::validate(c), Contains("0 synthetic samples"));
  }
  SECTION("synthetic classes") {
    c.synthetic_classes = 0;
    REQUIRE_THROWS_WITH(train::validate(c), Contains("0 synthetic classes"));
  }
  SECTION("stop after") {
    c.stop_after_steps = -1;
    REQUIRE_THROWS_WITH(train::validate(c), Contains("stop after -1 steps"));
  }
  SECTION("micro-batch") {
    c.micro_batch = c.batch + 1;
    REQUIRE_THROWS_WITH(train::validate(c), Contains("--micro-batch 33 must be between 1 and --batch 32"));
  }
  SECTION("a resume with no folder") {
    c.resume = true;
    REQUIRE_THROWS_WITH(train::validate(c), Contains("--resume needs --checkpoint DIR"));
  }
}

TEST_CASE("train args: --help says what kiln-train does", "[trainer][train_args]") {
  const std::string text = train::usage();
  // It compiles (--compile) and runs on CUDA (--device cuda): not "eagerly on the CPU".
  CHECK_THAT(text, !Contains("eagerly on the CPU"));
  CHECK_THAT(text, Contains("compiled with --compile") && Contains("--device cuda"));
  for (const char* option : {"--nesterov", "--zero-init-residual", "--pad N", "--weight-decay-scope", "--image-size N",
                             "--workers N"})
    CHECK_THAT(text, Contains(option));
  CHECK_THAT(text, Contains("(off, as torchvision)") && Contains("[all]") && Contains("(1 to 4096)") &&
                       Contains("(0 to 256)"));
  CHECK_THAT(text, Contains("running mean loss") && Contains("whole run"));
}

TEST_CASE("train args: the settings that differ from PyTorch's defaults are named", "[trainer][train_args]") {
  CHECK(train::pytorch_differences(parse({})).empty());
  CHECK(train::pytorch_differences(parse({"--data", "fashion-mnist", "--image-size", "28"})).empty());
  CHECK(train::pytorch_differences(parse({"--arch", "cnn", "--zero-init-residual"})).empty());  // no residual blocks
  CHECK(train::pytorch_differences(parse({"--weight-decay", "0", "--weight-decay-scope", "no-norm-bias"})).empty());
  const std::vector<std::string> d =
      train::pytorch_differences(parse({"--data", "fashion-mnist", "--image-size", "32", "--zero-init-residual",
                                        "--weight-decay-scope", "no-norm-bias", "--label-smoothing", "0.1",
                                        "--nesterov"}));
  CHECK(d == std::vector<std::string>{"zero-init-residual on", "weight decay skips norms and biases",
                                      "Nesterov momentum", "label smoothing 0.1",
                                      "images stretched 28 -> 32 (bilinear)"});
}
