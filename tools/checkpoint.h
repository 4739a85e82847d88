#pragma once
// kiln-train's checkpoints: one folder per save, DIR/step-NNNNNNNN/ holding
// model.safetensors, optimizer.safetensors and trainer.safetensors (the loop's position,
// the random generator, the history), and DIR/latest naming the newest complete one.
//
// A save is atomic: the folder is written under a temporary name, synced and renamed into
// place, and only then does `latest` (itself written to a temporary file and renamed) point
// at it; an interrupted save leaves the previous checkpoint current. The two newest
// checkpoints are kept.
#include <filesystem>
#include <string>
#include <vector>

#include "models/module.h"
#include "optim/optimizer.h"
#include "tools/trainer.h"

namespace kiln::train {

// Everything of a run's progress that is not a model or optimizer tensor.
struct TrainingState {
  int64_t step = 0;    // optimizer steps done
  int64_t epoch = 0;   // the epoch to continue (from 0)
  int64_t batch = 0;   // the next batch of that epoch
  int64_t micro_batch = 0;
  // The running sums of the unfinished epoch, so its record covers all its batches.
  double epoch_loss_sum = 0;
  int64_t epoch_correct = 0;
  int64_t epoch_seen = 0;
  std::string fingerprint;  // the settings that must not change across a resume
  std::vector<EpochRecord> epochs;
  std::vector<double> step_losses;
};

// The settings a resumed run must share with the run that saved (not workers, logs or
// checkpoint paths, which do not change the result).
std::string fingerprint(const Config& config);

// Saves and returns the checkpoint's folder; also captures the default generator's state.
std::filesystem::path save_checkpoint(const std::filesystem::path& dir, const TrainingState& state,
                                      const nn::Module& model, const optim::Optimizer& optimizer);
// Loads DIR's latest checkpoint into model and optimizer, restores the default generator
// and returns the state. A missing or malformed checkpoint is a kiln::Error naming it.
TrainingState load_checkpoint(const std::filesystem::path& dir, nn::Module& model, optim::Optimizer& optimizer);

}  // namespace kiln::train
