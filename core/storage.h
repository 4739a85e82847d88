#pragma once
// Storage: one allocation that tensors view. Views of the same storage share its version
// counter, which autograd uses to detect a tensor modified after it was saved.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/device.h"

namespace kiln {

struct StorageImpl {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  std::function<void(void*)> deleter;  // empty for memory the user owns
  std::atomic<uint64_t> version = 0;

  StorageImpl(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
      : data(data), nbytes(nbytes), device(device), deleter(std::move(deleter)) {}
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;
  ~StorageImpl() {
    if (deleter) deleter(data);
  }
};
using Storage = std::shared_ptr<StorageImpl>;

// Allocates `nbytes` on `device` (64-byte aligned on the CPU).
Storage allocate_storage(size_t nbytes, Device device);

// A pending storage: `nbytes` on `device` with no memory yet. A deferred op's outputs live
// in one (core/registry.h, DeferHookGuard) until whoever deferred the op computes them;
// Tensor::data_ptr() on a pending storage first asks the thread's PendingHook to.
Storage pending_storage(size_t nbytes, Device device);
inline bool is_pending(const StorageImpl& s) { return s.data == nullptr && s.nbytes != 0; }
// Gives the pending storage `to` the memory of `from` (same size and device: a value just
// computed there), which is left empty; nothing else may hold `from`.
void take_memory(StorageImpl& to, StorageImpl& from);

// Per-device allocation functions; a backend (CUDA) installs its own.
struct DeviceAllocator {
  void* (*allocate)(size_t nbytes, int device_index) = nullptr;
  void (*release)(void* ptr, size_t nbytes, int device_index) = nullptr;
};
void set_device_allocator(DeviceType type, DeviceAllocator allocator);
bool has_device_allocator(DeviceType type);

// Copies `nbytes` of plain memory between devices, at least one of them not the CPU, through
// the function the backend installed for that device type. The copy is ordered after the
// work queued on the device, and complete when it returns if the destination is the CPU.
using CopyBytesFn = void (*)(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);
void set_copy_bytes(DeviceType type, CopyBytesFn copy);
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);

// Bytes held by live tensor storages of one device type, counted by allocate_storage
// (requested sizes, not the allocator's rounding or cache).
struct MemoryStats {
  int64_t allocated = 0;     // bytes in live storages now
  int64_t peak = 0;          // the most `allocated` has been since the last reset
  int64_t allocations = 0;   // storages allocated since the process started
};
MemoryStats memory_stats(DeviceType type = DeviceType::cpu);
// Sets the peak to the bytes allocated now, to measure the peak of what follows.
void reset_peak_memory(DeviceType type = DeviceType::cpu);

// Returns the CPU allocator's cached blocks (kept for reuse after tensors die) to the
// system.
void empty_cpu_cache();
// How many blocks the CPU allocator has taken from the system (not from its cache) since
// the process started: after a training step's first call, its later calls take none.
int64_t cpu_system_allocations();

}  // namespace kiln
