// The kernel cache's disk entries and scratch directories (core/disk_cache.h,
// compiler/codegen/cpp_jit.h): entries are checked against their digest before dlopen, bad ones
// are discarded with a warning and rebuilt, cache directories are private, scratch
// directories are private and removed, and a rebuilt entry is the code that runs.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "compiler/codegen/cpp_jit.h"
#include "compiler_testing.h"
#include "core/disk_cache.h"
#include "core/error.h"
#include "stderr_capture.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler::codegen;
using Catch::Matchers::Contains;
using kiln::testing::TempCache;
namespace fs = std::filesystem;

namespace {

// Sets (or, with nullptr, unsets) an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> previous;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* p = std::getenv(n)) previous = p;
    if (value)
      setenv(n, value, 1);
    else
      unsetenv(n);
  }
  ~ScopedEnv() {
    if (previous)
      setenv(name.c_str(), previous->c_str(), 1);
    else
      unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

using kiln::testing::StderrCapture;

// A kernel that stores `value`; `tag` makes the source (and so the cache key) distinct.
std::string value_source(const std::string& tag, int value) {
  return "#include <cstdint>\n// " + tag +
         "\nextern \"C\" void k_value(void* const* b, const int64_t*) { " +
         "*static_cast<int64_t*>(b[0]) = " + std::to_string(value) + "; }\n";
}

int64_t call(const CompiledKernel& c) {
  int64_t value = 0;
  void* buffers[] = {&value};
  c.function(buffers, nullptr);
  return value;
}

// Replaces `path` by a new file holding `bytes`: what a later process would find, without
// touching the file this process has mapped.
void replace_file(const fs::path& path, const std::string& bytes) {
  fs::remove(path);
  std::ofstream(path, std::ios::binary) << bytes;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

mode_t mode_of(const fs::path& path) {
  struct stat st {};
  stat(path.c_str(), &st);
  return st.st_mode & 07777;
}

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

std::string host_compiler() { return disk_cache::env_or("KILN_CXX", "c++"); }

}  // namespace

TEST_CASE("kernel cache: SHA-256 and sealed entries", "[kernel_cache]") {
  CHECK(disk_cache::sha256_hex("") ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(disk_cache::sha256_hex("abc") ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(disk_cache::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(disk_cache::sha256_hex(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");

  const std::string payload = std::string(
                                  "\x7f"
                                  "ELF",
                                  4) +
                              std::string(300, '\0') + "code";
  const std::string entry = disk_cache::seal("0123.so", payload);
  CHECK(entry.size() == payload.size() + disk_cache::kTrailerSize);
  CHECK(disk_cache::unseal("0123.so", entry) == payload);
  CHECK(disk_cache::unseal("0123.so", disk_cache::seal("0123.so", "")) == std::string());
  // Tied to the name: another key's entry, or a .log under a .cubin's name, is refused.
  CHECK_FALSE(disk_cache::unseal("4567.so", entry));
  CHECK_FALSE(disk_cache::unseal("0123.cubin", entry));
  CHECK_FALSE(disk_cache::unseal("0123.so", entry.substr(0, entry.size() - 1)));
  CHECK_FALSE(disk_cache::unseal("0123.so", entry.substr(0, disk_cache::kTrailerSize - 1)));
  CHECK_FALSE(disk_cache::unseal("0123.so", payload));
  for (size_t at : {size_t{0}, payload.size() / 2, payload.size() + 3, entry.size() - 1}) {
    std::string flipped = entry;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x20);
    CHECK_FALSE(disk_cache::unseal("0123.so", flipped));
  }
}

TEST_CASE(
    "kernel cache: a truncated, flipped or emptied .so is discarded with a warning and rebuilt",
    "[kernel_cache][jit]") {
  TempCache cache;
  clear_kernel_memory_cache();
  const std::string source = value_source("damaged entries", 7);
  CompiledKernel previous = compile_cpp(source, "k_value");
  REQUIRE(call(previous) == 7);
  const fs::path path = previous.path;
  CHECK(path.parent_path() == cache.dir / "kernels");
  const std::string whole = disk_cache::read_file(path);

  struct Damage {
    const char* what;
    std::string bytes;
  };
  std::string flipped = whole;
  for (size_t i = whole.size() / 3; i < whole.size() / 3 + 64; ++i)
    flipped[i] = static_cast<char>(~flipped[i]);
  const Damage damages[] = {{"truncated to half", whole.substr(0, whole.size() / 2)},
                            {"one byte short", whole.substr(0, whole.size() - 1)},
                            {"64 bytes flipped", flipped},
                            {"empty", ""}};
  for (const Damage& d : damages) {
    INFO(d.what);
    replace_file(path, d.bytes);
    clear_kernel_memory_cache();
    const int64_t before = compiler_invocations();
    StderrCapture err;
    const CompiledKernel rebuilt = compile_cpp(source, "k_value");
    const std::string warnings = err.text();
    CHECK(compiler_invocations() == before + 1);
    CHECK_THAT(warnings,
               Contains("discarded the cache entry " + path.string()) && Contains("digest"));
    CHECK(count(warnings, "warning") == 1);
    CHECK(rebuilt.path == path.string());
    CHECK(call(rebuilt) == 7);
    // The rebuilt entry is the code that runs, not the object dlopen already had.
    CHECK(rebuilt.function != previous.function);
    CHECK(disk_cache::unseal(path.filename().string(), disk_cache::read_file(path)));
    previous = rebuilt;
  }

  // A sound entry is loaded without a word, and without the compiler.
  clear_kernel_memory_cache();
  const int64_t before = compiler_invocations();
  StderrCapture err;
  CHECK(call(compile_cpp(source, "k_value")) == 7);
  CHECK(compiler_invocations() == before);
  CHECK(err.text().empty());
}

TEST_CASE("kernel cache: a planted shared object is never loaded", "[kernel_cache][jit]") {
  TempCache cache;
  clear_kernel_memory_cache();
  const disk_cache::ScratchDir work("test");
  const fs::path marker = work.path() / "constructor-ran";
  // The same symbol as the real kernel, another value, and a constructor that leaves a mark.
  const fs::path planted_cpp = work.path() / "planted.cpp", planted_so = work.path() / "planted.so";
  std::ofstream(planted_cpp)
      << "#include <cstdint>\n#include <cstdio>\n"
      << "__attribute__((constructor)) static void planted() { std::FILE* f = std::fopen(\""
      << marker.string() << "\", \"w\"); if (f) std::fclose(f); }\n"
      << "extern \"C\" void k_value(void* const* b, const int64_t*) { "
      << "*static_cast<int64_t*>(b[0]) = 666; }\n";
  const std::string command = host_compiler() + " -shared -fPIC -o '" + planted_so.string() +
                              "' '" + planted_cpp.string() + "'";
  REQUIRE(std::system(command.c_str()) == 0);
  const std::string planted = disk_cache::read_file(planted_so);

  const std::string source = value_source("planted", 7);
  const fs::path path = kernel_cache_path(source);
  // Plain, sealed under another entry's name, and with a digest of its bytes alone.
  const std::string variants[] = {planted,
                                  disk_cache::seal("0123456789abcdef0123456789abcdef.so", planted),
                                  planted + "kiln-sha" + unhex(disk_cache::sha256_hex(planted))};
  for (const std::string& bytes : variants) {
    replace_file(path, bytes);
    clear_kernel_memory_cache();
    StderrCapture err;
    const CompiledKernel c = compile_cpp(source, "k_value");
    CHECK_THAT(err.text(), Contains("discarded the cache entry " + path.string()));
    CHECK_FALSE(fs::exists(marker));
    CHECK(call(c) == 7);
  }

  // Another kernel's sound entry, copied under this key, is refused too.
  const std::string other = value_source("planted, other", 8);
  const CompiledKernel o = compile_cpp(other, "k_value");
  replace_file(path, disk_cache::read_file(o.path));
  clear_kernel_memory_cache();
  StderrCapture err;
  CHECK(call(compile_cpp(source, "k_value")) == 7);
  CHECK_THAT(err.text(), Contains("discarded the cache entry " + path.string()));
}

TEST_CASE("kernel cache: cache directories are created private and others' are refused",
          "[kernel_cache][jit]") {
  TempCache cache;
  clear_kernel_memory_cache();
  const std::string source = value_source("private directories", 7);

  // Created 0700, every missing level; entries 0600.
  const fs::path nested = cache.dir / "new" / "root";
  {
    ScopedEnv env("KILN_CACHE_DIR", nested.c_str());
    const CompiledKernel c = compile_cpp(source, "k_value");
    CHECK(call(c) == 7);
    CHECK(mode_of(cache.dir / "new") == 0700);
    CHECK(mode_of(nested) == 0700);
    CHECK(mode_of(nested / "kernels") == 0700);
    CHECK(mode_of(c.path) == 0600);
  }

  // A root, or a kernels directory, that group or others may write.
  clear_kernel_memory_cache();
  REQUIRE(chmod(cache.dir.c_str(), 0777) == 0);
  CHECK_THROWS_AS(compile_cpp(source, "k_value"), Error);
  CHECK_THROWS_WITH(compile_cpp(source, "k_value"),
                    Contains("refusing the cache directory " + cache.dir.string()) &&
                        Contains("writable by group or others (mode 0777)"));
  CHECK_THROWS_WITH(kernel_cache_path(source), Contains("mode 0777"));
  REQUIRE(chmod(cache.dir.c_str(), 0700) == 0);
  fs::create_directories(cache.dir / "kernels");
  REQUIRE(chmod((cache.dir / "kernels").c_str(), 0770) == 0);
  CHECK_THROWS_WITH(compile_cpp(source, "k_value"),
                    Contains((cache.dir / "kernels").string()) && Contains("(mode 0770)"));
  REQUIRE(chmod((cache.dir / "kernels").c_str(), 0755) == 0);  // readable by others is fine
  CHECK(call(compile_cpp(source, "k_value")) == 7);

  // Another user's directory (only root can make one).
  if (geteuid() == 0) {
    clear_kernel_memory_cache();
    REQUIRE(chown((cache.dir / "kernels").c_str(), 65534, 65534) == 0);
    CHECK_THROWS_WITH(compile_cpp(source, "k_value"),
                      Contains("owned by uid 65534, not by this user"));
    REQUIRE(chown((cache.dir / "kernels").c_str(), 0, 0) == 0);
  }
}

TEST_CASE("kernel cache: no shared fallback without HOME", "[kernel_cache][jit]") {
  TempCache cache;
  clear_kernel_memory_cache();
  ScopedEnv no_dir("KILN_CACHE_DIR", nullptr), no_home("HOME", nullptr),
      no_xdg("XDG_CACHE_HOME", nullptr);
  CHECK(disk_cache::root().empty());
  CHECK_FALSE(disk_cache::enabled());
  const std::string source = value_source("no home", 7);
  CHECK(kernel_cache_path(source).empty());
  const CompiledKernel c = compile_cpp(source, "k_value");
  CHECK(c.path.empty());
  CHECK(call(c) == 7);
  {
    ScopedEnv relative("XDG_CACHE_HOME", "relative/cache");  // ignored, as the XDG rules say
    CHECK(disk_cache::root().empty());
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", cache.dir.c_str());
    CHECK(disk_cache::root() == cache.dir / "kiln");
    ScopedEnv home("HOME", "/home/nobody");
    CHECK(disk_cache::root() == cache.dir / "kiln");
  }
  ScopedEnv home("HOME", "/home/somebody");
  CHECK(disk_cache::root() == fs::path("/home/somebody/.cache/kiln"));
  ScopedEnv dir("KILN_CACHE_DIR", cache.dir.c_str());
  CHECK(disk_cache::root() == cache.dir);
}

TEST_CASE("kernel cache: the compiler works in a private scratch directory that is removed",
          "[kernel_cache][jit]") {
  TempCache cache;
  clear_kernel_memory_cache();
  const disk_cache::ScratchDir tmp("test"), tools("test");
  const fs::path record = tools.path() / "record.txt", wrapper = tools.path() / "cxx";
  // A compiler that notes the mode and owner of the directory it writes its output to.
  std::ofstream(wrapper) << "#!/bin/sh\nout=\nprev=\nfor a in \"$@\"; do\n"
                         << "  if [ \"$prev\" = -o ]; then out=\"$a\"; fi\n  prev=\"$a\"\ndone\n"
                         << "if [ -n \"$out\" ]; then d=$(dirname \"$out\"); echo \"$d $(stat -c "
                            "'%a %u' \"$d\")\" >> '"
                         << record.string() << "'; fi\nexec " << host_compiler() << " \"$@\"\n";
  REQUIRE(chmod(wrapper.c_str(), 0755) == 0);
  ScopedEnv cxx("KILN_CXX", wrapper.c_str()), tmpdir("TMPDIR", tmp.path().c_str());

  CHECK(call(compile_cpp(value_source("scratch", 7), "k_value")) == 7);
  std::ifstream in(record);
  std::string dir, mode, uid;
  REQUIRE(in >> dir >> mode >> uid);
  CHECK_THAT(dir, Contains((tmp.path() / "kiln-build-").string()));
  CHECK(mode == "700");
  CHECK(uid == std::to_string(geteuid()));
  CHECK(fs::is_empty(tmp.path()));
  {
    ScopedEnv off("KILN_CACHE", "off");
    CHECK(call(compile_cpp(value_source("scratch, cache off", 9), "k_value")) == 9);
    CHECK(fs::is_empty(tmp.path()));
  }

  // On failure too; the source the compiler rejected is kept, as a file of its own.
  CHECK_THROWS_WITH(compile_cpp("extern \"C\" void k_broken() { not C++ }\n", "k_broken"),
                    Contains("source kept at " + (tmp.path() / "kiln-failed-k_broken-").string()));
  int files = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(tmp.path())) {
    ++files;
    CHECK(e.is_regular_file());
    CHECK_THAT(e.path().filename().string(), Contains("kiln-failed-k_broken-"));
    CHECK(mode_of(e.path()) == 0600);
  }
  CHECK(files == 1);
  // And the cache directory holds entries only: no temporary or link left behind.
  for (const fs::directory_entry& e : fs::directory_iterator(cache.dir / "kernels"))
    CHECK_THAT(e.path().filename().string(), !Contains("tmp-"));
}

TEST_CASE("kernel cache: a TMPDIR that does not exist is a kiln::Error naming TMPDIR",
          "[kernel_cache][jit]") {
  TempCache cache;
  clear_kernel_memory_cache();
  const std::string missing = (cache.dir / "no-such-dir").string();
  ScopedEnv tmpdir("TMPDIR", missing.c_str());
  CHECK_THROWS_AS(compile_cpp(value_source("missing tmpdir", 7), "k_value"), Error);
  CHECK_THROWS_WITH(
      compile_cpp(value_source("missing tmpdir", 7), "k_value"),
      Contains("compile_cpp: cannot create a scratch directory in TMPDIR=" + missing) &&
          Contains("No such file or directory"));
  ScopedEnv off("KILN_CACHE", "off");
  CHECK_THROWS_WITH(compile_cpp(value_source("missing tmpdir, cache off", 7), "k_value"),
                    Contains("TMPDIR="));
}
