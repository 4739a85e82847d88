#pragma once
// The loader's batches on the training device, copied one batch ahead: on a GPU the next
// batch's host-to-device copies run on a copy stream of their own while the current step
// runs on the device's stream, which waits for them (an event) only when it uses the batch.
// On the CPU the batches are the loader's tensors and nothing is copied.
#include <memory>

#include "core/cuda.h"
#include "data/loader.h"

namespace kiln::train {

struct DeviceBatch {
  data::Batch host;             // the loader's batch (pinned on a GPU run)
  Tensor input, target, mask;   // on the device (mask undefined when the batch has none)
  std::shared_ptr<cuda::Event> copied;  // recorded on the copy stream after the copies (GPU only)
};

class DeviceBatchCopier {
 public:
  explicit DeviceBatchCopier(Device device);
  // Queues `host`'s copies to the device and returns at once. Call it for the next batch
  // before queuing the current step, so that the copies overlap that step.
  DeviceBatch start(data::Batch host);
  // Makes the device's current stream wait for `batch`'s copies (nothing on the CPU); call
  // before the step that reads the batch.
  void wait(const DeviceBatch& batch) const;

 private:
  Device device_;
  cuda::Stream copy_stream_{};
};

}  // namespace kiln::train
