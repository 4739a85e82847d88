#include "core/disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

#ifndef KILN_SOURCE_INCLUDE_DIR
#define KILN_SOURCE_INCLUDE_DIR "."
#endif

namespace kiln::disk_cache {
namespace fs = std::filesystem;

namespace {

// SHA-256 (FIPS 180-4). The round constants are the first 32 bits of the fractional parts of
// the cube roots of the first 64 primes; the initial state, of the square roots of the
// first 8.
class Sha256 {
 public:
  void update(std::string_view data) {
    length_ += data.size();
    for (unsigned char c : data) {
      buffer_[used_++] = c;
      if (used_ == 64) {
        block(buffer_);
        used_ = 0;
      }
    }
  }

  std::array<uint8_t, 32> finish() {
    const uint64_t bits = length_ * 8;
    const unsigned char one = 0x80;
    update(std::string_view(reinterpret_cast<const char*>(&one), 1));
    while (used_ != 56) update(std::string_view("\0", 1));
    unsigned char size[8];
    for (int i = 0; i < 8; ++i) size[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    update(std::string_view(reinterpret_cast<const char*>(size), 8));
    std::array<uint8_t, 32> out{};
    for (int i = 0; i < 32; ++i) out[i] = static_cast<uint8_t>(h_[i / 4] >> (24 - 8 * (i % 4)));
    return out;
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void block(const unsigned char* p) {
    static constexpr uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t{p[4 * i]} << 24 | uint32_t{p[4 * i + 1]} << 16 | uint32_t{p[4 * i + 2]} << 8 |
             p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 =
          h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    const uint32_t add[8] = {a, b, c, d, e, f, g, h};
    for (int i = 0; i < 8; ++i) h_[i] += add[i];
  }

  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  unsigned char buffer_[64] = {};
  size_t used_ = 0;
  uint64_t length_ = 0;
};

constexpr std::string_view kMagic = "kiln-sha";
static_assert(kMagic.size() + 32 == kTrailerSize);

std::array<uint8_t, 32> entry_digest(std::string_view name, std::string_view payload) {
  Sha256 sha;
  sha.update(std::string_view("kiln cache entry\0", 17));
  sha.update(name);
  sha.update(std::string_view("\0", 1));
  sha.update(payload);
  return sha.finish();
}

// Every missing component of `dir`, created 0700.
void create_private(const fs::path& dir, const char* who) {
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) return;
  fs::path prefix;
  for (const fs::path& part : dir) {
    prefix /= part;
    if (::mkdir(prefix.c_str(), 0700) == 0 || errno == EEXIST) continue;
    const int err = errno;
    if (::stat(prefix.c_str(), &st) == 0) continue;
    fail("{}: cannot create the cache directory {}: {}", who, prefix.string(), std::strerror(err));
  }
}

// kiln dlopens what it finds in the cache: a directory someone else can write is refused.
void check_private(const fs::path& dir, const char* who) {
  struct stat st;
  KILN_CHECK(::stat(dir.c_str(), &st) == 0, "{}: cannot use the cache directory {}: {}", who,
             dir.string(), std::strerror(errno));
  KILN_CHECK(S_ISDIR(st.st_mode), "{}: the cache path {} is not a directory", who, dir.string());
  KILN_CHECK(st.st_uid == ::geteuid(),
             "{}: refusing the cache directory {}: it is owned by uid {}, not by this user "
             "(uid {}), and kiln loads compiled code from it; set KILN_CACHE_DIR to a directory of "
             "your own",
             who, dir.string(), st.st_uid, ::geteuid());
  KILN_CHECK((st.st_mode & (S_IWGRP | S_IWOTH)) == 0,
             "{}: refusing the cache directory {}: it is writable by group or others "
             "(mode {:04o}), and kiln loads compiled code from it; run chmod go-w on it or set "
             "KILN_CACHE_DIR to a private directory",
             who, dir.string(), st.st_mode & 07777);
}

bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// So that a rename survives a crash (some file systems refuse: nothing more to do then).
void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

fs::path root() {
  if (std::string dir = env_or("KILN_CACHE_DIR", ""); !dir.empty()) return dir;
  // The XDG base directory rules: a relative XDG_CACHE_HOME is ignored.
  if (std::string xdg = env_or("XDG_CACHE_HOME", ""); !xdg.empty() && xdg.front() == '/')
    return fs::path(xdg) / "kiln";
  if (std::string home = env_or("HOME", ""); !home.empty())
    return fs::path(home) / ".cache" / "kiln";
  return {};
}

bool enabled() {
  if (env_or("KILN_CACHE", "on") == "off") return false;
  if (!root().empty()) return true;
  static std::once_flag said;
  std::call_once(said, [] {
    fmt::print(stderr,
               "kiln: warning: none of KILN_CACHE_DIR, XDG_CACHE_HOME and HOME is set, so "
               "compiled kernels are not cached on disk\n");
  });
  return false;
}

fs::path directory(const std::string& kind, const char* who) {
  const fs::path base = root();
  KILN_CHECK(!base.empty(), "{}: no cache directory: set KILN_CACHE_DIR", who);
  const fs::path dir = base / kind;
  create_private(dir, who);
  check_private(base, who);
  check_private(dir, who);
  return dir;
}

fs::path temp_root() { return env_or("TMPDIR", "/tmp"); }

ScratchDir::ScratchDir(const char* who) {
  std::string pattern = (temp_root() / "kiln-build-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) {
    const int err = errno;
    const std::string tmpdir = env_or("TMPDIR", "");
    fail("{}: cannot create a scratch directory in {}: {}", who,
         tmpdir.empty() ? std::string("/tmp (TMPDIR is not set)") : "TMPDIR=" + tmpdir,
         std::strerror(err));
  }
  path_ = pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& path, const std::string& bytes, const char* who) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  out.close();
  KILN_CHECK(out.good(), "{}: cannot write {}", who, path.string());
}

fs::path temp_path_for(const fs::path& dest) {
  static std::atomic<int64_t> counter{0};
  return dest.parent_path() / fmt::format("tmp-{}-{}-{}", dest.stem().string().substr(0, 16), getpid(), counter++);
}

void write_atomic(const fs::path& dest, const std::string& bytes, const char* who) {
  const fs::path temp = temp_path_for(dest);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  KILN_CHECK(fd >= 0, "{}: cannot create {}: {}", who, temp.string(), std::strerror(errno));
  bool ok = write_all(fd, bytes) && ::fsync(fd) == 0;
  int err = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && ::rename(temp.c_str(), dest.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(temp.c_str());
    fail("{}: cannot write the cache entry {}: {}", who, dest.string(), std::strerror(err));
  }
  sync_directory(dest.parent_path());
}

std::string seal(std::string_view name, std::string_view payload) {
  const std::array<uint8_t, 32> digest = entry_digest(name, payload);
  std::string out;
  out.reserve(payload.size() + kTrailerSize);
  out.append(payload);
  out.append(kMagic);
  out.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  return out;
}

std::optional<std::string> unseal(std::string_view name, std::string_view entry) {
  if (entry.size() < kTrailerSize) return std::nullopt;
  const std::string_view payload = entry.substr(0, entry.size() - kTrailerSize);
  const std::string_view trailer = entry.substr(payload.size());
  if (trailer.substr(0, kMagic.size()) != kMagic) return std::nullopt;
  const std::array<uint8_t, 32> digest = entry_digest(name, payload);
  const std::string_view expected(reinterpret_cast<const char*>(digest.data()), digest.size());
  if (trailer.substr(kMagic.size()) != expected) return std::nullopt;
  return std::string(payload);
}

void write_entry(const fs::path& path, std::string_view payload, const char* who) {
  write_atomic(path, seal(path.filename().string(), payload), who);
}

std::optional<std::string> read_entry(const fs::path& path, const char* who) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  std::optional<std::string> payload = unseal(path.filename().string(), read_file(path));
  if (!payload) discard_entry(path, kMismatch, who);
  return payload;
}

void discard_entry(const fs::path& path, const std::string& why, const char* who) {
  std::error_code ec;
  fs::remove(path, ec);
  // One write, so that lines of concurrent threads do not interleave.
  fmt::print(stderr, "kiln: warning: {}: discarded the cache entry {}: {}; it is rebuilt\n", who,
             path.string(), why);
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 sha;
  sha.update(bytes);
  std::string out;
  for (uint8_t b : sha.finish()) out += fmt::format("{:02x}", b);
  return out;
}

// FNV-1a over the text, twice with different offsets.
std::string hash_hex(const std::string& text) {
  uint64_t h[2] = {1469598103934665603ull, 0x9ae16a3b2f90404full};
  for (uint64_t& x : h)
    for (unsigned char c : text) {
      x ^= c;
      x *= 1099511628211ull;
    }
  return fmt::format("{:016x}{:016x}", h[0], h[1]);
}

std::string include_dir() { return env_or("KILN_INCLUDE_DIR", KILN_SOURCE_INCLUDE_DIR); }

namespace {

// The targets of the #include "..." lines of `text` (system includes <...> are not kiln's).
std::vector<std::string> quoted_includes(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t hash = line.find_first_not_of(" \t");
    if (hash == std::string::npos || line[hash] != '#') continue;
    const size_t directive = line.find_first_not_of(" \t", hash + 1);
    if (directive == std::string::npos || line.compare(directive, 7, "include") != 0) continue;
    const size_t open = line.find('"', directive + 7);
    const size_t close = open == std::string::npos ? open : line.find('"', open + 1);
    if (close != std::string::npos) out.push_back(line.substr(open + 1, close - open - 1));
  }
  return out;
}

std::mutex g_headers_mutex;
std::map<std::string, std::string> g_headers;  // path -> contents, read once per process

const std::string& header_contents(const fs::path& path, const char* who) {
  std::lock_guard lock(g_headers_mutex);
  auto it = g_headers.find(path.string());
  if (it == g_headers.end()) {
    KILN_CHECK(fs::exists(path), "{}: {} not found; set KILN_INCLUDE_DIR to kiln's include directory", who,
               path.string());
    it = g_headers.emplace(path.string(), read_file(path)).first;
  }
  return it->second;
}

}  // namespace

std::string header_identity(const std::string& source, const char* who) {
  const std::string dir = include_dir();
  std::string identity;
  std::set<std::string> seen;
  std::vector<std::string> pending = quoted_includes(source);
  while (!pending.empty()) {
    const std::string header = pending.back();
    pending.pop_back();
    if (!seen.insert(header).second) continue;
    const std::string& text = header_contents(fs::path(dir) / header, who);
    identity += header + "\n" + text;
    for (std::string& nested : quoted_includes(text)) pending.push_back(std::move(nested));
  }
  return identity;
}

}  // namespace kiln::disk_cache
