#pragma once
// What a process group's transport does (dist/process_group.cpp drives it): collectives on
// raw CPU memory, called one at a time, in the same order on every rank, from the group's
// worker thread. Each call blocks until done and throws on failure (a peer gone, the
// timeout passed). Dtype conversions (bf16 and f16 reduced in f32), averaging and
// reduce-scatter are the group's, so a backend needs only these.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/tensor.h"

namespace kiln::dist {

class TcpStore;

enum class ReduceOp { sum, avg, max };

class Backend {
 public:
  virtual ~Backend() = default;
  // In place over `count` elements of `dtype` (f32, f64, i32 or i64); op is sum or max.
  virtual void all_reduce(void* data, size_t count, DType dtype, ReduceOp op, uint32_t tag) = 0;
  virtual void broadcast(void* data, size_t bytes, int root, uint32_t tag) = 0;
  // out holds size() * bytes: rank r's `bytes` of in land at out + r * bytes.
  virtual void all_gather(const void* in, void* out, size_t bytes, uint32_t tag) = 0;
  virtual void barrier(uint32_t tag) = 0;
  // The rank whose connection a failure's message names, or -1 (for error messages).
  virtual int peer_named_in(const std::string& message) const = 0;
};

// One collective queued on a device: done when the device has run it.
class DeviceWork {
 public:
  virtual ~DeviceWork() = default;
  // True once the device ran it; throws kiln::Error when the transport reported a failure.
  virtual bool query() = 0;
  // Blocks until the device ran it, at most the group's timeout; then (or on a failure the
  // transport reports) aborts the transport and throws kiln::Error. Makes the calling
  // thread's current stream wait for the collective too.
  virtual void wait() = 0;
  // Seconds the collective took on the device (0 until it completed).
  virtual double seconds() = 0;
};

// What a process group's transport for CUDA tensors does (dist/nccl_backend.cpp): each
// collective is queued on the transport's own stream, after what the device's current
// stream holds when it is called, and returns at once. Tensors are contiguous, on the
// transport's device; the group checks shapes and dtypes. Reductions are the transport's
// own (avg included, bf16 and f16 natively).
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual int device() const = 0;
  virtual std::shared_ptr<DeviceWork> all_reduce(const Tensor& t, ReduceOp op) = 0;
  virtual std::shared_ptr<DeviceWork> broadcast(const Tensor& t, int root) = 0;
  virtual std::shared_ptr<DeviceWork> all_gather(const Tensor& out, const Tensor& in) = 0;
  virtual std::shared_ptr<DeviceWork> reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) = 0;
  virtual std::shared_ptr<DeviceWork> barrier() = 0;
};

// Why NCCL cannot run in this process ("this kiln was built without NCCL", "libnccl.so.2
// could not be loaded: ...", "no CUDA device: ..."); empty when it can.
std::string nccl_unavailable_reason();
// NCCL's version as "2.28.9" (loading the library); empty when it cannot be loaded.
std::string nccl_version();
// Connects this rank's NCCL communicator on CUDA device `device`: rank 0 makes NCCL's
// unique id and passes it through the store under `prefix`. Bounded by `timeout`: a rank
// that never comes makes the others fail with a kiln::Error. Throws kiln::Error where
// nccl_unavailable_reason() is not empty.
std::unique_ptr<DeviceBackend> make_nccl_backend(TcpStore& store, const std::string& prefix, int rank, int size,
                                                 int device, std::chrono::milliseconds timeout);

// Connects to every other rank through the store (keys under `prefix`). Throws kiln::Error
// when this build has no Gloo.
std::unique_ptr<Backend> make_gloo_backend(TcpStore& store, const std::string& prefix, int rank, int size,
                                           std::chrono::milliseconds timeout);

}  // namespace kiln::dist
