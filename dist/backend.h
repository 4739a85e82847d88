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

// Connects to every other rank through the store (keys under `prefix`). Throws kiln::Error
// when this build has no Gloo.
std::unique_ptr<Backend> make_gloo_backend(TcpStore& store, const std::string& prefix, int rank, int size,
                                           std::chrono::milliseconds timeout);

}  // namespace kiln::dist
