// kiln-train's engine (tools/trainer.h): a run interrupted and resumed ends bitwise equal to
// one that is not (mid-epoch, at an epoch boundary, twice, with other worker counts, with
// adamw); a step's loss and update do not depend on how the global batch is cut into
// micro-batches; checkpoint folders, rotation, atomicity and resume errors; the JSON log and
// the SVG plot (round ticks, eager or compiled in the title); --micro-batch auto; bad
// names; and the edges: an epoch with no full batch, a loss that is not finite, an
// unwritable log or plot (found before training), --zero-init-residual,
// --weight-decay-scope, --nesterov, --pad, the settings named as differing from PyTorch's,
// the progress line. The mixed-precision runs are in test_trainer_amp.cpp.
//
// Tolerances: resume equivalence is exact (every tensor byte, every step loss, every epoch
// record except its images/s, a timing). Micro-batch equivalence uses an MLP (no batch
// norm, whose statistics would depend on the micro-batch), so only float rounding of the
// accumulated sums differs. Compiled against eager, channels-last against contiguous and
// split against whole batches sum the same terms in other orders, so losses and weights
// agree within the summation bound of their longest sum (tests/tolerance.h): losses
// relative, the weights and buffers normwise as one vector.
#include "testing.h"
#include "tolerance.h"
#include "tools/trainer_testing.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "data/datasets.h"
#include "data/image.h"
#include "tools/checkpoint.h"
#include "tools/progress.h"
#include "tools/trainer.h"

using namespace kiln;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;
namespace train = kiln::train;
using namespace kiln::testing;  // tools/trainer_testing.h

namespace {

// small_cnn()'s longest sum has 128 * 3 * 3 = 1152 terms (the input gradient of the last
// convolution, 128 channels of 3x3): two kernels that order its sums differently give
// losses and weights within 2 gamma(1152) = 1.4e-4 of each other, however OpenBLAS blocks
// its GEMMs on the machine at hand. (Measured with several OpenBLAS core types, on an idle
// and on a loaded machine, where OpenBLAS's AVX-512 kernels sum in yet other orders: losses
// within 1.4e-5, weights within 2.2e-5 normwise, after 10 steps.)
constexpr double kSmallCnnSums = kiln::testing::summation_bound(128 * 3 * 3);

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);) lines.push_back(line);
  return lines;
}

// An image folder, DIR/train/{a,b}/<i>.jpg for i < per_class, of 16x16 RGB JPEGs (or of
// side_of(class, i) pixels square), and a run that trains an MLP on it at 16x16, batch 4.
train::Config mlp_on_image_folder(const fs::path& dir, int per_class,
                                  const std::function<int64_t(const std::string&, int)>& side_of = {}) {
  for (const std::string cls : {"a", "b"}) {
    fs::create_directories(dir / "train" / cls);
    for (int i = 0; i < per_class; ++i) {
      const int64_t side = side_of ? side_of(cls, i) : 16;
      data::Image image(side, side, 3);
      for (size_t k = 0; k < image.pixels.size(); ++k) image.pixels[k] = static_cast<uint8_t>((k * 7 + i) % 256);
      data::write_jpeg(dir / "train" / cls / fmt::format("{}.jpg", i), image);
    }
  }
  train::Config c;
  c.data = dir.string();
  c.arch = "mlp";
  c.image_size = 16;
  c.batch = 4;
  c.epochs = 1;
  c.workers = 2;
  c.quiet = true;
  return c;
}

// Interrupts `c` after `stop_after` steps, then resumes it (with `resume_workers` loader
// threads) until done; returns the resumed run's result.
train::Result interrupted_and_resumed(train::Config c, const fs::path& dir, int64_t stop_after,
                                      int64_t resume_workers) {
  c.checkpoint_dir = dir;
  c.stop_after_steps = stop_after;
  const train::Result first = run(c);
  REQUIRE(first.interrupted);
  REQUIRE(first.steps == stop_after);
  REQUIRE(fs::is_directory(first.checkpoint));
  c.stop_after_steps = 0;
  c.resume = true;
  c.workers = resume_workers;
  return run(c);
}

}  // namespace

