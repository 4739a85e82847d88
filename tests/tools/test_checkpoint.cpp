// kiln-train's checkpoints (tools/checkpoint.h): a step saved again (a run stopped on an
// epoch's last batch, then resumed) gets a folder of its own, and a save killed at each of
// its points leaves a checkpoint that resumes to the uninterrupted run's weights; folder
// names and their order; `latest` must name a folder of its directory; stored fields no run
// of the settings could have saved are refused, naming the file and the field; temporaries
// of dead processes are removed at the next save or load, a running process's kept.
//
// The runs are a small ConvNet (with batch norm) on 40 synthetic images: 5 steps of batch 8
// an epoch, 2 epochs. Resumed runs must match the uninterrupted one exactly.
#include "testing.h"
#include "tools/trainer_testing.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/fifo_testing.h"
#include "models/safetensors.h"
#include "tools/checkpoint.h"
#include "tools/trainer.h"

using namespace kiln;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;
namespace train = kiln::train;
using namespace kiln::testing;  // tools/trainer_testing.h

namespace {

// A child process that sleeps until it is killed (when this goes out of scope).
class RunningProcess {
 public:
  RunningProcess() : pid_(::fork()) {
    REQUIRE(pid_ >= 0);
    if (pid_ == 0)
      for (;;) ::pause();
  }
  ~RunningProcess() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  RunningProcess(const RunningProcess&) = delete;
  RunningProcess& operator=(const RunningProcess&) = delete;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

// The id of a process that has exited (and been reaped): what a killed save leaves behind.
pid_t exited_pid() {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// Runs `c` into `dir` and stops it after `steps` optimizer steps.
train::Result stopped_after(train::Config c, const fs::path& dir, int64_t steps) {
  c.checkpoint_dir = dir;
  c.stop_after_steps = steps;
  train::Result r = run(c);
  REQUIRE(r.interrupted);
  REQUIRE(r.steps == steps);
  return r;
}

// Continues the run in `dir` until it is done.
train::Result resumed(train::Config c, const fs::path& dir) {
  c.checkpoint_dir = dir;
  c.resume = true;
  train::Result r = run(c);
  CHECK_FALSE(r.interrupted);
  return r;
}

// The weights, the step losses and the epoch records but their images/s (a timing).
void require_same_run(const train::Result& actual, const train::Result& expected) {
  require_bitwise_equal(actual.model, expected.model);
  require_same_history(actual, expected);
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc | std::ios::binary);
  f << text;
  REQUIRE(f.good());
}

// The names of everything in dir.
std::set<std::string> entries(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

std::vector<std::string> folder_names(const fs::path& dir) {
  std::vector<std::string> names;
  for (const fs::path& p : train::checkpoint_folders(dir)) names.push_back(p.filename().string());
  return names;
}

SafetensorsMetadata stored_fields(const fs::path& folder) {
  return load_safetensors_with_metadata((folder / "trainer.safetensors").string()).metadata;
}

// Rewrites one metadata field of the checkpoint's trainer.safetensors.
void set_stored_field(const fs::path& folder, const std::string& key, const std::string& value) {
  const fs::path file = folder / "trainer.safetensors";
  SafetensorsContents contents = load_safetensors_with_metadata(file.string());
  REQUIRE(contents.metadata.count(key) == 1);
  contents.metadata[key] = value;
  save_safetensors(contents.tensors, file.string(), contents.metadata);
}

}  // namespace

TEST_CASE("checkpoint: folder names and their order", "[checkpoint]") {
  TempDir tmp;
  for (const char* name : {"step-00000010", "step-00000005.10", "step-00000005", "step-100000000", "step-00000005.2",
                           "step-00000005.1",
                           // not checkpoint folders:
                           "step-5", "step-00000005.0", "step-00000005.01", "step-00000005.x", "step-00000005.1.2",
                           "step-00000005.tmp-12", "step-00000005.1.tmp-12", "step--0000005", "step-0000000x", "other"})
    fs::create_directories(tmp.path() / name);
  write_text(tmp.path() / "step-00000011", "a file, not a folder");
  CHECK(folder_names(tmp.path()) == std::vector<std::string>{"step-00000005", "step-00000005.1", "step-00000005.2",
                                                             "step-00000005.10", "step-00000010", "step-100000000"});
  CHECK(train::checkpoint_folders(tmp.path() / "missing").empty());
}

TEST_CASE("checkpoint: a step saved again gets a folder of its own, removed only after latest moves on",
          "[checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "ckpt";
  const train::Config c = small_cnn();
  const train::Result reference = run(c);
  REQUIRE(reference.steps == 10);

  // Ctrl-C on epoch 0's last batch: the checkpoint is at the end of that epoch's batches...
  const train::Result first = stopped_after(c, dir, 5);
  CHECK(first.checkpoint == dir / "step-00000005");
  CHECK(read_text(dir / "latest") == "step-00000005\n");
  CHECK(stored_fields(dir / "step-00000005").at("batch") == "5");

  // ...and the resumed run saves step 5 again at the epoch's end, under the next generation.
  train::Config again = c;
  again.checkpoint_dir = dir;
  again.resume = true;
  again.stop_after_steps = 1;
  const train::Result second = run(again);
  REQUIRE(second.interrupted);
  CHECK(second.checkpoint == dir / "step-00000006");
  CHECK(read_text(dir / "latest") == "step-00000006\n");
  // The first save of step 5 is gone; the second is step 6's predecessor.
  CHECK(folder_names(dir) == std::vector<std::string>{"step-00000005.1", "step-00000006"});
  const SafetensorsMetadata resaved = stored_fields(dir / "step-00000005.1");
  CHECK(resaved.at("step") == "5");
  CHECK(resaved.at("epoch") == "1");
  CHECK(resaved.at("batch") == "0");

  const train::Result done = resumed(c, dir);
  CHECK(done.steps == 10);
  require_same_run(done, reference);
  CHECK(read_text(dir / "latest") == "step-00000010\n");
  CHECK(folder_names(dir) == std::vector<std::string>{"step-00000006", "step-00000010"});
}

TEST_CASE("checkpoint: a save of a step again killed at any point leaves a checkpoint that resumes",
          "[checkpoint]") {
  TempDir tmp;
  const train::Config c = small_cnn();
  const train::Result reference = run(c);

  // `saved`: stopped on epoch 0's last batch, then resumed for one step, which saved step 5
  // again (step-00000005.1) on the way. `killed` starts as `saved` was before the resume; each
  // section adds what a resume killed during that save of step 5 would have left.
  const fs::path saved = tmp.path() / "saved", killed = tmp.path() / "killed";
  stopped_after(c, saved, 5);
  fs::copy(saved, killed, fs::copy_options::recursive);
  train::Config one_step = c;
  one_step.checkpoint_dir = saved;
  one_step.resume = true;
  one_step.stop_after_steps = 1;
  REQUIRE(run(one_step).interrupted);
  const fs::path resaved = saved / "step-00000005.1";
  REQUIRE(fs::is_directory(resaved));

  std::vector<std::string> expected_folders;
  SECTION("killed while the new folder was written") {
    const fs::path partial = killed / fmt::format("step-00000005.1.tmp-{}", exited_pid());
    fs::create_directories(partial);
    fs::copy_file(resaved / "model.safetensors", partial / "model.safetensors");
    // The temporary is removed, so step 5's next save is its generation 1.
    expected_folders = {"step-00000005.1", "step-00000010"};
  }
  SECTION("killed after the new folder was renamed in, before latest named it") {
    fs::copy(resaved, killed / "step-00000005.1", fs::copy_options::recursive);
    REQUIRE(read_text(killed / "latest") == "step-00000005\n");
    expected_folders = {"step-00000005.2", "step-00000010"};
  }
  SECTION("killed after latest named the new folder, before the old one was removed") {
    fs::copy(resaved, killed / "step-00000005.1", fs::copy_options::recursive);
    write_text(killed / "latest", "step-00000005.1\n");
    expected_folders = {"step-00000005.1", "step-00000010"};
  }
  SECTION("killed while latest was written") {
    fs::copy(resaved, killed / "step-00000005.1", fs::copy_options::recursive);
    write_text(killed / fmt::format("latest.tmp-{}", exited_pid()), "step-00000005.1\n");
    expected_folders = {"step-00000005.2", "step-00000010"};
  }

  const train::Result done = resumed(c, killed);
  CHECK(done.steps == 10);
  require_same_run(done, reference);
  CHECK(read_text(killed / "latest") == "step-00000010\n");
  CHECK(folder_names(killed) == expected_folders);
  for (const std::string& name : entries(killed)) {
    INFO(name);
    CHECK(name.find(".tmp-") == std::string::npos);
  }
}

TEST_CASE("checkpoint: latest must name a checkpoint folder of its directory", "[checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "ckpt";
  train::Config c = small_cnn();
  stopped_after(c, dir, 3);
  // A folder that would be read if `latest` were followed as a path.
  fs::copy(dir / "step-00000003", tmp.path() / "x", fs::copy_options::recursive);
  c.checkpoint_dir = dir;
  c.resume = true;

  for (const std::string content : {"/etc\n", "/etc", "../x\n", "../x", "step-00000003/../../x\n", "./step-00000003\n",
                                    "step-00000003/\n", "step-3\n", "step-00000003.0\n", "\n", "",
                                    "step-00000003\nstep-00000002\n", "step-00000003\r\n"}) {
    INFO("latest holds \"" << content << "\"");
    write_text(dir / "latest", content);
    REQUIRE_THROWS_AS(run(c), Error);
    REQUIRE_THROWS_WITH(run(c), Contains((dir / "latest").string()) &&
                                    Contains("is not the name of a checkpoint folder") &&
                                    !Contains("trainer.safetensors"));
  }
  write_text(dir / "latest", "/etc\n");
  REQUIRE_THROWS_WITH(run(c), Contains("holds \"/etc\\n\""));
  write_text(dir / "latest", "../x");
  REQUIRE_THROWS_WITH(run(c), Contains("holds \"../x\""));

  write_text(dir / "latest", "step-00000003.1\n");  // a name, but no such folder
  REQUIRE_THROWS_WITH(run(c), Contains("latest") && Contains("step-00000003.1") && Contains("does not exist"));

  write_text(dir / "latest", "step-00000003");  // the newline is optional
  c.stop_after_steps = 1;
  CHECK(run(c).steps == 4);
}

TEST_CASE("checkpoint: a latest or model file that is a FIFO is refused without blocking", "[checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "ckpt";
  train::Config c = small_cnn();
  stopped_after(c, dir, 3);
  c.checkpoint_dir = dir;
  c.resume = true;
  {
    fs::remove(dir / "latest");
    const kiln::testing::Fifo fifo(dir / "latest");
    REQUIRE_THROWS_WITH(run(c), Contains("latest") && Contains("not a regular file"));
  }
  write_text(dir / "latest", "step-00000003\n");
  fs::remove(dir / "step-00000003" / "model.safetensors");
  const kiln::testing::Fifo fifo(dir / "step-00000003" / "model.safetensors");
  REQUIRE_THROWS_WITH(run(c), Contains("model.safetensors") && Contains("not a regular file"));
}

TEST_CASE("checkpoint: stored fields no run of the settings could have saved are refused", "[checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "ckpt";
  train::Config c = small_cnn();
  stopped_after(c, dir, 3);  // epoch 0, batch 3, micro-batch 4 of batch 8
  const fs::path folder = dir / "step-00000003";
  const SafetensorsMetadata good = stored_fields(folder);
  c.checkpoint_dir = dir;
  c.resume = true;

  struct Case {
    std::string field, value, says;
  };
  for (const Case& bad : std::vector<Case>{
           {"micro_batch", "64", "must be between 1 and the batch, 8"},
           {"micro_batch", "9", "must be between 1 and the batch, 8"},
           {"micro_batch", "0", "must be between 1 and the batch, 8"},
           {"micro_batch", "-4", "must be between 1 and the batch, 8"},
           {"micro_batch", "1", "batch norm"},
           {"micro_batch", "four", "is not an integer"},
           {"step", "11", "outside the run's [0, 10]"},
           {"step", "-1", "outside the run's [0, 10]"},
           {"step", "2", "holds 3 losses"},
           {"step", "4", "is more than the 3 batches before epoch 0, batch 3"},
           {"epoch", "3", "outside the run's [0, 2]"},
           {"epoch", "-1", "outside the run's [0, 2]"},
           {"epoch", "1", "holds 0 records"},
           {"batch", "6", "outside [0, 5]"},
           {"batch", "-1", "outside [0, 5]"},
           {"epoch_seen", "25", "outside [0, 24]"},
           {"epoch_seen", "-8", "outside [0, 24]"},
           {"epoch_correct", "25", "outside [0, epoch_seen = 24]"},
           {"epoch_correct", "-1", "outside [0, epoch_seen = 24]"},
           {"epoch_loss_sum", "nan", "not a sum of losses"},
           {"epoch_loss_sum", "-1", "not a sum of losses"},
       }) {
    INFO(bad.field << " = " << bad.value);
    set_stored_field(folder, bad.field, bad.value);
    REQUIRE_THROWS_AS(run(c), Error);
    REQUIRE_THROWS_WITH(run(c), Contains((folder / "trainer.safetensors").string()) &&
                                    Contains(fmt::format("\"{}\"", bad.field)) && Contains(bad.says));
    set_stored_field(folder, bad.field, good.at(bad.field));
  }
  set_stored_field(folder, "fingerprint", good.at("fingerprint") + " extra");
  REQUIRE_THROWS_WITH(run(c), Contains("other settings") && Contains(folder.string()));
  set_stored_field(folder, "fingerprint", good.at("fingerprint"));

  // Restored, the checkpoint resumes; a smaller stored micro-batch than the command line's
  // is fine (it is the run's own, as with --micro-batch auto).
  set_stored_field(folder, "micro_batch", "2");
  c.stop_after_steps = 1;
  const train::Result r = run(c);
  CHECK(r.steps == 4);
  CHECK(r.micro_batch == 2);
}

TEST_CASE("checkpoint: temporaries of dead processes are removed at the next save or load", "[checkpoint]") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "ckpt";
  train::Config c = small_cnn();
  c.checkpoint_dir = dir;
  const train::Result done = run(c);  // step-00000005 and step-00000010
  REQUIRE(done.steps == 10);

