// core/cuda.h in a build without the CUDA toolkit: nothing is available, and every call
// that needs a GPU says so. Builds with the toolkit use kernels/cuda/runtime.cpp instead.
#include "core/cuda.h"

#if !defined(KILN_HAVE_CUDA)

#include "core/error.h"

namespace kiln::cuda {
namespace {

[[noreturn]] void unavailable(const char* what) {
  fail("{}: CUDA is not available: this build of kiln has no CUDA backend", what);
}

}  // namespace

bool is_available() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "this build of kiln has no CUDA backend"; }
std::string DeviceProperties::arch() const { return "sm_" + std::to_string(major * 10 + minor); }
DeviceProperties device_properties(int) { unavailable("cuda::device_properties"); }
void synchronize(int) { unavailable("cuda::synchronize"); }
void set_device(int) { unavailable("cuda::set_device"); }
void Stream::synchronize() const { unavailable("cuda::Stream::synchronize"); }
Stream current_stream(int) { unavailable("cuda::current_stream"); }
Stream new_stream(int) { unavailable("cuda::new_stream"); }
StreamGuard::StreamGuard(Stream) { unavailable("cuda::StreamGuard"); }
StreamGuard::~StreamGuard() = default;
Event::Event(int) { unavailable("cuda::Event"); }
Event::~Event() = default;
void Event::record(Stream) { unavailable("cuda::Event::record"); }
void Event::wait(Stream) const { unavailable("cuda::Event::wait"); }
void Event::synchronize() const { unavailable("cuda::Event::synchronize"); }
float Event::elapsed_ms(const Event&) const { unavailable("cuda::Event::elapsed_ms"); }
AllocatorStats allocator_stats(int) { return {}; }
void reset_peak_allocator_stats(int) {}
std::string memory_summary(int) { return "CUDA is not available: this build of kiln has no CUDA backend\n"; }
void empty_cache() {}
void set_allow_tf32(bool) {}
bool allow_tf32() { return false; }
std::vector<std::string> host_fallback_ops() { return {}; }
void set_cudnn_benchmark(bool) {}
bool cudnn_benchmark() { return false; }
ThreadCudnnBenchmark::ThreadCudnnBenchmark(bool) : previous_(false) {}
ThreadCudnnBenchmark::~ThreadCudnnBenchmark() = default;
Tensor pin_memory(const Tensor&) { unavailable("cuda::pin_memory"); }
Tensor empty_pinned(const Shape&, DType) { unavailable("cuda::empty_pinned"); }
bool is_pinned(const Tensor&) { return false; }
MemPool::MemPool(int) { unavailable("cuda::MemPool"); }
MemPool::~MemPool() = default;
int64_t MemPool::reserved_bytes() const { return 0; }
CudaGraph::~CudaGraph() = default;
void CudaGraph::capture(MemPool&, const std::function<void()>&) { unavailable("cuda::CudaGraph::capture"); }
void CudaGraph::replay() const { unavailable("cuda::CudaGraph::replay"); }

}  // namespace kiln::cuda

#endif

#if defined(KILN_HAVE_CUDA) && !defined(KILN_HAVE_CUDNN)
// A CUDA build without cuDNN has no convolutions on the GPU, so nothing to benchmark.
namespace kiln::cuda {
void set_cudnn_benchmark(bool) {}
bool cudnn_benchmark() { return false; }
ThreadCudnnBenchmark::ThreadCudnnBenchmark(bool) : previous_(false) {}
ThreadCudnnBenchmark::~ThreadCudnnBenchmark() = default;
}  // namespace kiln::cuda
#endif
