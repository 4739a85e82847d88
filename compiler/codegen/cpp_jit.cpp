#include "compiler/codegen/cpp_jit.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "core/disk_cache.h"
#include "core/error.h"

extern char** environ;

namespace kiln::compiler::codegen {
namespace {

namespace fs = std::filesystem;

std::mutex g_mutex;  // guards g_memory
std::unordered_map<std::string, CompiledKernel> g_memory;
std::atomic<int64_t> g_invocations{0};

constexpr const char* kWho = "compile_cpp";

std::string compiler() { return disk_cache::env_or("KILN_CXX", "c++"); }

// Portable flags only: the cache may be shared between machines. -fno-trapping-math changes
// no result (no reassociation, no contraction); it tells g++ that kiln never traps on
// floating-point exceptions, so it may compute both sides of a where() and select, which
// is what lets a kernel with a comparison vectorize: ResNet-50's residual relu-backward
// kernels (add, gt, where) took 5.6 ms of its compiled step as branchy scalar loops and
// 0.6 ms vectorized.
const std::vector<std::string>& flags() {
  static const std::vector<std::string> f = {"-O3", "-fno-trapping-math", "-fopenmp", "-fPIC", "-shared", "-std=c++20"};
  return f;
}

#if defined(__x86_64__)
constexpr const char* kTarget = "cpp-x86_64-linux";
#elif defined(__aarch64__)
constexpr const char* kTarget = "cpp-aarch64-linux";
#else
constexpr const char* kTarget = "cpp-other";
#endif

// Runs argv with stdout and stderr into `log`; returns the exit status (-1: did not start).
int run_process(const std::vector<std::string>& argv, const fs::path& log) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const int log_flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW;  // a new file, in a private dir
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), log_flags, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

fs::path cache_dir() { return disk_cache::directory("kernels", kWho); }

// The host compiler's identity, computed once per process.
const std::string& compiler_identity() {
  static const std::string identity = [] {
    const disk_cache::ScratchDir scratch(kWho);
    const fs::path log = scratch.path() / "compiler-version.txt";
    const int rc = run_process({compiler(), "--version"}, log);
    KILN_CHECK(rc == 0, "compile_cpp: `{} --version` failed (exit {}); set KILN_CXX to a C++ compiler",
               compiler(), rc);
    return disk_cache::read_file(log);
  }();
  return identity;
}

// What decides the compiled code: the source, the flags, the target, the compiler and the
// kiln headers the source includes.
std::string key_of(const std::string& source) {
  std::string all = source;
  for (const std::string& f : flags()) all += "\n" + f;
  all += std::string("\n") + kTarget + "\n" + disk_cache::kEntryFormat + "\n" +
         compiler_identity() + disk_cache::header_identity(source, kWho);
  return disk_cache::hash_hex(all);
}

// dlopen + dlsym; the error text, appended to `error`, when either fails.
KernelFunction load(const fs::path& path, const std::string& name, std::string* error) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!handle) {
    *error += dlerror();
    return nullptr;
  }
  void* symbol = dlsym(handle, name.c_str());
  if (!symbol) {
    *error += fmt::format("symbol {} not found in {}", name, path.string());
    return nullptr;
  }
  return reinterpret_cast<KernelFunction>(symbol);
}

// Loads `name` from the cache entry `entry` once its digest checks out. nullptr, with the
// reason in `error`, when there is no entry, or when it was bad or did not load: then it has
// been discarded (with a warning) for a rebuild. The entry is opened through a hard link of
// its own: dlopen hands back the object it already has for a path it has seen, which would
// be the old code after a rebuild; and the link pins the bytes that were checked, should
// another process replace the entry meanwhile.
KernelFunction load_entry(const fs::path& entry, const std::string& name, std::string* error) {
  const fs::path link = disk_cache::temp_path_for(entry).string() + ".so";
  std::string bytes;
  if (::link(entry.c_str(), link.c_str()) == 0) {
    bytes = disk_cache::read_file(link);
  } else {
    if (errno == ENOENT) {
      *error = fmt::format("{} does not exist", entry.string());
      return nullptr;
    }
    // A file system without hard links: load a private copy of the bytes checked.
    bytes = disk_cache::read_file(entry);
    if (disk_cache::unseal(entry.filename().string(), bytes))
      disk_cache::write_atomic(link, bytes, kWho);
  }
  std::error_code ec;
  if (!disk_cache::unseal(entry.filename().string(), bytes)) {
    fs::remove(link, ec);
    *error = disk_cache::kMismatch;
    disk_cache::discard_entry(entry, *error, kWho);
    return nullptr;
  }
  KernelFunction f = load(link, name, error);
  fs::remove(link, ec);  // the mapping stays valid
  if (!f) disk_cache::discard_entry(entry, *error, kWho);
  return f;
}

struct Job {
  std::string source, name, key;
  CompiledKernel result;
  std::string error;
};