TEST_CASE("trainer: an interrupted and resumed run ends bitwise equal to an uninterrupted one", "[trainer]") {
  train::Config c = small_cnn();
  auto optimizer = GENERATE(as<std::string>{}, "sgd", "adamw");
  c.optimizer = optimizer;
  INFO("optimizer " << optimizer);
  // Every section compares with the same uninterrupted run: run it once per optimizer.
  static std::map<std::string, train::Result> references;
  if (!references.contains(optimizer)) references[optimizer] = run(c);
  const train::Result& reference = references[optimizer];
  REQUIRE_FALSE(reference.interrupted);
  REQUIRE(reference.steps == 10);
  REQUIRE(reference.step_losses.size() == 10);
  REQUIRE(reference.epochs.size() == 2);
  REQUIRE(reference.micro_batch == 4);

  TempDir tmp;
  SECTION("stopped mid-epoch (step 3 of 5)") {
    const train::Result resumed = interrupted_and_resumed(c, tmp.path(), 3, c.workers);
    CHECK_FALSE(resumed.interrupted);
    CHECK(resumed.steps == 10);
    require_bitwise_equal(resumed.model, reference.model);
    require_same_history(resumed, reference);
  }
  SECTION("stopped at the epoch boundary (step 5)") {
    const train::Result resumed = interrupted_and_resumed(c, tmp.path(), 5, c.workers);
    require_bitwise_equal(resumed.model, reference.model);
    require_same_history(resumed, reference);
  }
  SECTION("resumed with no loader threads") {
    const train::Result resumed = interrupted_and_resumed(c, tmp.path(), 3, 0);
    require_bitwise_equal(resumed.model, reference.model);
    require_same_history(resumed, reference);
  }
  SECTION("resumed with two loader threads") {
    const train::Result resumed = interrupted_and_resumed(c, tmp.path(), 7, 2);
    require_bitwise_equal(resumed.model, reference.model);
    require_same_history(resumed, reference);
  }
  SECTION("stopped twice") {
    c.checkpoint_dir = tmp.path();
    c.stop_after_steps = 2;
    REQUIRE(run(c).steps == 2);
    c.resume = true;
    c.stop_after_steps = 6;
    const train::Result second = run(c);
    REQUIRE(second.interrupted);
    REQUIRE(second.steps == 8);
    c.stop_after_steps = 0;
    const train::Result resumed = run(c);
    require_bitwise_equal(resumed.model, reference.model);
    require_same_history(resumed, reference);
  }
}

TEST_CASE("trainer: a run with other workers or a checkpoint folder gives the same weights", "[trainer]") {
  train::Config c = small_cnn();
  const train::Result reference = run(c);
  TempDir tmp;
  c.workers = 0;
  c.checkpoint_dir = tmp.path();
  const train::Result other = run(c);
  require_bitwise_equal(other.model, reference.model);
  require_same_history(other, reference);
}

TEST_CASE("trainer: the step loss is the global batch mean however the batch is split", "[trainer]") {
  // An MLP has no batch norm, so accumulation is exact up to float rounding. Its longest
  // sums have 256 terms (the second layer's inputs); the split changes the GEMMs' row
  // counts, for which OpenBLAS may pick other kernels that order those sums differently.
  constexpr double kMlpSums = kiln::testing::summation_bound(256);
  train::Config c;
  c.data = "synthetic";
  c.synthetic_size = 16;
  c.synthetic_classes = 4;
  c.image_size = 8;
  c.arch = "mlp";
  c.batch = 8;
  c.steps = 1;
  c.lr = 0.1;
  c.workers = 0;
  c.seed = 5;
  c.quiet = true;
  c.micro_batch = 0;
  const train::Result whole = run(c);
  REQUIRE(whole.steps == 1);
  REQUIRE(whole.step_losses.size() == 1);
  CHECK(whole.micro_batch == 8);
  for (int64_t micro : {3, 8}) {
    INFO("micro-batch " << micro);
    c.micro_batch = micro;
    const train::Result split = run(c);
    CHECK(split.micro_batch == micro);
    REQUIRE(split.step_losses.size() == 1);
    CHECK(split.step_losses[0] == Approx(whole.step_losses[0]).epsilon(kMlpSums));
    CHECK(kiln::testing::relative_difference(split.model, whole.model) <= kMlpSums);
  }
}

TEST_CASE("trainer: a step reads its loss and accuracy back once, not once per micro-step", "[trainer]") {
  // On a GPU each read waits for the device: the micro-steps sum on the device instead, so
  // a step split in four micro-steps reads the host as often as a step in one (the
  // optimizer's hyperparameters, then the loss and the count of correct answers, together
  // in one read_steps).
  auto reads_of_a_step = [](int64_t micro_batch) {
    manual_seed(7);
    models::MLP model({16, 8, 4});
    optim::SGD sgd(model.parameters(), {.lr = 0.1});
    const optim::Accumulation accumulation({.batch = 8, .micro_batch = micro_batch});
    const Tensor x = randn({8, 1, 4, 4}), y = randint(0, 4, {8});
    int64_t reads = 0, counts = 0;
    train::StepStats stats;
    {
      HostReadHookGuard hook([&](const Tensor&, const char* reader, bool) {
        ++reads;
        counts += std::string(reader) == "read_steps" ? 1 : 0;
      });
      stats = train::train_step(model, sgd, accumulation, x, y, 0.0);
    }
    CHECK(counts == 1);  // the loss and the correct answers, in one read
    CHECK(stats.samples == 8);
    CHECK(stats.correct >= 0);
    CHECK(stats.correct <= 8);
    CHECK(std::isfinite(stats.loss));
    return reads;
  };
  CHECK(reads_of_a_step(2) == reads_of_a_step(8));
}

