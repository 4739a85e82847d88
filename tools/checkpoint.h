#pragma once
// kiln-train's checkpoints: one folder per save, DIR/step-NNNNNNNN/ holding
// model.safetensors, optimizer.safetensors, trainer.safetensors (the loop's position,
// the random generator, the history) and, with a loss scaler, grad_scaler.safetensors, and
// DIR/latest naming the newest complete one.
//
// A save never touches the folder `latest` names: the new folder is written under a
// temporary name (NAME.tmp-PID), synced and renamed to a name no folder has, then `latest`
// (itself written to a temporary file and renamed) points at it, and only then are older
// folders removed. A step saved again (a run stopped on an epoch's last batch saves that
// step once more, at the epoch's end, when resumed) gets the next generation's name:
// step-NNNNNNNN.1, .2, ... So a save killed at any moment leaves `latest` naming a complete
// checkpoint. Each save keeps the new folder and the newest of an earlier step, removing
// older ones and earlier saves of its step (folders of later steps stay until a save passes
// them); saves and loads remove the temporaries of processes no longer running.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "models/module.h"
#include "optim/grad_scaler.h"
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
                                      const nn::Module& model, const optim::Optimizer& optimizer,
                                      const optim::GradScaler* scaler = nullptr);

// Loads the latest checkpoint of config.checkpoint_dir into model and optimizer, restores
// the default generator and returns the state. Each of these is a kiln::Error naming the
// file: no checkpoint; a `latest` that is not the name of a checkpoint folder (step-N or
// step-N.G, no path) or names a missing one; a malformed file; a checkpoint made with other
// settings (its fingerprint); and a stored field no run of config's settings, at
// `batches_per_epoch` batches an epoch, could have saved (a micro-batch outside
// [1, batch] or 1 for a model with batch norm, a position past the run's end, a history
// that does not match the position), named too; a scaler's file missing. Model, optimizer,
// scaler and generator are only touched once these pass.
TrainingState load_checkpoint(const Config& config, int64_t batches_per_epoch, nn::Module& model,
                              optim::Optimizer& optimizer, optim::GradScaler* scaler = nullptr);

// DIR's checkpoint folders, oldest first (by step, then generation).
std::vector<std::filesystem::path> checkpoint_folders(const std::filesystem::path& dir);

}  // namespace kiln::train
