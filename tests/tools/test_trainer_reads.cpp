// kiln-train's reads of the step's statistics (tools/trainer.cpp, read_steps): the losses
// and counts stay where the steps left them (on a GPU, the device) and are read once per
// progress line, log line, checkpoint and epoch end, never once per micro-step or per
// step that shows nothing; and reading them late changes no number (exact comparisons:
// the same steps, the same order of the epoch's sums).
#include <sstream>
#include <string>

#include "core/registry.h"
#include "tools/trainer_testing.h"

using namespace kiln;
using namespace kiln::testing;
using Catch::Matchers::Contains;

namespace {

// train::run(c) and how often it read the steps' statistics back.
train::Result run_counting_reads(const train::Config& c, int64_t& reads, std::string* printed = nullptr) {
  reads = 0;
  std::ostringstream out;
  HostReadHookGuard hook([&](const Tensor&, const char* reader, bool) {
    reads += std::string(reader) == "read_steps" ? 1 : 0;
  });
  train::Result r = train::run(c, out);
  if (printed) *printed = out.str();
  return r;
}

}  // namespace

TEST_CASE("trainer: the steps' statistics are read once per printed or logged line and per epoch",
          "[trainer][reads]") {
  // small_cnn: 2 epochs of 5 steps, each step 2 micro-steps.
  for (const bool compile : {false, true}) {
    INFO("compile " << compile);
    train::Config c = small_cnn();
    c.compile = compile;
    int64_t reads = 0;
    // Quiet, no log: once at each epoch's end.
    const train::Result quiet = run_counting_reads(c, reads);
    CHECK(reads == 2);
    REQUIRE(quiet.step_losses.size() == 10);
    // Progress lines every 2 steps: at batches 2, 4 and the epoch's last, 5 (the epoch's end
    // then has nothing left to read).
    c.quiet = false;
    c.print_every = 2;
    std::string printed;
    const train::Result lines = run_counting_reads(c, reads, &printed);
    CHECK(reads == 6);
    CHECK_THAT(printed, Contains("epoch 1/2 step 4/5 mean loss"));
    // A log line per step: a read per step.
    TempDir tmp;
    c.quiet = true;
    c.log_file = tmp.path() / "log.jsonl";
    const train::Result logged = run_counting_reads(c, reads);
    CHECK(reads == 10);
    // The same numbers however late they were read.
    CHECK(lines.step_losses == quiet.step_losses);
    CHECK(logged.step_losses == quiet.step_losses);
    require_same_history(lines, quiet);
    require_same_history(logged, quiet);
    require_bitwise_equal(logged.model, quiet.model);
  }
}

TEST_CASE("trainer: a loss that is not finite is found when its step is read, naming that step", "[trainer][reads]") {
  // No log and no progress: the NaN of step 2 is read at the epoch's end, and the error
  // names step 2, not the step that read it (test_trainer.cpp has the logged case).
  train::Config c = small_cnn();
  c.arch = "mlp";
  c.micro_batch = 0;
  c.lr = 1e300;
  c.lr_schedule = "constant";
  REQUIRE_THROWS_WITH(run(c), Contains("step 2 (epoch 1, batch 2 of 5): the loss is NaN"));
}
