#include "core/storage.h"
#include "testing.h"

using namespace kiln;

TEST_CASE("memory_stats counts live storages and the peak", "[memory]") {
  const MemoryStats before = memory_stats();
  reset_peak_memory();
  {
    Tensor a = empty({1000});  // 4000 bytes
    Tensor b = empty({500}, {.dtype = DType::f64});  // 4000 bytes
    const MemoryStats during = memory_stats();
    CHECK(during.allocated == before.allocated + 8000);
    CHECK(during.allocations == before.allocations + 2);
    Tensor view = a.view({10, 100});  // shares a's storage
    CHECK(memory_stats().allocated == during.allocated);
  }
  const MemoryStats after = memory_stats();
  CHECK(after.allocated == before.allocated);
  CHECK(after.peak == before.allocated + 8000);
  reset_peak_memory();
  CHECK(memory_stats().peak == after.allocated);
}
