#include "tools/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <string_view>

#include "core/error.h"
#include "core/generator.h"
#include "core/regular_file.h"
#include "core/ops/factory.h"
#include "models/safetensors.h"

namespace kiln::train {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "kiln-train checkpoint 1";
constexpr int64_t kEpochFields = 6;
constexpr int kKeep = 2;
// A save in progress writes NAME.tmp-PID, then renames it to NAME.
constexpr std::string_view kTemporary = ".tmp-";

void sync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_text_atomically(const fs::path& path, const std::string& text) {
  const fs::path temporary = path.string() + fmt::format("{}{}", kTemporary, ::getpid());
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

// A checkpoint folder's place in the order of saves: its step, and which save of that
// step it is (0: the first; a step saved again gets the next generation).
struct FolderName {
  int64_t step = 0;
  int64_t generation = 0;
  auto operator<=>(const FolderName&) const = default;
};

std::string folder_name(FolderName f) {
  return f.generation == 0 ? fmt::format("step-{:08}", f.step) : fmt::format("step-{:08}.{}", f.step, f.generation);
}

// A decimal count (digits only) that fits an int64_t.
std::optional<int64_t> parse_count(std::string_view text) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text.front()))) return std::nullopt;
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

// The FolderName of exactly what folder_name writes: so a name with a '/', "..", or
// anything else that is not a checkpoint folder of this directory has none.
std::optional<FolderName> parse_folder_name(std::string_view name) {
  constexpr std::string_view kPrefix = "step-";
  if (!name.starts_with(kPrefix)) return std::nullopt;
  const std::string_view rest = name.substr(kPrefix.size());
  const size_t dot = rest.find('.');
  const std::optional<int64_t> step = parse_count(rest.substr(0, dot));
  const std::optional<int64_t> generation =
      dot == std::string_view::npos ? std::optional<int64_t>(0) : parse_count(rest.substr(dot + 1));
  if (!step || !generation) return std::nullopt;
  const FolderName f{*step, *generation};
  if (folder_name(f) != name) return std::nullopt;  // zero-padded step; generation 1+, no leading zeros
  return f;
}

struct SavedFolder {
  FolderName name;
  fs::path path;
};

// The checkpoint folders in dir, oldest first.
std::vector<SavedFolder> saved_checkpoints(const fs::path& dir) {
  std::vector<SavedFolder> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    const std::optional<FolderName> name = parse_folder_name(it->path().filename().string());
    if (name && it->is_directory(type_ec)) found.push_back({*name, it->path()});
  }
  std::sort(found.begin(), found.end(), [](const SavedFolder& a, const SavedFolder& b) { return a.name < b.name; });
  return found;
}

// Whether process `pid` exists (EPERM: it does, under another user).
bool process_running(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// Removes what saves killed midway left in dir: temporaries (a folder's or latest's,
// NAME.tmp-PID) whose process is no longer running. Another process's save in progress
// and this process's own temporaries are left alone, and nothing here fails a save or load.
void remove_stale_temporaries(const fs::path& dir) {
  std::vector<fs::path> stale;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t at = name.rfind(kTemporary);
    if (at == std::string::npos) continue;
    const std::string_view base = std::string_view(name).substr(0, at);
    if (base != "latest" && !parse_folder_name(base)) continue;  // not one of ours
    const std::optional<int64_t> pid = parse_count(std::string_view(name).substr(at + kTemporary.size()));
    // pid 0 and -1 would make kill() ask about process groups.
    if (!pid || *pid <= 0 || *pid > std::numeric_limits<pid_t>::max() || *pid == ::getpid()) continue;
    if (!process_running(static_cast<pid_t>(*pid))) stale.push_back(it->path());
  }
  for (const fs::path& path : stale) fs::remove_all(path, ec);
}

