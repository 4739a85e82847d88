#pragma once
// The CUDA device runtime as users see it: availability, devices, streams, events, the
// caching allocator's statistics. Works in every build: without the CUDA backend, or on a
// machine without a GPU or driver, is_available() is false and the rest says why in a
// kiln::Error. The implementation lives in kernels/cuda/runtime.cpp (core/cuda.cpp when
// the build has no CUDA toolkit); CUDA types cross this header as opaque pointers, so
// users need no CUDA headers.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln::cuda {

// True when this build has the CUDA backend and at least one GPU answers.
bool is_available();
// GPUs visible to this process (0 when none, or without the backend).
int device_count();
// Why is_available() is false ("this build of kiln has no CUDA backend", "no CUDA driver:
// ...", "no CUDA device"); empty when it is true.
std::string unavailable_reason();

struct DeviceProperties {
  std::string name;           // "NVIDIA H200"
  int major = 0, minor = 0;   // compute capability
  int multiprocessors = 0;
  int64_t total_memory = 0;   // bytes
  std::string arch() const;   // "sm_90"
};
DeviceProperties device_properties(int device = 0);

// Waits for all work queued on the device (every stream).
void synchronize(int device = 0);
// Makes cuda:`device` current on the calling thread (as torch.cuda.set_device), and the
// device whose context pinned memory is allocated and freed in, on any thread. kiln's ops
// run on their tensors' device either way; what this changes is where CUDA calls outside an
// op go (cudaHostAlloc in a loader's workers, a stream's synchronize): to the thread's
// current device, cuda:0 unless set, which gives every process a context there. A process
// that works on cuda:n alone (a data-parallel rank) calls it first. kiln::Error naming the
// device where it is not available.
void set_device(int device);

// A stream of device `device`. kiln queues each device's work on its current stream,
// which is a non-blocking stream kiln creates per device (not the legacy default stream)
// until a StreamGuard swaps in another.
struct Stream {
  void* handle = nullptr;  // cudaStream_t
  int device = 0;
  void synchronize() const;
  bool operator==(const Stream&) const = default;
};
Stream current_stream(int device = 0);
// A new stream of `device`, owned by the process (never destroyed).
Stream new_stream(int device = 0);

// Makes `stream` the current stream of its device for the guard's lifetime.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// A CUDA event with timing.
class Event {
 public:
  explicit Event(int device = 0);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(Stream stream);
  void record() { record(current_stream(device_)); }
  // Makes the work queued on `stream` from now on wait for what this event's last record()
  // covers, without the host waiting (cudaStreamWaitEvent).
  void wait(Stream stream) const;
  void synchronize() const;
  // Milliseconds from `start` (recorded earlier) to this event; both must have completed.
  float elapsed_ms(const Event& start) const;

 private:
  void* handle_ = nullptr;  // cudaEvent_t
  int device_ = 0;
};

// Whether f32 matrix products (and, later, convolutions) may use TF32 tensor cores: about
// 10 bits of mantissa in the products, f32 accumulation. Off by default, as in PyTorch's
// torch.backends.cuda.matmul.allow_tf32.
void set_allow_tf32(bool allow);
bool allow_tf32();

// How convolutions choose their cuDNN algorithm: by cuDNN's heuristics (false, the
// default), or by timing every applicable algorithm once per shape and keeping the fastest
// (true, like torch.backends.cudnn.benchmark; the first call of each shape is slower).
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();
// The same for the calling thread only, while the guard lives (compile's max-autotune
// around its programs' runs): convolutions choose by timing when either is on.
class ThreadCudnnBenchmark {
 public:
  explicit ThreadCudnnBenchmark(bool on);
  ~ThreadCudnnBenchmark();
  ThreadCudnnBenchmark(const ThreadCudnnBenchmark&) = delete;
  ThreadCudnnBenchmark& operator=(const ThreadCudnnBenchmark&) = delete;

 private:
  bool previous_;
};

// The ops that ran on CUDA tensors through the host fallback since the process started
// (copied to the CPU, computed there, copied back: correct and slow), sorted; ops get real
// CUDA kernels one by one and leave the fallback.
std::vector<std::string> host_fallback_ops();

