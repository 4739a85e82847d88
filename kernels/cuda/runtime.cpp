// The CUDA device runtime: availability, devices, streams, events, the caching allocator
// (with the private pools of CUDA graphs), copies between the host and devices, CUDA graph
// capture and replay, and loading and launching generated kernels. Pinned host memory is
// pinned.cpp.
#include "kernels/cuda/runtime.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "core/storage.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxDevices = 64;

struct Availability {
  int count = 0;
  std::string reason;  // empty when count > 0
};

// Asked once: cudart opens the driver on its first call and answers
// cudaErrorInsufficientDriver (or cudaErrorNoDevice) where there is none.
const Availability& availability() {
  static const Availability a = [] {
    Availability r;
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error so later calls report their own
      r.reason = err == cudaErrorNoDevice
                     ? std::string("no CUDA device")
                     : fmt::format("no CUDA driver ({}: {})", cudaGetErrorName(err), cudaGetErrorString(err));
      return r;
    }
    r.count = std::min(n, kMaxDevices);
    if (r.count == 0) r.reason = "no CUDA device";
    return r;
  }();
  return a;
}

}  // namespace

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  fail("{}: CUDA error {}: {}", what, cudaGetErrorName(err), cudaGetErrorString(err));
}

bool is_available() { return availability().count > 0; }
int device_count() { return availability().count; }
std::string unavailable_reason() { return availability().reason; }

void require_device(int device, const char* what) {
  const Availability& a = availability();
  KILN_CHECK(a.count > 0, "{}: cuda:{} is not available: {}", what, device, a.reason);
  KILN_CHECK(device >= 0 && device < a.count, "{}: cuda:{} is not available: this machine has {} CUDA device{}",
             what, device, a.count, a.count == 1 ? "" : "s");
}

std::string DeviceProperties::arch() const { return fmt::format("sm_{}{}", major, minor); }

DeviceProperties device_properties(int device) {
  require_device(device, "cuda::device_properties");
  cudaDeviceProp p{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&p, device), "cuda::device_properties");
  return {p.name, p.major, p.minor, p.multiProcessorCount, static_cast<int64_t>(p.totalGlobalMem)};
}

DeviceGuard::DeviceGuard(int device) {
  KILN_CUDA_CHECK(cudaGetDevice(&previous_), "cuda::DeviceGuard");
  if (previous_ != device) KILN_CUDA_CHECK(cudaSetDevice(device), "cuda::DeviceGuard");
}
DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

namespace {
std::atomic<int> g_process_device{-1};
}  // namespace

void set_device(int device) {
  require_device(device, "cuda::set_device");
  KILN_CUDA_CHECK(cudaSetDevice(device), "cuda::set_device");
  g_process_device.store(device);
}

int process_device() { return g_process_device.load(); }

void synchronize(int device) {
  require_device(device, "cuda::synchronize");
  DeviceGuard guard(device);
  KILN_CUDA_CHECK(cudaDeviceSynchronize(), "cuda::synchronize");
}

// ---- streams ----

namespace {

// One stream per device, non-blocking (it never waits on the legacy default stream that
// other libraries may use, and it can be captured into a CUDA graph), created on first use.
class StreamPerDevice {
 public:
  cudaStream_t get(int device, const char* what) {
    std::lock_guard lock(mutex_);
    cudaStream_t& s = streams_[static_cast<size_t>(device)];
    if (!s) {
      DeviceGuard guard(device);
      KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), what);
    }
    return s;
  }

 private:
  std::mutex mutex_;
  std::array<cudaStream_t, kMaxDevices> streams_{};
};

// Each device's kiln stream, where its work goes unless a StreamGuard says otherwise.
cudaStream_t device_stream(int device) {
  static StreamPerDevice streams;
  return streams.get(device, "cuda::current_stream");
}

thread_local std::array<cudaStream_t, kMaxDevices> t_current{};

}  // namespace

Stream current_stream(int device) {
  require_device(device, "cuda::current_stream");
  cudaStream_t s = t_current[static_cast<size_t>(device)];
  return {s ? s : device_stream(device), device};
}

Stream new_stream(int device) {
  require_device(device, "cuda::new_stream");
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cuda::new_stream");
  return {s, device};
}