TEST_CASE("trainer: checkpoints are complete, rotated and atomic", "[trainer]") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "ckpt";
  train::Config c = small_cnn();
  c.epochs = 3;
  c.checkpoint_dir = dir;
  const train::Result done = run(c);
  REQUIRE(done.steps == 15);

  const std::string latest = read_text(dir / "latest");
  CHECK(latest == "step-00000015\n");
  const fs::path newest = dir / "step-00000015";
  CHECK(done.checkpoint == newest);
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "trainer.safetensors"}) {
    INFO(file);
    CHECK(fs::is_regular_file(newest / file));
  }
  int64_t step_folders = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    INFO(entry.path().string());
    CHECK(name.find(".tmp-") == std::string::npos);
    if (entry.is_directory() && name.starts_with("step-")) ++step_folders;
  }
  CHECK(step_folders == 2);
  CHECK(fs::is_regular_file(dir / "curves.svg"));  // the plot's default place

  SECTION("resuming a finished run returns its weights without training") {
    c.resume = true;
    const train::Result again = run(c);
    CHECK(again.steps == 15);
    require_bitwise_equal(again.model, done.model);
    require_same_history(again, done);
  }
  SECTION("resuming with other settings is refused") {
    c.resume = true;
    c.lr = 0.06;
    REQUIRE_THROWS_WITH(run(c), Contains("other settings") && Contains("lr=0.06"));
  }
  SECTION("resuming without a checkpoint says so") {
    c.resume = true;
    c.checkpoint_dir = tmp.path() / "empty";
    fs::create_directories(c.checkpoint_dir);
    REQUIRE_THROWS_WITH(run(c), Contains("no checkpoint") && Contains("empty"));
    c.checkpoint_dir.clear();
    REQUIRE_THROWS_WITH(run(c), Contains("--resume needs --checkpoint"));
  }
  SECTION("a corrupt trainer.safetensors is an error naming it") {
    std::ofstream(newest / "trainer.safetensors", std::ios::trunc) << "this is not a safetensors file";
    c.resume = true;
    REQUIRE_THROWS_AS(run(c), Error);
    REQUIRE_THROWS_WITH(run(c), Contains("trainer.safetensors"));
  }
  SECTION("latest naming a missing folder is an error naming both") {
    fs::remove_all(newest);
    c.resume = true;
    REQUIRE_THROWS_WITH(run(c), Contains("latest") && Contains("step-00000015"));
  }
}

TEST_CASE("trainer: the log has a JSON line per step and per epoch and the plot is an SVG", "[trainer]") {
  TempDir tmp;
  train::Config c = small_cnn();
  c.log_file = tmp.path() / "log.jsonl";
  c.plot_file = tmp.path() / "curves.svg";
  const train::Result done = run(c);

  const std::vector<std::string> lines = read_lines(c.log_file);
  REQUIRE(lines.size() == 12);  // 5 steps and an epoch line, twice
  int64_t step_lines = 0, epoch_lines = 0;
  for (const std::string& line : lines) {
    INFO(line);
    REQUIRE(line.starts_with("{"));
    REQUIRE(line.ends_with("}"));
    if (line.starts_with("{\"step\":")) {
      ++step_lines;
      for (const char* key : {"\"step\":", "\"epoch\":", "\"loss\":", "\"lr\":", "\"img_per_s\":", "\"accuracy\":"})
        CHECK_THAT(line, Contains(key));
    } else {
      ++epoch_lines;
      CHECK(line.starts_with("{\"epoch\":"));
      for (const char* key : {"\"train_loss\":", "\"train_accuracy\":", "\"val_loss\":", "\"val_accuracy\":"})
        CHECK_THAT(line, Contains(key));
    }
    CHECK_THAT(line, !Contains("null"));
  }
  CHECK(step_lines == 10);
  CHECK(epoch_lines == 2);
  CHECK(lines[5].starts_with("{\"epoch\":1,\"step\":5,"));
  CHECK(lines[11].starts_with("{\"epoch\":2,\"step\":10,"));

  const std::string svg = read_text(c.plot_file);
  CHECK(svg.starts_with("<svg"));
  CHECK_THAT(svg, Contains("</svg>"));
  CHECK(svg.find("</svg>") > svg.size() - 16);  // closed at the end
  CHECK_FALSE(fs::exists(tmp.path() / "ckpt"));   // no checkpoint folder asked for, none made
  (void)done;

  SECTION("an interrupted and resumed run appends to the same log") {
    TempDir other;
    train::Config r = c;
    r.log_file = other.path() / "log.jsonl";
    r.plot_file.clear();
    r.checkpoint_dir = other.path() / "ckpt";
    r.stop_after_steps = 3;
    run(r);
    CHECK(read_lines(r.log_file).size() == 3);
    r.stop_after_steps = 0;
    r.resume = true;
    run(r);
    CHECK(read_lines(r.log_file).size() == 12);
    CHECK(fs::is_regular_file(r.checkpoint_dir / "curves.svg"));
  }
}

