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
// Backends: "gloo" (CPU tensors; Debian's libgloo-dev), "nccl" (CUDA tensors; not built
// yet: an error says so), "auto" (NCCL where built and CUDA is in use, else Gloo).
// Tensors: CPU, contiguous (a strided view is an error naming it), f32, f64, bf16, f16,
// i32, i64 (bf16 and f16 are reduced in f32 and rounded once; avg needs a floating dtype).
//
// Failure: every wait is bounded by the group's timeout. A rank that never arrives makes
// init_process_group fail on the others naming the missing ranks; a rank that dies or stops
// mid-job makes the next collective fail with a kiln::Error naming the collective, this
// rank and, where the transport says, the peer. After a failure the group is broken: later
// collectives fail at once with the first error. A process with a group ignores SIGPIPE
// (unless it installed a handler): Gloo's writes to a dead peer would raise it.
#include <chrono>
#include <cstdint>
#include <memory>
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

  int rank_ = 0;
  int size_ = 1;
  std::string backend_name_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<TcpStore> store_;
  std::unique_ptr<Backend> backend_;
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
