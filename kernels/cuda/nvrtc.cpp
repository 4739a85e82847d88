#include "kernels/cuda/nvrtc.h"

#include <nvrtc.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "core/disk_cache.h"
#include "core/error.h"

#ifndef KILN_CUDA_INCLUDE_DIR
#define KILN_CUDA_INCLUDE_DIR "/usr/local/cuda/include"
#endif

namespace kiln::cuda {
namespace {

namespace fs = std::filesystem;

constexpr const char* kWho = "compile_cuda";

std::mutex g_mutex;  // guards g_memory
std::unordered_map<std::string, CudaBinary> g_memory;  // key -> binary
std::atomic<int64_t> g_invocations{0};

std::string cuda_include_dir() { return disk_cache::env_or("KILN_CUDA_INCLUDE_DIR", KILN_CUDA_INCLUDE_DIR); }

std::vector<std::string> nvrtc_options(const NvrtcOptions& o) {
  std::vector<std::string> opts = {"-std=c++20", "--gpu-architecture=" + o.arch, "--fmad=false",
                                   "-I" + disk_cache::include_dir(), "-I" + cuda_include_dir(),
                                   "--ptxas-options=-v"};
  opts.insert(opts.end(), o.extra.begin(), o.extra.end());
  return opts;
}

const std::string& nvrtc_version() {
  static const std::string version = [] {
    int major = 0, minor = 0;
    KILN_CHECK(nvrtcVersion(&major, &minor) == NVRTC_SUCCESS, "compile_cuda: nvrtcVersion failed");
    return fmt::format("nvrtc {}.{}", major, minor);
  }();
  return version;
}

std::string key_of(const std::string& source, const std::string& name, const NvrtcOptions& o) {
  std::string all = source + "\n" + name + "\n" + o.arch + "\n" + nvrtc_version() + "\n" +
                    disk_cache::kEntryFormat;
  // The include directories are where headers come from, not what they say: the header
  // identity below covers the contents, so two checkouts share entries.
  for (const std::string& opt : nvrtc_options(o))
    if (opt.rfind("-I", 0) != 0) all += "\n" + opt;
  all += "\n" + disk_cache::header_identity(source, kWho);
  return disk_cache::hash_hex(all);
}

// A whole 64-bit little-endian ELF file: the magic, and the section header table (which
// ptxas writes last) inside the file.
bool whole_elf(const std::string& image) {
  if (image.size() < 64 || image.compare(0, 4, "\x7f" "ELF") != 0 || image[4] != 2) return false;
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0;
  std::memcpy(&shoff, image.data() + 0x28, sizeof(shoff));
  std::memcpy(&shentsize, image.data() + 0x3a, sizeof(shentsize));
  std::memcpy(&shnum, image.data() + 0x3c, sizeof(shnum));
  return shoff <= image.size() && static_cast<uint64_t>(shentsize) * shnum <= image.size() - shoff;
}

std::string numbered(const std::string& source) {
  std::string out;
  std::istringstream in(source);
  int n = 0;
  for (std::string line; std::getline(in, line);) out += fmt::format("{:5}  {}\n", ++n, line);
  return out;
}

std::string program_log(nvrtcProgram program) {
  size_t size = 0;
  if (nvrtcGetProgramLogSize(program, &size) != NVRTC_SUCCESS || size == 0) return "";
  std::string log(size, '\0');
  nvrtcGetProgramLog(program, log.data());
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

struct Job {
  std::string source, name;
  CudaBinary result;
  std::string error;
};

void build(Job& job, const NvrtcOptions& o) {
  nvrtcProgram program = nullptr;
  nvrtcResult rc = nvrtcCreateProgram(&program, job.source.c_str(), (job.name + ".cu").c_str(), 0, nullptr, nullptr);
  if (rc != NVRTC_SUCCESS) {
    job.error = fmt::format("compile_cuda: nvrtcCreateProgram failed for kernel {}: {}", job.name,
                            nvrtcGetErrorString(rc));
    return;
  }
  const std::vector<std::string> opts = nvrtc_options(o);
  std::vector<const char*> argv;
  for (const std::string& opt : opts) argv.push_back(opt.c_str());
  ++g_invocations;
  rc = nvrtcCompileProgram(program, static_cast<int>(argv.size()), argv.data());
  CudaBinary& b = job.result;
  b.log = program_log(program);
  if (rc == NVRTC_SUCCESS) {
    size_t size = 0;
    rc = nvrtcGetCUBINSize(program, &size);
    if (rc == NVRTC_SUCCESS) {
      b.cubin.resize(size);
      rc = nvrtcGetCUBIN(program, b.cubin.data());
    }
  }
  nvrtcDestroyProgram(&program);
  if (rc != NVRTC_SUCCESS) {
    job.error = fmt::format("compile_cuda: NVRTC failed on kernel {} for {} ({}); options: {}\nlog:\n{}\nsource:\n{}",
                            job.name, o.arch, nvrtcGetErrorString(rc), fmt::join(opts, " "), b.log,
                            numbered(job.source));
    return;
  }
  parse_ptxas_report(b.log, b);
}

// The disk entry of `key`, when both files are there and match their digests (a file that
// does not is discarded, with a warning, by read_entry) and the CUBIN is a whole ELF file.
bool load_entry(const fs::path& dir, const std::string& key, CudaBinary& b) {
  const fs::path cubin_path = dir / (key + ".cubin");
  std::optional<std::string> cubin = disk_cache::read_entry(cubin_path, kWho);
  if (!cubin) return false;
  std::optional<std::string> log = disk_cache::read_entry(dir / (key + ".log"), kWho);
  if (!log) return false;  // rebuilt: the new report is written before the new CUBIN
  if (!whole_elf(*cubin)) {
    disk_cache::discard_entry(cubin_path, "it is not a whole ELF file", kWho);
    return false;
  }
  b.cubin = std::move(*cubin);
  b.log = std::move(*log);
  parse_ptxas_report(b.log, b);
  return true;
}

int number_before(const std::string& text, size_t pos) {
  size_t begin = pos;
  while (begin > 0 && text[begin - 1] == ' ') --begin;
  size_t end = begin;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(text[begin - 1]))) --begin;
  return begin == end ? 0 : std::stoi(text.substr(begin, end - begin));
}

int number_after(const std::string& text, size_t pos) {
  while (pos < text.size() && text[pos] == ' ') ++pos;
  size_t end = pos;
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  return end == pos ? 0 : std::stoi(text.substr(pos, end - pos));
}

}  // namespace

