#include "tools/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "core/error.h"
#include "core/generator.h"
#include "core/ops/factory.h"
#include "models/safetensors.h"

namespace kiln::train {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "kiln-train checkpoint 1";
constexpr int64_t kEpochFields = 6;
constexpr int kKeep = 2;

void sync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_text_atomically(const fs::path& path, const std::string& text) {
  const fs::path temporary = path.string() + fmt::format(".tmp-{}", ::getpid());
  {
    std::ofstream f(temporary, std::ios::trunc);
    f << text;
    f.flush();
    KILN_CHECK(f.good(), "checkpoint: cannot write {}", temporary.string());
  }
  sync_path(temporary);
  std::error_code ec;
  fs::rename(temporary, path, ec);
  KILN_CHECK(!ec, "checkpoint: cannot rename {} to {}: {}", temporary.string(), path.string(), ec.message());
}

const std::string& meta(const SafetensorsMetadata& m, const std::string& key, const fs::path& file) {
  auto it = m.find(key);
  KILN_CHECK(it != m.end(), "checkpoint: {} lacks \"{}\"", file.string(), key);
  return it->second;
}

int64_t meta_int(const SafetensorsMetadata& m, const std::string& key, const fs::path& file) {
  const std::string& text = meta(m, key, file);
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  fail("checkpoint: {}: \"{}\" = \"{}\" is not an integer", file.string(), key, text);
}

uint64_t meta_u64(const SafetensorsMetadata& m, const std::string& key, const fs::path& file) {
  const std::string& text = meta(m, key, file);
  try {
    size_t used = 0;
    const unsigned long long v = std::stoull(text, &used);
    if (used == text.size() && !text.starts_with('-')) return v;
  } catch (const std::exception&) {
  }
  fail("checkpoint: {}: \"{}\" = \"{}\" is not an unsigned integer", file.string(), key, text);
}

double meta_double(const SafetensorsMetadata& m, const std::string& key, const fs::path& file) {
  const std::string& text = meta(m, key, file);
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  fail("checkpoint: {}: \"{}\" = \"{}\" is not a number", file.string(), key, text);
}

std::vector<fs::path> saved_checkpoints(const fs::path& dir) {
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.starts_with("step-") && name.find(".tmp") == std::string::npos)
      found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end());  // zero-padded step numbers sort in step order
  return found;
}

}  // namespace

std::string fingerprint(const Config& c) {
  return fmt::format(
      "data={} arch={} epochs={} steps={} batch={} lr={} schedule={} warmup={} optimizer={} momentum={} "
      "weight_decay={} label_smoothing={} image_size={} seed={} train_samples={} synthetic={}x{}",
      c.data, c.arch, c.epochs, c.steps, c.batch, c.lr, c.lr_schedule, c.warmup, c.optimizer, c.momentum,
      c.weight_decay, c.label_smoothing, c.image_size, c.seed, c.train_samples, c.synthetic_size, c.synthetic_classes);
}

