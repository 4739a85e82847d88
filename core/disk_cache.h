#pragma once
// What kiln's on-disk caches of compiled code share: where they live, how an entry is
// written (sealed with a digest, atomically, durably) and read back (checked before use),
// private scratch directories for the compilers, and how a key is made (a content hash that
// covers the kiln headers a generated source includes). Used by the C++ JIT
// (compiler/codegen/cpp_jit.cpp) and by NVRTC (kernels/cuda/nvrtc.cpp).
//
// Layout: <root>/<kind>/<key>.<ext>. The root is $KILN_CACHE_DIR, else
// $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; with none of them set there is no disk
// cache (never a shared folder such as /tmp). KILN_CACHE=off turns every disk cache off.
// Directories kiln creates are 0700; a cache directory that group or others may write, or
// that another user owns, is refused (kiln loads code from it). docs/design-notes.md says
// what this protects against and what it does not.
//
// An entry is its payload followed by a trailer: 8 magic bytes and the SHA-256 of the
// entry's file name and payload. A missing, short or different trailer means the entry is
// truncated, corrupt, from an older kiln or not written by kiln: it is discarded with a
// warning and rebuilt. Tying the digest to the file name keeps an entry copied under
// another key (or a .log under a .cubin's name) from being accepted.
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::disk_cache {

// The environment variable `name`, or `fallback` when it is unset or empty.
std::string env_or(const char* name, const std::string& fallback);

// The cache root (see above); empty when no variable names one.
std::filesystem::path root();
// False when KILN_CACHE=off or when there is no root (then says so on stderr, once).
bool enabled();
// The subdirectory `kind` ("kernels", "cuda") of the root, created 0700 with any missing
// parent. A root or subdirectory that group or others may write, or that this user does not
// own, is a kiln::Error naming `who`, the directory and its mode or owner.
std::filesystem::path directory(const std::string& kind, const char* who);

// A fresh private directory (mkdtemp, 0700) under $TMPDIR (/tmp when unset), removed with
// everything in it when the object is destroyed, on success or failure alike. A TMPDIR
// where none can be made is a kiln::Error naming `who` and TMPDIR.
class ScratchDir {
 public:
  explicit ScratchDir(const char* who);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};
// $TMPDIR, or /tmp when it is unset or empty.
std::filesystem::path temp_root();

// The whole file ("" when it cannot be read).
std::string read_file(const std::filesystem::path& path);
// Writes `bytes` to `path` (throws, naming `who`, when it cannot).
void write_file(const std::filesystem::path& path, const std::string& bytes, const char* who);
// A path next to `dest` that no other thread or process uses (for a temporary file).
std::filesystem::path temp_path_for(const std::filesystem::path& dest);
// Writes `bytes` to a new temporary file (0600, never through a link), fsyncs it, renames it
// to `dest` and fsyncs the directory: concurrent readers see the old entry or the whole new
// one, and after a crash the entry is whole or absent.
void write_atomic(const std::filesystem::path& dest, const std::string& bytes, const char* who);

// The size of an entry's trailer.
constexpr size_t kTrailerSize = 8 + 32;
// `payload` followed by the trailer for an entry whose file is named `name` ("<key>.so").
std::string seal(std::string_view name, std::string_view payload);
// The payload of `entry`, the bytes of a file named `name`, when its trailer matches.
std::optional<std::string> unseal(std::string_view name, std::string_view entry);
// write_atomic of the sealed `payload` to `path` (its file name is the one sealed).
void write_entry(const std::filesystem::path& path, std::string_view payload, const char* who);
// The payload of the entry `path`: nullopt when there is none, and when the file is there
// but does not unseal, which discard_entry reports.
std::optional<std::string> read_entry(const std::filesystem::path& path, const char* who);
// Removes the entry `path` and warns on stderr, once per call, naming `who`, the file and
// `why`.
void discard_entry(const std::filesystem::path& path, const std::string& why, const char* who);
// The `why` of an entry whose trailer does not match.
constexpr const char* kMismatch =
    "its content does not match its digest (truncated, corrupted or not written by kiln)";

// The SHA-256 of `bytes`, as 64 hex digits.
std::string sha256_hex(std::string_view bytes);
// A 128-bit content hash of `text`, as 32 hex digits (not cryptographic: a cache key).
std::string hash_hex(const std::string& text);
// Hashed into every key: entries of an older layout are never looked at (so they are not
// reported as corrupt either).
constexpr const char* kEntryFormat = "kiln cache entry format 2: payload + sha-256 trailer";

// Where the kiln headers of generated sources are found: $KILN_INCLUDE_DIR, else the
// source tree the library was built from.
std::string include_dir();

// The contents of every kiln header that `source` includes with #include "...", directly
// or through other kiln headers, read from include_dir(): part of a cache key, so that a
// changed kernels/scalar.h never serves stale code. A header that is not found is an error
// naming `who` and KILN_INCLUDE_DIR. File contents are read once per process.
std::string header_identity(const std::string& source, const char* who);

}  // namespace kiln::disk_cache