void Stream::synchronize() const {
  KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle)), "cuda::Stream::synchronize");
}

StreamGuard::StreamGuard(Stream stream) : previous_(current_stream(stream.device)) {
  t_current[static_cast<size_t>(stream.device)] = static_cast<cudaStream_t>(stream.handle);
}
StreamGuard::~StreamGuard() {
  t_current[static_cast<size_t>(previous_.device)] = static_cast<cudaStream_t>(previous_.handle);
}

// ---- events ----

Event::Event(int device) : device_(device) {
  require_device(device, "cuda::Event");
  DeviceGuard guard(device);
  cudaEvent_t e = nullptr;
  KILN_CUDA_CHECK(cudaEventCreate(&e), "cuda::Event");
  handle_ = e;
}
Event::~Event() {
  if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}
void Event::record(Stream stream) {
  KILN_CHECK(stream.device == device_, "cuda::Event::record: the event is on cuda:{}, the stream on cuda:{}",
             device_, stream.device);
  KILN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(stream.handle)),
                  "cuda::Event::record");
}
void Event::wait(Stream stream) const {
  KILN_CHECK(stream.device == device_, "cuda::Event::wait: the event is on cuda:{}, the stream on cuda:{}", device_,
             stream.device);
  KILN_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle), static_cast<cudaEvent_t>(handle_), 0),
                  "cuda::Event::wait");
}
void Event::synchronize() const {
  KILN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)), "cuda::Event::synchronize");
}
float Event::elapsed_ms(const Event& start) const {
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_),
                                       static_cast<cudaEvent_t>(handle_)),
                  "cuda::Event::elapsed_ms");
  return ms;
}

// ---- the caching allocator ----
//
// Each block is one cudaMalloc, rounded up to a size class; a freed block goes to its
// device's cache, keyed by (stream, size class), and the next request of that class on that
// stream takes it. Reuse stays on the block's stream, whose order makes it safe without
// synchronizing: the new user's kernels queue after the old user's. A training step asks for
// the same sizes every step, so after the first step it allocates from the cache alone.
// When cudaMalloc fails, the device's cache is freed and the allocation retried once.

