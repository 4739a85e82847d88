// Pinned (page-locked) host memory (core/cuda.h: empty_pinned, pin_memory, is_pinned) and
// what the copies of runtime.cpp ask of it (runtime.h: note_copy_from_host).
//
// Each pinned block is one cudaHostAlloc, registered by address so that a copy can tell
// pinned memory from pageable. A copy from a pinned block returns as soon as it is queued;
// the block keeps an event per (device, stream) it was copied on, recorded after the last
// such copy. A freed block is kept (up to kPinnedCache bytes, evicting free blocks whose
// copies are done when it is full) and handed out again, once its events have passed, to a
// request of its exact size: a loader asks for the same batch size every step, and
// cudaHostAlloc is slow (milliseconds for a batch of images).
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {
namespace {

constexpr size_t kPinnedCache = size_t{1} << 30;

struct PinnedCopy {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
};
struct PinnedBlock {
  size_t nbytes = 0;
  std::vector<PinnedCopy> copies;
  bool free = false;
};
std::mutex g_pinned_mutex;
size_t g_pinned_cached = 0;  // bytes in free blocks
size_t g_pinned_bytes = 0;   // bytes in all blocks
std::map<uintptr_t, PinnedBlock>& pinned_blocks() {
  static auto* m = new std::map<uintptr_t, PinnedBlock>;  // outlives every tensor
  return *m;
}

// The block in use holding [p, p + nbytes), or null (caller holds g_pinned_mutex).
PinnedBlock* pinned_block_of(const void* p, size_t nbytes) {
  auto& blocks = pinned_blocks();
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto it = blocks.upper_bound(address);
  if (it == blocks.begin()) return nullptr;
  --it;
  return !it->second.free && address + nbytes <= it->first + it->second.nbytes ? &it->second : nullptr;
}

// Whether every copy from the block has finished (it may be reused). A broken event (a
// failed context) counts as finished: nothing will run on it any more.
bool copies_done(const PinnedBlock& b) {
  for (const PinnedCopy& c : b.copies) {
    const cudaError_t e = cudaEventQuery(c.event);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) cudaGetLastError();
  }
  return true;
}

// Where set_device chose a device for the process, cudaHostAlloc and cudaFreeHost run with
// it current (any thread's current device is cuda:0 unless set, and a first CUDA call there
// would make a context on cuda:0); elsewhere on the thread's current device, as before.
// Never throws: the free runs in a storage's deleter, possibly at exit; where the switch
// fails the call runs on the thread's device.
class OnProcessDevice {
 public:
  OnProcessDevice() {
    const int device = process_device();
    if (device < 0) return;
    if (cudaGetDevice(&previous_) != cudaSuccess || (previous_ != device && cudaSetDevice(device) != cudaSuccess)) {
      cudaGetLastError();
      return;
    }
    switched_ = previous_ != device;
  }
  ~OnProcessDevice() {
    if (switched_) cudaSetDevice(previous_);
  }
  OnProcessDevice(const OnProcessDevice&) = delete;
  OnProcessDevice& operator=(const OnProcessDevice&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

// Frees a block that is no longer registered: waits for its copies, then cudaFreeHost.
void release_pinned(uintptr_t address, const std::vector<PinnedCopy>& copies) {
  const OnProcessDevice on_process_device;
  for (const PinnedCopy& c : copies) {
    cudaEventSynchronize(c.event);
    cudaEventDestroy(c.event);
  }
  cudaFreeHost(reinterpret_cast<void*>(address));
  cudaGetLastError();
}

struct Unregistered {
  uintptr_t address;
  std::vector<PinnedCopy> copies;
};

// Unregisters free blocks (copies done first) until `wanted` more bytes fit in the cache,
// or all of them with wanted = SIZE_MAX; the caller frees them outside the lock.
std::vector<Unregistered> evict_pinned(size_t wanted) {
  std::vector<Unregistered> out;
  auto& blocks = pinned_blocks();
  for (auto it = blocks.begin(); it != blocks.end() && (wanted == SIZE_MAX || g_pinned_cached + wanted > kPinnedCache);) {
    if (it->second.free && (wanted == SIZE_MAX || copies_done(it->second))) {
      g_pinned_cached -= it->second.nbytes;
      g_pinned_bytes -= it->second.nbytes;
      out.push_back({it->first, std::move(it->second.copies)});
      it = blocks.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void free_unregistered(const std::vector<Unregistered>& blocks) {
  for (const Unregistered& b : blocks) release_pinned(b.address, b.copies);
}

void free_pinned(void* p) {
  std::vector<Unregistered> to_free;
  {
    std::lock_guard lock(g_pinned_mutex);
    auto& blocks = pinned_blocks();
    auto it = blocks.find(reinterpret_cast<uintptr_t>(p));
    if (it == blocks.end()) return;
    const size_t n = it->second.nbytes;
    if (g_pinned_cached + n > kPinnedCache) to_free = evict_pinned(n);
    if (g_pinned_cached + n <= kPinnedCache) {
      it->second.free = true;
      g_pinned_cached += n;
    } else {
      g_pinned_bytes -= n;
      to_free.push_back({it->first, std::move(it->second.copies)});
      blocks.erase(it);
    }
  }
  free_unregistered(to_free);  // outside the lock: waits for copies, and cudaFreeHost synchronizes
}

// A cached free block of exactly `nbytes` whose copies are done, taken; or null.
void* take_pinned(size_t nbytes) {
  std::lock_guard lock(g_pinned_mutex);
  for (auto& [address, b] : pinned_blocks())
    if (b.free && b.nbytes == nbytes && copies_done(b)) {
      b.free = false;
      g_pinned_cached -= nbytes;
      return reinterpret_cast<void*>(address);
    }
  return nullptr;
}

// Notes a copy from pinned block `block` queued on `stream` of `device` (current): its
// event for that stream, created on first use, recorded after the copy. On failure the
// copy is waited for, so the block is never reused under it.
void note_pinned_copy(PinnedBlock& block, int device, cudaStream_t stream) {
  PinnedCopy* entry = nullptr;
  for (PinnedCopy& c : block.copies)
    if (c.device == device && c.stream == stream) entry = &c;
  cudaError_t err = cudaSuccess;
  if (!entry) {
    cudaEvent_t event = nullptr;
    err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err == cudaSuccess) entry = &block.copies.emplace_back(PinnedCopy{device, stream, event});
  }
  if (err == cudaSuccess) err = cudaEventRecord(entry->event, stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    cudaStreamSynchronize(stream);
    check(err, "to_device");
  }
}

}  // namespace

void note_copy_from_host(const void* src, size_t nbytes, int device, cudaStream_t stream) {
  std::lock_guard lock(g_pinned_mutex);
  if (PinnedBlock* block = pinned_block_of(src, nbytes)) note_pinned_copy(*block, device, stream);
}

void release_pinned_cache() {
  std::vector<Unregistered> cached;
  {
    std::lock_guard lock(g_pinned_mutex);
    cached = evict_pinned(SIZE_MAX);
  }
  free_unregistered(cached);
}

PinnedBytes pinned_bytes() {
  std::lock_guard lock(g_pinned_mutex);
  return {static_cast<int64_t>(g_pinned_bytes), static_cast<int64_t>(g_pinned_cached)};
}

Tensor empty_pinned(const Shape& shape, DType dtype) {
  KILN_CHECK(is_available(), "cuda::empty_pinned: CUDA is not available: {}", unavailable_reason());
  for (int64_t d : shape) KILN_CHECK(d >= 0, "cuda::empty_pinned: negative size in shape {}", shape_str(shape));
  const size_t nbytes = std::max<size_t>(static_cast<size_t>(numel_of(shape)) * itemsize(dtype), 1);
  void* p = take_pinned(nbytes);
  if (!p) {
    const OnProcessDevice on_process_device;
    cudaError_t err = cudaHostAlloc(&p, nbytes, cudaHostAllocDefault);
    if (err != cudaSuccess) {  // free the cache and try once more
      cudaGetLastError();
      release_pinned_cache();
      err = cudaHostAlloc(&p, nbytes, cudaHostAllocDefault);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail("cuda::empty_pinned: cannot pin {} bytes of host memory ({}: {})", nbytes, cudaGetErrorName(err),
           cudaGetErrorString(err));
    }
    std::lock_guard lock(g_pinned_mutex);
    pinned_blocks()[reinterpret_cast<uintptr_t>(p)] = PinnedBlock{nbytes, {}, false};
    g_pinned_bytes += nbytes;
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<StorageImpl>(p, nbytes, Device::cpu(), free_pinned);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = Device::cpu();
  return Tensor(std::move(impl));
}

Tensor pin_memory(const Tensor& t) {
  KILN_CHECK(t.defined() && t.device().is_cpu(), "cuda::pin_memory: expects a CPU tensor, got {}",
             t.defined() ? t.meta_str() : std::string("an undefined tensor"));
  Tensor pinned = empty_pinned(t.shape(), t.dtype());
  pinned.copy_(t);
  return pinned;
}

bool is_pinned(const Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || !t.storage() || !t.storage()->data) return false;
  std::lock_guard lock(g_pinned_mutex);
  return pinned_block_of(t.storage()->data, t.storage()->nbytes) != nullptr;
}

}  // namespace kiln::cuda
