#include "cuda/cuda_emulator.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "compiler/codegen/render.h"
#include "compiler/codegen/cpp_run.h"
#include "core/error.h"

namespace kiln::testing {

using namespace kiln::compiler::codegen;

namespace {

// What CUDA gives a kernel, for the host compiler. The index variables are thread-local:
// each emulated thread of a reduction is a real thread; __shared__ arrays are statics,
// shared by the block's threads, and blocks run one after another.
constexpr const char* kPrelude = R"(#include <math.h>

#include <atomic>
#include <barrier>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

struct kiln_emu_dim3 { unsigned int x = 0, y = 0, z = 0; };
struct kiln_emu_size3 { unsigned int x = 1, y = 1, z = 1; };
static thread_local kiln_emu_dim3 threadIdx, blockIdx;
static kiln_emu_size3 blockDim, gridDim;
#define __global__
#define __device__
#define __launch_bounds__(n)
#define __shared__ static

static thread_local std::barrier<>* kiln_emu_block_barrier = nullptr;
static std::vector<std::unique_ptr<std::barrier<>>> kiln_emu_warp_barriers;
static unsigned long long kiln_emu_lane_value[1024];
static long long* kiln_emu_vector_groups = nullptr;  // counts the vector path's groups
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rsqrt(float x) { return 1.0f / sqrtf(x); }
template <class A, class B> auto min(A a, B b) { return b < a ? b : a; }
template <class A, class B> auto max(A a, B b) { return a < b ? b : a; }

// Atomics: the block's threads are real threads.
inline std::mutex kiln_emu_atomic_mutex;
template <class T> T atomicAdd(T* p, T v) {
  std::lock_guard lock(kiln_emu_atomic_mutex);
  const T old = *p;
  *p = old + v;
  return old;
}

inline void __syncthreads() { kiln_emu_block_barrier->arrive_and_wait(); }
// Blocks run one after another, so a block's writes are seen by the later ones anyway.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// Every lane of the warp writes its value, then reads lane `source`'s (its own where that
// is outside the warp). The whole warp must take part, as the kernels' full masks say.
template <class T> T kiln_emu_shuffle(T v, unsigned source) {
  static_assert(sizeof(T) <= sizeof(unsigned long long));
  const unsigned t = threadIdx.x, warp_start = t / 32 * 32;
  std::barrier<>& warp = *kiln_emu_warp_barriers[t / 32];
  std::memcpy(&kiln_emu_lane_value[t], &v, sizeof(T));
  warp.arrive_and_wait();
  T r = v;
  if (source < 32 && warp_start + source < blockDim.x) std::memcpy(&r, &kiln_emu_lane_value[warp_start + source], sizeof(T));
  warp.arrive_and_wait();
  return r;
}
template <class T> T __shfl_down_sync(unsigned, T v, int delta) { return kiln_emu_shuffle(v, threadIdx.x % 32 + delta); }
template <class T> T __shfl_sync(unsigned, T v, int lane, int width = 32) {
  return kiln_emu_shuffle(v, threadIdx.x % 32 / width * width + lane % width);
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

// Runs `function` (an extern "C" kernel) with the arguments of a cudaLaunchKernel call:
// each params[i] points at the i-th parameter's value.
constexpr const char* kInvoke = R"(
#include <cstdint>
#include <type_traits>
#include <utility>
template <class... A> void kiln_emu_invoke(void (*f)(A...), void* const* params) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<A>*>(params[I])...);
  }(std::index_sequence_for<A...>{});
}
)";

// launch = {grid, block, address of the vector-group counter}.
constexpr const char* kLauncher = R"(
extern "C" void kiln_emulate(void* const* params, const int64_t* launch) {{
  gridDim.x = static_cast<unsigned>(launch[0]);
  blockDim.x = static_cast<unsigned>(launch[1]);
  kiln_emu_vector_groups = reinterpret_cast<long long*>(launch[2]);
  auto run_block = [&] {{ kiln_emu_invoke({0}, params); }};
{1}}}
)";

// Last block and thread first: an order a GPU may take too, and one that a kernel relying
// on the obvious order (a += where an atomic is needed, a read of another thread's
// element) is more likely to get wrong.
constexpr const char* kOneThreadAtATime = R"(  for (unsigned b = gridDim.x; b-- > 0;)
    for (unsigned t = blockDim.x; t-- > 0;) {
      blockIdx.x = b;
      threadIdx.x = t;
      run_block();
    }
)";