TEST_CASE("trainer: micro-batch auto picks the largest micro-batch that fits the budget", "[trainer]") {
  train::Config c = small_cnn();
  c.micro_batch = 0;
  c.micro_batch_auto = true;
  c.epochs = 1;
  // 16x16 images: the ConvNet's last stage sees 2x2, so batch norm has more than one value
  // per channel even for the one-sample trial (at 12x12 it sees 1x1 and the trial throws).
  c.image_size = 16;

  // What a step of 1, 2, 4 samples of this configuration takes (the weights do not matter).
  std::shared_ptr<nn::Module> model = train::make_model("cnn", 4, 3, 16);
  const StateDict before = [&] {
    StateDict copy;
    for (const auto& [name, t] : model->state_dict()) copy[name] = t.clone();
    return copy;
  }();
  const int64_t one = train::measure_step_bytes(*model, {3, 16, 16}, 4, 1);
  const int64_t two = train::measure_step_bytes(*model, {3, 16, 16}, 4, 2);
  const int64_t four = train::measure_step_bytes(*model, {3, 16, 16}, 4, 4);
  INFO("peak bytes of 1, 2, 4 samples: " << one << ", " << two << ", " << four);
  REQUIRE(one > 0);
  REQUIRE(one < two);
  REQUIRE(two < four);
  require_bitwise_equal(model->state_dict(), before);  // the trials leave the model as it was
  for (const Tensor& p : model->parameters()) {
    if (!p.grad().defined()) continue;
    bool zero = true;
    for (double g : testing::values(p.grad())) zero = zero && g == 0;
    CHECK(zero);  // and no gradient left behind
  }

  SECTION("a huge budget takes the whole batch, with the same weights as no accumulation") {
    c.memory_budget = int64_t{1} << 40;
    const train::Result automatic = run(c);
    CHECK(automatic.micro_batch == 8);
    train::Config plain = c;
    plain.micro_batch_auto = false;
    plain.micro_batch = 0;
    require_bitwise_equal(automatic.model, run(plain).model);
  }
  SECTION("a budget below the smallest trial is an error") {
    // The ConvNet has batch norm, so the first trial is 2 samples.
    c.memory_budget = one / 2;
    REQUIRE_THROWS_WITH(run(c), Contains("a step of 2 samples needs"));
  }
  SECTION("a budget between the 2- and 4-sample peaks gives 2") {
    c.memory_budget = (two + four) / 2;
    CHECK(run(c).micro_batch == 2);
  }
  SECTION("a bigger budget never gives a smaller micro-batch") {
    int64_t previous = 0;
    for (int64_t budget : {two, (two + four) / 2, four, four * 2, four * 8}) {
      INFO("budget " << budget);
      c.memory_budget = budget;
      const int64_t micro = run(c).micro_batch;
      CHECK(micro >= previous);
      previous = micro;
    }
    CHECK(previous == 8);
  }
}

TEST_CASE("trainer: channels-last trains as the contiguous run does eager and compiled", "[trainer]") {
  // NHWC convolutions and batch norm sum in other orders: the losses agree within
  // kSmallCnnSums over the run's steps.
  train::Config c = small_cnn();
  const train::Result reference = run(c);
  c.channels_last = true;
  const bool compile = GENERATE(false, true);
  c.compile = compile;
  INFO("compile " << compile);
  const train::Result nhwc = run(c);
  REQUIRE(nhwc.step_losses.size() == reference.step_losses.size());
  for (size_t i = 0; i < nhwc.step_losses.size(); ++i)
    CHECK(nhwc.step_losses[i] == Approx(reference.step_losses[i]).epsilon(kSmallCnnSums));
  c.arch = "mlp";
  REQUIRE_THROWS_WITH(run(c), Contains("--channels-last needs a convolutional --arch"));
}

