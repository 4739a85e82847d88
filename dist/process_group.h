#pragma once
// Process groups: the ranks of a job, connected once through rank 0's TcpStore, and the
// collectives between them (all_reduce, broadcast, all_gather, reduce_scatter, barrier).
//
//   dist::init_process_group({.backend = "gloo"});      // reads RANK, WORLD_SIZE, ... (launch_env.h)
//   Tensor g = ...;                                      // the same shape on every rank
//   dist::all_reduce(g, dist::ReduceOp::avg).wait();     // g is now the mean over the ranks
//
// Every collective is asynchronous: it is queued on the group's worker thread and returns
// a Work whose wait() blocks until it finished (and throws when it failed). Collectives run
// one after another in the order they were called, which must be the same on every rank.
// The tensors given must stay untouched until wait() returns; the Work keeps them alive.
//
// Backends: "gloo" (CPU tensors; Debian's libgloo-dev), "nccl" (CUDA tensors; the CUDA
// toolkit's NCCL, connected at init_process_group on cuda:LOCAL_RANK modulo the visible
// GPUs unless .device says), "auto" (Gloo for CPU tensors, NCCL for CUDA tensors, its
// communicator connected at the first collective on a CUDA tensor, on that tensor's device;
// every rank must make that call, as every collective). A backend that cannot run here
// (not built, no GPU, libnccl.so.2 missing) is a kiln::Error saying why.
// Tensors: contiguous (a strided view is an error naming it), f32, f64, bf16, f16, i32,
// i64 (avg needs a floating dtype). On Gloo, bf16 and f16 are reduced in f32 and rounded
// once; NCCL reduces them natively (rounding at each of its steps).
//
// CUDA tensors: the collective is queued on the group's own stream, after the work already
// queued on the device's current stream (an event orders them), and returns at once; wait()
// blocks the host until the device ran it (polling, bounded by the timeout) and orders the
// current stream after it. The group keeps the tensors alive until the device ran it.
//
// Failure: every wait is bounded by the group's timeout (on NCCL: past it, or when NCCL
// reports an error, the communicator is aborted with ncclCommAbort, which also ends kernels
// waiting for a dead peer, and the wait throws). A rank that never arrives makes
// init_process_group fail on the others naming the missing ranks; a rank that dies or stops
// mid-job makes the next collective fail with a kiln::Error naming the collective, this
// rank and, where the transport says, the peer. After a failure the group is broken: later
// collectives fail at once with the first error. A process with a group ignores SIGPIPE
// (unless it installed a handler): Gloo's writes to a dead peer would raise it.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "core/tensor.h"
#include "dist/backend.h"

namespace kiln::dist {

class TcpStore;

// The handle of one collective.
class Work {
 public:
  struct State;
  Work() = default;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // Blocks until the collective finished; throws kiln::Error when it failed.
  void wait() const;
  bool is_completed() const;
  // Seconds the collective ran on the group's worker (0 until it completed).
  double seconds() const;

 private:
  std::shared_ptr<State> state_;
};

struct ProcessGroupOptions {
  std::string backend = "auto";  // "gloo", "nccl" or "auto"
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // bound of every wait
  // -1 / empty: from the launch environment (launch_env.h).
  int rank = -1;
  int world_size = -1;
  std::string master_addr = {};
  int master_port = -1;
  // nccl: the CUDA device of this rank's communicator; -1: the launcher's LOCAL_RANK modulo
  // the GPUs visible (one GPU per rank on each node, as torchrun's convention).
  int device = -1;
};

// How many collectives of each kind this group has run (issued, successful or not).
struct CollectiveCounts {
  int64_t all_reduce = 0;
  int64_t broadcast = 0;
  int64_t all_gather = 0;
  int64_t reduce_scatter = 0;
  int64_t barrier = 0;
};

class ProcessGroup {
 public:
  // Connects to the other ranks: rank 0 serves the store, every rank announces itself and
  // waits for the others, then the backend connects. Prefer init_process_group.
  explicit ProcessGroup(const ProcessGroupOptions& options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "gloo", "nccl", or for "auto" what serves it: "gloo", "gloo+nccl" (where NCCL can run).
  const std::string& backend() const { return backend_name_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  TcpStore& store() { return *store_; }

  // In place: every rank's t becomes the reduction of all ranks' t (same shape and dtype).
  Work all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum);
  // In place: every rank's t becomes root's.
  Work broadcast(const Tensor& t, int root = 0);
  // out (size() * n rows along dim 0, where in has n) gets every rank's in, by rank.
  Work all_gather(const Tensor& out, const Tensor& in);
  // in has size() * n rows along dim 0; out (n rows) gets this rank's slice of the
  // reduction of all ranks' in. Runs as an all-reduce of in (Gloo has no reduce-scatter
  // over unbound buffers): size() times out's bytes on the wire, not out's.
  Work reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum);
  Work barrier();

  CollectiveCounts counts() const;

  struct Queue;

 private:
  Work enqueue(std::string what, std::function<void(Backend&, uint32_t tag)> run);
  // The NCCL backend for a collective on `t` (a CUDA tensor), connected at the first call
  // under "auto"; a kiln::Error naming `op` when this group has none for it.
  DeviceBackend& device_backend(const char* op, const Tensor& t);
  // The CUDA device of NCCL's communicator when no tensor says: .device, else LOCAL_RANK
  // modulo the visible GPUs.
  int nccl_device() const;
  // Counts the collective (kind: a member of CollectiveCounts).
  void count(int64_t CollectiveCounts::*kind);

  int rank_ = 0;
  int size_ = 1;
  std::string backend_name_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<TcpStore> store_;
  std::unique_ptr<Backend> backend_;          // Gloo, for CPU tensors (null: none)
  std::unique_ptr<DeviceBackend> device_backend_;  // NCCL, for CUDA tensors (null: none yet)
  bool cuda_enabled_ = false;  // "nccl", or "auto" in a build with NCCL
  int local_rank_ = 0;
  int nccl_device_ = -1;
  std::mutex device_mutex_;
  std::unique_ptr<Queue> queue_;
};

// Makes the default group (the launch environment fills what options leave out) and
// returns it; a process no launcher started is a job of one rank. A second call without
// destroy_process_group is an error.
ProcessGroup& init_process_group(const ProcessGroupOptions& options = {});
bool is_initialized();
// The default group; an error when there is none.
ProcessGroup& default_group();
// Closes the default group (its worker finishes queued collectives first).
void destroy_process_group();

// The collectives on the default group.
Work all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum);
Work broadcast(const Tensor& t, int root = 0);
Work all_gather(const Tensor& out, const Tensor& in);
Work reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum);
Work barrier();
int get_rank();
int get_world_size();

}  // namespace kiln::dist
