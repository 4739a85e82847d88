// kernels/cuda/nvrtc.h without a GPU: CUDA C++ -> sm_90 CUBIN, the ptxas report, the
// in-memory and on-disk caches, and what a compile error says.
#include <filesystem>
#include <fstream>

#include "compiler/compiler_testing.h"
#include "core/disk_cache.h"
#include "kernels/cuda/nvrtc.h"
#include "testing.h"

using namespace kiln;
using Catch::Matchers::Contains;
using kiln::testing::TempCache;

namespace {

// A small kernel over kiln's scalar functions and 16-bit floats, with static shared memory.
const char* kSource = R"(#include "core/half.h"
#include "kernels/scalar.h"

extern "C" __global__ void scale_rows(float* out, const kiln::Half* in, long long n) {
  __shared__ float tile[64];
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  tile[threadIdx.x % 64] = i < n ? kiln::scalar::exp(float(in[i])) : 0.0f;
  __syncthreads();
  if (i < n) out[i] = tile[(threadIdx.x + 1) % 64];
}
)";

bool is_elf(const std::string& image) { return image.size() > 64 && image.compare(0, 4, "\x7f" "ELF") == 0; }

}  // namespace

TEST_CASE("nvrtc: a kernel compiles to an sm_90 CUBIN and is cached in memory then on disk", "[nvrtc]") {
  TempCache cache;
  cuda::clear_cuda_memory_cache();
  const int64_t before = cuda::nvrtc_invocations();
  const cuda::CudaBinary first = cuda::compile_cuda(kSource, "scale_rows");
  CHECK(cuda::nvrtc_invocations() == before + 1);
  CHECK(is_elf(first.cubin));
  CHECK(first.arch == "sm_90");
  CHECK(first.name == "scale_rows");
  CHECK(first.key.size() == 32);
  CHECK_THAT(first.log, Contains("Compiling entry function 'scale_rows' for 'sm_90'"));
  CHECK(first.registers > 0);
  CHECK(first.spill_store_bytes == 0);
  CHECK(first.spill_load_bytes == 0);
  CHECK(first.shared_bytes == 64 * 4);

  // Memory.
  const cuda::CudaBinary again = cuda::compile_cuda(kSource, "scale_rows");
  CHECK(cuda::nvrtc_invocations() == before + 1);
  CHECK(again.cubin == first.cubin);

  // Disk, with the report kept beside the CUBIN.
  const std::filesystem::path entry = cache.dir / "cuda" / (first.key + ".cubin");
  REQUIRE(std::filesystem::exists(entry));
  cuda::clear_cuda_memory_cache();
  const cuda::CudaBinary from_disk = cuda::compile_cuda(kSource, "scale_rows");
  CHECK(cuda::nvrtc_invocations() == before + 1);
  CHECK(from_disk.cubin == first.cubin);
  CHECK(from_disk.registers == first.registers);
  CHECK(from_disk.shared_bytes == first.shared_bytes);

  // Another arch or other options are another entry.
  const cuda::CudaBinary other = cuda::compile_cuda(kSource, "scale_rows", {.arch = "sm_80"});
  CHECK(other.key != first.key);
  CHECK_THAT(other.log, Contains("'sm_80'"));
  CHECK(cuda::nvrtc_invocations() == before + 2);

  // A truncated entry, then one that is not an ELF file at all, are rebuilt.
  for (const std::string& damage : {first.cubin.substr(0, first.cubin.size() / 2), std::string("not a cubin")}) {
    std::ofstream(entry, std::ios::binary | std::ios::trunc) << damage;
    cuda::clear_cuda_memory_cache();
    const int64_t n = cuda::nvrtc_invocations();
    const cuda::CudaBinary rebuilt = cuda::compile_cuda(kSource, "scale_rows");
    CHECK(cuda::nvrtc_invocations() == n + 1);
    CHECK(rebuilt.cubin == first.cubin);
    CHECK(std::filesystem::file_size(entry) == first.cubin.size() + disk_cache::kTrailerSize);
  }
}

TEST_CASE("nvrtc: KILN_CACHE=off compiles without touching the disk", "[nvrtc]") {
  TempCache cache;
  setenv("KILN_CACHE", "off", 1);
  cuda::clear_cuda_memory_cache();
  const int64_t before = cuda::nvrtc_invocations();
  const std::string source = std::string(kSource) + "// off\n";
  const std::vector<cuda::CudaBinary> b = cuda::compile_cuda_batch({{source, "scale_rows"}, {source, "scale_rows"}});
  CHECK(cuda::nvrtc_invocations() == before + 1);  // the repeated pair compiles once
  REQUIRE(b.size() == 2);
  CHECK(b[0].cubin == b[1].cubin);
  CHECK(!std::filesystem::exists(cache.dir / "cuda"));
}

TEST_CASE("nvrtc: a syntax error is a kiln::Error with the log and the numbered source", "[nvrtc]") {
  TempCache cache;
  const std::string source = "extern \"C\" __global__ void broken(float* out) {\n  out[0] = 1.0f +;\n}\n";
  try {
    cuda::compile_cuda(source, "broken");
    FAIL("compile_cuda accepted a syntax error");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Contains("compile_cuda: NVRTC failed on kernel broken"));
    CHECK_THAT(what, Contains("broken.cu(2): error"));  // the program log
    CHECK_THAT(what, Contains("    2    out[0] = 1.0f +;"));  // the numbered source
  }
}

TEST_CASE("nvrtc: the ptxas report is parsed per function", "[nvrtc]") {
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'k_sum' for 'sm_90'\n"
      "ptxas info    : Function properties for k_sum\n"
      "ptxas         .     24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 40 registers, used 1 barriers, 24 bytes cumulative stack size, 64 bytes smem\n"
      "ptxas info    : Function properties for helper\n"
      "ptxas         .     0 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n";
  cuda::CudaBinary b{.name = "k_sum"};
  cuda::parse_ptxas_report(log, b);
  CHECK(b.registers == 40);
  CHECK(b.stack_bytes == 24);
  CHECK(b.shared_bytes == 64);
  CHECK(b.spill_store_bytes == 12);
  CHECK(b.spill_load_bytes == 16);
}