namespace {

constexpr size_t kSmall = size_t{1} << 20;   // below: 512-byte classes
constexpr size_t kMedium = size_t{16} << 20;  // below: 512 KiB classes; above: 2 MiB classes

size_t size_class(size_t nbytes) {
  const size_t step = nbytes < kSmall ? 512 : nbytes < kMedium ? (size_t{512} << 10) : (size_t{2} << 20);
  const size_t r = (nbytes + step - 1) / step * step;
  return std::max(r, step);
}

struct Block {
  size_t size = 0;  // its size class
  cudaStream_t stream = nullptr;
  int64_t pool = 0;  // the MemPool that owns it (0: the shared cache)
};

// A MemPool's blocks: the free ones by size class, and the bytes it owns.
struct PoolBlocks {
  std::map<size_t, std::vector<void*>> free_blocks;
  int64_t bytes = 0;
  cudaStream_t stream = nullptr;  // the stream its graphs were captured on (set by the first)
};

struct DeviceCache {
  std::unordered_map<void*, Block> live;
  std::map<std::pair<cudaStream_t, size_t>, std::vector<void*>> free_blocks;
  std::unordered_map<int64_t, PoolBlocks> pools;
  // While a CudaGraph captures: the private stream it captures (only the capturing thread
  // has it as its current stream), the stream its replays will run on (the device's kiln
  // stream: pool blocks are ordered on it), and the pool its allocations use.
  cudaStream_t capture_stream = nullptr, replay_stream = nullptr;
  int64_t capture_pool = 0;
  AllocatorStats stats;
};

std::mutex g_alloc_mutex;
std::array<DeviceCache, kMaxDevices>& caches() {
  static auto* c = new std::array<DeviceCache, kMaxDevices>;  // outlives every tensor
  return *c;
}

void note_allocated(AllocatorStats& s, int64_t bytes) {
  s.allocated += bytes;
  s.peak_allocated = std::max(s.peak_allocated, s.allocated);
}

// Frees the cached blocks of one device (caller holds g_alloc_mutex).
void release_cached(int device) {
  DeviceCache& c = caches()[static_cast<size_t>(device)];
  if (c.free_blocks.empty()) return;
  DeviceGuard guard(device);
  for (auto& [key, blocks] : c.free_blocks)
    for (void* p : blocks) {
      cudaFree(p);
      c.stats.reserved -= static_cast<int64_t>(key.second);
      ++c.stats.cuda_frees;
    }
  c.free_blocks.clear();
}

// Pops a block from `blocks` (nullptr when empty).
void* pop(std::vector<void*>* blocks) {
  if (!blocks || blocks->empty()) return nullptr;
  void* p = blocks->back();
  blocks->pop_back();
  return p;
}

void* cuda_allocate(size_t nbytes, int device) {
  require_device(device, "allocate");
  const size_t size = size_class(nbytes);
  const cudaStream_t stream = stream_of(device);
  std::lock_guard lock(g_alloc_mutex);
  DeviceCache& c = caches()[static_cast<size_t>(device)];
  ++c.stats.allocations;
  // During a capture the capturing stream allocates from the graph's pool: its own free
  // blocks first, then blocks the shared cache holds for the replay stream (which the pool
  // then owns). Its blocks belong to the replay stream, where the graph will use them.
  const bool capturing = c.capture_pool != 0 && stream == c.capture_stream;
  PoolBlocks* pool = capturing ? &c.pools.at(c.capture_pool) : nullptr;
  const cudaStream_t owner = capturing ? c.replay_stream : stream;
  auto take = [&](void* p, bool from_pool) {
    c.live[p] = {size, owner, capturing ? c.capture_pool : 0};
    if (pool && !from_pool) pool->bytes += static_cast<int64_t>(size);
    ++c.stats.cache_hits;
    note_allocated(c.stats, static_cast<int64_t>(size));
    return p;
  };
  if (pool) {
    auto it = pool->free_blocks.find(size);
    if (void* p = pop(it == pool->free_blocks.end() ? nullptr : &it->second)) return take(p, true);
  }
  auto it = c.free_blocks.find({owner, size});
  if (void* p = pop(it == c.free_blocks.end() ? nullptr : &it->second)) return take(p, false);
  DeviceGuard guard(device);
  void* p = nullptr;
  cudaError_t err = cudaSuccess;
  if (capturing) {
    // cudaMalloc is not a stream operation, so a capture forbids it by default; the pool
    // keeps the block for as long as the graph can run, which makes it safe here.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    err = cudaMalloc(&p, size);
    cudaThreadExchangeStreamCaptureMode(&mode);
  } else {
    err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {  // (no cudaFree during a capture)
      cudaGetLastError();
      release_cached(device);
      err = cudaMalloc(&p, size);
    }
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    fail("allocate: CUDA out of memory allocating {} bytes on cuda:{} ({}: {}); kiln holds {} MiB in tensors "
         "and {} MiB reserved; the device has {} MiB free of {} MiB",
         nbytes, device, cudaGetErrorName(err), cudaGetErrorString(err), c.stats.allocated >> 20,
         c.stats.reserved >> 20, free_bytes >> 20, total_bytes >> 20);
  }
  ++c.stats.cuda_mallocs;
  c.stats.reserved += static_cast<int64_t>(size);
  c.stats.peak_reserved = std::max(c.stats.peak_reserved, c.stats.reserved);
  if (pool) pool->bytes += static_cast<int64_t>(size);
  c.live[p] = {size, owner, capturing ? c.capture_pool : 0};
  note_allocated(c.stats, static_cast<int64_t>(size));
  return p;
}

void cuda_release(void* p, size_t, int device) {
  std::lock_guard lock(g_alloc_mutex);
  DeviceCache& c = caches()[static_cast<size_t>(device)];
  auto it = c.live.find(p);
  if (it == c.live.end()) return;  // not ours: nothing sane to do in a deleter
  const Block b = it->second;
  c.live.erase(it);
  c.stats.allocated -= static_cast<int64_t>(b.size);
  // A pool's block stays in its pool while the pool lives (a graph may write it again).
  auto pool = b.pool ? c.pools.find(b.pool) : c.pools.end();
  if (pool != c.pools.end())
    pool->second.free_blocks[b.size].push_back(p);
  else
    c.free_blocks[{b.stream, b.size}].push_back(p);
}

// Copies between the host and a device, or between devices, on the device's current
// stream. A copy to the host waits for it; a copy from pageable host memory returns once
// CUDA has staged the source, so the caller may free it.
void cuda_copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  const int device = dst_device.is_cuda() ? dst_device.index : src_device.index;
  require_device(device, "to_device");
  if (src_device.is_cuda()) require_device(src_device.index, "to_device");
  DeviceGuard guard(device);
  const cudaStream_t stream = stream_of(device);
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    // The source's stream must be done writing before the peer copy reads it.
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_of(src_device.index)), "to_device");
    KILN_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, stream), "to_device");
    return;
  }
  if (dst_device.is_cpu() || src_device.is_cpu()) {
    // A capture would record the copy with the host address, and every replay would read
    // (or write) whatever that host memory holds by then: refuse, so the capture fails.
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &status), "to_device");
    KILN_CHECK(status == cudaStreamCaptureStatusNone,
               "to_device: a copy between the host and cuda:{} inside a CUDA graph capture (a graph cannot hold "
               "it: its replays would read host memory that has changed)",
               device);
  }
  const cudaMemcpyKind kind = dst_device.is_cpu()   ? cudaMemcpyDeviceToHost
                              : src_device.is_cpu() ? cudaMemcpyHostToDevice
                                                    : cudaMemcpyDeviceToDevice;
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, stream), "to_device");
  if (dst_device.is_cpu()) {
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream), "to_device");
    return;
  }
  // From pinned memory the copy is still running: noted, so the block is not reused before
  // it has been read. (Pageable memory was staged before the return.)
  if (src_device.is_cpu()) note_copy_from_host(src, nbytes, device, stream);
}