// After `current` became latest: keeps it and the newest folder of each of the kKeep - 1
// newest earlier steps; removes older ones and earlier saves of current's step. Folders of
// later steps stay until a save passes them: an earlier run's, where a new run was started
// in the same folder, or one a save killed before `latest` named it left.
void remove_superseded(const fs::path& dir, FolderName current) {
  std::vector<FolderName> kept{current};
  const std::vector<SavedFolder> all = saved_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend() && kept.size() < static_cast<size_t>(kKeep); ++it)
    if (it->name.step < kept.back().step) kept.push_back(it->name);
  std::error_code ec;
  for (const SavedFolder& s : all)
    if (s.name.step <= current.step && std::find(kept.begin(), kept.end(), s.name) == kept.end())
      fs::remove_all(s.path, ec);
}

// `text` as it can be shown in a message: control and non-ASCII bytes escaped, at most
// 200 characters.
std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text.substr(0, 200)) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\\' || c == '"') out += fmt::format("\\{}", c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (byte < 0x20 || byte >= 0x7f) out += fmt::format("\\x{:02x}", byte);
    else out += c;
  }
  if (text.size() > 200) out += "...";
  return out;
}

// The folder `latest` names: a checkpoint folder's plain name (so nothing outside dir),
// which exists.
fs::path latest_folder(const fs::path& dir) {
  const fs::path file = dir / "latest";
  KILN_CHECK(fs::symlink_status(file).type() != fs::file_type::not_found,
             "kiln-train: --resume: no checkpoint in {} (no 'latest' file)", dir.string());
  // Not an ifstream: a FIFO named latest would block it; this refuses any non-regular file.
  const std::string text = read_regular_file(file, "kiln-train: --resume", 4096);
  std::string_view name = text;
  if (name.ends_with('\n')) name.remove_suffix(1);
  KILN_CHECK(parse_folder_name(name).has_value(),
             "kiln-train: --resume: {} holds \"{}\", which is not the name of a checkpoint folder in {} "
             "(step-NNNNNNNN or step-NNNNNNNN.G)",
             file.string(), printable(text), dir.string());
  const fs::path path = dir / name;
  KILN_CHECK(fs::is_directory(path), "kiln-train: --resume: {} names {}, which does not exist", file.string(),
             path.string());
  return path;
}

// The stored position, micro-batch and history against the settings of the resumed run,
// as the command line's are checked: a corrupt or edited checkpoint must not reach the loop
// with values no run of these settings could have saved.
void check_stored_state(const TrainingState& s, const Config& c, int64_t per_epoch, bool batch_norm,
                        const fs::path& file) {
  const std::string where = fmt::format("checkpoint: {}:", file.string());
  KILN_CHECK(s.micro_batch >= 1 && s.micro_batch <= c.batch,
             "{} \"micro_batch\" = {} must be between 1 and the batch, {}", where, s.micro_batch, c.batch);
  KILN_CHECK(!batch_norm || s.micro_batch >= 2,
             "{} \"micro_batch\" = {}: {} has batch norm, which needs at least 2 samples per micro-batch", where,
             s.micro_batch, c.arch);
  const RunLength length = run_length(c, per_epoch);
  const int64_t total_steps = length.steps, epochs = length.epochs;
  KILN_CHECK(s.step >= 0 && s.step <= total_steps, "{} \"step\" = {} is outside the run's [0, {}]", where, s.step,
             total_steps);
  KILN_CHECK(s.epoch >= 0 && s.epoch <= epochs, "{} \"epoch\" = {} is outside the run's [0, {}]", where, s.epoch,
             epochs);
  KILN_CHECK(s.batch >= 0 && s.batch <= per_epoch, "{} \"batch\" = {} is outside [0, {}] (batches an epoch)", where,
             s.batch, per_epoch);
  // A step per batch served (fewer where a batch of bad images was skipped).
  KILN_CHECK(s.step <= s.epoch * per_epoch + s.batch,
             "{} \"step\" = {} is more than the {} batches before epoch {}, batch {} ({} batches an epoch)", where,
             s.step, s.epoch * per_epoch + s.batch, s.epoch, s.batch, per_epoch);
  // The predictions seen: samples, or the predicted tokens of the language models (mlm, clm).
  const int64_t per_sample = is_text_arch(c.arch) && task_of(c) != "classify" ? c.seq_len : 1;
  KILN_CHECK(s.epoch_seen >= 0 && s.epoch_seen <= s.batch * c.batch * per_sample,
             "{} \"epoch_seen\" = {} is outside [0, {}] ({} batches of {} run in the epoch{})", where, s.epoch_seen,
             s.batch * c.batch * per_sample, s.batch, c.batch,
             per_sample > 1 ? fmt::format(", {} tokens each", per_sample) : std::string());
  KILN_CHECK(s.epoch_correct >= 0 && s.epoch_correct <= s.epoch_seen,
             "{} \"epoch_correct\" = {} is outside [0, epoch_seen = {}]", where, s.epoch_correct, s.epoch_seen);
  KILN_CHECK(std::isfinite(s.epoch_loss_sum) && s.epoch_loss_sum >= 0,
             "{} \"epoch_loss_sum\" = {} is not a sum of losses (finite, 0 or more)", where, s.epoch_loss_sum);
  KILN_CHECK(static_cast<int64_t>(s.step_losses.size()) == s.step,
             "{} \"step_losses\" holds {} losses for \"step\" = {} steps", where, s.step_losses.size(), s.step);
  KILN_CHECK(static_cast<int64_t>(s.epochs.size()) == s.epoch,
             "{} \"epochs\" holds {} records for \"epoch\" = {} finished epochs", where, s.epochs.size(), s.epoch);
}

}  // namespace