TEST_CASE("trainer: bad settings are errors naming them", "[trainer]") {
  train::Config c = small_cnn();
  c.epochs = 1;
  SECTION("arch") {
    c.arch = "resnet9";
    REQUIRE_THROWS_WITH(run(c), Contains("--arch resnet9"));
  }
  SECTION("optimizer") {
    c.optimizer = "lamb";
    REQUIRE_THROWS_WITH(run(c), Contains("--optimizer lamb"));
  }
  SECTION("schedule") {
    c.lr_schedule = "poly";
    REQUIRE_THROWS_WITH(run(c), Contains("--lr-schedule poly"));
  }
  SECTION("device") {
    c.device = "tpu";
    REQUIRE_THROWS_WITH(run(c), Contains("--device tpu"));
  }
  SECTION("data") {
    c.data = (fs::temp_directory_path() / "kiln-no-such-folder").string();
    REQUIRE_THROWS_WITH(run(c), Contains("kiln-no-such-folder"));
  }
  SECTION("micro-batch above the batch") {
    c.micro_batch = 9;
    REQUIRE_THROWS_WITH(run(c), Contains("--micro-batch 9"));
  }
  SECTION("no epochs or steps") {
    c.epochs = 0;
    REQUIRE_THROWS_WITH(run(c), Contains("--epochs or --steps"));
  }
  SECTION("label smoothing") {
    c.label_smoothing = 1.5;
    REQUIRE_THROWS_WITH(run(c), Contains("--label-smoothing 1.5"));
  }
}

TEST_CASE("trainer: a corrupt image stops the run naming it or is skipped and counted", "[trainer]") {
  TempDir dir;
  // Two classes of 6 images each, one of them corrupt.
  train::Config c = mlp_on_image_folder(dir.path(), 6);
  std::ofstream(dir.path() / "train" / "b" / "3.jpg", std::ios::trunc | std::ios::binary) << "not a jpeg at all";
  REQUIRE_THROWS_WITH(run(c), Contains("3.jpg"));
  c.skip_bad_images = true;
  const train::Result result = run(c);
  CHECK(result.skipped == 1);
  CHECK(result.steps == 3);
}

TEST_CASE("trainer: a run that skipped whole batches of bad images resumes where it stopped", "[trainer]") {
  // Batch 1: each bad image is a whole batch the loader skips, so the epoch's position runs
  // ahead of the number of steps taken; a resume must continue from the loader's position.
  TempDir dir;
  train::Config c = mlp_on_image_folder(dir.path(), 4);
  for (const char* bad : {"a/1.jpg", "a/2.jpg", "b/0.jpg"})
    std::ofstream(dir.path() / "train" / bad, std::ios::trunc | std::ios::binary) << "not a jpeg";
  c.batch = 1;
  c.workers = 0;
  c.skip_bad_images = true;
  const train::Result reference = run(c);
  REQUIRE(reference.skipped == 3);
  for (const int64_t stop_after : {1, 2, 3, 4}) {
    INFO("stopped after " << stop_after << " steps");
    TempDir ckpt;
    train::Config first = c;
    first.checkpoint_dir = ckpt.path();
    first.stop_after_steps = stop_after;
    REQUIRE(run(first).interrupted);
    train::Config rest = c;
    rest.checkpoint_dir = ckpt.path();
    rest.resume = true;
    const train::Result resumed = run(rest);
    require_bitwise_equal(resumed.model, reference.model);
    CHECK(resumed.step_losses == reference.step_losses);
  }
}

TEST_CASE("trainer: --max-image-pixels refuses larger images, or skips and counts them", "[trainer]") {
  TempDir dir;
  // Two classes of six 16x16 images, one of them 32x32: over a limit of 16 * 16 pixels.
  train::Config c =
      mlp_on_image_folder(dir.path(), 6, [](const std::string& cls, int i) { return cls == "a" && i == 2 ? 32 : 16; });
  c.max_image_pixels = 16 * 16;
  REQUIRE_THROWS_WITH(run(c), Contains("2.jpg") && Contains("larger than the limit of 256 pixels"));
  c.skip_bad_images = true;
  const train::Result result = run(c);
  CHECK(result.skipped == 1);
  c.max_image_pixels = -1;
  REQUIRE_THROWS_WITH(run(c), Contains("--max-image-pixels -1 must not be negative"));
  // The limit is the process's: a later run without the option has the default again.
  c.max_image_pixels = 0;
  c.skip_bad_images = false;
  CHECK(run(c).skipped == 0);
  CHECK(data::max_image_pixels() == data::kDefaultMaxImagePixels);
}