// Keeps a source the compiler rejected, for inspection, in a new private file in $TMPDIR
// (the scratch directory is removed). Returns where, or why it could not.
std::string keep_failed_source(const std::string& source, const std::string& name) {
  const std::string pattern = fmt::format("kiln-failed-{}-XXXXXX.cpp", name.substr(0, 64));
  std::string kept = (disk_cache::temp_root() / pattern).string();
  const int fd = ::mkstemps(kept.data(), 4);  // 0600, a name nobody else has
  if (fd < 0) return fmt::format("nowhere ({})", std::strerror(errno));
  std::FILE* out = ::fdopen(fd, "w");
  if (!out) {
    ::close(fd);
    return fmt::format("nowhere (cannot write {})", kept);
  }
  const bool written = std::fwrite(source.data(), 1, source.size(), out) == source.size();
  if (std::fclose(out) != 0 || !written) return fmt::format("nowhere (cannot write {})", kept);
  return kept;
}

// Compiles one job in a private scratch directory (removed afterwards, also on failure),
// seals the shared object into the cache directory `dir` and loads it from there (or, with
// no `dir`, the disk cache off, loads it from the scratch directory).
void build(Job& job, const fs::path& dir) {
  const disk_cache::ScratchDir scratch(kWho);
  const fs::path cpp = scratch.path() / "kernel.cpp", so = scratch.path() / "kernel.so",
                 log = scratch.path() / "compiler.log";
  disk_cache::write_file(cpp, job.source, kWho);
  std::vector<std::string> argv = {compiler()};
  argv.insert(argv.end(), flags().begin(), flags().end());
  argv.insert(argv.end(), {"-I", disk_cache::include_dir(), cpp.string(), "-o", so.string()});
  ++g_invocations;
  const int rc = run_process(argv, log);
  if (rc != 0) {
    const std::string output = disk_cache::read_file(log);
    job.error = fmt::format(
        "compile_cpp: the host compiler failed on kernel {} (exit {}); source kept at {}\n"
        "command: {}\n{}",
        job.name, rc, keep_failed_source(job.source, job.name), fmt::join(argv, " "), output);
    return;
  }
  std::string error;
  if (!dir.empty()) {
    const fs::path entry = dir / (job.key + ".so");
    disk_cache::write_entry(entry, disk_cache::read_file(so), kWho);
    if (KernelFunction f = load_entry(entry, job.name, &error)) {
      job.result = {f, job.name, job.key, entry.string()};
      return;
    }
    error += "; from the scratch directory: ";  // another process may have removed the entry
  }
  // From the scratch directory (unique names); the mapping outlives the file.
  job.result = {load(so, job.name, &error), job.name, job.key, ""};
  if (job.result.function) return;
  job.error = fmt::format("compile_cpp: cannot load the compiled kernel {}: {}", job.name, error);
}

std::string memory_key(const std::string& key, const std::string& name) { return key + "/" + name; }

}  // namespace

std::vector<CompiledKernel> compile_cpp_batch(const std::vector<std::pair<std::string, std::string>>& sources,
                                              int jobs) {
  const bool disk = disk_cache::enabled();
  const fs::path dir = disk ? cache_dir() : fs::path();
  std::vector<CompiledKernel> results(sources.size());
  std::vector<Job> pending;
  std::unordered_map<std::string, size_t> pending_of;  // memory key -> index in pending
  std::vector<std::pair<size_t, size_t>> waiting;     // (result, pending job)
  for (size_t i = 0; i < sources.size(); ++i) {
    const auto& [source, name] = sources[i];
    const std::string key = key_of(source);
    const std::string mkey = memory_key(key, name);
    {
      std::lock_guard lock(g_mutex);
      if (auto it = g_memory.find(mkey); it != g_memory.end()) {
        results[i] = it->second;
        continue;
      }
    }
    if (disk) {
      const fs::path path = dir / (key + ".so");
      std::string error;
      if (KernelFunction f = load_entry(path, name, &error)) {
        results[i] = {f, name, key, path.string()};
        std::lock_guard lock(g_mutex);
        g_memory[mkey] = results[i];
        continue;
      }
    }
    auto [it, inserted] = pending_of.emplace(mkey, pending.size());
    if (inserted) pending.push_back({source, name, key, {}, {}});
    waiting.push_back({i, it->second});
  }

  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t j = next++; j < pending.size(); j = next++) {
      try {
        build(pending[j], dir);
      } catch (const std::exception& e) {
        pending[j].error = e.what();
      }
    }
  };
  std::vector<std::thread> threads;
  const size_t n = std::min(pending.size(), static_cast<size_t>(std::max(jobs, 1)));
  for (size_t t = 1; t < n; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();

  for (const Job& job : pending) {
    if (!job.error.empty()) fail("{}", job.error);
    std::lock_guard lock(g_mutex);
    g_memory[memory_key(job.key, job.name)] = job.result;
  }
  for (const auto& [i, j] : waiting) results[i] = pending[j].result;
  return results;
}

CompiledKernel compile_cpp(const std::string& source, const std::string& name) {
  return compile_cpp_batch({{source, name}}, 1)[0];
}

std::string kernel_cache_path(const std::string& source) {
  if (!disk_cache::enabled()) return "";
  return (cache_dir() / (key_of(source) + ".so")).string();
}

int64_t compiler_invocations() { return g_invocations.load(); }

void clear_kernel_memory_cache() {
  std::lock_guard lock(g_mutex);
  g_memory.clear();
}

}  // namespace kiln::compiler::codegen
