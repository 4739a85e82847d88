// The NVRTC disk cache checks each file of an entry against its digest before use (core/
// disk_cache.h): a damaged, swapped or planted .cubin or .log is discarded with a warning
// and rebuilt. No GPU needed.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "compiler/compiler_testing.h"
#include "core/disk_cache.h"
#include "kernels/cuda/nvrtc.h"
#include "stderr_capture.h"
#include "testing.h"

using namespace kiln;
using Catch::Matchers::Contains;
using kiln::testing::TempCache;
namespace fs = std::filesystem;

namespace {

const char* kSource =
    R"(extern "C" __global__ void add_one(float* out, const float* in, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + 1.0f;
}
)";

using kiln::testing::StderrCapture;

void replace_file(const fs::path& path, const std::string& bytes) {
  fs::remove(path);
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE(
    "nvrtc cache: damaged, swapped or planted entry files are discarded with a warning and rebuilt",
    "[nvrtc][kernel_cache]") {
  TempCache cache;
  cuda::clear_cuda_memory_cache();
  const cuda::CudaBinary first = cuda::compile_cuda(kSource, "add_one");
  const fs::path cubin = cache.dir / "cuda" / (first.key + ".cubin"),
                 log = cache.dir / "cuda" / (first.key + ".log");
  const std::string whole_cubin = disk_cache::read_file(cubin),
                    whole_log = disk_cache::read_file(log);
  REQUIRE(disk_cache::unseal(cubin.filename().string(), whole_cubin) == first.cubin);
  REQUIRE(disk_cache::unseal(log.filename().string(), whole_log) == first.log);

  std::string flipped = whole_cubin;
  for (size_t i = whole_cubin.size() / 2; i < whole_cubin.size() / 2 + 16; ++i)
    flipped[i] = static_cast<char>(~flipped[i]);
  struct Damage {
    const char* what;
    fs::path file;
    std::string bytes;
  };
  const Damage damages[] = {
      {"cubin truncated", cubin, whole_cubin.substr(0, whole_cubin.size() / 2)},
      {"cubin with flipped bytes", cubin, flipped},
      {"cubin unsealed (a plain ELF file planted)", cubin, first.cubin},
      {"the report under the cubin's name", cubin, whole_log},
      {"report truncated", log, whole_log.substr(0, whole_log.size() - 1)},
      {"report edited", log, disk_cache::unseal(log.filename().string(), whole_log).value() + "x"},
  };
  for (const Damage& d : damages) {
    INFO(d.what);
    replace_file(d.file, d.bytes);
    cuda::clear_cuda_memory_cache();
    const int64_t before = cuda::nvrtc_invocations();
    StderrCapture err;
    const cuda::CudaBinary rebuilt = cuda::compile_cuda(kSource, "add_one");
    const std::string warnings = err.text();
    CHECK(cuda::nvrtc_invocations() == before + 1);
    CHECK_THAT(warnings, Contains("compile_cuda: discarded the cache entry " + d.file.string()) &&
                             Contains("digest"));
    CHECK(rebuilt.cubin == first.cubin);
    CHECK(rebuilt.registers == first.registers);
    CHECK(disk_cache::read_file(cubin) == whole_cubin);
    CHECK(disk_cache::unseal(log.filename().string(),
                             disk_cache::read_file(log)));  // (its timings vary)
  }

  // A sound entry is used without a word.
  cuda::clear_cuda_memory_cache();
  const int64_t before = cuda::nvrtc_invocations();
  StderrCapture err;
  CHECK(cuda::compile_cuda(kSource, "add_one").cubin == first.cubin);
  CHECK(cuda::nvrtc_invocations() == before);
  CHECK(err.text().empty());
}

TEST_CASE("nvrtc cache: a cache directory others can write is refused", "[nvrtc][kernel_cache]") {
  TempCache cache;
  cuda::clear_cuda_memory_cache();
  REQUIRE(chmod(cache.dir.c_str(), 0757) == 0);
  CHECK_THROWS_WITH(cuda::compile_cuda(kSource, "add_one"),
                    Contains("compile_cuda: refusing the cache directory " + cache.dir.string()) &&
                        Contains("(mode 0757)"));
  REQUIRE(chmod(cache.dir.c_str(), 0700) == 0);
}