TEST_CASE("trainer: --compile trains like eager", "[trainer]") {
  // The micro-steps run as generated code (kiln::compile); the optimizer step stays eager.
  // Kernels compute what the eager ops compute, summed in other orders, so the runs agree
  // within kSmallCnnSums: the losses of the 10 steps, the weights after them.
  train::Config c = small_cnn();
  const train::Result eager = run(c);
  c.compile = true;
  const train::Result compiled = run(c);
  REQUIRE(compiled.step_losses.size() == eager.step_losses.size());
  for (size_t i = 0; i < eager.step_losses.size(); ++i)
    CHECK(compiled.step_losses[i] == Approx(eager.step_losses[i]).epsilon(kSmallCnnSums));
  CHECK(kiln::testing::relative_difference(compiled.model, eager.model) <= kSmallCnnSums);
  // Validation runs compiled too (the forward in eval mode): the same loss and accuracy.
  REQUIRE(compiled.epochs.size() == eager.epochs.size());
  for (size_t e = 0; e < eager.epochs.size(); ++e) {
    REQUIRE(eager.epochs[e].val_loss > 0);  // the synthetic set has a validation split
    CHECK(compiled.epochs[e].val_loss == Approx(eager.epochs[e].val_loss).epsilon(kSmallCnnSums));
    CHECK(compiled.epochs[e].val_accuracy == Approx(eager.epochs[e].val_accuracy));
  }
  // reduce-overhead and max-autotune on the CPU: no CUDA graphs, nothing to tune, the
  // default mode's program, the same run.
  for (const char* mode : {"reduce-overhead", "max-autotune"}) {
    INFO(mode);
    c.compile_mode = mode;
    const train::Result graphed = run(c);
    REQUIRE(graphed.step_losses.size() == compiled.step_losses.size());
    for (size_t i = 0; i < compiled.step_losses.size(); ++i) CHECK(graphed.step_losses[i] == compiled.step_losses[i]);
  }
  c.compile_mode = "fastest";
  REQUIRE_THROWS_WITH(run(c), Contains("--compile fastest: expected default, reduce-overhead or max-autotune"));
}

TEST_CASE("trainer: --device cuda trains on the GPU as on the CPU", "[trainer][cuda]") {
  train::Config c = small_cnn();
  c.device = "cuda";
  if (!cuda::is_available()) {
    REQUIRE_THROWS_WITH(run(c), Contains("--device cuda: CUDA is not available"));
    return;
  }
  c.epochs = 1;
  const train::Result gpu = run(c);
  c.device = "cpu";
  const train::Result cpu = run(c);
  REQUIRE(gpu.step_losses.size() == cpu.step_losses.size());
  // The same batches and initial weights; cuDNN sums in other orders, so the losses agree
  // closely at first and drift slowly (f32, TF32 off).
  CHECK(gpu.step_losses.front() == Approx(cpu.step_losses.front()).epsilon(1e-4));
  for (size_t i = 0; i < cpu.step_losses.size(); ++i)
    CHECK(gpu.step_losses[i] == Approx(cpu.step_losses[i]).epsilon(1e-2));
  // The weights come back to the CPU in the result (a checkpoint's state dict).
  for (const auto& [name, t] : gpu.model) CHECK(t.device() == Device::cpu());
}

TEST_CASE("trainer: an epoch with no full batch is an error saying why", "[trainer][train_args]") {
  // Once a division by zero (SIGFPE): with batch norm a last batch of 1 sample is dropped,
  // so 1 sample in batches of 2 made 0 batches an epoch.
  train::Config c = small_cnn();
  c.train_samples = 1;
  c.batch = 2;
  c.micro_batch = 0;
  c.steps = 2;
  REQUIRE_THROWS_AS(run(c), Error);
  REQUIRE_THROWS_WITH(run(c), Contains("1 training sample gives no full batch of 2 with drop_last") &&
                                  Contains("batch norm"));
  c.epochs = 1;
  c.steps = 0;
  REQUIRE_THROWS_WITH(run(c), Contains("1 training sample gives no full batch of 2"));

  SECTION("an image folder of one image") {
    TempDir dir;
    fs::create_directories(dir.path() / "only");
    data::write_jpeg(dir.path() / "only" / "0.jpg", data::Image(16, 16, 3));
    train::Config f;
    f.data = dir.path().string();
    f.arch = "cnn";
    f.image_size = 16;
    f.workers = 0;
    f.quiet = true;
    REQUIRE_THROWS_WITH(run(f), Contains("1 training sample gives no full batch of 32 with drop_last"));
    f.arch = "mlp";  // no batch norm: one batch of one sample
    CHECK(run(f).steps == 1);
  }
}

