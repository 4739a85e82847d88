#include "core/storage.h"

#include <cstdlib>
#include <new>

#include "core/error.h"

namespace kiln {
namespace {

constexpr size_t kCpuAlignment = 64;

void* cpu_allocate(size_t nbytes, int) {
  const size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  void* p = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
  if (!p) fail("allocate: out of CPU memory allocating {} bytes", nbytes);
  return p;
}
void cpu_release(void* p, int) { std::free(p); }

DeviceAllocator& allocator_for(DeviceType type) {
  static DeviceAllocator table[kNumDeviceTypes] = {{cpu_allocate, cpu_release}, {}};
  return table[static_cast<int>(type)];
}

}  // namespace

void set_device_allocator(DeviceType type, DeviceAllocator allocator) {
  allocator_for(type) = allocator;
}

Storage allocate_storage(size_t nbytes, Device device) {
  DeviceAllocator a = allocator_for(device.type);
  KILN_CHECK(a.allocate, "allocate: device {} is not available (kiln has no backend for it in this build)",
             device);
  void* p = a.allocate(nbytes, device.index);
  auto release = a.release;
  const int index = device.index;
  return std::make_shared<StorageImpl>(p, nbytes, device,
                                       [release, index](void* q) { release(q, index); });
}

}  // namespace kiln
