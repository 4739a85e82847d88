// kiln-train's batch copier (tools/device_batches.h): on the CPU the loader's tensors pass
// through as they are; on a GPU (not run yet: none here) the copies queued on the copy
// stream, waited for by the device's stream, hold the host batches' values, one batch
// ahead, while the device's stream is busy.
#include <optional>

#include "core/cuda.h"
#include "core/ops/factory.h"
#include "core/ops/linalg.h"
#include "core/ops/reduce.h"
#include "testing.h"
#include "tools/device_batches.h"

using namespace kiln;

namespace {

data::Batch batch_of(int64_t index, bool pinned) {
  data::Batch b;
  b.input = full({4, 3}, static_cast<double>(index) + 0.5);
  b.target = full({4}, index, {.dtype = DType::i64});
  b.mask = full({4, 3}, 1, {.dtype = DType::i64});
  if (pinned) {
    b.input = cuda::pin_memory(b.input);
    b.target = cuda::pin_memory(b.target);
    b.mask = cuda::pin_memory(b.mask);
  }
  b.index = index;
  return b;
}

}  // namespace

TEST_CASE("device batches: on the CPU the loader's tensors pass through", "[trainer][device_batches]") {
  train::DeviceBatchCopier copier(Device::cpu());
  const data::Batch host = batch_of(3, false);
  const train::DeviceBatch b = copier.start(host);
  copier.wait(b);
  CHECK(b.input.same(host.input));
  CHECK(b.target.same(host.target));
  CHECK(b.mask.same(host.mask));
  CHECK(b.host.index == 3);
  CHECK_FALSE(b.copied);
  data::Batch no_mask = batch_of(4, false);
  no_mask.mask = Tensor();
  CHECK_FALSE(copier.start(no_mask).mask.defined());
}

TEST_CASE("device batches: on a GPU the copy stream's copies hold the host batches' values",
          "[trainer][device_batches][cuda]") {
  if (!cuda::is_available()) {
    REQUIRE_THROWS_WITH(train::DeviceBatchCopier(Device::cuda(0)), Catch::Matchers::Contains("cuda::new_stream: "));
    return;
  }
  train::DeviceBatchCopier copier(Device::cuda(0));
  // Two batches in flight at a time, as kiln-train has them, the device's stream busy with a
  // large product meanwhile: each arrives whole.
  const Tensor a = randn({2048, 2048}, {.device = Device::cuda(0)});
  std::optional<train::DeviceBatch> ahead = copier.start(batch_of(0, true));
  for (int64_t k = 0; k < 6; ++k) {
    const train::DeviceBatch current = std::move(*ahead);
    ahead = copier.start(batch_of(k + 1, true));
    copier.wait(current);
    const Tensor busy = matmul(a, a);
    CHECK(current.input.device() == Device::cuda(0));
    KILN_CHECK_EQUAL(current.input.to(Device::cpu()), full({4, 3}, static_cast<double>(k) + 0.5));
    KILN_CHECK_EQUAL(current.target.to(Device::cpu()), full({4}, k, {.dtype = DType::i64}));
    CHECK(sum(busy).item<double>() != 0);
  }
}