  const RunningProcess running;
  const pid_t dead = exited_pid();
  const std::string dead_folder = fmt::format("step-00000004.tmp-{}", dead),
                    dead_generation = fmt::format("step-00000010.1.tmp-{}", dead),
                    dead_latest = fmt::format("latest.tmp-{}", dead),
                    live_folder = fmt::format("step-00000007.tmp-{}", running.pid()),
                    live_latest = fmt::format("latest.tmp-{}", running.pid()),
                    own_folder = fmt::format("step-00000008.tmp-{}", ::getpid()),
                    not_ours = fmt::format("notes.tmp-{}", dead), pid_zero = "step-00000004.tmp-0";
  for (const std::string& folder : {dead_folder, dead_generation, live_folder, own_folder, not_ours, pid_zero}) {
    fs::create_directories(dir / folder);
    write_text(dir / folder / "model.safetensors", "partial");
  }
  write_text(dir / dead_latest, "step-00000004\n");
  write_text(dir / live_latest, "step-00000007\n");

  SECTION("at a load") {
    c.resume = true;  // of a finished run: a load and no save
    CHECK(run(c).steps == 10);
  }
  SECTION("at a save") {
    c.epochs = 1;  // a new run into the same folder
    CHECK(run(c).steps == 5);
    // Its step 5 replaced the first run's; the first run's step 10 stays until a save passes it.
    CHECK(read_text(dir / "latest") == "step-00000005.1\n");
    CHECK(folder_names(dir) == std::vector<std::string>{"step-00000005.1", "step-00000010"});
  }
  const std::set<std::string> left = entries(dir);
  for (const std::string& name : {dead_folder, dead_generation, dead_latest}) {
    INFO(name);
    CHECK(left.count(name) == 0);
  }
  for (const std::string& name : {live_folder, live_latest, own_folder, not_ours, pid_zero}) {
    INFO(name);
    CHECK(left.count(name) == 1);
  }
}
