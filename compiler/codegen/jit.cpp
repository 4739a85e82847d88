#include "compiler/codegen/jit.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
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
std::atomic<int64_t> g_temp_counter{0};

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
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
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

fs::path scratch_dir() {
  fs::path dir = fs::temp_directory_path() / fmt::format("kiln-kernels-{}", getpid());
  fs::create_directories(dir);
  return dir;
}

fs::path cache_dir() { return disk_cache::directory("kernels", kWho); }

// The host compiler's identity, computed once per process.
const std::string& compiler_identity() {
  static const std::string identity = [] {
    const fs::path log = scratch_dir() / "compiler-version.txt";
    const int rc = run_process({compiler(), "--version"}, log);
    KILN_CHECK(rc == 0, "compile_cpp: `{} --version` failed (exit {}); set KILN_CXX to a C++ compiler",
               compiler(), rc);
    std::string id = disk_cache::read_file(log);
    fs::remove(log);
    return id;
  }();
  return identity;
}

// What decides the compiled code: the source, the flags, the target, the compiler and the
// kiln headers the source includes.
std::string key_of(const std::string& source) {
  std::string all = source;
  for (const std::string& f : flags()) all += "\n" + f;
  all += std::string("\n") + kTarget + "\n" + compiler_identity() + disk_cache::header_identity(source, kWho);
  return disk_cache::hash_hex(all);
}

// dlopen + dlsym; the error text when either fails.
KernelFunction load(const fs::path& path, const std::string& name, std::string* error) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!handle) {
    *error = dlerror();
    return nullptr;
  }
  void* symbol = dlsym(handle, name.c_str());
  if (!symbol) {
    *error = fmt::format("symbol {} not found in {}", name, path.string());
    return nullptr;
  }
  return reinterpret_cast<KernelFunction>(symbol);
}

struct Job {
  std::string source, name, key;
  CompiledKernel result;
  std::string error;
};

// Compiles one job into a fresh temporary object, moves it into the cache (or loads it from
// the scratch directory) and loads it.
void build(Job& job, bool disk) {
  const fs::path dir = disk ? cache_dir() : scratch_dir();
  const fs::path stem = dir / fmt::format("tmp-{}-{}-{}", job.key.substr(0, 16), getpid(), g_temp_counter++);
  const fs::path cpp = stem.string() + ".cpp", so = stem.string() + ".so", log = stem.string() + ".log";
  disk_cache::write_file(cpp, job.source, kWho);
  std::vector<std::string> argv = {compiler()};
  argv.insert(argv.end(), flags().begin(), flags().end());
  argv.insert(argv.end(), {"-I", disk_cache::include_dir(), cpp.string(), "-o", so.string()});
  ++g_invocations;
  const int rc = run_process(argv, log);
  if (rc != 0) {
    job.error = fmt::format("compile_cpp: the host compiler failed on kernel {} (exit {}); source kept at {}\n"
                            "command: {}\n{}", job.name, rc, cpp.string(), fmt::join(argv, " "), disk_cache::read_file(log));
    std::error_code ec;
    fs::remove(so, ec);
    return;
  }
  std::error_code ec;
  fs::remove(log, ec);
  fs::remove(cpp, ec);
  fs::path final_path = so;
  if (disk) {
    final_path = dir / (job.key + ".so");
    fs::rename(so, final_path, ec);  // atomic: readers see the old entry or the whole new one
    if (ec) {
      job.error = fmt::format("compile_cpp: cannot move {} to {}: {}", so.string(), final_path.string(), ec.message());
      return;
    }
  }
  std::string error;
  job.result = {load(final_path, job.name, &error), job.name, job.key, disk ? final_path.string() : ""};
  if (!disk) fs::remove(so, ec);  // the mapping stays valid
  if (!job.result.function)
    job.error = fmt::format("compile_cpp: cannot load the compiled kernel {}: {}", job.name, error);
}

std::string memory_key(const std::string& key, const std::string& name) { return key + "/" + name; }

}  // namespace

std::vector<CompiledKernel> compile_cpp_batch(const std::vector<std::pair<std::string, std::string>>& sources,
                                              int jobs) {
  const bool disk = disk_cache::enabled();
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
      const fs::path path = cache_dir() / (key + ".so");
      if (fs::exists(path)) {
        std::string error;
        if (KernelFunction f = load(path, name, &error)) {
          results[i] = {f, name, key, path.string()};
          std::lock_guard lock(g_mutex);
          g_memory[mkey] = results[i];
          continue;
        }
        std::error_code ec;
        fs::remove(path, ec);  // corrupt or foreign: rebuild it
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
        build(pending[j], disk);
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
