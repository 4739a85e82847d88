#include "core/disk_cache.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
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

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

bool enabled() { return env_or("KILN_CACHE", "on") != "off"; }

fs::path root() {
  const std::string home = env_or("HOME", "");
  return env_or("KILN_CACHE_DIR", home.empty() ? std::string("/tmp/kiln-cache") : home + "/.cache/kiln");
}

fs::path directory(const std::string& kind, const char* who) {
  const fs::path dir = root() / kind;
  std::error_code ec;
  fs::create_directories(dir, ec);
  KILN_CHECK(!ec, "{}: cannot create the cache directory {}: {}", who, dir.string(), ec.message());
  return dir;
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
  write_file(temp, bytes, who);
  std::error_code ec;
  fs::rename(temp, dest, ec);
  if (ec) {
    fs::remove(temp, ec);
    fail("{}: cannot move a new cache entry to {}", who, dest.string());
  }
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
