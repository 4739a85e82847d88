#pragma once
// NVRTC: CUDA C++ source -> CUBIN for one real architecture, behind a cache. Needs no GPU
// and no driver (NVRTC runs ptxas in-process), so the CUDA code generator is checked on
// machines without a GPU.
//
// Options: -std=c++17, --gpu-architecture=<arch> (a CUBIN, never PTX), --fmad=false (no
// contraction of a*b+c into an FMA, no fast math: results follow the CPU's rounding),
// -I<kiln headers> (the source tree the library was built from; $KILN_INCLUDE_DIR
// overrides it), -I<toolkit headers> ($KILN_CUDA_INCLUDE_DIR overrides it),
// --ptxas-options=-v (the register and spill report parsed into CudaBinary), then
// NvrtcOptions::extra.
//
// Cache key: a hash of the source, the kernel name, the options, the arch, NVRTC's version
// and the contents of the kiln headers the source includes (core/disk_cache.h). Two levels:
// in memory per process, and on disk as <cache root>/cuda/<key>.cubin with the ptxas
// report beside it in <key>.log (written first; each file sealed with a SHA-256 trailer,
// written to a temporary name, fsynced and renamed: core/disk_cache.h). A file whose
// digest does not match is discarded with a warning; an entry that is not a whole ELF file,
// or lacks its report, is rebuilt. KILN_CACHE=off turns the disk level off.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::cuda {

struct NvrtcOptions {
  std::string arch = "sm_90";      // a real architecture: the output is machine code
  std::vector<std::string> extra;  // more NVRTC options, appended (part of the key)
};

struct CudaBinary {
  std::string cubin;  // the ELF image, for cuModuleLoadData / cudaLibraryLoadData
  std::string arch;
  std::string name;   // the extern "C" __global__ function
  std::string log;    // NVRTC's log: the ptxas report
  std::string key;    // the cache key (hex)
  // From the ptxas report for `name` (-1 registers: not reported).
  int registers = -1;
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
  int shared_bytes = 0;  // static shared memory
  int stack_bytes = 0;   // per-thread stack frame
};

// Compiles (or finds in the cache) `source`, whose kernel is the extern "C" __global__
// function `name`. An NVRTC failure is a kiln::Error with the program log and the source
// with line numbers.
CudaBinary compile_cuda(const std::string& source, const std::string& name, const NvrtcOptions& options = {});

// As compile_cuda for many (source, name) pairs, compiling up to `jobs` programs at once on
// threads. Repeated pairs compile once. The first failure is thrown after every
// compilation has finished.
std::vector<CudaBinary> compile_cuda_batch(const std::vector<std::pair<std::string, std::string>>& sources,
                                           const NvrtcOptions& options = {}, int jobs = 2);

// How many programs this process has compiled with NVRTC (cache misses; for tests).
int64_t nvrtc_invocations();
// Forgets the in-memory cache, so the next compile looks at the disk (for tests).
void clear_cuda_memory_cache();

// Parses a ptxas -v report into `binary`'s statistics for its function `binary.name`.
void parse_ptxas_report(const std::string& log, CudaBinary& binary);

}  // namespace kiln::cuda