std::string fingerprint(const Config& c) {
  return fmt::format(
      "data={} arch={} epochs={} steps={} batch={} lr={} schedule={} warmup={} optimizer={} momentum={} "
      "nesterov={} weight_decay={} weight_decay_scope={} label_smoothing={} zero_init_residual={} image_size={} "
      "pad={} seed={} train_samples={} synthetic={}x{} amp={} loss_scale={} clip_grad_norm={}",
      c.data, c.arch, c.epochs, c.steps, c.batch, c.lr, c.lr_schedule, c.warmup, c.optimizer, c.momentum, c.nesterov,
      c.weight_decay, c.weight_decay_scope, c.label_smoothing, c.zero_init_residual, c.image_size, c.pad, c.seed,
      c.train_samples, c.synthetic_size, c.synthetic_classes, c.amp, c.loss_scale, c.clip_grad_norm) +
         // The transformers' settings (absent for the image models, whose earlier
         // checkpoints keep resuming).
         (is_text_arch(c.arch) ? fmt::format(" task={} seq_len={} vocab={} vocab_size={} init={} mlm_probability={}",
                                             task_of(c), c.seq_len, c.vocab.string(), c.vocab_size, c.init.string(),
                                             c.mlm_probability)
                               : std::string());
}

fs::path save_checkpoint(const fs::path& dir, const TrainingState& state, const nn::Module& model,
                         const optim::Optimizer& optimizer, const optim::GradScaler* scaler) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  KILN_CHECK(!ec, "checkpoint: cannot create {}: {}", dir.string(), ec.message());
  remove_stale_temporaries(dir);
  // A name no folder has: the folder `latest` names stays whole until `latest` names another.
  FolderName name{state.step, 0};
  for (const SavedFolder& s : saved_checkpoints(dir))
    if (s.name.step == state.step) name.generation = std::max(name.generation, s.name.generation + 1);
  const fs::path final_path = dir / folder_name(name);
  const fs::path temporary = dir / fmt::format("{}{}{}", folder_name(name), kTemporary, ::getpid());
  fs::remove_all(temporary, ec);
  fs::create_directories(temporary, ec);
  KILN_CHECK(!ec, "checkpoint: cannot create {}: {}", temporary.string(), ec.message());

  try {
    save_safetensors(model.state_dict(), (temporary / "model.safetensors").string());
    save_safetensors(optimizer.state_dict(), (temporary / "optimizer.safetensors").string());
    if (scaler && scaler->is_enabled())
      save_safetensors(scaler->state_dict(), (temporary / "grad_scaler.safetensors").string());

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
    sync_path(temporary);  // save_safetensors syncs each file

    fs::rename(temporary, final_path, ec);
    KILN_CHECK(!ec, "checkpoint: cannot rename {} to {}: {}", temporary.string(), final_path.string(),
               ec.message());
  } catch (...) {
    fs::remove_all(temporary, ec);
    throw;
  }
  sync_path(dir);
  write_text_atomically(dir / "latest", folder_name(name) + "\n");
  sync_path(dir);
  remove_superseded(dir, name);
  return final_path;
}

