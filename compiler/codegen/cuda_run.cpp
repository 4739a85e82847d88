#include "compiler/codegen/cuda_run.h"

#include "core/error.h"

#if defined(KILN_HAVE_CUDA)

#include <algorithm>
#include <map>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "compiler/codegen/cuda.h"
#include "compiler/codegen/cpp_run.h"
#include "kernels/cuda/nvrtc.h"
#include "kernels/cuda/runtime.h"

namespace kiln::compiler::codegen {

const std::string& cuda_arch(Device device) {
  static std::mutex mutex;
  static std::vector<std::string> archs;
  std::lock_guard lock(mutex);
  if (archs.empty())
    for (int d = 0; d < cuda::device_count(); ++d) archs.push_back(cuda::device_properties(d).arch());
  KILN_CHECK(device.is_cuda() && device.index >= 0 && device.index < static_cast<int>(archs.size()),
             "cuda kernels: device {} is not available{}", device,
             cuda::is_available() ? "" : ": " + cuda::unavailable_reason());
  return archs[static_cast<size_t>(device.index)];
}

std::vector<CudaFunction> load_cuda_kernels(const std::vector<const Kernel*>& kernels, Device device, int jobs) {
  const std::string& arch = cuda_arch(device);
  std::vector<std::pair<std::string, std::string>> sources;
  for (const Kernel* k : kernels) sources.emplace_back(render_cuda(*k), cuda_symbol(*k));
  const std::vector<cuda::CudaBinary> binaries = cuda::compile_cuda_batch(sources, {.arch = arch}, jobs);
  std::vector<CudaFunction> out;
  for (size_t i = 0; i < kernels.size(); ++i) {
    const cuda::LoadedKernel loaded = cuda::load_kernel(binaries[i].cubin, sources[i].second);
    out.push_back({loaded.handle, loaded.name, arch});
  }
  return out;
}

namespace {

// A one-element CPU tensor (an lr, a loss weight, the 2 of `x * 2`) on `device`: one device
// copy per device, dtype, shape and value, kept for the life of the process, so that the
// kernels reading it, and CUDA graphs that captured them, can run at any later time without
// a host-to-device copy (a capture cannot hold one). Past kMaxConstants values, each call
// copies anew (a capture then fails cleanly: kernels/cuda/runtime.cpp refuses the copy).
Tensor device_constant(const Tensor& t, Device device) {
  constexpr size_t kMaxConstants = 4096;
  // The copy is queued on the creating stream: a use from another stream waits for it once,
  // except inside a capture whose replays run on the creating stream (nothing runs at
  // capture; replays come after the copy in that stream's order).
  struct Entry {
    Tensor tensor;
    cuda::Stream made_on;
    bool done = false;
  };
  static std::mutex mutex;
  static auto* cache = new std::map<std::string, Entry>;  // never destroyed: outlives graphs
  std::string key = fmt::format("{}|{}|{}|{}|{}|", device.index, t.dtype(), shape_str(t.shape()),
                                shape_str(t.strides()), t.is_wrapped_number());
  key.append(static_cast<const char*>(t.data_ptr()), t.itemsize());
  const cuda::Stream stream = cuda::current_stream(device.index);
  std::lock_guard lock(mutex);
  auto it = cache->find(key);
  if (it != cache->end()) {
    Entry& e = it->second;
    if (!e.done && !(e.made_on == stream) &&
        cuda::capture_replay_stream(device.index) != static_cast<cudaStream_t>(e.made_on.handle)) {
      e.made_on.synchronize();
      e.done = true;
    }
    return e.tensor;
  }
  Tensor copy = t.to(device);
  copy.impl()->wrapped_number = t.is_wrapped_number();
  if (cache->size() < kMaxConstants) cache->emplace(std::move(key), Entry{copy, stream});
  return copy;
}

}  // namespace

void run_cuda_kernel(const CudaFunction& function, const Kernel& kernel, std::span<const Tensor> inputs,
                     std::span<const Tensor> outputs, const LaunchTuning& tuning) {
  KILN_CHECK(function.handle != nullptr, "run_cuda_kernel {}: the kernel is not loaded", kernel.name);
  KILN_CHECK(!outputs.empty(), "run_cuda_kernel {}: no outputs", kernel.name);
  const Device device = outputs[0].device();
  std::vector<Tensor> bound(inputs.begin(), inputs.end());
  for (Tensor& t : bound)
    if (t.defined() && t.device() != device) {
      KILN_CHECK(t.device().is_cpu() && t.numel() == 1, "run_cuda_kernel {}: input {} is not on {}", kernel.name,
                 t.meta_str(), device);
      t = device_constant(t, device);  // a CPU scalar (an lr, a loss weight, a wrapped number)
    }
  KernelCall call = kernel_call(kernel, bound, outputs, /*split_long_runs=*/false);
  if (call.args.empty()) call.args.push_back(0);  // the argument struct is never empty
  std::vector<void*> params;
  for (void*& b : call.buffers) params.push_back(&b);
  params.push_back(call.args.data());
  const CudaLaunch shape = cuda_launch_shape(kernel, call.args, tuning);
  if (shape.grid == 0) return;
  cuda::launch({static_cast<cudaKernel_t>(function.handle), function.name}, {shape.grid, shape.block, shape.shared_bytes},
               params.data(), device.index);
}

TunedLaunch tune_cuda_launch(const CudaFunction& function, const Kernel& kernel, std::span<const Tensor> inputs,
                             std::span<const Tensor> outputs) {
  KILN_CHECK(!outputs.empty(), "tune_cuda_launch {}: no outputs", kernel.name);
  KILN_CHECK(kernel.num_reduced == 0, "tune_cuda_launch {}: a reduction keeps its launch (it orders its sums)",
             kernel.name);
  const Device device = outputs[0].device();
  std::vector<Tensor> scratch;
  for (const Tensor& o : outputs) scratch.push_back(make_tensor(o.shape(), o.dtype(), o.device(), o.suggest_memory_format()));
  const int64_t sms = cuda::device_properties(device.index).multiprocessors;
  std::vector<LaunchTuning> candidates = {{}};  // the default first: it wins ties
  for (int block : {256, 128, 64})
    for (int64_t grid : {int64_t{65536}, sms * 32, sms * 8, sms * 2}) candidates.push_back({block, grid});
  const cuda::Stream stream = cuda::current_stream(device.index);
  cuda::Event start(device.index), stop(device.index);
  constexpr int kRuns = 5;
  TunedLaunch best;
  for (size_t c = 0; c < candidates.size(); ++c) {
    run_cuda_kernel(function, kernel, inputs, scratch, candidates[c]);  // a warm launch
    start.record(stream);
    for (int r = 0; r < kRuns; ++r) run_cuda_kernel(function, kernel, inputs, scratch, candidates[c]);
    stop.record(stream);
    stop.synchronize();
    const double us = 1000.0 * stop.elapsed_ms(start) / kRuns;
    if (c == 0) best = {candidates[0], us, us};
    else if (us < best.best_us * 0.97) best = {candidates[c], us, best.default_us};  // 3%: past the noise
  }
  return best;
}

}  // namespace kiln::compiler::codegen

#else

namespace kiln::compiler::codegen {

const std::string& cuda_arch(Device device) { fail("cuda kernels: device {} is not available: this build of kiln has no CUDA backend", device); }
std::vector<CudaFunction> load_cuda_kernels(const std::vector<const Kernel*>&, Device device, int) {
  fail("cuda kernels: device {} is not available: this build of kiln has no CUDA backend", device);
}
void run_cuda_kernel(const CudaFunction&, const Kernel& kernel, std::span<const Tensor>, std::span<const Tensor>,
                     const LaunchTuning&) {
  fail("run_cuda_kernel {}: this build of kiln has no CUDA backend", kernel.name);
}
TunedLaunch tune_cuda_launch(const CudaFunction&, const Kernel& kernel, std::span<const Tensor>, std::span<const Tensor>) {
  fail("tune_cuda_launch {}: this build of kiln has no CUDA backend", kernel.name);
}

}  // namespace kiln::compiler::codegen

#endif