TEST_CASE("trainer: a loss that is not finite stops the run naming the step", "[trainer]") {
  // An MLP (no batch norm to renormalize): the first step's update at this rate overflows
  // f32, so the second step's loss is NaN.
  train::Config c = small_cnn();
  c.arch = "mlp";
  c.micro_batch = 0;
  c.lr = 1e300;
  c.lr_schedule = "constant";
  TempDir tmp;
  c.log_file = tmp.path() / "log.jsonl";
  REQUIRE_THROWS_AS(run(c), Error);
  REQUIRE_THROWS_WITH(run(c), Contains("step 2 (epoch 1, batch 2 of 5): the loss is NaN") && Contains("--lr"));
  // The log has the step that stopped it, with its loss as null.
  const std::vector<std::string> lines = read_lines(c.log_file);
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[1], Contains("\"step\":2") && Contains("\"loss\":null"));
}

TEST_CASE("trainer: an unwritable log or plot is an error before any training", "[trainer]") {
  TempDir tmp;
  const fs::path file = tmp.path() / "a-file";
  std::ofstream(file) << "not a folder";
  train::Config c = small_cnn();
  c.checkpoint_dir = tmp.path() / "ckpt";
  SECTION("log") {
    c.log_file = file / "log.jsonl";
    REQUIRE_THROWS_WITH(run(c), Contains("--log") && Contains("cannot create the folder"));
  }
  SECTION("plot") {
    c.plot_file = file / "sub" / "curves.svg";
    REQUIRE_THROWS_WITH(run(c), Contains("--plot") && Contains("cannot create the folder"));
  }
  SECTION("the plot beside the checkpoints") {
    c.checkpoint_dir = file / "ckpt";
    REQUIRE_THROWS_WITH(run(c), Contains("--checkpoint") && Contains("curves.svg"));
  }
  // Nothing trained: no checkpoint was written.
  CHECK_FALSE(fs::exists(tmp.path() / "ckpt"));
}

TEST_CASE("trainer: --zero-init-residual is off by default as in torchvision", "[trainer]") {
  for (const bool zero : {false, true}) {
    INFO("zero_init_residual " << zero);
    manual_seed(0);
    const StateDict state = train::make_model("resnet18", 10, 3, 32, zero)->state_dict();
    for (const char* name : {"layer1.0.bn2.weight", "layer4.1.bn2.weight"})
      for (double w : testing::values(state.at(name))) CHECK(w == (zero ? 0.0 : 1.0));
    for (double w : testing::values(state.at("layer1.0.bn1.weight"))) CHECK(w == 1.0);
  }
  manual_seed(0);
  const StateDict plain = train::make_model("resnet18", 10, 3, 32)->state_dict();
  for (double w : testing::values(plain.at("layer2.0.bn2.weight"))) CHECK(w == 1.0);
}

TEST_CASE("trainer: --weight-decay-scope all decays every parameter and no-norm-bias spares the 1-d ones",
          "[trainer]") {
  // One step from the same weights and batch: the gradients are the same, so only the decay
  // of each parameter differs.
  train::Config c = small_cnn();
  c.steps = 1;
  c.momentum = 0;
  c.weight_decay = 0.5;
  const StateDict all = run(c).model;
  c.weight_decay_scope = "no-norm-bias";
  const StateDict spared = run(c).model;
  c.weight_decay = 0;
  const StateDict none = run(c).model;
  int64_t vectors = 0, matrices = 0;
  for (const auto& [name, t] : none) {
    if (t.dtype() != DType::f32 || name.find("running_") != std::string::npos) continue;  // buffers
    INFO(name);
    if (t.dim() == 1) {
      ++vectors;
      CHECK(testing::values(spared.at(name)) == testing::values(t));  // no decay
      if (name.ends_with(".weight")) CHECK(testing::values(all.at(name)) != testing::values(t));  // decayed
    } else {
      ++matrices;
      CHECK(testing::values(spared.at(name)) == testing::values(all.at(name)));
      CHECK(testing::values(all.at(name)) != testing::values(t));
    }
  }
  CHECK(vectors > 0);
  CHECK(matrices > 0);
}

TEST_CASE("trainer: --nesterov trains with Nesterov momentum", "[trainer]") {
  train::Config c = small_cnn();
  c.epochs = 1;
  const train::Result plain = run(c);
  c.nesterov = true;
  const train::Result nesterov = run(c);
  REQUIRE(nesterov.step_losses.size() == plain.step_losses.size());
  CHECK(nesterov.step_losses.front() == plain.step_losses.front());  // the same first forward
  CHECK(nesterov.step_losses.back() != plain.step_losses.back());    // another update
}