// ptxas -v writes, per function:
//   ptxas info    : Compiling entry function 'k_add' for 'sm_90'
//   ptxas info    : Function properties for k_add
//   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//   ptxas info    : Used 12 registers, used 1 barriers, 64 bytes smem, ...
// Spills are summed over every function of the program (a called device function that
// spills slows the kernel as much); registers, shared memory and stack are the entry's.
void parse_ptxas_report(const std::string& log, CudaBinary& b) {
  b.registers = -1;
  b.spill_store_bytes = b.spill_load_bytes = b.shared_bytes = b.stack_bytes = 0;
  std::istringstream in(log);
  std::string properties_of, entry;
  for (std::string line; std::getline(in, line);) {
    if (size_t p = line.find("Compiling entry function '"); p != std::string::npos) {
      p += std::strlen("Compiling entry function '");
      entry = line.substr(p, line.find('\'', p) - p);
    } else if (size_t q = line.find("Function properties for "); q != std::string::npos) {
      properties_of = line.substr(q + std::strlen("Function properties for "));
    } else if (size_t s = line.find(" bytes spill stores"); s != std::string::npos) {
      b.spill_store_bytes += number_before(line, s);
      if (size_t l = line.find(" bytes spill loads"); l != std::string::npos)
        b.spill_load_bytes += number_before(line, l);
      if (size_t f = line.find(" bytes stack frame"); f != std::string::npos && properties_of == b.name)
        b.stack_bytes = number_before(line, f);
    } else if (size_t u = line.find("Used "); u != std::string::npos && entry == b.name) {
      if (line.find(" registers", u) != std::string::npos) b.registers = number_after(line, u + 5);
      if (size_t m = line.find(" bytes smem"); m != std::string::npos) b.shared_bytes = number_before(line, m);
      entry.clear();  // the next "Used" line belongs to another function
    }
  }
}

