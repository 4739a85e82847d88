#include "cuda/cuda_emulator.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "compiler/codegen/render.h"
#include "compiler/codegen/run.h"
#include "core/error.h"

namespace kiln::testing {

using namespace kiln::compiler::codegen;

namespace {

// What CUDA gives a kernel, for the host compiler. The index variables are thread-local:
// each emulated thread of a reduction is a real thread; __shared__ arrays are statics,
// shared by the block's threads, and blocks run one after another.
constexpr const char* kPrelude = R"(#include <barrier>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct kiln_emu_dim3 { unsigned int x = 0, y = 0, z = 0; };
static thread_local kiln_emu_dim3 threadIdx, blockIdx;
static kiln_emu_dim3 blockDim, gridDim;
#define __global__
#define __device__
#define __launch_bounds__(n)
#define __shared__ static

static std::barrier<>* kiln_emu_block_barrier = nullptr;
static std::vector<std::unique_ptr<std::barrier<>>> kiln_emu_warp_barriers;
static unsigned long long kiln_emu_lane_value[1024];
static long long* kiln_emu_vector_groups = nullptr;  // counts the vector path's groups

inline void __syncthreads() { kiln_emu_block_barrier->arrive_and_wait(); }

// Every lane of the warp writes its value, then reads its partner's (its own past lane 31).
template <class T> T __shfl_down_sync(unsigned, T v, int delta) {
  static_assert(sizeof(T) <= sizeof(unsigned long long));
  const unsigned t = threadIdx.x, lane = t % 32;
  std::barrier<>& warp = *kiln_emu_warp_barriers[t / 32];
  std::memcpy(&kiln_emu_lane_value[t], &v, sizeof(T));
  warp.arrive_and_wait();
  T r = v;
  if (lane + static_cast<unsigned>(delta) < 32) std::memcpy(&r, &kiln_emu_lane_value[t + delta], sizeof(T));
  warp.arrive_and_wait();
  return r;
}

inline double __longlong_as_double(long long bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}
inline float __int_as_float(int bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

)";

}  // namespace

EmulatedKernel emulate_cuda(const Kernel& kernel) {
  const TargetSyntax& syntax = kCudaSyntax;
  std::vector<std::string> casts;
  for (size_t b = 0; b < kernel.buffers.size(); ++b) {
    const Buffer& buf = kernel.buffers[b];
    const std::string type = syntax.storage[static_cast<size_t>(buf.dtype)];
    casts.push_back(fmt::format("static_cast<{}{}*>(buffers[{}])", buf.output ? "" : "const ", type, b));
  }
  casts.push_back("a");
  const int count = std::max(1, arg_layout(kernel).count);
  const bool threads = kernel.num_reduced > 0;
  std::string launcher = fmt::format(R"(
extern "C" void kiln_emulate(void* const* buffers, const int64_t* args) {{
  KilnArgs a;
  std::memcpy(a.v, args, sizeof a.v);
  gridDim.x = static_cast<unsigned>(args[{0}]);
  blockDim.x = static_cast<unsigned>(args[{0} + 1]);
  kiln_emu_vector_groups = reinterpret_cast<long long*>(args[{0} + 2]);
  auto run_block = [&] {{ {1}({2}); }};
)",
                                     count, cuda_symbol(kernel), fmt::join(casts, ", "));
  if (!threads) {
    launcher += R"(  for (unsigned b = 0; b < gridDim.x; ++b)
    for (unsigned t = 0; t < blockDim.x; ++t) {
      blockIdx.x = b;
      threadIdx.x = t;
      run_block();
    }
}
)";
  } else {
    launcher += R"(  std::barrier<> block(blockDim.x);
  kiln_emu_block_barrier = &block;
  kiln_emu_warp_barriers.clear();
  for (unsigned w = 0; w < blockDim.x / 32; ++w) kiln_emu_warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
  std::vector<std::thread> team;
  for (unsigned t = 0; t < blockDim.x; ++t)
    team.emplace_back([&, t] {
      threadIdx.x = t;
      for (unsigned b = 0; b < gridDim.x; ++b) {
        blockIdx.x = b;
        run_block();
        block.arrive_and_wait();  // the next block may reuse the shared arrays
      }
    });
  for (std::thread& t : team) t.join();
}
)";
  }
  std::string kernel_source = render_cuda(kernel);
  // Counts the vector path's iterations (pointwise kernels of rank > 0 have one).
  const std::string group_start = "const long long linear = group * 4;";
  const size_t at = kernel_source.find(group_start);
  KILN_CHECK(threads || kernel.rank == 0 || at != std::string::npos,
             "emulate_cuda {}: the rendering has no vector path to count (\"{}\")", kernel.name, group_start);
  if (at != std::string::npos) kernel_source.insert(at + group_start.size(), " ++*kiln_emu_vector_groups;");
  const std::string source = kPrelude + kernel_source + launcher;
  return {&kernel, compile_cpp(source, "kiln_emulate")};
}

int64_t run_emulated(const EmulatedKernel& k, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                  const LaunchTuning& tuning) {
  const Kernel& kernel = *k.kernel;
  KernelCall call = kernel_call(kernel, inputs, outputs, /*split_long_runs=*/false);
  const CudaLaunch shape = cuda_launch_shape(kernel, call.args, tuning);
  if (shape.grid == 0) return 0;
  KILN_CHECK(kernel.num_reduced == 0 || shape.grid * shape.block <= 64 * 256,
             "run_emulated {}: {} blocks of {} threads is too many for the emulator's reductions", kernel.name,
             shape.grid, shape.block);
  call.args.resize(static_cast<size_t>(std::max(1, arg_layout(kernel).count)));
  call.args.push_back(shape.grid);
  call.args.push_back(shape.block);
  long long groups = 0;
  call.args.push_back(reinterpret_cast<int64_t>(&groups));
  k.compiled.function(call.buffers.data(), call.args.data());
  return groups;
}

}  // namespace kiln::testing