fs::path save_checkpoint(const fs::path& dir, const TrainingState& state, const nn::Module& model,
                         const optim::Optimizer& optimizer) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  KILN_CHECK(!ec, "checkpoint: cannot create {}: {}", dir.string(), ec.message());
  const std::string name = fmt::format("step-{:08}", state.step);
  const fs::path final_path = dir / name;
  const fs::path temporary = dir / fmt::format("{}.tmp-{}", name, ::getpid());
  fs::remove_all(temporary, ec);
  fs::create_directories(temporary, ec);
  KILN_CHECK(!ec, "checkpoint: cannot create {}: {}", temporary.string(), ec.message());

  save_safetensors(model.state_dict(), (temporary / "model.safetensors").string());
  save_safetensors(optimizer.state_dict(), (temporary / "optimizer.safetensors").string());

  const Generator& g = default_generator();
  SafetensorsMetadata m{{"format", kFormat},
                        {"step", std::to_string(state.step)},
                        {"epoch", std::to_string(state.epoch)},
                        {"batch", std::to_string(state.batch)},
                        {"micro_batch", std::to_string(state.micro_batch)},
                        {"epoch_loss_sum", fmt::format("{}", state.epoch_loss_sum)},
                        {"epoch_correct", std::to_string(state.epoch_correct)},
                        {"epoch_seen", std::to_string(state.epoch_seen)},
                        {"fingerprint", state.fingerprint},
                        {"generator_seed", std::to_string(g.seed())},
                        {"generator_offset", std::to_string(g.offset())}};
  StateDict history;
  if (!state.step_losses.empty()) history["step_losses"] = from_vector<double>(state.step_losses);
  if (!state.epochs.empty()) {
    std::vector<double> rows;
    for (const EpochRecord& e : state.epochs)
      rows.insert(rows.end(), {static_cast<double>(e.epoch), e.train_loss, e.train_accuracy, e.val_loss,
                               e.val_accuracy, e.images_per_second});
    history["epochs"] = from_vector<double>(rows, {static_cast<int64_t>(state.epochs.size()), kEpochFields});
  }
  save_safetensors(history, (temporary / "trainer.safetensors").string(), m);
  sync_path(temporary);

  fs::remove_all(final_path, ec);
  fs::rename(temporary, final_path, ec);
  KILN_CHECK(!ec, "checkpoint: cannot rename {} to {}: {}", temporary.string(), final_path.string(), ec.message());
  sync_path(dir);
  write_text_atomically(dir / "latest", name + "\n");
  sync_path(dir);

  std::vector<fs::path> all = saved_checkpoints(dir);
  for (size_t i = 0; i + kKeep < all.size(); ++i)
    if (all[i] != final_path) fs::remove_all(all[i], ec);
  return final_path;
}

TrainingState load_checkpoint(const fs::path& dir, nn::Module& model, optim::Optimizer& optimizer) {
  std::ifstream latest(dir / "latest");
  std::string name;
  KILN_CHECK(latest && std::getline(latest, name) && !name.empty(),
             "kiln-train: --resume: no checkpoint in {} (no 'latest' file)", dir.string());
  const fs::path path = dir / name;
  KILN_CHECK(fs::is_directory(path), "kiln-train: --resume: {} names {}, which does not exist",
             (dir / "latest").string(), path.string());

  const fs::path trainer_file = path / "trainer.safetensors";
  const SafetensorsContents contents = load_safetensors_with_metadata(trainer_file.string());
  const SafetensorsMetadata& m = contents.metadata;
  KILN_CHECK(meta(m, "format", trainer_file) == kFormat, "checkpoint: {} is not a {} file", trainer_file.string(),
             kFormat);
  TrainingState s;
  s.step = meta_int(m, "step", trainer_file);
  s.epoch = meta_int(m, "epoch", trainer_file);
  s.batch = meta_int(m, "batch", trainer_file);
  s.micro_batch = meta_int(m, "micro_batch", trainer_file);
  s.epoch_loss_sum = meta_double(m, "epoch_loss_sum", trainer_file);
  s.epoch_correct = meta_int(m, "epoch_correct", trainer_file);
  s.epoch_seen = meta_int(m, "epoch_seen", trainer_file);
  s.fingerprint = meta(m, "fingerprint", trainer_file);
  if (auto it = contents.tensors.find("step_losses"); it != contents.tensors.end()) {
    const Tensor t = it->second.to(DType::f64).contiguous();
    s.step_losses.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  }
  if (auto it = contents.tensors.find("epochs"); it != contents.tensors.end()) {
    const Tensor t = it->second.to(DType::f64).contiguous();
    KILN_CHECK(t.dim() == 2 && t.size(1) == kEpochFields, "checkpoint: {}: epochs has shape {}",
               trainer_file.string(), t.shape());
    const double* p = t.data_ptr<double>();
    for (int64_t i = 0; i < t.size(0); ++i, p += kEpochFields)
      s.epochs.push_back({static_cast<int64_t>(p[0]), p[1], p[2], p[3], p[4], p[5]});
  }

  model.load_state_dict(load_safetensors((path / "model.safetensors").string()));
  optimizer.load_state_dict(load_safetensors((path / "optimizer.safetensors").string()));
  Generator& g = default_generator();
  g.manual_seed(meta_u64(m, "generator_seed", trainer_file));
  g.set_offset(meta_u64(m, "generator_offset", trainer_file));
  return s;
}

}  // namespace kiln::train
