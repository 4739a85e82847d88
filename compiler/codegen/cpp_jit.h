#pragma once
// The C++ JIT: generated sources -> the host compiler -> a shared object -> dlopen'ed
// function, behind a kernel cache.
//
// Cache key: a hash of the source, the compiler flags, the target, the host compiler's
// `--version` output and the content of the kiln headers the kernels include (so a changed
// kernels/scalar.h never serves stale code). Two levels:
// - in memory, per process (key -> function);
// - on disk, <cache root>/kernels/<key>.so (core/disk_cache.h: $KILN_CACHE_DIR, else
//   ~/.cache/kiln; a private directory). Entries are sealed with a SHA-256 trailer, written
//   to a temporary file, fsynced and renamed into place; the digest is checked before
//   dlopen, and an entry that does not match or fails to load is discarded with a warning
//   and rebuilt. An entry is dlopen'ed through a hard link of its own, so a rebuilt entry
//   is loaded even where the process has the old one. KILN_CACHE=off disables it.
// The compiler runs in a private scratch directory (mkdtemp in $TMPDIR), removed afterwards;
// a source it rejects is kept as $TMPDIR/kiln-failed-<name>-XXXXXX.cpp.
// Flags are portable (-O3, no -march=native), since a cache directory may be shared by
// machines. The compiler is `c++` (KILN_CXX overrides it); headers come from the kiln
// source tree the library was built from (KILN_INCLUDE_DIR overrides it, for an install).
//
// Shared objects are never closed (dlclose of code built with g++'s OpenMP crashes in
// libgomp), so each distinct kernel costs one mapping for the life of the process.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::compiler::codegen {

using KernelFunction = void (*)(void* const* buffers, const int64_t* args);

struct CompiledKernel {
  KernelFunction function = nullptr;
  std::string name;  // the symbol
  std::string key;   // the cache key (hex)
  std::string path;  // the shared object loaded ("" when the disk cache is off)
};

// Compiles (or finds in the cache) `source` and returns its function `name`. A compiler
// failure is a kiln::Error with the compiler's output and the path of the source file kept
// for inspection.
CompiledKernel compile_cpp(const std::string& source, const std::string& name);

// As compile_cpp for many (source, name) pairs, running up to `jobs` compiler processes at
// once. The first failure is thrown after every compilation has finished.
std::vector<CompiledKernel> compile_cpp_batch(const std::vector<std::pair<std::string, std::string>>& sources,
                                              int jobs = 2);

// The disk cache entry `source` would use ("" when the disk cache is off).
std::string kernel_cache_path(const std::string& source);
// How many times this process has run the host compiler (for tests).
int64_t compiler_invocations();
// Forgets the in-memory cache, so the next compile looks at the disk (for tests).
void clear_kernel_memory_cache();

}  // namespace kiln::compiler::codegen
