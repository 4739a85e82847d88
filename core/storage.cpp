#include "core/storage.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace kiln {
namespace {

constexpr size_t kCpuAlignment = 64;
constexpr size_t kHugePage = size_t{2} << 20;

// Freed blocks, kept by size class for the next allocation of that class: a training step
// allocates the same tensors every step, so after the first step it takes no memory from
// the system (and a fresh large block would cost a page fault per 2 MiB on first touch).
// Bytes of freed blocks kept: a quarter of the machine's memory, at least 2 GiB. A step's
// temporaries must all fit, or the ones past the limit are fresh pages at every step: with
// 2 GiB, GPT-2 small's bf16 step (b8 x 128) lost 400 ms a step to page faults in the
// gradient of its 154 MB embedding. A training loop asks for the same sizes every step, so
// the cache stays near its working set; empty_cpu_cache() returns it all.
size_t cache_limit() {
  static const size_t limit = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    const size_t quarter = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) / 4 : 0;
    return std::max(size_t{2} << 30, quarter);
  }();
  return limit;
}

struct BlockCache {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;
  size_t cached_bytes = 0;
  int64_t system_allocations = 0;

  void* take(size_t rounded) {
    std::lock_guard lock(mutex);
    auto it = free_blocks.find(rounded);
    if (it == free_blocks.end() || it->second.empty()) {
      ++system_allocations;  // the caller goes to the system next
      return nullptr;
    }
    void* p = it->second.back();
    it->second.pop_back();
    cached_bytes -= rounded;
    return p;
  }
  bool keep(void* p, size_t rounded) {
    std::lock_guard lock(mutex);
    if (cached_bytes + rounded > cache_limit()) return false;
    free_blocks[rounded].push_back(p);
    cached_bytes += rounded;
    return true;
  }
  void clear() {
    std::lock_guard lock(mutex);
    for (auto& [size, blocks] : free_blocks)
      for (void* p : blocks) std::free(p);
    free_blocks.clear();
    cached_bytes = 0;
  }
};

BlockCache& block_cache() {
  static BlockCache* cache = new BlockCache;  // outlives every tensor
  return *cache;
}

// The size class of an allocation: a multiple of 2 MiB for large blocks (huge pages);
// below, four classes per power of two (at most 25% rounding), at least 64 bytes.
size_t rounded_size(size_t nbytes) {
  if (nbytes <= kCpuAlignment) return kCpuAlignment;
  if (nbytes >= kHugePage) return (nbytes + kHugePage - 1) / kHugePage * kHugePage;
  const int top = 63 - __builtin_clzll(static_cast<unsigned long long>(nbytes - 1));
  const size_t step = std::max(kCpuAlignment, size_t{1} << (top > 2 ? top - 2 : 0));
  return (nbytes + step - 1) / step * step;
}

void* cpu_allocate(size_t nbytes, int) {
  // Large buffers are aligned to 2 MiB and asked to use transparent huge pages: a fresh
  // 256 MiB tensor then takes 128 page faults instead of 65536.
  const size_t rounded = rounded_size(nbytes);
  if (void* p = block_cache().take(rounded)) return p;
  const size_t align = rounded >= kHugePage ? kHugePage : kCpuAlignment;
  void* p = std::aligned_alloc(align, rounded);
  if (!p) fail("allocate: out of CPU memory allocating {} bytes", nbytes);
  if (align == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

void cpu_release(void* p, size_t nbytes, int) {
  if (!block_cache().keep(p, rounded_size(nbytes))) std::free(p);
}

DeviceAllocator& allocator_for(DeviceType type) {
  static DeviceAllocator table[kNumDeviceTypes] = {{cpu_allocate, cpu_release}, {}};
  return table[static_cast<int>(type)];
}

struct MemoryCounters {
  std::atomic<int64_t> allocated{0}, peak{0}, allocations{0};

  void add(int64_t nbytes) {
    const int64_t now = allocated.fetch_add(nbytes) + nbytes;
    allocations.fetch_add(1);
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
};

MemoryCounters& counters_for(DeviceType type) {
  static MemoryCounters* table = new MemoryCounters[kNumDeviceTypes];  // outlives every tensor
  return table[static_cast<int>(type)];
}

}  // namespace

MemoryStats memory_stats(DeviceType type) {
  MemoryCounters& c = counters_for(type);
  return {c.allocated.load(), c.peak.load(), c.allocations.load()};
}

void reset_peak_memory(DeviceType type) {
  MemoryCounters& c = counters_for(type);
  c.peak.store(c.allocated.load());
}

void empty_cpu_cache() { block_cache().clear(); }

int64_t cpu_system_allocations() {
  BlockCache& cache = block_cache();
  std::lock_guard lock(cache.mutex);
  return cache.system_allocations;
}

void set_device_allocator(DeviceType type, DeviceAllocator allocator) {
  allocator_for(type) = allocator;
}

bool has_device_allocator(DeviceType type) { return allocator_for(type).allocate != nullptr; }

static CopyBytesFn& copier_for(DeviceType type) {
  static CopyBytesFn table[kNumDeviceTypes] = {};
  return table[static_cast<int>(type)];
}

void set_copy_bytes(DeviceType type, CopyBytesFn copy) { copier_for(type) = copy; }

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  const DeviceType backend = dst_device.is_cpu() ? src_device.type : dst_device.type;
  CopyBytesFn copy = copier_for(backend);
  KILN_CHECK(copy, "to_device: no copy from {} to {} in this build", src_device, dst_device);
  copy(dst, dst_device, src, src_device, nbytes);
}

Storage allocate_storage(size_t nbytes, Device device) {
  DeviceAllocator a = allocator_for(device.type);
  KILN_CHECK(a.allocate, "allocate: device {} is not available (kiln has no backend for it in this build)",
             device);
  void* p = a.allocate(nbytes, device.index);
  MemoryCounters& counters = counters_for(device.type);
  counters.add(static_cast<int64_t>(nbytes));
  auto release = a.release;
  const int index = device.index;
  return std::make_shared<StorageImpl>(p, nbytes, device, [release, nbytes, index, &counters](void* q) {
    counters.allocated.fetch_sub(static_cast<int64_t>(nbytes));
    release(q, nbytes, index);
  });
}

Storage pending_storage(size_t nbytes, Device device) {
  KILN_CHECK(allocator_for(device.type).allocate,
             "allocate: device {} is not available (kiln has no backend for it in this build)", device);
  return std::make_shared<StorageImpl>(nullptr, nbytes, device, nullptr);
}

void take_memory(StorageImpl& to, StorageImpl& from) {
  KILN_CHECK(is_pending(to) && !is_pending(from) && to.nbytes == from.nbytes && to.device == from.device,
             "take_memory: a pending storage of {} bytes on {} cannot take {} bytes on {}", to.nbytes, to.device,
             from.nbytes, from.device);
  to.data = from.data;
  to.deleter = std::move(from.deleter);
  from.deleter = nullptr;
  from.data = nullptr;
  from.nbytes = 0;
}

}  // namespace kiln