struct Registrar {
  Registrar() {
    set_device_allocator(DeviceType::cuda, {cuda_allocate, cuda_release});
    set_copy_bytes(DeviceType::cuda, cuda_copy_bytes);
  }
} registrar;

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

AllocatorStats allocator_stats(int device) {
  KILN_CHECK(device >= 0 && device < kMaxDevices, "cuda::allocator_stats: no device cuda:{}", device);
  std::lock_guard lock(g_alloc_mutex);
  const DeviceCache& c = caches()[static_cast<size_t>(device)];
  AllocatorStats s = c.stats;
  for (const auto& [id, pool] : c.pools) s.graph_pools += pool.bytes;
  return s;
}

void reset_peak_allocator_stats(int device) {
  KILN_CHECK(device >= 0 && device < kMaxDevices, "cuda::reset_peak_allocator_stats: no device cuda:{}", device);
  std::lock_guard lock(g_alloc_mutex);
  AllocatorStats& s = caches()[static_cast<size_t>(device)].stats;
  s.peak_allocated = s.allocated;
  s.peak_reserved = s.reserved;
}

std::string memory_summary(int device) {
  if (!is_available()) return fmt::format("CUDA is not available: {}\n", unavailable_reason());
  require_device(device, "cuda::memory_summary");
  size_t cached_blocks = 0;
  AllocatorStats s;
  size_t live_blocks = 0;
  {
    std::lock_guard lock(g_alloc_mutex);
    const DeviceCache& c = caches()[static_cast<size_t>(device)];
    s = c.stats;
    for (const auto& [id, pool] : c.pools) s.graph_pools += pool.bytes;
    live_blocks = c.live.size();
    for (const auto& [key, blocks] : c.free_blocks) cached_blocks += blocks.size();
  }
  const MemoryStats tensors = memory_stats(DeviceType::cuda);
  std::string out = fmt::format("kiln CUDA memory summary, cuda:{} ({})\n", device, device_properties(device).name);
  out += fmt::format("  {:<28}{:>14}{:>14}\n", "", "now", "peak");
  out += fmt::format("  {:<28}{:>14}{:>14}\n", "tensors (requested bytes)", mib(tensors.allocated), mib(tensors.peak));
  out += fmt::format("  {:<28}{:>14}{:>14}\n", "allocated (size classes)", mib(s.allocated), mib(s.peak_allocated));
  out += fmt::format("  {:<28}{:>14}{:>14}\n", "reserved from CUDA", mib(s.reserved), mib(s.peak_reserved));
  out += fmt::format("  {:<28}{:>14}\n", "cached (free) bytes", mib(s.reserved - s.allocated));
  out += fmt::format("  blocks: {} live, {} cached; {} allocations, {} from the cache; {} cudaMalloc, {} cudaFree\n",
                     live_blocks, cached_blocks, s.allocations, s.cache_hits, s.cuda_mallocs, s.cuda_frees);
  if (s.graph_pools > 0) out += fmt::format("  CUDA graph pools: {} of the reserved bytes\n", mib(s.graph_pools));
  if (const PinnedBytes pinned = pinned_bytes(); pinned.total > 0)
    out += fmt::format("  pinned host memory: {} ({} cached for reuse)\n", mib(pinned.total), mib(pinned.cached));
  return out;
}

