// kiln-train's command line (tools/train_args.cpp): values as the next argument or after
// '=', flags, sizes with K/M/G suffixes, --micro-batch auto, --help, and errors for unknown
// options, missing values and malformed numbers.
#include "testing.h"

#include <string>
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
  const train::Config later = parse({"--compile", "--amp", "--channels-last"});
  CHECK(later.compile);
  CHECK(later.compile_mode == "default");
  const train::Config moded = parse({"--compile", "default", "--epochs", "2"});
  CHECK(moded.compile);
  CHECK(moded.epochs == 2);
  CHECK(parse({"--compile=max-autotune"}).compile_mode == "max-autotune");
  CHECK(parse({"--compile", "--epochs", "3"}).epochs == 3);  // no mode: the next option is not eaten
  CHECK(later.amp);
  CHECK(later.channels_last);
  CHECK_FALSE(later.skip_bad_images);
  CHECK(parse({"--skip-bad-images"}).skip_bad_images);
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