// Each block has its own __syncthreads barrier, which a thread leaving the kernel drops
// out of (an exited GPU thread holds no barrier up); a second barrier, used only between
// blocks, keeps the next block off the shared arrays until this one is done.
constexpr const char* kBlockOfThreads = R"(  std::vector<std::unique_ptr<std::barrier<>>> per_block;
  for (unsigned b = 0; b < gridDim.x; ++b) per_block.push_back(std::make_unique<std::barrier<>>(blockDim.x));
  std::barrier<> between(blockDim.x);
  kiln_emu_warp_barriers.clear();
  for (unsigned w = 0; w < blockDim.x / 32; ++w) kiln_emu_warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
  std::vector<std::thread> team;
  for (unsigned t = 0; t < blockDim.x; ++t)
    team.emplace_back([&, t] {
      threadIdx.x = t;
      for (unsigned b = 0; b < gridDim.x; ++b) {
        blockIdx.x = b;
        kiln_emu_block_barrier = per_block[b].get();
        run_block();
        per_block[b]->arrive_and_drop();
        between.arrive_and_wait();
      }
    });
  for (std::thread& t : team) t.join();
)";

}  // namespace


EmulatedSource emulate_source(const std::string& source, const std::string& name) {
  EmulatedSource e;
  e.block_threads = source.find("__syncthreads") != std::string::npos || source.find("_sync(") != std::string::npos;
  const std::string launcher = fmt::format(fmt::runtime(kLauncher), name, e.block_threads ? kBlockOfThreads : kOneThreadAtATime);
  e.compiled = compile_cpp(kPrelude + source + kInvoke + launcher, "kiln_emulate");
  return e;
}

int64_t run_source(const EmulatedSource& e, long long grid, int block, void** params) {
  KILN_CHECK(!e.block_threads || grid * block <= 64 * 256,
             "run_source: {} blocks of {} threads is too many for the emulator's blocks of real threads", grid, block);
  KILN_CHECK(!e.block_threads || block % 32 == 0, "run_source: blocks of {} threads are not whole warps", block);
  long long groups = 0;
  const int64_t launch[] = {grid, block, reinterpret_cast<int64_t>(&groups)};
  e.compiled.function(params, launch);
  return groups;
}

EmulatedKernel emulate_cuda(const Kernel& kernel) {
  std::string source = render_cuda(kernel);
  // Counts the vector path's iterations (pointwise kernels of rank > 0 have one).
  const std::string group_start = "const long long linear = group * 4;";
  const size_t at = source.find(group_start);
  KILN_CHECK(kernel.num_reduced > 0 || kernel.rank == 0 || at != std::string::npos,
             "emulate_cuda {}: the rendering has no vector path to count (\"{}\")", kernel.name, group_start);
  if (at != std::string::npos) source.insert(at + group_start.size(), " ++*kiln_emu_vector_groups;");
  return {&kernel, emulate_source(source, cuda_symbol(kernel))};
}

int64_t run_emulated(const EmulatedKernel& k, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                     const LaunchTuning& tuning) {
  const Kernel& kernel = *k.kernel;
  KernelCall call = kernel_call(kernel, inputs, outputs, /*split_long_runs=*/false);
  if (call.args.empty()) call.args.push_back(0);  // as run_cuda_kernel: the struct is never empty
  const CudaLaunch shape = cuda_launch_shape(kernel, call.args, tuning);
  if (shape.grid == 0) return 0;
  std::vector<void*> params;
  for (void*& b : call.buffers) params.push_back(&b);
  params.push_back(call.args.data());
  return run_source(k.source, shape.grid, shape.block, params.data());
}

namespace {
std::atomic<int64_t> hand_launches{0};
void emulated_launch(const cuda::KernelSource& kernel, long long grid, int block, void** args) {
  run_source(emulate_source(kernel.source, kernel.name), grid, block, args);
  ++hand_launches;
}
}  // namespace

int64_t EmulatedHandKernels::launches() { return hand_launches.load(); }

EmulatedHandKernels::EmulatedHandKernels() : previous_(cuda::set_kernel_launch_hook(emulated_launch)) {}
EmulatedHandKernels::~EmulatedHandKernels() { cuda::set_kernel_launch_hook(previous_); }

}  // namespace kiln::testing