void empty_cache() {
  if (!is_available()) return;
  release_pinned_cache();
  std::lock_guard lock(g_alloc_mutex);
  for (int d = 0; d < device_count(); ++d) {
    // Blocks may still be read by queued kernels: finish them before freeing.
    DeviceGuard guard(d);
    cudaDeviceSynchronize();
    release_cached(d);
  }
}

// ---- CUDA graphs and their pools ----

cudaStream_t capture_replay_stream(int device) {
  const cudaStream_t current = stream_of(device);
  std::lock_guard lock(g_alloc_mutex);
  const DeviceCache& c = caches()[static_cast<size_t>(device)];
  return c.capture_pool != 0 && c.capture_stream == current ? c.replay_stream : nullptr;
}

MemPool::MemPool(int device) : device_(device) {
  require_device(device, "cuda::MemPool");
  static std::atomic<int64_t> next{1};
  id_ = next++;
  std::lock_guard lock(g_alloc_mutex);
  caches()[static_cast<size_t>(device)].pools[id_];
}

MemPool::~MemPool() {
  std::lock_guard lock(g_alloc_mutex);
  DeviceCache& c = caches()[static_cast<size_t>(device_)];
  auto it = c.pools.find(id_);
  if (it == c.pools.end()) return;
  // Free blocks go to the shared cache on the stream the pool's graphs ran on, where stream
  // order keeps their next user behind the last replay; live ones follow when freed.
  for (auto& [size, blocks] : it->second.free_blocks)
    for (void* p : blocks) c.free_blocks[{it->second.stream, size}].push_back(p);
  c.pools.erase(it);
}

int64_t MemPool::reserved_bytes() const {
  std::lock_guard lock(g_alloc_mutex);
  const DeviceCache& c = caches()[static_cast<size_t>(device_)];
  auto it = c.pools.find(id_);
  return it == c.pools.end() ? 0 : it->second.bytes;
}

CudaGraph::~CudaGraph() {
  if (!exec_) return;
  // Safe with a replay in flight: CUDA frees the executable graph when it completes. Errors
  // are ignored (at process exit the runtime may be gone).
  DeviceGuard guard(device_);
  cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  cudaGetLastError();
}

namespace {

// The private stream each device's captures run on: no other thread queues work there, so
// nothing but the capturing thread's work enters a graph.
cudaStream_t capture_stream_of(int device) {
  static StreamPerDevice streams;
  return streams.get(device, "cuda::CudaGraph::capture");
}

}  // namespace

