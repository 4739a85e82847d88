#pragma once
// What kiln's on-disk caches of compiled code share: where they live, how an entry is
// written (atomically), and how a key is made (a content hash that covers the kiln headers
// a generated source includes). Used by the C++ JIT (compiler/codegen/jit.cpp) and by
// NVRTC (kernels/cuda/nvrtc.cpp).
//
// Layout: $KILN_CACHE_DIR/<kind>/<key>.<ext>, KILN_CACHE_DIR defaulting to ~/.cache/kiln
// (/tmp/kiln-cache without a HOME). KILN_CACHE=off turns every disk cache off.
#include <filesystem>
#include <string>

namespace kiln::disk_cache {

// The environment variable `name`, or `fallback` when it is unset or empty.
std::string env_or(const char* name, const std::string& fallback);

// False when KILN_CACHE=off.
bool enabled();
// The cache root, and its subdirectory `kind` ("kernels", "cuda"), created if needed.
// `who` names the caller in the error when the directory cannot be created.
std::filesystem::path root();
std::filesystem::path directory(const std::string& kind, const char* who);

// The whole file ("" when it cannot be read).
std::string read_file(const std::filesystem::path& path);
// Writes `bytes` to `path` (throws, naming `who`, when it cannot).
void write_file(const std::filesystem::path& path, const std::string& bytes, const char* who);
// A path next to `dest` that no other thread or process uses (for a temporary file).
std::filesystem::path temp_path_for(const std::filesystem::path& dest);
// Writes `bytes` to a temporary file and renames it to `dest`, so that concurrent readers
// see the old entry or the whole new one, never a partial file.
void write_atomic(const std::filesystem::path& dest, const std::string& bytes, const char* who);

// A 128-bit content hash of `text`, as 32 hex digits (not cryptographic: a cache key).
std::string hash_hex(const std::string& text);

// Where the kiln headers of generated sources are found: $KILN_INCLUDE_DIR, else the
// source tree the library was built from.
std::string include_dir();

// The contents of every kiln header that `source` includes with #include "...", directly
// or through other kiln headers, read from include_dir(): part of a cache key, so that a
// changed kernels/scalar.h never serves stale code. A header that is not found is an error
// naming `who` and KILN_INCLUDE_DIR. File contents are read once per process.
std::string header_identity(const std::string& source, const char* who);

}  // namespace kiln::disk_cache
