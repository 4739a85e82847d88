#pragma once
// The CUDA runtime inside kiln (kernels/cuda/ and the compiler's CUDA target use it; users
// see core/cuda.h). Errors become kiln::Error naming what failed; a device is made current
// with DeviceGuard; work goes on the device's current stream; generated CUBINs are loaded
// through the runtime's library API (no libcuda at link time).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>

#include "core/cuda.h"
#include "core/error.h"
#include "core/registry.h"

namespace kiln::cuda {

// Throws kiln::Error "<what>: <CUDA's name and message of err>" unless err is cudaSuccess.
void check(cudaError_t err, const char* what);
#define KILN_CUDA_CHECK(expr, what) ::kiln::cuda::check((expr), (what))

// Throws unless CUDA is available and `device` is one of its devices.
void require_device(int device, const char* what);

// The device set_device chose for this process, or -1 where it was never called.
int process_device();

// Makes `device` current on this thread for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

inline cudaStream_t stream_of(int device) {
  return static_cast<cudaStream_t>(current_stream(device).handle);
}

// A __global__ function of a loaded CUBIN. Libraries are loaded once per image and never
// unloaded (kernels live as long as the process, like the C++ target's shared objects).
struct LoadedKernel {
  cudaKernel_t handle = nullptr;
  std::string name;
};
LoadedKernel load_kernel(const std::string& cubin, const std::string& name);

struct LaunchShape {
  int64_t grid = 1;
  int block = 1;
  int shared_bytes = 0;
};
// Launches on `device`'s current stream; `args` points at each parameter's value.
void launch(const LoadedKernel& kernel, const LaunchShape& shape, void** args, int device);

// Pinned host memory (pinned.cpp), as the copies and the allocator's reports see it. A copy
// from host memory [src, src + nbytes) queued on `stream` of `device` is noted: when the
// memory is pinned, its block is not handed out again before the copy has run.
void note_copy_from_host(const void* src, size_t nbytes, int device, cudaStream_t stream);
// Frees the cached free pinned blocks (empty_cache).
void release_pinned_cache();
// Bytes in pinned blocks, and of those, in cached free ones.
struct PinnedBytes {
  int64_t total = 0, cached = 0;
};
PinnedBytes pinned_bytes();

// While this thread captures a CUDA graph on `device` (its current stream is the capture
// stream): the stream the graph's replays will run on; nullptr otherwise.
cudaStream_t capture_replay_stream(int device);

// The host fallback (host_fallback.cpp) for a call a CUDA kernel does not cover: copies the
// inputs to the CPU, runs op's CPU kernel, copies the results into `out`, and lists the op
// in host_fallback_ops(). Correct and slow (a synchronization, copies both ways).
void run_on_host(const OpDef& op, std::span<const Tensor> in, std::span<const Tensor> out, const Attrs& attrs);

}  // namespace kiln::cuda