void CudaGraph::capture(MemPool& pool, const std::function<void()>& record) {
  KILN_CHECK(!exec_, "cuda::CudaGraph::capture: the graph is captured already");
  const int device = pool.device();
  require_device(device, "cuda::CudaGraph::capture");
  DeviceGuard guard(device);
  const cudaStream_t replay_stream = stream_of(device);  // where replays will run
  const cudaStream_t stream = capture_stream_of(device);
  {
    std::lock_guard lock(g_alloc_mutex);
    DeviceCache& c = caches()[static_cast<size_t>(device)];
    KILN_CHECK(c.capture_pool == 0, "cuda::CudaGraph::capture: cuda:{} is capturing another graph", device);
    PoolBlocks& blocks = c.pools.at(pool.id());
    if (!blocks.stream) blocks.stream = replay_stream;
    KILN_CHECK(blocks.stream == replay_stream,
               "cuda::CudaGraph::capture: the pool's graphs replay on another stream of cuda:{}", device);
    c.capture_pool = pool.id();
    c.capture_stream = stream;
    c.replay_stream = replay_stream;
  }
  struct EndPool {
    int device;
    ~EndPool() {
      std::lock_guard lock(g_alloc_mutex);
      DeviceCache& c = caches()[static_cast<size_t>(device)];
      c.capture_pool = 0;
      c.capture_stream = c.replay_stream = nullptr;
    }
  } end_pool{device};
  // The capturing thread's kiln ops go to the capture stream while `record` runs.
  const StreamGuard on_capture_stream(Stream{stream, device});
  // Thread-local: an unsafe call of this thread (one a capture cannot hold) fails, and so
  // does the capture, instead of running outside the graph; other threads' unsafe calls are
  // not refused, and their work cannot enter the graph (it goes to other streams).
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cuda::CudaGraph::capture");
  auto abandon = [&] {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream, &partial);
    if (partial) cudaGraphDestroy(partial);
    cudaGetLastError();
  };
  try {
    record();
  } catch (const Error& e) {
    abandon();
    fail("cuda::CudaGraph::capture: {}", e.what());
  } catch (...) {
    abandon();
    throw;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (ended != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    check(ended, "cuda::CudaGraph::capture: the capture failed (something in it waited for the GPU or used an "
                 "operation a graph cannot hold)");
  }
  size_t nodes = 0;
  cudaGraphGetNodes(graph, nullptr, &nodes);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(made, "cuda::CudaGraph::capture: instantiating the graph");
  exec_ = exec;
  device_ = device;
  nodes_ = static_cast<int64_t>(nodes);
  stream_ = replay_stream;
}

void CudaGraph::replay() const {
  KILN_CHECK(exec_, "cuda::CudaGraph::replay: nothing was captured");
  // The pool's blocks are ordered on the stream the graph was captured for; the work around
  // a replay (copies in and out) runs on the current stream: they must be the same.
  KILN_CHECK(stream_of(device_) == stream_,
             "cuda::CudaGraph::replay: cuda:{}'s current stream is not the one the graph was captured for", device_);
  DeviceGuard guard(device_);
  KILN_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(stream_)),
                  "cuda::CudaGraph::replay");
}

// ---- kernels ----

LoadedKernel load_kernel(const std::string& cubin, const std::string& name) {
  // One library per distinct image, kept for the life of the process.
  static std::mutex mutex;
  static std::unordered_map<std::string, cudaLibrary_t> libraries;
  KILN_CHECK(is_available(), "cuda::load_kernel {}: CUDA is not available: {}", name, unavailable_reason());
  std::lock_guard lock(mutex);
  cudaLibrary_t& lib = libraries[cubin];
  if (!lib) {
    const cudaError_t err = cudaLibraryLoadData(&lib, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (err != cudaSuccess) {
      libraries.erase(cubin);
      check(err, fmt::format("cuda::load_kernel {}", name).c_str());
    }
  }
  LoadedKernel k;
  k.name = name;
  KILN_CUDA_CHECK(cudaLibraryGetKernel(&k.handle, lib, name.c_str()),
                  fmt::format("cuda::load_kernel {}", name).c_str());
  return k;
}

void launch(const LoadedKernel& kernel, const LaunchShape& shape, void** args, int device) {
  KILN_CHECK(shape.grid >= 1 && shape.grid <= 0x7fffffff && shape.block >= 1 && shape.block <= 1024,
             "cuda::launch {}: grid {} and block {} are out of range", kernel.name, shape.grid, shape.block);
  DeviceGuard guard(device);
  const dim3 grid(static_cast<unsigned>(shape.grid)), block(static_cast<unsigned>(shape.block));
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel.handle), grid, block, args,
                                   static_cast<size_t>(shape.shared_bytes), stream_of(device)),
                  fmt::format("cuda::launch {}", kernel.name).c_str());
}

}  // namespace kiln::cuda