TrainingState load_checkpoint(const Config& config, int64_t batches_per_epoch, nn::Module& model,
                              optim::Optimizer& optimizer, optim::GradScaler* scaler) {
  const fs::path& dir = config.checkpoint_dir;
  remove_stale_temporaries(dir);
  const fs::path path = latest_folder(dir);

  const fs::path trainer_file = path / "trainer.safetensors";
  const SafetensorsContents contents = load_safetensors_with_metadata(trainer_file.string());
  const SafetensorsMetadata& m = contents.metadata;
  KILN_CHECK(meta(m, "format", trainer_file) == kFormat, "checkpoint: {} is not a {} file", trainer_file.string(),
             kFormat);
  TrainingState s;
  s.fingerprint = meta(m, "fingerprint", trainer_file);
  KILN_CHECK(s.fingerprint == fingerprint(config),
             "kiln-train: --resume: the checkpoint {} was made with other settings ({}); now {}", path.string(),
             s.fingerprint, fingerprint(config));
  s.step = meta_int(m, "step", trainer_file);
  s.epoch = meta_int(m, "epoch", trainer_file);
  s.batch = meta_int(m, "batch", trainer_file);
  s.micro_batch = meta_int(m, "micro_batch", trainer_file);
  s.epoch_loss_sum = meta_double(m, "epoch_loss_sum", trainer_file);
  s.epoch_correct = meta_int(m, "epoch_correct", trainer_file);
  s.epoch_seen = meta_int(m, "epoch_seen", trainer_file);
  if (auto it = contents.tensors.find("step_losses"); it != contents.tensors.end()) {
    const Tensor t = it->second.to(DType::f64).contiguous();
    s.step_losses.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  }
  if (auto it = contents.tensors.find("epochs"); it != contents.tensors.end()) {
    const Tensor t = it->second.to(DType::f64).contiguous();
    KILN_CHECK(t.dim() == 2 && t.size(1) == kEpochFields, "checkpoint: {}: epochs has shape {}",
               trainer_file.string(), t.shape());
    const double* p = t.data_ptr<double>();
    for (int64_t i = 0; i < t.size(0); ++i, p += kEpochFields) {
      KILN_CHECK(p[0] == static_cast<double>(i), "checkpoint: {}: \"epochs\" record {} is of epoch {}",
                 trainer_file.string(), i, p[0]);
      s.epochs.push_back({i, p[1], p[2], p[3], p[4], p[5]});
    }
  }
  check_stored_state(s, config, batches_per_epoch, has_batch_norm(model), trainer_file);
  const uint64_t generator_seed = meta_u64(m, "generator_seed", trainer_file);
  const uint64_t generator_offset = meta_u64(m, "generator_offset", trainer_file);

  // The fingerprint holds --amp and --loss-scale, so a run with a scaler resumes from one.
  const fs::path scaler_file = path / "grad_scaler.safetensors";
  const bool scaled = scaler && scaler->is_enabled();
  KILN_CHECK(!scaled || fs::exists(scaler_file), "checkpoint: {} is missing (the run scales its loss)",
             scaler_file.string());
  const StateDict scaler_state = scaled ? load_safetensors(scaler_file.string()) : StateDict();
  model.load_state_dict(load_safetensors((path / "model.safetensors").string()));
  optimizer.load_state_dict(load_safetensors((path / "optimizer.safetensors").string()));
  if (scaled) scaler->load_state_dict(scaler_state);
  Generator& g = default_generator();
  g.manual_seed(generator_seed);
  g.set_offset(generator_offset);
  return s;
}

std::vector<fs::path> checkpoint_folders(const fs::path& dir) {
  std::vector<fs::path> paths;
  for (const SavedFolder& s : saved_checkpoints(dir)) paths.push_back(s.path);
  return paths;
}

}  // namespace kiln::train