TEST_CASE("trainer: --pad pads the images with black instead of resizing them", "[trainer]") {
  // An MLP's first layer shows the size the model sees: 3 x (16 + 2 * 2)^2 inputs.
  TempDir dir;
  train::Config c = mlp_on_image_folder(dir.path(), 2);
  c.pad = 2;
  c.workers = 0;
  const train::Result padded = run(c);
  CHECK(padded.model.at("0.weight").shape() == Shape{256, 3 * 20 * 20});
  if (fs::exists(data::kFashionMnistDir)) {
    train::Config f;
    f.data = "fashion-mnist";
    f.arch = "mlp";
    f.pad = 2;
    f.train_samples = 8;
    f.val_samples = 8;
    f.batch = 8;
    f.workers = 0;
    f.quiet = true;
    CHECK(run(f).model.at("0.weight").shape() == Shape{256, 32 * 32});
  } else {
    WARN("skipped the Fashion-MNIST part: " << data::kFashionMnistDir << " is not installed");
  }
}

TEST_CASE("trainer: a run's first lines name the settings that differ from PyTorch's defaults", "[trainer]") {
  train::Config c = small_cnn();
  c.quiet = false;
  c.epochs = 1;
  std::ostringstream plain;
  train::run(c, plain);
  CHECK_THAT(plain.str(), Contains("differs from PyTorch's defaults: nothing"));
  c.weight_decay_scope = "no-norm-bias";
  c.label_smoothing = 0.1;
  c.synthetic_size = 41;  // batches of 8: the last one holds 1 sample, which batch norm cannot train on
  std::ostringstream changed;
  train::run(c, changed);
  CHECK_THAT(changed.str(), Contains("differs from PyTorch's defaults: weight decay skips norms and biases, "
                                     "label smoothing 0.1, drops each epoch's last batch of 1 sample (batch norm)"));
}

TEST_CASE("trainer: progress shows the epoch's mean loss and the whole run's ETA", "[trainer]") {
  std::ostringstream out;
  train::Progress progress(out, train::ProgressMode::lines, 2);
  progress.start_run(0, 6);
  progress.start_epoch(0, 2, 3);
  progress.step(1, 1, 3.0, 10);
  progress.step(2, 2, 2.5, 10);
  progress.step(3, 3, 2.0, 10);
  progress.finish();
  progress.start_epoch(1, 2, 3);
  progress.step(1, 4, 1.0, 10);
  progress.step(2, 5, 0.75, 10);
  const std::string text = out.str();
  INFO(text);
  CHECK_THAT(text, Contains("epoch 1/2 step 2/3 mean loss 2.5000 10.0 img/s run ETA 0:0"));
  CHECK_THAT(text, Contains("epoch 1/2 step 3/3 mean loss 2.0000"));
  CHECK_THAT(text, Contains("epoch 2/2 step 2/3 mean loss 0.7500"));
  CHECK_THAT(text, !Contains("step 1/3"));  // every 2 steps, and an epoch's last
}

TEST_CASE("trainer: the plot's ticks are round and its title says eager or compiled", "[trainer]") {
  // Multiples of 1, 2 or 5 times a power of ten that cover the range.
  CHECK(train::axis_ticks(0, 2.49, 5) == std::vector<double>{0, 0.5, 1, 1.5, 2, 2.5});
  CHECK(train::axis_ticks(0, 1, 5) == std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1});
  CHECK(train::axis_ticks(0, 140, 5) == std::vector<double>{0, 50, 100, 150});
  CHECK(train::axis_ticks(0, 7.3, 5) == std::vector<double>{0, 2, 4, 6, 8});
  CHECK(train::axis_ticks(1, 2, 5) == std::vector<double>{1, 1.2, 1.4, 1.6, 1.8, 2});
  CHECK(train::axis_ticks(0, 0.031, 4) == std::vector<double>{0, 0.01, 0.02, 0.03, 0.04});
  CHECK(train::axis_ticks(3, 3, 5).size() >= 2);  // an empty range still has an axis

  TempDir tmp;
  train::Config c = small_cnn();
  c.epochs = 1;
  c.plot_file = tmp.path() / "curves.svg";
  run(c);
  const std::string eager = read_text(c.plot_file);
  CHECK_THAT(eager, Contains("kiln-train cnn on synthetic: eager, cpu"));
  // The y labels of the loss panel are round values, printed as such.
  CHECK_THAT(eager, Contains(R"(text-anchor="end" font-size="11">0.0</text>)") ||
                        Contains(R"(text-anchor="end" font-size="11">0</text>)"));
  CHECK_THAT(eager, Contains(">100%<") && Contains(">20%<"));
  c.compile = true;
  run(c);
  CHECK_THAT(read_text(c.plot_file), Contains("kiln-train cnn on synthetic: compiled (default), cpu"));
}
