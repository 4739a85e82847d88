#include "tools/device_batches.h"

namespace kiln::train {

DeviceBatchCopier::DeviceBatchCopier(Device device) : device_(device) {
  if (device_.is_cuda()) copy_stream_ = cuda::new_stream(device_.index);
}

DeviceBatch DeviceBatchCopier::start(data::Batch host) {
  DeviceBatch b;
  b.host = std::move(host);
  if (device_.is_cpu()) {
    b.input = b.host.input;
    b.target = b.host.target;
    b.mask = b.host.mask;
    return b;
  }
  // The copy stream first waits for everything queued on the device's stream so far: the
  // copies allocate on the copy stream, whose cache may hand them a block that a batch of a
  // step still queued there was read from (the step queued after this call is not waited
  // for, and overlaps the copies).
  cuda::Event queued(device_.index);
  queued.record(cuda::current_stream(device_.index));
  b.copied = std::make_shared<cuda::Event>(device_.index);
  {
    cuda::StreamGuard on_copy_stream(copy_stream_);
    queued.wait(copy_stream_);
    // From pinned memory these return once queued; the pinned cache keeps each host block
    // until its copy on this stream has run.
    b.input = b.host.input.to(device_);
    b.target = b.host.target.to(device_);
    if (b.host.mask.defined()) b.mask = b.host.mask.to(device_);
    b.copied->record(copy_stream_);
  }
  return b;
}

void DeviceBatchCopier::wait(const DeviceBatch& batch) const {
  if (batch.copied) batch.copied->wait(cuda::current_stream(device_.index));
}

}  // namespace kiln::train