// The caching allocator's view of one device: bytes in live blocks (rounded to the
// allocator's size classes) and bytes reserved from CUDA (live blocks plus the cache).
// kiln::memory_stats(DeviceType::cuda) counts the tensors' requested bytes instead.
struct AllocatorStats {
  int64_t allocated = 0, peak_allocated = 0;
  int64_t reserved = 0, peak_reserved = 0;
  int64_t allocations = 0;   // blocks handed out
  int64_t cache_hits = 0;    // of which came from the cache
  int64_t cuda_mallocs = 0;  // cudaMalloc calls
  int64_t cuda_frees = 0;    // cudaFree calls (empty_cache, or an allocation retried)
  int64_t graph_pools = 0;   // bytes owned by MemPools (part of reserved)
};
AllocatorStats allocator_stats(int device = 0);
void reset_peak_allocator_stats(int device = 0);
// A table of the allocator's state, like torch.cuda.memory_summary().
std::string memory_summary(int device = 0);
// Returns the cached free blocks of every device to CUDA.
void empty_cache();

// Page-locked ("pinned") host memory: CPU tensors whose copies to a GPU run asynchronously
// and at the link's full speed (pageable memory is staged through a driver buffer, at a
// fraction of it). A pinned tensor is an ordinary CPU tensor otherwise. A copy from it
// returns once queued, as PyTorch's non_blocking copies do: writing the tensor before the
// copy has run (cuda::synchronize, or later work on the stream that waits for it) changes
// what is copied; freeing it is safe (its memory is reused only after its last copy).
// Copies from the GPU into it still wait, as every copy to the host does. Blocks are
// cached by size (up to 1 GiB) for reuse. kiln::Error where CUDA is not available.
Tensor pin_memory(const Tensor& t);  // a pinned, contiguous copy of t (a CPU tensor)
Tensor empty_pinned(const Shape& shape, DType dtype);
bool is_pinned(const Tensor& t);

// A private memory pool for captured CUDA graphs (compile's reduce-overhead mode). While a
// CudaGraph captures into it, every allocation on the capturing stream comes from the pool
// and a block freed during the capture goes back to it, not to the shared cache: a
// replayed graph writes every block it used at capture, so no block may leave the pool
// while a graph captured into it can still run. Several graphs may share a pool when
// their replays never overlap (one stream, one after another) and none keeps a value
// across replays in a block it freed. Destroying the pool returns its free blocks to the
// device's cache; blocks still live go there when they are freed.
class MemPool {
 public:
  explicit MemPool(int device = 0);
  ~MemPool();
  MemPool(const MemPool&) = delete;
  MemPool& operator=(const MemPool&) = delete;
  int device() const { return device_; }
  int64_t id() const { return id_; }
  // Bytes of the blocks the pool owns (live and free).
  int64_t reserved_bytes() const;

 private:
  int64_t id_ = 0;
  int device_ = 0;
};

// A CUDA graph: the work that `record` queues on the device (kiln's ops on the current
// stream), captured (not run) and replayed with the same kernels, arguments and buffers.
// The capture runs on a private stream that `record` sees as current, so other threads'
// work stays out; replays run on the device's current stream as it was at capture (a
// kiln::Error if it is another then). Capture fails with a kiln::Error when `record` does
// what a capture cannot hold: wait for the GPU, copy between the host and the device
// (kiln refuses it: a replay would read host memory that has changed); nothing `record`
// queued has run then.
class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  // Allocations on the stream during the capture come from `pool` (of the same device).
  void capture(MemPool& pool, const std::function<void()>& record);
  // Queues the captured work on the device's current stream.
  void replay() const;
  bool captured() const { return exec_ != nullptr; }
  int64_t num_nodes() const { return nodes_; }  // kernels, copies and memsets captured

 private:
  void* exec_ = nullptr;  // cudaGraphExec_t
  int device_ = 0;
  int64_t nodes_ = 0;
  void* stream_ = nullptr;  // the stream replays run on (the device's kiln stream at capture)
};

}  // namespace kiln::cuda