std::vector<CudaBinary> compile_cuda_batch(const std::vector<std::pair<std::string, std::string>>& sources,
                                           const NvrtcOptions& options, int jobs) {
  const bool disk = disk_cache::enabled();
  const fs::path dir = disk ? disk_cache::directory("cuda", kWho) : fs::path();
  std::vector<CudaBinary> results(sources.size());
  std::vector<Job> pending;
  std::unordered_map<std::string, size_t> pending_of;  // key -> index in pending
  std::vector<std::pair<size_t, size_t>> waiting;     // (result, pending job)
  for (size_t i = 0; i < sources.size(); ++i) {
    const auto& [source, name] = sources[i];
    const std::string key = key_of(source, name, options);
    {
      std::lock_guard lock(g_mutex);
      if (auto it = g_memory.find(key); it != g_memory.end()) {
        results[i] = it->second;
        continue;
      }
    }
    CudaBinary b{.arch = options.arch, .name = name, .key = key};
    if (disk && load_entry(dir, key, b)) {
      std::lock_guard lock(g_mutex);
      results[i] = g_memory[key] = std::move(b);
      continue;
    }
    auto [it, inserted] = pending_of.emplace(key, pending.size());
    if (inserted) pending.push_back({source, name, std::move(b), {}});
    waiting.push_back({i, it->second});
  }

  // Compiles a job and keeps a successful result on disk.
  auto build_and_save = [&](Job& job) {
    try {
      build(job, options);
      if (job.error.empty() && disk) {
        // The report first: a .cubin present means its .log is too.
        disk_cache::write_entry(dir / (job.result.key + ".log"), job.result.log, kWho);
        disk_cache::write_entry(dir / (job.result.key + ".cubin"), job.result.cubin, kWho);
      }
    } catch (const std::exception& e) {
      job.error = e.what();
    }
  };
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t j = next++; j < pending.size(); j = next++) build_and_save(pending[j]);
  };
  std::vector<std::thread> threads;
  const size_t n = std::min(pending.size(), static_cast<size_t>(std::max(jobs, 1)));
  for (size_t t = 1; t < n; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  // Seen on an H200 machine: with programs compiling on two threads, a program's log
  // sometimes lacked its ptxas report (the registers and spills of its entry), while the
  // CUBIN was sound. Such a program is compiled again alone, so its statistics are real.
  for (Job& job : pending) {
    if (!job.error.empty() || job.result.registers >= 0) continue;
    static std::mutex alone;
    std::lock_guard lock(alone);
    job.result.cubin.clear();
    build_and_save(job);
  }

  for (const Job& job : pending) {
    if (!job.error.empty()) throw Error(job.error);
    std::lock_guard lock(g_mutex);
    g_memory[job.result.key] = job.result;
  }
  for (const auto& [i, j] : waiting) results[i] = pending[j].result;
  return results;
}

CudaBinary compile_cuda(const std::string& source, const std::string& name, const NvrtcOptions& options) {
  return compile_cuda_batch({{source, name}}, options, 1)[0];
}

int64_t nvrtc_invocations() { return g_invocations.load(); }

void clear_cuda_memory_cache() {
  std::lock_guard lock(g_mutex);
  g_memory.clear();
}

}  // namespace kiln::cuda
